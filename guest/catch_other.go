//go:build !amd64 && !arm64

package guest

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// catchSignal sets sig to its default here (catch.go's handler is written
// for amd64 and arm64): Linux spares a namespace's init a default action
// sent from inside; gVisor's guest on these architectures is not spared.
func catchSignal(sig unix.Signal) error {
	dfl := sigaction{}
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0); e != 0 {
		return fmt.Errorf("reset signal %d: %w", sig, e)
	}
	return nil
}
