// Package fds keeps descriptors from leaking into child processes: a process
// inherits whatever its parent left open, and Go passes non-close-on-exec
// descriptors on to every child it starts.
package fds

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseOnExecFrom marks every descriptor >= from close-on-exec.
func CloseOnExecFrom(from int) error {
	if err := unix.CloseRange(uint(from), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	// Kernels before 5.11: walk the descriptor table.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < from {
			continue
		}
		unix.CloseOnExec(fd)
	}
	return nil
}
