package proc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

const (
	// readChunk is the most one read or one output event carries (a pipe
	// holds 64 KiB).
	readChunk = 64 << 10
	// segmentCost bounds the order log: a process may have one segment per
	// segmentCost bytes of its output bound, so the log never costs more
	// memory than the output itself. Only output that switches stream every
	// few bytes reaches it; what comes after is dropped as truncated.
	segmentCost = 16
)

// Stream indexes.
const (
	stdout = 0
	stderr = 1
)

// Process is one started process and the output it keeps. Its methods are
// safe for concurrent use.
//
// The output is append-only: each stream's kept bytes in one buffer, bounded
// by limit, and an order log of segments saying how the two interleave (a
// segment is a run of one stream, so output written a byte at a time costs
// no more than its bytes). Readers (Result, Subscribe) take what they need by
// offset under mu and never write, so a slow reader never holds up the
// process, its pipe readers or other readers.
type Process struct {
	pid     int
	args    []string
	started time.Time
	limit   int64                // kept bytes per stream
	exit    chan unix.WaitStatus // the reaper's one status for pid
	exitedC chan struct{}        // closed once the status arrived
	done    chan struct{}        // closed once finished
	// background: started by StartBackground, so its exit goes to the
	// exits stream (an exec stream reports its own).
	background bool

	// Input and terminal, set before the process is started.
	tty   bool
	term  *os.File      // a terminal's master: its output, and its input
	stdin *os.File      // open input without a terminal: the stdin pipe's write end
	turn  chan struct{} // capacity 1: held by the one writer of input

	mu          sync.Mutex
	out         [2][]byte // kept output per stream; bytes below len never change
	segs        []segment // order of the output, as read
	truncated   [2]bool
	changed     chan struct{} // closed and replaced on every append and at the end
	exited      bool          // the status arrived: no more signals by timer
	timedOut    bool
	finished    bool
	result      guestapi.Result // without output; set when finished
	size        guestapi.TTY    // the terminal's size
	screen      scrollback      // a terminal's recent output
	inputClosed bool            // CloseInput ran
}

// segment is a run of output from one stream, ending at an offset of that
// stream's buffer; the last segment grows while its stream keeps writing.
type segment struct {
	stream int
	end    int
}

func newProcess(args []string, limit int64) *Process {
	return &Process{
		args: args, limit: limit, started: time.Now(),
		exit: make(chan unix.WaitStatus, 1), done: make(chan struct{}), changed: make(chan struct{}),
		turn: make(chan struct{}, 1), exitedC: make(chan struct{}),
	}
}

// Pid is the process id inside the sandbox; 0 for a program that never started.
func (p *Process) Pid() int { return p.pid }

// Done is closed when the process has exited and its output is complete.
func (p *Process) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not finished yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Info describes the process, with its Result (output included) once finished.
func (p *Process) Info() guestapi.ProcessInfo { return p.info(true) }

func (p *Process) info(output bool) guestapi.ProcessInfo {
	info := guestapi.ProcessInfo{Pid: p.pid, Args: p.args, Running: p.Running(), StartedUnixMs: p.started.UnixMilli()}
	if !info.Running {
		r := p.outcome(output)
		info.Result = &r
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		size := p.size
		info.TTY = &size
	}
	info.OpenStdin = p.inputFile() != nil && !p.inputClosed && !p.exited && !p.finished
	return info
}

// Result says how the process ended, with its kept output. Valid after Done.
func (p *Process) Result() guestapi.Result { return p.outcome(true) }

func (p *Process) outcome(output bool) guestapi.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.result
	r.StdoutTruncated, r.StderrTruncated = p.truncated[stdout], p.truncated[stderr]
	if !output {
		return r
	}
	if len(p.out[stdout]) > 0 {
		r.Stdout = slices.Clone(p.out[stdout])
	}
	if len(p.out[stderr]) > 0 {
		r.Stderr = slices.Clone(p.out[stderr])
	}
	return r
}

func (p *Process) keptBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(len(p.out[stdout]) + len(p.out[stderr]) + len(p.screen.buf))
}

// Signal sends sig to the process's group while the process is not finished
// (the group may outlive its leader: a background child keeps it).
func (p *Process) Signal(sig syscall.Signal) error {
	if p.pid == 0 || !p.Running() {
		return errdefs.New(errdefs.Conflict, "process %d has exited", p.pid)
	}
	if err := unix.Kill(-p.pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal process group %d: %w", p.pid, err)
	}
	return nil
}

