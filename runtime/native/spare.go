package native

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/cgroup"
	"github.com/berthsh/berth/runtime"
)

// A cold create spends most of its time before the guest can read its
// bootstrap: the fork of the daemon for the user namespace's clone (2.5–3.5
// ms on the bench VM), the guest's Go runtime start (0.5–1 ms) and its
// bounding set's drops (1–1.5 ms). None of that depends on the sandbox, only
// on its id (the cgroup's name) and its id range (the user namespace's
// owner and map), which the manager can give in advance. A spare is a guest
// started that far for a sandbox id and range given ahead: a Create of that
// id boots on it. It waits in its bootstrap's recvmsg with nothing inside,
// and ends when its socket closes, so a daemon that dies takes its spares
// along (the start of the next clears their cgroups).

// guestProc is a started guest that waits for its bootstrap.
type guestProc struct {
	pid      int
	pidfd    *os.File // names the guest for good, unlike pid once it exits
	cg       cgroup.Group
	bootSock *os.File
	statusR  *os.File
	exited   <-chan struct{} // closed once the guest exits
	spare    bool            // started ahead as a spare
}

// spawn creates cgroup id (with limits, unless nil) and has the spawner
// start a guest in it, in new namespaces whose user namespace maps and is
// owned by users' range, with its log at logPath. On error nothing is left.
func (r *Runtime) spawn(id string, users runtime.IDMap, logPath string, limits *cgroup.Limits) (_ *guestProc, err error) {
	cg, err := r.Cgroups.Create(id)
	if err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	defer func() {
		if err != nil {
			if kerr := cg.Kill(); kerr != nil { // a guest started whose reply was lost
				err = errors.Join(err, kerr)
			}
			if rerr := cg.Remove(); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if limits != nil {
		if err := cg.Set(*limits); err != nil {
			return nil, fmt.Errorf("apply limits: %w", err)
		}
	}
	entry, err := cg.Entry()
	if err != nil {
		return nil, fmt.Errorf("start guest: %w", err)
	}
	defer entry.Close()
	req, files, bootSock, statusR, err := r.guestRequest(logPath, users)
	if err != nil {
		return nil, err
	}
	files.Cgroup = entry
	pid, pidfd, err := r.spawner.Start(req, files)
	files.Output.Close()
	for _, f := range files.Extra {
		f.Close()
	}
	if err != nil {
		bootSock.Close()
		statusR.Close()
		return nil, fmt.Errorf("start guest: %w", err)
	}
	watched, err := unix.FcntlInt(pidfd.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.PidfdSendSignal(int(pidfd.Fd()), unix.SIGKILL, nil, 0)
		pidfd.Close()
		bootSock.Close()
		statusR.Close()
		return nil, fmt.Errorf("start guest: %w", err)
	}
	// The guest outlives the daemon: Close ends the watch, not the guest.
	exited := r.watcher.WatchPidfd(watched)
	return &guestProc{pid: pid, pidfd: pidfd, cg: cg, bootSock: bootSock, statusR: statusR, exited: exited}, nil
}

// exitedWithin says whether the guest exits within d (it may be on its
// way out: a killed process loses its namespaces before its pidfd says it
// exited).
func (g *guestProc) exitedWithin(d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(g.pidfd.Fd()), Events: unix.POLLIN}}
	for deadline := time.Now().Add(d); ; {
		n, err := unix.Poll(fds, max(int(time.Until(deadline).Milliseconds())+1, 0)) // never -1, which waits for ever
		if n > 0 {
			return true
		}
		if !errors.Is(err, unix.EINTR) || time.Now().After(deadline) {
			return false
		}
	}
}

