package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// MaxTTYSide bounds a terminal's rows and columns.
const MaxTTYSide = 10000

// defaultTerm is TERM for a process on a terminal whose spec sets none.
const defaultTerm = "xterm-256color"

// eofChar is the terminal's end-of-input character when its settings
// cannot be read (^D, the POSIX default).
const eofChar = 0x04

// validTTY checks a terminal size, naming the field.
func validTTY(size guestapi.TTY) error {
	if size.Rows < 1 || size.Rows > MaxTTYSide {
		return errdefs.New(errdefs.InvalidArgument, "tty.rows: %d is outside 1..%d", size.Rows, MaxTTYSide)
	}
	if size.Cols < 1 || size.Cols > MaxTTYSide {
		return errdefs.New(errdefs.InvalidArgument, "tty.cols: %d is outside 1..%d", size.Cols, MaxTTYSide)
	}
	return nil
}

// openPTY allocates a pseudo-terminal of the given size inside the sandbox
// and returns its master, non-blocking (its reads and writes take
// deadlines), and its slave, blocking as programs expect, which the caller
// hands to the child and then closes.
func openPTY(size guestapi.TTY) (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	fail := func(what string, err error) (*os.File, *os.File, error) {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("pseudo-terminal: %s: %w", what, err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlock", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		return fail("number", err)
	}
	if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols}); err != nil {
		return fail("size", err)
	}
	sfd, err := openSlave(fd, n)
	if err != nil {
		return fail("open the slave", err)
	}
	// The master is non-blocking, so NewFile registers it with the poller;
	// the slave is blocking, as programs expect.
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	return os.NewFile(uintptr(fd), "/dev/ptmx ("+name+")"), os.NewFile(uintptr(sfd), name), nil
}

// openSlave opens the slave of the master fd, number n. TIOCGPTPEER opens it
// from the master itself, so nothing in the sandbox's /dev/pts (which its
// processes may change) is looked up; a kernel older than 4.13 lacks it,
// and the slave is opened by its path then.
func openSlave(fd int, n uint32) (int, error) {
	const flags = unix.O_RDWR | unix.O_NOCTTY | unix.O_CLOEXEC
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, flags)
	if errno == 0 {
		return int(r), nil
	}
	if errno != unix.EINVAL && errno != unix.ENOTTY {
		return -1, errno
	}
	s, err := unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), flags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(s, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		unix.Close(s)
		return -1, errors.New("/dev/pts entry is not a terminal")
	}
	return s, nil
}

// scrollback keeps the last guestapi.ScrollbackBytes of a terminal's output
// in a ring, addressed by offset in everything the terminal ever wrote.
type scrollback struct {
	buf   []byte // allocated at the first write; offset o lives at buf[o%len(buf)]
	total int64  // bytes ever written
}

// write adds b to the ring, overwriting the oldest bytes once it is full.
func (s *scrollback) write(b []byte) {
	if s.buf == nil {
		s.buf = make([]byte, guestapi.ScrollbackBytes)
	}
	size := int64(len(s.buf))
	end := s.total + int64(len(b))
	if int64(len(b)) > size {
		b = b[int64(len(b))-size:]
	}
	at := int((end - int64(len(b))) % size)
	n := copy(s.buf[at:], b)
	copy(s.buf, b[n:])
	s.total = end
}

// oldest is the offset of the oldest byte the ring still holds.
func (s *scrollback) oldest() int64 {
	return max(0, s.total-int64(len(s.buf)))
}

// read copies at most most bytes from offset from on (or from the oldest
// kept, if from is older) and returns them and the offset after them.
func (s *scrollback) read(from int64, most int) ([]byte, int64) {
	from = max(from, s.oldest())
	n := int(min(int64(most), s.total-from))
	if n <= 0 {
		return nil, from
	}
	out := make([]byte, n)
	at := int(from % int64(len(s.buf)))
	k := copy(out, s.buf[at:])
	copy(out[k:], s.buf)
	return out, from + int64(n)
}

// appendTerminal keeps a terminal's output: bounded from the start, like a
// pipe's, and in the scrollback.
func (p *Process) appendTerminal(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.screen.write(b)
	p.keepLocked(stdout, b)
	p.notifyLocked()
}

