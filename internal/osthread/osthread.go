// Package osthread runs work on an OS thread that ends with it, for what
// changes a thread alone (its cgroups, its credentials) and must never
// reach another goroutine.
package osthread

import (
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Discarded runs fn on a locked OS thread that ends when fn returns (the
// goroutine exits without unlocking it), so that what fn changes about its
// thread never reaches another goroutine. The Go runtime cannot end the
// main thread: a goroutine that lands there holds it and runs fn on
// another. It returns the thread's id and fn's error.
func Discarded(fn func(tid int) error) (int, error) {
	res := make(chan result, 1)
	go run(fn, res)
	r := <-res
	return r.tid, r.err
}

type result struct {
	tid int
	err error
}

func run(fn func(tid int) error, res chan<- result) {
	runtime.LockOSThread()
	tid := unix.Gettid()
	if tid == unix.Getpid() {
		inner := make(chan result, 1)
		go run(fn, inner) // cannot run on this thread: it is ours
		r := <-inner
		runtime.UnlockOSThread()
		res <- r
		return
	}
	res <- result{tid, fn(tid)}
}

// SetIDs sets the calling thread's real and effective uid and gid to id,
// on this thread alone (raw system calls: the syscall package's Setresuid
// changes every thread of the process), and keeps its capabilities: the
// saved ids stay, so the permitted set does, and the effective set, which
// a change of effective uid from 0 clears, is raised to it again. Only on
// a thread that Discarded runs.
//
// A thread so changed forks children (and creates user namespaces) as id,
// and may act on a process whose ids are all id (prlimit) without
// CAP_SYS_RESOURCE, while keeping what its capabilities allow.
func SetIDs(id uint32) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(id), uintptr(id), ^uintptr(0)); e != 0 {
		return fmt.Errorf("thread: set gid %d: %w", id, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(id), uintptr(id), ^uintptr(0)); e != 0 {
		return fmt.Errorf("thread: set uid %d: %w", id, e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("thread: capget: %w", err)
	}
	data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("thread: capset: %w", err)
	}
	return nil
}

// WaitGone waits (up to a second) until thread tid of this process has
// exited, as a thread Discarded ran does soon after fn returns.
func WaitGone(tid int) {
	pid := unix.Getpid()
	deadline := time.Now().Add(time.Second)
	for i := 0; unix.Tgkill(pid, tid, 0) == nil && time.Now().Before(deadline); i++ {
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}