// alive fails once the guest has exited. Checked after a use of its pid
// (/proc/PID/…): its pid could name another process only after it exited.
func (g *guestProc) alive() error {
	fds := []unix.PollFd{{Fd: int32(g.pidfd.Fd()), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, 0); n > 0 {
		return errors.New("guest exited during set-up")
	}
	return nil
}

// end kills the guest and everything in its cgroup, waits (up to 5 s) for
// it to exit, and removes the cgroup.
func (g *guestProc) end(log *slog.Logger, id string) {
	if err := g.cg.Kill(); err != nil {
		log.Error("end guest: kill its cgroup", "sandbox", id, "err", err)
	}
	unix.PidfdSendSignal(int(g.pidfd.Fd()), unix.SIGKILL, nil, 0)
	g.exitedWithin(5 * time.Second)
	if err := g.cg.Remove(); err != nil {
		log.Error("end guest: remove its cgroup", "sandbox", id, "err", err)
	}
	g.pidfd.Close()
	g.bootSock.Close()
	g.statusR.Close()
}

// spareGuest is a spare: a guest started for sandbox id and id map users.
type spareGuest struct {
	*guestProc
	id      string
	users   runtime.IDMap
	takenCh chan struct{} // closed when TakeSpare hands it out
}

// spareSet is the runtime's spares: ready ones, and those handed out whose
// Create has not come yet.
type spareSet struct {
	mu    sync.Mutex
	ready map[string]*spareGuest
	taken map[string]*spareGuest
	wake  chan struct{} // a spare was handed out: start another
	died  chan struct{} // a ready spare died: start another, later
}

func newSpareSet() *spareSet {
	return &spareSet{ready: map[string]*spareGuest{}, taken: map[string]*spareGuest{},
		wake: make(chan struct{}, 1), died: make(chan struct{}, 1)}
}

// poke sends on ch unless a send is pending.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// spareDir holds the logs of spares not yet handed to a sandbox; its names
// are the spares' ids, which New reads to clear what a dead daemon left.
func (r *Runtime) spareDir() string { return filepath.Join(r.cfg.StateDir, "spares") }

func (r *Runtime) spareLog(id string) string { return filepath.Join(r.spareDir(), id+".log") }

// KeepSpares implements runtime.Spares. Spares that fail to start or die
// unused are started again after a pause that doubles each time (up to 30
// s) until one is handed out.
func (r *Runtime) KeepSpares(ctx context.Context, n int, reserve func() (string, runtime.IDMap, error), release func(string)) {
	var watchers sync.WaitGroup
	defer watchers.Wait()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var backoff time.Duration
	var notBefore time.Time
	fail := func(err error) {
		backoff = min(max(2*backoff, 100*time.Millisecond), 30*time.Second)
		notBefore = time.Now().Add(backoff)
		r.log.Warn("spare guests", "err", err, "retry_in", backoff)
	}
	for {
		for ctx.Err() == nil && !time.Now().Before(notBefore) && r.ReadySpares() < n {
			sp, err := r.startSpare(reserve, release)
			if err != nil {
				fail(fmt.Errorf("start one: %w", err))
				break
			}
			watchers.Add(1)
			go func() {
				defer watchers.Done()
				r.watchSpare(ctx, sp, release)
			}()
		}
		var retryC <-chan time.Time
		if d := time.Until(notBefore); d > 0 {
			retry.Reset(d)
			retryC = retry.C
		}
		select {
		case <-ctx.Done():
			r.endSpares(release)
			return
		case <-r.spares.wake: // one was handed out: they work
			backoff = 0
		case <-r.spares.died:
			fail(errors.New("one ended unused"))
		case <-retryC:
		}
	}
}

// ReadySpares implements runtime.Spares.
func (r *Runtime) ReadySpares() int {
	r.spares.mu.Lock()
	defer r.spares.mu.Unlock()
	return len(r.spares.ready)
}

// startSpare reserves an id and range and starts a spare for them.
func (r *Runtime) startSpare(reserve func() (string, runtime.IDMap, error), release func(string)) (*spareGuest, error) {
	id, users, err := reserve()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.spareDir(), 0o700); err != nil {
		release(id)
		return nil, err
	}
	g, err := r.spawn(id, users, r.spareLog(id), nil)
	if err != nil {
		os.Remove(r.spareLog(id))
		release(id)
		return nil, err
	}
	g.spare = true
	sp := &spareGuest{guestProc: g, id: id, users: users, takenCh: make(chan struct{})}
	r.spares.mu.Lock()
	r.spares.ready[id] = sp
	r.spares.mu.Unlock()
	return sp, nil
}

