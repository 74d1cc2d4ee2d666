// Package proc is the guest's process table: it starts processes in their own process groups (or sessions, on a pseudo-terminal), feeds their input, reaps every child (the guest is PID 1), keeps bounded output for replay, and enforces timeouts.
package proc

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Output bounds, per stream of one process.
const (
	DefaultMaxOutput = 4 << 20
	MaxOutput        = 64 << 20
)

// DefaultPath is the PATH a process gets when its spec sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

const (
	// exitGrace is how long output is still read once a process has exited.
	// A background child that inherited the pipes may hold them open forever;
	// after the grace the readers stop, the pipes are closed (such a child
	// then gets EPIPE) and the process is finished.
	exitGrace = 100 * time.Millisecond
	// maxFinished bounds the finished processes kept for later reads; the
	// oldest is forgotten first.
	maxFinished = 1024
	// maxFinishedBytes bounds the output those finished processes keep, so
	// that many chatty background processes cannot grow the guest without
	// limit (one process's two streams always fit).
	maxFinishedBytes = 512 << 20
	// closeWait bounds how long Close waits for killed processes.
	closeWait = 5 * time.Second
)

// Defaults fill what a spec leaves out.
type Defaults struct {
	Hostname string // HOSTNAME for processes
	Path     string // PATH for processes; DefaultPath when empty
}

// Table owns the processes the guest started. Its methods are safe for
// concurrent use.
type Table struct {
	log      *slog.Logger
	defaults Defaults
	// Caps on finished entries; fields so tests can lower them.
	maxFinished      int
	maxFinishedBytes int64

	// mu is held across fork+register in Start and across wait4+lookup in
	// reap, so a child that exits at once is never reaped before it is known.
	mu      sync.Mutex
	procs   map[int]*Process // by pid, running and finished, until removed
	waiting map[int]*Process // started and not reaped yet
	// finished lists finished entries of procs, oldest first.
	finished      []*Process
	finishedBytes int64
	exits         exitLog       // background processes' exits, for the exits stream
	live          int           // runner goroutines not finished yet
	ended         chan struct{} // poked (never closed) each time a runner finishes
	closed        bool
}

// NewTable returns an empty table. Run must be running for processes to end.
func NewTable(log *slog.Logger, defaults Defaults) *Table {
	if defaults.Path == "" {
		defaults.Path = DefaultPath
	}
	return &Table{
		log: log, defaults: defaults,
		maxFinished: maxFinished, maxFinishedBytes: maxFinishedBytes,
		procs: map[int]*Process{}, waiting: map[int]*Process{}, ended: make(chan struct{}, 1),
	}
}

// Run is the reaper: until ctx ends it waits for SIGCHLD and reaps every
// exited child. The statuses of processes the table started go to them;
// other children (orphans re-parented to the guest as PID 1 or subreaper)
// are just reaped.
func (t *Table) Run(ctx context.Context) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	defer signal.Stop(sig)
	// SIGCHLDs coalesce, but one pending in sig always means another full
	// reap, so none is lost; the ticker only guards against the unforeseen.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		t.reap()
		select {
		case <-ctx.Done():
			return nil
		case <-sig:
		case <-tick.C:
		}
	}
}

// reap collects every child that has exited, without blocking.
func (t *Table) reap() {
	for {
		var ws unix.WaitStatus
		t.mu.Lock()
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			t.mu.Unlock()
			continue
		}
		if err != nil || pid <= 0 { // ECHILD: no children; 0: none exited
			t.mu.Unlock()
			return
		}
		p := t.waiting[pid]
		delete(t.waiting, pid)
		t.mu.Unlock()
		if p != nil {
			p.exit <- ws // buffered: exactly one status per process
		}
	}
}

// Close kills the process groups of every unfinished process, refuses new
// ones, and waits (a few seconds at most) until they are finished. It reaps
// by itself, so it works whether or not Run is still running.
func (t *Table) Close() {
	t.mu.Lock()
	t.closed = true
	for pid, p := range t.procs {
		if p.Running() {
			unix.Kill(-pid, unix.SIGKILL)
		}
	}
	t.mu.Unlock()
	// Wait for a child to exit (to reap it) or a runner to finish, whichever
	// comes; a SIGCHLD that came before this registered is reaped below.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	defer signal.Stop(sig)
	timeout := time.NewTimer(closeWait)
	defer timeout.Stop()
	for {
		t.reap()
		t.mu.Lock()
		live := t.live
		t.mu.Unlock()
		if live == 0 {
			return
		}
		select {
		case <-sig:
		case <-t.ended:
		case <-timeout.C:
			t.log.Warn("processes still running after close", "count", live)
			return
		}
	}
}

// Get returns a process by pid.
func (t *Table) Get(pid int) (*Process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "process %d not found", pid)
	}
	return p, nil
}

// List describes every process in the table, by pid. Finished processes
// carry their Result without output (read one process for its output).
func (t *Table) List() []guestapi.ProcessInfo {
	t.mu.Lock()
	ps := make([]*Process, 0, len(t.procs))
	for _, p := range t.procs {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	slices.SortFunc(ps, func(a, b *Process) int { return a.pid - b.pid })
	out := make([]guestapi.ProcessInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info(false))
	}
	return out
}

// Remove forgets a finished process; a running one is a conflict.
func (t *Table) Remove(pid int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok {
		return errdefs.New(errdefs.NotFound, "process %d not found", pid)
	}
	if p.Running() {
		return errdefs.New(errdefs.Conflict, "process %d is still running; signal it first", pid)
	}
	t.forgetLocked(p)
	return nil
}

// Forget removes p from the table if it is still the entry for its pid,
// running or not. It is for a caller that owns p, such as an exec stream:
// unlike Remove by pid, it cannot hit a later process that reused the pid.
func (t *Table) Forget(p *Process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[p.pid] == p {
		t.forgetLocked(p)
	}
}

// Signal sends sig to the process group of a running process.
func (t *Table) Signal(pid int, sig syscall.Signal) error {
	p, err := t.Get(pid)
	if err != nil {
		return err
	}
	return p.Signal(sig)
}

// register records a process that was just forked; t.mu is held.
func (t *Table) registerLocked(p *Process) {
	if old := t.procs[p.pid]; old != nil {
		// The pid was reused: the old entry has been reaped, so it is
		// finished or about to be; the new process takes the pid over.
		t.forgetLocked(old)
	}
	t.procs[p.pid] = p
	t.waiting[p.pid] = p
	t.live++
}

// forgetLocked drops p's entry; t.mu is held and t.procs[p.pid] == p.
func (t *Table) forgetLocked(p *Process) {
	delete(t.procs, p.pid)
	if i := slices.Index(t.finished, p); i >= 0 {
		t.finished = slices.Delete(t.finished, i, i+1)
		t.finishedBytes -= p.keptBytes()
	}
}

// finish records that p's runner is done: p joins the finished entries, and
// the oldest beyond the caps are forgotten.
func (t *Table) finish(p *Process) {
	kept := p.keptBytes()
	var r guestapi.Result
	if p.background {
		r = p.outcome(false)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.live--
	select {
	case t.ended <- struct{}{}:
	default:
	}
	if p.background {
		t.addExitLocked(r)
	}
	if t.procs[p.pid] != p {
		return // forgotten already, or its pid was reused
	}
	t.finished = append(t.finished, p)
	t.finishedBytes += kept
	for len(t.finished) > t.maxFinished || (t.finishedBytes > t.maxFinishedBytes && len(t.finished) > 1) {
		t.forgetLocked(t.finished[0])
	}
}
