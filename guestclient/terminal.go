package guestclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

const (
	// maxExitFrame bounds the Result JSON of an exit frame (it carries no output).
	maxExitFrame = 64 << 10
	// maxTTYSide bounds a terminal's rows and columns, as the guest does.
	maxTTYSide = 10000
)

// WriteStdin writes data to the input of a process started with OpenStdin
// or TTY (guestapi.PathProcessStdinSuffix) and, if close, then closes that
// input (for a terminal, types its end-of-input character). It returns once
// the guest has written all of data, which waits for the process to read
// it; ctx bounds the wait. A process without open input, or one that has
// exited, is a conflict; an unknown one is not found.
func (c *Client) WriteStdin(ctx context.Context, pid int, data []byte, close bool) error {
	if pid <= 0 {
		return errdefs.New(errdefs.InvalidArgument, "pid: %d is not a process id", pid)
	}
	if len(data) > guestapi.MaxStdinWrite {
		return errdefs.New(errdefs.TooLarge, "stdin: %d bytes, more than %d at once", len(data), guestapi.MaxStdinWrite)
	}
	p := procPath(pid, guestapi.PathProcessStdinSuffix)
	if close {
		p += "?close=true"
	}
	resp, err := c.raw(ctx, http.MethodPost, p, bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return c.predatesTerminals(ctx, pid, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return nil
}

// Attach opens an attachment to a process (guestapi.PathProcessAttachSuffix):
// first what it wrote before (a terminal's scrollback, or another process's
// kept output), then its output as it comes and its exit, while input,
// resizes and the end of input go the other way. ctx bounds the handshake
// only. Closing the attachment leaves the process running.
func (c *Client) Attach(ctx context.Context, pid int) (*Attachment, error) {
	if pid <= 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "pid: %d is not a process id", pid)
	}
	conn, err := c.Upgrade(ctx, http.MethodGet, procPath(pid, guestapi.PathProcessAttachSuffix), nil)
	if err != nil {
		return nil, c.predatesTerminals(ctx, pid, err)
	}
	return &Attachment{id: c.id, pid: pid, conn: conn, br: bufio.NewReaderSize(conn, 64<<10)}, nil
}

// predatesTerminals sorts out a not_found from a terminal route: either the
// process is unknown, or the guest does not know the route (it predates
// terminals). The process's own route, which every guest has, tells which.
func (c *Client) predatesTerminals(ctx context.Context, pid int, err error) error {
	if !errdefs.IsNotFound(err) {
		return err
	}
	if _, gerr := c.Get(ctx, pid); gerr == nil {
		return errdefs.New(errdefs.NotImplemented, "sandbox %s: its guest predates terminals", c.id)
	}
	return err
}

// Attachment is the daemon's end of an attachment to one process. Next is
// for one reader; Stdin, Resize, CloseStdin and Close are safe to call from
// any goroutine, also while Next waits.
type Attachment struct {
	id   string
	pid  int
	conn *Conn
	br   *bufio.Reader

	wmu sync.Mutex // one frame written at a time, and one Stdin's frames together

	// Read side, Next's own.
	exited bool  // the exit frame was read
	err    error // once set, what Next returns
}

// Next returns the next frame of output: kind guestapi.FrameStdout or
// FrameStderr with its data (the caller's to keep), or FrameExit with how
// the process ended (without output), which is the last; after it Next
// returns io.EOF once the guest has closed its side. It believes nothing
// the guest sends: an unknown frame type, a frame longer than
// guestapi.MaxFrame, an exit frame whose Result is not valid JSON, is
// longer than 64 KiB or names another process, or anything after the exit
// frame, is an error (unavailable), and so is a stream that ends before
// the exit frame.
func (a *Attachment) Next() (kind byte, data []byte, res *guestapi.Result, err error) {
	if a.err != nil {
		return 0, nil, nil, a.err
	}
	f, err := a.next()
	if err != nil {
		a.err = err
	}
	return f.kind, f.data, f.res, err
}

// frame is one frame of output.
type frame struct {
	kind byte
	data []byte
	res  *guestapi.Result
}