// watchSpare ends a ready spare that dies (its range goes back), until it
// is handed out or ctx ends (then KeepSpares ends it).
func (r *Runtime) watchSpare(ctx context.Context, sp *spareGuest, release func(string)) {
	select {
	case <-sp.exited:
	case <-sp.takenCh:
		return
	case <-ctx.Done():
		return
	}
	r.spares.mu.Lock()
	_, mine := r.spares.ready[sp.id]
	delete(r.spares.ready, sp.id)
	r.spares.mu.Unlock()
	if !mine {
		return // handed out meanwhile: Create finds it dead and starts anew
	}
	r.log.Warn("a spare guest ended unused", "sandbox", sp.id, "log", tailLog(r.spareLog(sp.id)))
	r.endSpare(sp, release)
	poke(r.spares.died)
}

func (r *Runtime) endSpare(sp *spareGuest, release func(string)) {
	sp.end(r.log, sp.id)
	os.Remove(r.spareLog(sp.id))
	if release != nil {
		release(sp.id)
	}
}

// endSpares ends the ready spares and gives their ranges back.
func (r *Runtime) endSpares(release func(string)) {
	r.spares.mu.Lock()
	all := r.spares.ready
	r.spares.ready = map[string]*spareGuest{}
	r.spares.mu.Unlock()
	for _, sp := range all {
		r.endSpare(sp, release)
	}
}

// TakeSpare implements runtime.Spares.
func (r *Runtime) TakeSpare() (string, bool) {
	r.spares.mu.Lock()
	defer r.spares.mu.Unlock()
	for id, sp := range r.spares.ready {
		delete(r.spares.ready, id)
		r.spares.taken[id] = sp
		close(sp.takenCh)
		poke(r.spares.wake)
		return id, true
	}
	return "", false
}

// DiscardSpare implements runtime.Spares.
func (r *Runtime) DiscardSpare(id string) {
	r.spares.mu.Lock()
	sp := r.spares.taken[id]
	delete(r.spares.taken, id)
	r.spares.mu.Unlock()
	if sp != nil {
		r.endSpare(sp, nil) // the id's range is the caller's
	}
}

// claimSpare returns the guest of the spare handed out for sandbox id, if
// it is alive and was started for users; else nil, having ended it.
func (r *Runtime) claimSpare(id string, users runtime.IDMap) *guestProc {
	r.spares.mu.Lock()
	sp := r.spares.taken[id]
	delete(r.spares.taken, id)
	r.spares.mu.Unlock()
	if sp == nil {
		return nil
	}
	select {
	case <-sp.exited:
		r.log.Warn("the spare guest handed out died; starting a new one", "sandbox", id, "log", tailLog(r.spareLog(id)))
		r.endSpare(sp, nil)
		return nil
	default:
	}
	if sp.users != users {
		r.log.Error("a spare guest was handed out for another id range; starting a new one", "sandbox", id)
		r.endSpare(sp, nil)
		return nil
	}
	return sp.guestProc
}

// clearSpares removes what spares of an earlier daemon left: their cgroups
// (they ended with their sockets) and logs. A spare handed to a sandbox
// had its log moved into the sandbox's directory, so it is not among them.
func (r *Runtime) clearSpares() error {
	entries, err := os.ReadDir(r.spareDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok {
			continue
		}
		if cg, err := r.Cgroups.Load(id); err == nil {
			if err := cg.Kill(); err != nil {
				return fmt.Errorf("clear spare %s: %w", id, err)
			}
			if err := cg.Remove(); err != nil {
				return fmt.Errorf("clear spare %s: %w", id, err)
			}
		}
		if err := os.Remove(filepath.Join(r.spareDir(), e.Name())); err != nil {
			return fmt.Errorf("clear spare %s: %w", id, err)
		}
	}
	return nil
}
