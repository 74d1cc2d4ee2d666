// Package capability limits the Linux capabilities of the calling process, on every OS thread, to the set a normal root in a container keeps.
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

// Cap is a capability number, as in unix.CAP_CHOWN.
type Cap int

// Default is what root inside a sandbox keeps: owning and changing files,
// switching users and groups, signalling its own processes, binding ports
// below 1024, chroot, file capabilities, audit messages and mknod (which a
// user namespace makes useless for device nodes). It leaves out NET_RAW
// (raw and packet sockets), SYS_ADMIN, SYS_PTRACE, SYS_MODULE, NET_ADMIN
// and every other capability that reaches the kernel or other processes.
func Default() []Cap {
	return []Cap{
		unix.CAP_CHOWN,
		unix.CAP_DAC_OVERRIDE,
		unix.CAP_FOWNER,
		unix.CAP_FSETID,
		unix.CAP_KILL,
		unix.CAP_SETGID,
		unix.CAP_SETUID,
		unix.CAP_SETPCAP,
		unix.CAP_NET_BIND_SERVICE,
		unix.CAP_SYS_CHROOT,
		unix.CAP_SETFCAP,
		unix.CAP_AUDIT_WRITE,
		unix.CAP_MKNOD,
	}
}

// Name returns the capability's name without the CAP_ prefix ("SYS_ADMIN"),
// or "cap(N)" for a number this package does not know.
func Name(c Cap) string {
	names := [...]string{
		unix.CAP_CHOWN:              "CHOWN",
		unix.CAP_DAC_OVERRIDE:       "DAC_OVERRIDE",
		unix.CAP_DAC_READ_SEARCH:    "DAC_READ_SEARCH",
		unix.CAP_FOWNER:             "FOWNER",
		unix.CAP_FSETID:             "FSETID",
		unix.CAP_KILL:               "KILL",
		unix.CAP_SETGID:             "SETGID",
		unix.CAP_SETUID:             "SETUID",
		unix.CAP_SETPCAP:            "SETPCAP",
		unix.CAP_LINUX_IMMUTABLE:    "LINUX_IMMUTABLE",
		unix.CAP_NET_BIND_SERVICE:   "NET_BIND_SERVICE",
		unix.CAP_NET_BROADCAST:      "NET_BROADCAST",
		unix.CAP_NET_ADMIN:          "NET_ADMIN",
		unix.CAP_NET_RAW:            "NET_RAW",
		unix.CAP_IPC_LOCK:           "IPC_LOCK",
		unix.CAP_IPC_OWNER:          "IPC_OWNER",
		unix.CAP_SYS_MODULE:         "SYS_MODULE",
		unix.CAP_SYS_RAWIO:          "SYS_RAWIO",
		unix.CAP_SYS_CHROOT:         "SYS_CHROOT",
		unix.CAP_SYS_PTRACE:         "SYS_PTRACE",
		unix.CAP_SYS_PACCT:          "SYS_PACCT",
		unix.CAP_SYS_ADMIN:          "SYS_ADMIN",
		unix.CAP_SYS_BOOT:           "SYS_BOOT",
		unix.CAP_SYS_NICE:           "SYS_NICE",
		unix.CAP_SYS_RESOURCE:       "SYS_RESOURCE",
		unix.CAP_SYS_TIME:           "SYS_TIME",
		unix.CAP_SYS_TTY_CONFIG:     "SYS_TTY_CONFIG",
		unix.CAP_MKNOD:              "MKNOD",
		unix.CAP_LEASE:              "LEASE",
		unix.CAP_AUDIT_WRITE:        "AUDIT_WRITE",
		unix.CAP_AUDIT_CONTROL:      "AUDIT_CONTROL",
		unix.CAP_SETFCAP:            "SETFCAP",
		unix.CAP_MAC_OVERRIDE:       "MAC_OVERRIDE",
		unix.CAP_MAC_ADMIN:          "MAC_ADMIN",
		unix.CAP_SYSLOG:             "SYSLOG",
		unix.CAP_WAKE_ALARM:         "WAKE_ALARM",
		unix.CAP_BLOCK_SUSPEND:      "BLOCK_SUSPEND",
		unix.CAP_AUDIT_READ:         "AUDIT_READ",
		unix.CAP_PERFMON:            "PERFMON",
		unix.CAP_BPF:                "BPF",
		unix.CAP_CHECKPOINT_RESTORE: "CHECKPOINT_RESTORE",
	}
	if c >= 0 && int(c) < len(names) {
		return names[c]
	}
	return "cap(" + strconv.Itoa(int(c)) + ")"
}