// notifyLocked wakes the subscribers; p.mu is held.
func (p *Process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// appendOutput keeps what fits of b; the rest is dropped.
func (p *Process) appendOutput(stream int, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keepLocked(stream, b) {
		p.notifyLocked()
	}
}

// keepLocked keeps what fits of b and says whether it kept any; p.mu is held.
func (p *Process) keepLocked(stream int, b []byte) bool {
	buf := p.out[stream]
	if room := int(p.limit) - len(buf); len(b) > room {
		p.truncated[stream] = true
		b = b[:max(room, 0)]
	}
	if len(b) == 0 {
		return false
	}
	n := len(p.segs)
	if n == 0 || p.segs[n-1].stream != stream {
		if int64(n) >= max(2*p.limit/segmentCost, 64) {
			p.truncated[stream] = true
			return false
		}
		p.segs = append(p.segs, segment{stream: stream})
		n++
	}
	if len(buf)+len(b) > cap(buf) {
		// Grow by doubling, but never past the bound.
		grown := make([]byte, len(buf), min(max(2*cap(buf), len(buf)+len(b), 4096), int(p.limit)))
		copy(grown, buf)
		buf = grown
	}
	buf = append(buf, b...)
	p.out[stream] = buf
	p.segs[n-1].end = len(buf)
	return true
}

// cursor is a reader's place in the output.
type cursor struct {
	seg  int    // index of the segment being read
	sent [2]int // bytes of each stream already read
}

// next returns up to most events of output after c and moves c past them.
// done says that the process is finished and c has reached its end.
func (p *Process) next(c *cursor, most int) (evs []guestapi.Event, done bool, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c.seg < len(p.segs) && len(evs) < most {
		sg := p.segs[c.seg]
		for c.sent[sg.stream] < sg.end && len(evs) < most {
			from := c.sent[sg.stream]
			to := min(sg.end, from+readChunk)
			typ := guestapi.EventStdout
			if sg.stream == stderr {
				typ = guestapi.EventStderr
			}
			// Written bytes never change: the event may share them.
			evs = append(evs, guestapi.Event{Type: typ, Data: p.out[sg.stream][from:to:to]})
			c.sent[sg.stream] = to
		}
		if c.sent[sg.stream] < sg.end || c.seg == len(p.segs)-1 {
			break // out of room, or on the last segment, which may grow
		}
		c.seg++
	}
	caughtUp := len(p.segs) == 0 || (c.seg == len(p.segs)-1 && c.sent[p.segs[c.seg].stream] == p.segs[c.seg].end)
	return evs, p.finished && caughtUp, p.changed
}

// end records the result and wakes everyone waiting.
func (p *Process) end(r guestapi.Result) {
	p.mu.Lock()
	p.result = r
	p.finished = true
	p.notifyLocked()
	p.mu.Unlock()
	close(p.done)
}

// failStart ends a process that could not start: like a shell, exit code
// 127 (not found) or 126 (not executable), the reason also on stderr.
func (p *Process) failStart(code int, msg string) {
	p.appendOutput(stderr, []byte(msg+"\n"))
	p.end(guestapi.Result{ExitCode: code, StartError: msg})
}

// expire is the timeout: it kills the group unless the process has exited.
func (p *Process) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return
	}
	p.timedOut = true
	unix.Kill(-p.pid, unix.SIGKILL)
}

// stdio is the guest's side of a started process's standard streams.
type stdio struct {
	out, err *os.File // the output pipes' read ends; for a terminal, out is its master and err nil
	in       *os.File // where the spec's Stdin goes: the stdin pipe's write end or the master; or nil
	initial  []byte   // the spec's Stdin
	// keepOpen leaves in open once initial is written (open input, or a
	// terminal); the writer of initial holds p.turn then, taken at start.
	keepOpen bool
}

