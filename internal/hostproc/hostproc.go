// Package hostproc names host processes across daemon restarts (a pid with
// its start time, which a reused pid does not share) and waits for them.
package hostproc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// OpenPidfd opens a pidfd of pid if it is still the process that started at
// start; -1 if that process is gone (a pid reused since is not it).
func OpenPidfd(pid int, start uint64) (int, error) {
	if !Alive(pid, start) {
		return -1, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("pidfd_open: %w", err)
	}
	// Checked again now that the pidfd pins the process.
	if !Alive(pid, start) {
		unix.Close(fd)
		return -1, nil
	}
	return fd, nil
}

// WaitExit waits until the process that started at start is gone (it has
// exited: a zombie counts as gone), at most timeout.
func WaitExit(pid int, start uint64, timeout time.Duration) error {
	fd, err := OpenPidfd(pid, start)
	if err != nil || fd < 0 {
		return err
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(timeout)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("still running %s after SIGKILL", timeout)
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll pidfd: %w", err)
		}
		if n > 0 {
			return nil
		}
	}
}

// Alive reports whether pid is still the process that started at start
// (a zombie counts as gone).
func Alive(pid int, start uint64) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	st, s, ok := parseStat(string(b))
	return ok && st == start && s != "Z" && s != "X"
}

// StartTime is pid's start time, in clock ticks since boot (/proc/<pid>/stat
// field 22): with the pid, it names one process for good.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	st, _, ok := parseStat(string(b))
	if !ok {
		return 0, fmt.Errorf("cannot parse /proc/%d/stat", pid)
	}
	return st, nil
}

// parseStat returns the start time (field 22) and state (field 3) of a
// /proc/<pid>/stat line. The command name may hold spaces and parentheses,
// so fields are counted after the last ')'.
func parseStat(s string) (start uint64, state string, ok bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, "", false
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	return start, f[0], err == nil
}

// Watcher reports the exits of processes that are not the caller's
// children (a sandbox that outlived the daemon that started it), each by a
// goroutine it owns until the process exits or the Watcher is closed.
type Watcher struct {
	closing int // an eventfd that Close makes readable
	wg      sync.WaitGroup
}

// NewWatcher returns a Watcher.
func NewWatcher() (*Watcher, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &Watcher{closing: fd}, nil
}

// Watch returns a channel closed when the process pid that started at
// start exits; ok is false when it is gone already.
func (w *Watcher) Watch(pid int, start uint64) (exited <-chan struct{}, ok bool, err error) {
	pidfd, err := OpenPidfd(pid, start)
	if err != nil || pidfd < 0 {
		return nil, false, err
	}
	return w.WatchPidfd(pidfd), true, nil
}

// WatchPidfd returns a channel closed when the process pidfd refers to
// exits. The watch owns pidfd, and closes it when it ends.
func (w *Watcher) WatchPidfd(pidfd int) <-chan struct{} {
	ch := make(chan struct{})
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer unix.Close(pidfd)
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}, {Fd: int32(w.closing), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || fds[0].Revents != 0 {
				close(ch)
				return
			}
			if fds[1].Revents != 0 {
				return // closing; the process runs on
			}
		}
	}()
	return ch
}

// Close stops every watch (the processes run on) and waits for them.
func (w *Watcher) Close() error {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	if _, err := unix.Write(w.closing, one[:]); err != nil {
		return fmt.Errorf("wake watches: %w", err)
	}
	w.wg.Wait()
	return unix.Close(w.closing)
}