// mask returns the capability sets' bit mask for caps, or an error for a
// number outside 0 to last.
func mask(caps []Cap, last int) (uint64, error) {
	var m uint64
	for _, c := range caps {
		if c < 0 || int(c) > last || c > 63 {
			return 0, fmt.Errorf("capability %s is not known to this kernel (last is %d)", Name(c), last)
		}
		m |= 1 << uint(c)
	}
	return m, nil
}

// lastCap reads the highest capability number the running kernel knows.
func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("parse cap_last_cap: %w", err)
	}
	return n, nil
}

// DropBounding drops every capability not in keep from the bounding set
// of every OS thread (the first part of Restrict).
func DropBounding(keep []Cap) error {
	m, last, err := Mask(keep)
	if err != nil {
		return err
	}
	return dropBounding(m, last)
}

// Mask returns keep as a bit mask (bit c for capability c), with the
// highest capability number the running kernel knows; a capability above
// it is an error.
func Mask(keep []Cap) (m uint64, last int, err error) {
	if last, err = lastCap(); err != nil {
		return 0, 0, fmt.Errorf("read the last capability: %w", err)
	}
	m, err = mask(keep, last)
	return m, last, err
}

// dropBounding drops from every thread's bounding set each capability up
// to last that m lacks, skipping those already gone (a drop stops every
// thread; Restrict after DropBounding has none left to make).
func dropBounding(m uint64, last int) error {
	for c := 0; c <= last && c < 64; c++ {
		if m&(1<<uint(c)) != 0 {
			continue
		}
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 0 {
			continue // dropped already, on every thread
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
			return fmt.Errorf("drop %s from the bounding set: %w", Name(Cap(c)), e)
		}
	}
	return nil
}

// Restrict limits every OS thread of the calling process to keep, so that
// every process it spawns afterwards inherits the limit. On each thread it
// drops every other capability up to the kernel's last from the bounding
// set (PR_CAPBSET_DROP, which needs CAP_SETPCAP; those dropped already are
// skipped), then sets permitted and effective to keep and inheritable to
// nothing (capset, which Linux applies per thread, hence
// syscall.AllThreadsSyscall). The kernel keeps no capability ambient that
// is not both permitted and inheritable, so the empty inheritable set
// empties the ambient set too, on every thread, with no call of its own.
//
// Inheritable ends empty on purpose: root keeps keep across execve anyway
// (its file sets count as full, capped by the bounding set), while a
// non-empty inheritable set would let root's children keep more than the
// bounding set (root's permitted set after execve is its bounding set and
// its inheritable set together), and an unprivileged user in the sandbox
// gain capabilities from a program with file-inheritable capabilities
// (CVE-2022-24769, the reason Docker empties it too).
//
// Every capability in keep must be in the permitted set already. Restrict
// needs a binary built with CGO_ENABLED=0: AllThreadsSyscall refuses to
// run alongside cgo. A failure on the first thread changes nothing; the Go
// runtime aborts the process if a call succeeds on one thread and fails on
// another.
func Restrict(keep []Cap) error {
	m, last, err := Mask(keep)
	if err != nil {
		return err
	}
	if err := dropBounding(m, last); err != nil {
		return err
	}
	// Pid 0 in the header means the calling thread, on each thread.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(m), Permitted: uint32(m)},
		{Effective: uint32(m >> 32), Permitted: uint32(m >> 32)},
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET,
		uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("set permitted and effective capabilities: %w", e)
	}
	return nil
}

// Effective reports whether the calling thread has c in its effective set.
func Effective(c Cap) (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capget: %w", err)
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0, nil
}
