package guest

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest/proc"
)

const (
	// attachLinger bounds how long an attachment that sent its exit frame
	// waits for the daemon to close: closing a socket with input unread may
	// reset it and lose the daemon's last frames.
	attachLinger = 5 * time.Second
	// maxExitText bounds a start error in an exit frame (the program's name
	// is in it), which the daemon takes up to 64 KiB of.
	maxExitText = 4 << 10
)

// stdin writes a request's body to a process's input (guestapi.PathProcessStdinSuffix);
// ?close=true closes the input after it.
func (s *server) stdin(w http.ResponseWriter, r *http.Request) error {
	p, err := s.process(r)
	if err != nil {
		return err
	}
	closeIt := false
	if v := r.URL.Query().Get("close"); v != "" {
		if closeIt, err = strconv.ParseBool(v); err != nil {
			return errdefs.New(errdefs.InvalidArgument, "close: %q is not a boolean", v)
		}
	}
	// Refused before the body is read: no such input, or too much of it.
	if err := p.CheckInput(closeIt); err != nil {
		return err
	}
	if r.ContentLength > guestapi.MaxStdinWrite {
		return tooMuchInput()
	}
	// All of the body or none of it: it is read before any is written.
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, guestapi.MaxStdinWrite))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return tooMuchInput()
	case err != nil:
		return errdefs.New(errdefs.InvalidArgument, "body: %v", err)
	}
	if len(data) > 0 || !closeIt {
		if err := p.WriteInput(r.Context(), data); err != nil {
			return err
		}
	}
	if closeIt {
		if err := p.CloseInput(r.Context()); err != nil {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func tooMuchInput() error {
	return errdefs.New(errdefs.TooLarge, "body: larger than %d bytes; send input in parts", guestapi.MaxStdinWrite)
}

// attach turns the request into an attachment to a process
// (guestapi.PathProcessAttachSuffix): frames of its output go out, frames
// of input and resizes come in. An unknown process is not_found before any
// upgrade.
func (s *server) attach(w http.ResponseWriter, r *http.Request) error {
	p, err := s.process(r)
	if err != nil {
		return err
	}
	return s.upgrade(w, r, func(c *streamConn) error { return s.serveAttachment(c, p) })
}

// serveAttachment runs one attachment until the process's exit frame is
// out (then it half-closes and lets the daemon close), the daemon's side
// ends (its EOF too: the daemon's attachment does not half-close), or a
// frame from the daemon cannot be taken. The process is left as it is.
func (s *server) serveAttachment(c *streamConn, p *proc.Process) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Frames are read apart from being acted on: input the process does
	// not take yet holds up the next frame, but the daemon's going away is
	// still seen, and ends the write.
	frames := make(chan frame)
	var wg sync.WaitGroup
	var readErr, applyErr error
	wg.Go(func() {
		defer close(frames)
		defer cancel() // ends the output
		readErr = readFrames(ctx, c, frames)
	})
	wg.Go(func() {
		for f := range frames {
			if err := applyFrame(ctx, p, f); err != nil && applyErr == nil {
				applyErr = err
				cancel()
			}
		}
	})
	err := sendFrames(ctx, c, p)
	cancel() // input to an exited process goes nowhere
	if err == nil {
		// The exit frame is out: the daemon reads to the end, then closes.
		c.CloseWrite()
		c.SetReadDeadline(time.Now().Add(attachLinger))
	} else {
		c.Close() // ends readFrames
	}
	wg.Wait()
	// For the log: a frame the guest could not take comes first.
	switch {
	case applyErr != nil:
		return applyErr
	case readErr != nil && !errors.Is(readErr, io.EOF) && !errors.Is(readErr, net.ErrClosed):
		return readErr
	}
	return err
}

// sendFrames sends what the process wrote before and writes now, then its
// exit frame; nil once the exit frame is out.
func sendFrames(ctx context.Context, c *streamConn, p *proc.Process) error {
	buf := make([]byte, guestapi.FrameHead, guestapi.FrameHead+64<<10)
	for ev := range p.Attach(ctx) {
		var typ byte
		payload := ev.Data
		switch ev.Type {
		case guestapi.EventStdout:
			typ = guestapi.FrameStdout
		case guestapi.EventStderr:
			typ = guestapi.FrameStderr
		case guestapi.EventExit:
			typ = guestapi.FrameExit
			r := *ev.Result
			if len(r.StartError) > maxExitText {
				r.StartError = r.StartError[:maxExitText] + "…"
			}
			var err error
			if payload, err = json.Marshal(r); err != nil {
				return err
			}
		default:
			continue
		}
		buf = append(buf[:guestapi.FrameHead], payload...)
		buf[0] = typ
		binary.BigEndian.PutUint32(buf[1:guestapi.FrameHead], uint32(len(payload)))
		if _, err := c.Write(buf); err != nil {
			return err
		}
		if typ == guestapi.FrameExit {
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err // the daemon's side ended first
	}
	return errors.New("the process's output ended without an exit")
}

// frame is one frame from the daemon.
type frame struct {
	typ     byte
	payload []byte
}

// readFrames reads the daemon's frames and hands them over until the
// stream ends (io.EOF) or a frame cannot be taken (an unknown type, one
// the daemon does not send, or one too long). Once ctx has ended, frames
// are read and dropped.
func readFrames(ctx context.Context, c *streamConn, out chan<- frame) error {
	br := bufio.NewReaderSize(c, 64<<10)
	var head [guestapi.FrameHead]byte
	for {
		if _, err := io.ReadFull(br, head[:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return errors.New("attachment: the stream ended inside a frame")
			}
			return err
		}
		typ, n := head[0], binary.BigEndian.Uint32(head[1:])
		if n > guestapi.MaxFrame {
			return fmt.Errorf("attachment: frame of %d bytes, more than %d", n, guestapi.MaxFrame)
		}
		switch typ {
		case guestapi.FrameStdin, guestapi.FrameResize:
		case guestapi.FrameCloseStdin:
			if n != 0 {
				return fmt.Errorf("attachment: close-stdin frame with %d bytes", n)
			}
		default:
			return fmt.Errorf("attachment: frame type %d is not one the daemon sends", typ)
		}
		f := frame{typ: typ, payload: make([]byte, n)}
		if _, err := io.ReadFull(br, f.payload); err != nil {
			return fmt.Errorf("attachment: the stream ended inside a frame: %w", err)
		}
		select {
		case out <- f:
		case <-ctx.Done():
		}
	}
}

// applyFrame acts on one frame. Input a process cannot take (it exited, or
// has no open input or no terminal) is dropped: the daemon learns of an
// exit from the exit frame, and knows from the process's info what it
// takes. An error (a resize that cannot be) ends the attachment.
func applyFrame(ctx context.Context, p *proc.Process, f frame) error {
	var err error
	switch f.typ {
	case guestapi.FrameStdin:
		err = p.WriteInput(ctx, f.payload)
	case guestapi.FrameCloseStdin:
		err = p.CloseInput(ctx)
	case guestapi.FrameResize:
		var size guestapi.TTY
		if err := json.Unmarshal(f.payload, &size); err != nil {
			return fmt.Errorf("attachment: resize frame: %w", err)
		}
		err = p.Resize(size)
	}
	switch {
	case err == nil, errdefs.IsConflict(err), ctx.Err() != nil:
		return nil
	}
	return fmt.Errorf("attachment: %w", err)
}
