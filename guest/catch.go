//go:build amd64 || arm64

package guest

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// catchers returns the addresses of catch.s's handler, which returns at
// once, and of the restorer its return goes through (amd64; 0 on arm64,
// where the kernel returns through its vDSO).
func catchers() (handler, restorer uintptr)

// catchSignal gives signal sig a handler that does nothing. The guest runs
// it for the signals Go leaves at their default (32 and 34), where root
// inside could end the guest with a kill: Linux spares a namespace's init
// a default action sent from inside, gVisor does not. Unlike SIG_IGN, a
// handler does not outlive an execve: the workload's processes start with
// the default. It runs on the thread's alternate signal stack, which Go
// gives every thread it makes, since a goroutine's stack has no room for
// the kernel's signal frame.
func catchSignal(sig unix.Signal) error {
	handler, restorer := catchers()
	act := sigaction{handler: handler, flags: saOnstack | saRestart, restorer: restorer}
	if restorer != 0 {
		act.flags |= saRestorer
	}
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
		return fmt.Errorf("catch signal %d: %w", sig, e)
	}
	return nil
}

// The kernel's sa_flags that x/sys/unix does not name.
const (
	saRestorer = 0x04000000
	saOnstack  = 0x08000000
	saRestart  = 0x10000000
)
