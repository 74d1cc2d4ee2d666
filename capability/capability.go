// Package capability reduces the Linux capabilities of the calling process,
// on every OS thread, to the set a normal root-in-a-container keeps.
package capability

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cap is a capability number (unix.CAP_*).
type Cap int

// Default is what root inside a sandbox keeps: enough to own files, switch
// users and bind low ports; not NET_RAW, SYS_ADMIN, SYS_PTRACE, SYS_MODULE
// and the rest that reach the kernel or other processes.
func Default() []Cap {
	return []Cap{
		unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_KILL,
		unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE,
		unix.CAP_SYS_CHROOT, unix.CAP_SETFCAP, unix.CAP_AUDIT_WRITE, unix.CAP_MKNOD,
	}
}

var names = map[Cap]string{
	unix.CAP_CHOWN: "CHOWN", unix.CAP_DAC_OVERRIDE: "DAC_OVERRIDE", unix.CAP_FOWNER: "FOWNER",
	unix.CAP_FSETID: "FSETID", unix.CAP_KILL: "KILL", unix.CAP_SETGID: "SETGID", unix.CAP_SETUID: "SETUID",
	unix.CAP_SETPCAP: "SETPCAP", unix.CAP_NET_BIND_SERVICE: "NET_BIND_SERVICE", unix.CAP_SYS_CHROOT: "SYS_CHROOT",
	unix.CAP_SETFCAP: "SETFCAP", unix.CAP_AUDIT_WRITE: "AUDIT_WRITE", unix.CAP_MKNOD: "MKNOD",
	unix.CAP_SYS_ADMIN: "SYS_ADMIN", unix.CAP_NET_RAW: "NET_RAW", unix.CAP_SYS_PTRACE: "SYS_PTRACE",
	unix.CAP_NET_ADMIN: "NET_ADMIN", unix.CAP_SYS_MODULE: "SYS_MODULE",
}

// Name returns the capability's name without the CAP_ prefix.
func Name(c Cap) string {
	if n, ok := names[c]; ok {
		return n
	}
	return "CAP_" + strconv.Itoa(int(c))
}

// Mask returns the bit mask of caps.
func Mask(caps []Cap) uint64 {
	var m uint64
	for _, c := range caps {
		m |= 1 << uint(c)
	}
	return m
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Restrict drops every capability not in keep from the bounding and ambient
// sets, sets permitted and effective to keep and clears inheritable, on all threads.
func Restrict(keep []Cap) error {
	last, err := lastCap()
	if err != nil {
		return fmt.Errorf("read cap_last_cap: %w", err)
	}
	mask := Mask(keep)
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		return fmt.Errorf("clear ambient capabilities: %w", e)
	}
	for c := 0; c <= last; c++ {
		if mask&(1<<uint(c)) != 0 {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 && e != unix.EINVAL {
			return fmt.Errorf("drop %s from the bounding set: %w", Name(Cap(c)), e)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	data[0].Permitted, data[1].Permitted = uint32(mask), uint32(mask>>32)
	data[0].Effective, data[1].Effective = uint32(mask), uint32(mask>>32)
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}