// Attach streams the process for an attachment: for a process on a
// terminal, its scrollback (the last guestapi.ScrollbackBytes of output)
// and then its output as it comes; for another process, what Subscribe
// streams (its kept output from the start, then live output). The exit
// event (its Result without output) comes last, once the process is
// finished, and the channel is closed after it, or early when ctx ends.
// Each attachment reads by offset under the lock: a slow one holds up
// neither the process nor the others.
func (p *Process) Attach(ctx context.Context) <-chan guestapi.Event {
	if !p.tty {
		return p.Subscribe(ctx)
	}
	ch := make(chan guestapi.Event)
	go func() {
		defer close(ch)
		var at int64 // clamped to the oldest byte kept: the scrollback comes first
		for {
			p.mu.Lock()
			// An attachment that fell further behind than the ring holds
			// skips ahead to the oldest byte kept: a terminal's recent
			// output matters, not all of it (the whole, up to the output
			// bound, is the Result's).
			data, next := p.screen.read(at, readChunk)
			done := p.finished && next == p.screen.total
			changed := p.changed
			p.mu.Unlock()
			at = next
			if len(data) > 0 {
				select {
				case ch <- guestapi.Event{Type: guestapi.EventStdout, Data: data}:
				case <-ctx.Done():
					return
				}
				continue
			}
			if done {
				select {
				case ch <- p.exitEvent():
				case <-ctx.Done():
				}
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// TTY says whether the process runs on a terminal.
func (p *Process) TTY() bool { return p.tty }

// inputFile is where input goes: the terminal's master or the stdin pipe;
// nil for a process without open input.
func (p *Process) inputFile() *os.File {
	if p.tty {
		return p.term
	}
	return p.stdin
}

// CheckInput says whether the process takes input now, as WriteInput
// (closedOK false) or CloseInput (closedOK true) would, without waiting.
func (p *Process) CheckInput(closedOK bool) error {
	_, err := p.checkInput(closedOK)
	return err
}

func (p *Process) checkInput(closedOK bool) (closed bool, err error) {
	if p.inputFile() == nil {
		return false, errdefs.New(errdefs.Conflict, "process %d was not started with open stdin (open_stdin or tty)", p.pid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.inputClosed && closedOK: // closing closed input is done, even once the process has exited
		return true, nil
	case p.exited || p.finished:
		return false, errdefs.New(errdefs.Conflict, "process %d has exited", p.pid)
	case p.inputClosed && !closedOK:
		return false, errdefs.New(errdefs.Conflict, "process %d's input was closed", p.pid)
	}
	return p.inputClosed, nil
}

// takeInput waits for the turn to write input, then checks that input can
// be written; the caller gives the turn back with releaseInput. closed says
// the input was closed (err is nil then only if closedOK).
func (p *Process) takeInput(ctx context.Context, closedOK bool) (f *os.File, closed bool, err error) {
	if _, err := p.checkInput(closedOK); err != nil { // before waiting: an ended process answers at once
		return nil, false, err
	}
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if closed, err = p.checkInput(closedOK); err != nil {
		p.releaseInput()
		return nil, false, err
	}
	return p.inputFile(), closed, nil
}

func (p *Process) releaseInput() { <-p.turn }

// WriteInput writes b to the process's input, its terminal or its stdin
// pipe, after the input written before it. It returns once all of b is
// written, or when ctx ends (part of b may be written then) or the process
// exits. A process without open input, one that exited and one whose input
// was closed are conflicts.
func (p *Process) WriteInput(ctx context.Context, b []byte) error {
	f, _, err := p.takeInput(ctx, false)
	if err != nil {
		return err
	}
	defer p.releaseInput()
	return p.inputError(ctx, writeInput(ctx, f, b))
}

// CloseInput ends the process's input after what was written before: a
// stdin pipe is closed (the process reads EOF); a terminal gets its
// end-of-input character (^D unless the process changed it), which ends a
// line-reading program's input at the start of a line. Either way no more
// input is taken. Closing closed input again does nothing.
func (p *Process) CloseInput(ctx context.Context) error {
	f, closed, err := p.takeInput(ctx, true)
	if err != nil || closed {
		return err
	}
	defer p.releaseInput()
	if p.tty {
		if err := writeInput(ctx, f, []byte{p.eofChar()}); err != nil {
			return p.inputError(ctx, err)
		}
	} else {
		f.Close()
	}
	p.mu.Lock()
	p.inputClosed = true
	p.mu.Unlock()
	return nil
}

// eofChar is the terminal's end-of-input character (VEOF).
func (p *Process) eofChar() byte {
	c := byte(eofChar)
	rc, err := p.term.SyscallConn()
	if err != nil {
		return c
	}
	rc.Control(func(fd uintptr) {
		// The master's TCGETS reads the slave's settings.
		if t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS); err == nil && t.Cc[unix.VEOF] != 0 {
			c = t.Cc[unix.VEOF]
		}
	})
	return c
}

// writeInput writes b to f, giving up when ctx ends.
func writeInput(ctx context.Context, f *os.File, b []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		f.SetWriteDeadline(time.Unix(1, 0)) // in the past: the write returns
		close(fired)
	})
	_, err := f.Write(b)
	if !stop() {
		<-fired
		f.SetWriteDeadline(time.Time{})
	}
	return err
}

// inputError sorts out a failed write of input.
func (p *Process) inputError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	p.mu.Lock()
	exited := p.exited || p.finished
	p.mu.Unlock()
	switch {
	case exited, errors.Is(err, os.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded):
		// The process exited meanwhile: its input was closed, or a
		// background child holding it stopped it.
		return errdefs.New(errdefs.Conflict, "process %d has exited", p.pid)
	case errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
		// Nothing reads the input any more: most often the process has
		// died and is about to be reaped.
		t := time.NewTimer(exitGrace)
		defer t.Stop()
		select {
		case <-p.exitedC:
			return errdefs.New(errdefs.Conflict, "process %d has exited", p.pid)
		case <-t.C:
			return errdefs.New(errdefs.Conflict, "process %d has closed its input", p.pid)
		}
	}
	return fmt.Errorf("write input of process %d: %w", p.pid, err)
}

// Resize changes the size of the process's terminal; the kernel signals
// SIGWINCH to the terminal's foreground process group.
func (p *Process) Resize(size guestapi.TTY) error {
	if err := validTTY(size); err != nil {
		return err
	}
	if !p.tty {
		return errdefs.New(errdefs.Conflict, "process %d has no terminal (it was not started with tty)", p.pid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited || p.finished {
		return errdefs.New(errdefs.Conflict, "process %d has exited", p.pid)
	}
	rc, err := p.term.SyscallConn()
	if err != nil {
		return fmt.Errorf("resize the terminal of process %d: %w", p.pid, err)
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols})
	}); err != nil {
		return errdefs.New(errdefs.Conflict, "process %d has exited", p.pid)
	}
	if ierr != nil {
		return fmt.Errorf("resize the terminal of process %d: %w", p.pid, ierr)
	}
	p.size = size
	return nil
}
