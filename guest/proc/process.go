package proc

import (
	"context"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
)

// Process is one started process and its kept output.
type Process struct {
	pid     int
	args    []string
	started time.Time
	limit   int64
	exit    chan unix.WaitStatus // from the reaper
	done    chan struct{}

	mu        sync.Mutex
	events    []guestapi.Event // output chunks, in order
	kept      [2]int64
	truncated [2]bool
	changed   chan struct{} // closed and replaced on every append or end
	finished  bool
	result    guestapi.Result
	timedOut  bool
}

func newProcess(args []string, limit int64) *Process {
	return &Process{args: args, limit: limit, done: make(chan struct{}), changed: make(chan struct{}), started: time.Now()}
}

// Pid is the process id inside the sandbox (0 for a program that never started).
func (p *Process) Pid() int { return p.pid }

// Done is closed when the process has ended and its output is complete.
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

// Info describes the process; Result (with output) once finished.
func (p *Process) Info() guestapi.ProcessInfo {
	info := guestapi.ProcessInfo{Pid: p.pid, Args: p.args, Running: p.Running(), StartedUnixMs: p.started.UnixMilli()}
	if !info.Running {
		r := p.Result()
		info.Result = &r
	}
	return info
}

// Result is how the process ended, with its kept output. Valid after Done.
func (p *Process) Result() guestapi.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.result
	var out, errb []byte
	for _, ev := range p.events {
		if ev.Type == guestapi.EventStdout {
			out = append(out, ev.Data...)
		} else {
			errb = append(errb, ev.Data...)
		}
	}
	r.Stdout, r.Stderr = out, errb
	r.StdoutTruncated, r.StderrTruncated = p.truncated[0], p.truncated[1]
	return r
}

// notifyLocked wakes subscribers.
func (p *Process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Process) appendOutput(stream int, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	room := p.limit - p.kept[stream]
	if int64(len(b)) > room {
		p.truncated[stream] = true
		b = b[:max(room, 0)]
	}
	if len(b) == 0 {
		return
	}
	p.kept[stream] += int64(len(b))
	typ := guestapi.EventStdout
	if stream == 1 {
		typ = guestapi.EventStderr
	}
	p.events = append(p.events, guestapi.Event{Type: typ, Data: append([]byte(nil), b...)})
	p.notifyLocked()
}

// finishWithoutStart ends a process that could not start.
func (p *Process) finishWithoutStart(code int, msg string) {
	p.appendOutput(1, []byte("berth: "+msg+"\n"))
	p.mu.Lock()
	p.result = guestapi.Result{ExitCode: code, StartError: msg}
	p.finished = true
	p.notifyLocked()
	p.mu.Unlock()
	close(p.done)
}

// run feeds stdin, drains output, enforces the timeout and records the end.
func (p *Process) run(outR, errR, stdinW *os.File, stdin []byte, timeout time.Duration) {
	var readers sync.WaitGroup
	for i, r := range []*os.File{outR, errR} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			buf := make([]byte, readChunk)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					p.appendOutput(i, buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	if stdinW != nil {
		readers.Add(1)
		go func() {
			defer readers.Done()
			stdinW.Write(stdin) // EPIPE when the process does not read: fine
			stdinW.Close()
		}()
	}
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() {
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			unix.Kill(-p.pid, unix.SIGKILL)
		})
	}
	ws := <-p.exit
	if timer != nil {
		timer.Stop()
	}
	end := time.Now()
	// Give the pipes a moment to drain; a background child may hold them open.
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(exitGrace):
		outR.SetReadDeadline(time.Now())
		errR.SetReadDeadline(time.Now())
		if stdinW != nil {
			stdinW.Close()
		}
		<-drained
	}
	outR.Close()
	errR.Close()

	p.mu.Lock()
	r := guestapi.Result{Pid: p.pid, TimedOut: p.timedOut, DurationMs: end.Sub(p.started).Milliseconds()}
	switch {
	case ws.Signaled():
		r.Signal = int(ws.Signal())
		r.ExitCode = 128 + r.Signal
	default:
		r.ExitCode = ws.ExitStatus()
	}
	p.result = r
	p.finished = true
	p.notifyLocked()
	p.mu.Unlock()
	close(p.done)
}

// Subscribe streams the kept output from the start, then live output, then
// an exit event (without output), and closes the channel. It stops early
// when ctx ends. Subscribers never slow the process: they read the log.
func (p *Process) Subscribe(ctx context.Context) <-chan guestapi.Event {
	ch := make(chan guestapi.Event)
	go func() {
		defer close(ch)
		next := 0
		for {
			p.mu.Lock()
			evs := p.events[next:]
			finished := p.finished
			changed := p.changed
			p.mu.Unlock()
			for _, ev := range evs {
				select {
				case ch <- ev:
				case <-ctx.Done():
					return
				}
			}
			next += len(evs)
			if finished {
				r := p.Result()
				r.Stdout, r.Stderr = nil, nil
				select {
				case ch <- guestapi.Event{Type: guestapi.EventExit, Pid: p.pid, Result: &r}:
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

// Snapshot returns the output kept so far and, if finished, the exit event.
func (p *Process) Snapshot() []guestapi.Event {
	p.mu.Lock()
	evs := append([]guestapi.Event(nil), p.events...)
	finished := p.finished
	p.mu.Unlock()
	if finished {
		r := p.Result()
		r.Stdout, r.Stderr = nil, nil
		evs = append(evs, guestapi.Event{Type: guestapi.EventExit, Pid: p.pid, Result: &r})
	}
	return evs
}