// run owns a started process until it is finished: it feeds stdin, drains
// the output pipes (or the terminal), enforces the timeout, and records the
// end once the reaper delivered the exit status and the output hit its end
// (EOF from a pipe, EIO from a terminal's master once nothing holds the
// terminal open) or exitGrace passed after the exit.
func (p *Process) run(s stdio, timeout time.Duration) {
	var pipes sync.WaitGroup
	for stream, r := range []*os.File{s.out, s.err} {
		if r == nil {
			continue
		}
		pipes.Go(func() {
			// Beyond the bound: read and dropped (a terminal's still
			// reaches the scrollback).
			keep := func(b []byte) {
				if p.tty {
					p.appendTerminal(b)
				} else {
					p.appendOutput(stream, b)
				}
			}
			buf := make([]byte, readChunk)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					keep(buf[:n])
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					drainBuffered(r, buf, keep)
				}
				if err != nil {
					return
				}
			}
		})
	}
	if s.in != nil && (len(s.initial) > 0 || !s.keepOpen) {
		pipes.Go(func() {
			s.in.Write(s.initial) // EPIPE when the process does not read it all: fine
			if s.keepOpen {
				p.releaseInput()
			} else {
				s.in.Close()
			}
		})
	}
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, p.expire)
	}

	ws := <-p.exit
	exitedAt := time.Now()
	p.mu.Lock()
	p.exited = true
	timedOut := p.timedOut
	p.mu.Unlock()
	close(p.exitedC)
	if timer != nil {
		timer.Stop()
	}

	drained := make(chan struct{})
	go func() { pipes.Wait(); close(drained) }()
	grace := time.NewTimer(exitGrace)
	select {
	case <-drained:
	case <-grace.C:
		// A background child holds a pipe: stop reading and writing now.
		// Input too: a write to it waits on that child.
		now := time.Now()
		for _, f := range []*os.File{s.out, s.err} {
			if f != nil {
				f.SetReadDeadline(now)
			}
		}
		if s.in != nil {
			s.in.SetWriteDeadline(now)
		}
		<-drained
	}
	grace.Stop()
	closeAll(s.out, s.err)
	if s.in != nil && s.in != s.out {
		s.in.Close() // a write of input still going on ends with os.ErrClosed
	}

	r := guestapi.Result{Pid: p.pid, TimedOut: timedOut, DurationMs: exitedAt.Sub(p.started).Milliseconds()}
	if ws.Signaled() {
		r.Signal = int(ws.Signal())
		r.ExitCode = 128 + r.Signal
	} else {
		r.ExitCode = ws.ExitStatus()
	}
	p.end(r)
}

// drainBuffered passes to keep what r (a non-blocking pipe or terminal)
// holds already, up to drainMost, without waiting for more. The deadline
// that ended the reading of r stops the wait for a writer that lives on
// (a background child), not the reading of what was written before: a
// reader scheduled late, under load, would otherwise drop output the
// process wrote before it exited.
func drainBuffered(r *os.File, buf []byte, keep func([]byte)) {
	rc, err := r.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		if fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
			return // a read could wait
		}
		for total := 0; total < drainMost; {
			n, err := unix.Read(int(fd), buf)
			if n <= 0 || err != nil {
				return // empty (EAGAIN), the end, or an error
			}
			keep(buf[:n])
			total += n
		}
	})
}

// drainMost bounds drainBuffered: what a pipe holds at its largest size,
// so a writer that goes on writing cannot keep it reading.
const drainMost = 1 << 20

// Subscribe streams the kept output from the beginning, then live output,
// then an exit event (its Result without output) once the process is
// finished, and closes the channel after it; it also closes the channel,
// early, when ctx ends. The sending goroutine lives until one of the two, so
// a caller that stops reading must end ctx. Subscribers read the log by
// index: a slow one holds up nobody else.
func (p *Process) Subscribe(ctx context.Context) <-chan guestapi.Event {
	ch := make(chan guestapi.Event)
	go func() {
		defer close(ch)
		var c cursor
		for {
			evs, done, changed := p.next(&c, 64)
			for _, ev := range evs {
				select {
				case ch <- ev:
				case <-ctx.Done():
					return
				}
			}
			if done {
				select {
				case ch <- p.exitEvent():
				case <-ctx.Done():
				}
				return
			}
			if len(evs) > 0 {
				continue // there may be more already
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

// Snapshot returns the output kept so far and, if the process is finished,
// the exit event.
func (p *Process) Snapshot() []guestapi.Event {
	var c cursor
	evs, done, _ := p.next(&c, math.MaxInt)
	if done {
		evs = append(evs, p.exitEvent())
	}
	return evs
}

func (p *Process) exitEvent() guestapi.Event {
	r := p.outcome(false)
	return guestapi.Event{Type: guestapi.EventExit, Pid: p.pid, Result: &r}
}
