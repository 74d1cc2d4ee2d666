//go:build !amd64 && !arm64

package seccomp

import "golang.org/x/sys/unix"

// auditArch is unused where there is no syscall table.
const auditArch = 0

func abiPrologue() []unix.SockFilter { return nil }

// syscallTable is nil: berth's filter is written for amd64 and arm64 only,
// and Assemble refuses other architectures rather than guess their numbers.
func syscallTable() map[string]int { return nil }