func (a *Attachment) next() (frame, error) {
	var head [guestapi.FrameHead]byte
	if a.exited {
		switch _, err := io.ReadFull(a.br, head[:1]); {
		case err == io.EOF:
			return frame{}, io.EOF
		case err != nil:
			return frame{}, a.broken(err, "reading past the exit frame")
		}
		return frame{}, a.bad("data after the exit frame")
	}
	if _, err := io.ReadFull(a.br, head[:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, a.broken(err, "attachment ended before the process's exit")
	}
	typ, n := head[0], binary.BigEndian.Uint32(head[1:])
	switch {
	case typ != guestapi.FrameStdout && typ != guestapi.FrameStderr && typ != guestapi.FrameExit:
		return frame{}, a.bad("frame of unknown type %d", typ)
	case n > guestapi.MaxFrame:
		return frame{}, a.bad("frame of %d bytes, more than %d", n, guestapi.MaxFrame)
	case typ == guestapi.FrameExit && n > maxExitFrame:
		return frame{}, a.bad("exit frame of %d bytes, more than %d", n, maxExitFrame)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(a.br, data); err != nil {
		return frame{}, a.broken(err, "attachment ended inside a frame")
	}
	if typ != guestapi.FrameExit {
		return frame{kind: typ, data: data}, nil
	}
	var r guestapi.Result
	if len(bytes.TrimSpace(data)) == 0 || bytes.TrimSpace(data)[0] != '{' {
		return frame{}, a.bad("exit frame is not a JSON object")
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return frame{}, a.bad("exit frame: %v", err)
	}
	if r.Pid != a.pid {
		return frame{}, a.bad("exit frame of process %d, not %d", r.Pid, a.pid)
	}
	r.Stdout, r.Stderr = nil, nil // the output came in frames
	a.exited = true
	return frame{kind: guestapi.FrameExit, res: &r}, nil
}

func (a *Attachment) bad(format string, args ...any) error {
	a.conn.Close()
	return errdefs.New(errdefs.Unavailable, "sandbox %s: bad attachment frame from guest: "+format, append([]any{a.id}, args...)...)
}

func (a *Attachment) broken(err error, what string) error {
	return errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: %s", a.id, what)
}

// Stdin sends data as the process's input, in frames of at most
// guestapi.MaxFrame bytes. Writes wait while the guest does not read
// (while the process does not take its input); Close ends them.
func (a *Attachment) Stdin(data []byte) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	for len(data) > 0 {
		n := min(len(data), guestapi.MaxFrame)
		if err := a.writeLocked(guestapi.FrameStdin, data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// Resize sets the size of the process's terminal (rows and cols in 1..10000).
func (a *Attachment) Resize(rows, cols uint16) error {
	if rows < 1 || rows > maxTTYSide {
		return errdefs.New(errdefs.InvalidArgument, "tty.rows: %d is outside 1..%d", rows, maxTTYSide)
	}
	if cols < 1 || cols > maxTTYSide {
		return errdefs.New(errdefs.InvalidArgument, "tty.cols: %d is outside 1..%d", cols, maxTTYSide)
	}
	b, err := json.Marshal(guestapi.TTY{Rows: rows, Cols: cols})
	if err != nil {
		return err
	}
	return a.write(guestapi.FrameResize, b)
}

// CloseStdin ends the process's input after what was sent before, as
// WriteStdin's close does.
func (a *Attachment) CloseStdin() error {
	return a.write(guestapi.FrameCloseStdin, nil)
}

// Close ends the attachment; the process goes on.
func (a *Attachment) Close() error {
	err := a.conn.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (a *Attachment) write(typ byte, payload []byte) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	return a.writeLocked(typ, payload)
}

func (a *Attachment) writeLocked(typ byte, payload []byte) error {
	var head [guestapi.FrameHead]byte
	head[0] = typ
	binary.BigEndian.PutUint32(head[1:], uint32(len(payload)))
	bufs := net.Buffers{head[:], payload}
	// The connection itself (not Conn, whose Read differs): writev.
	if _, err := bufs.WriteTo(a.conn.Conn); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: attachment", a.id)
	}
	return nil
}
