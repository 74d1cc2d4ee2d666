// Package seccomp builds and installs berth's seccomp filter: a documented
// deny-list that makes syscalls reaching the host kernel's shared state fail
// with an errno, while every ordinary program keeps working.
package seccomp

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Rule refuses one syscall. When ArgFlags is non-zero the syscall is refused
// only if the low 32 bits of argument ArgIndex share a bit with ArgFlags.
type Rule struct {
	Syscall  string
	Errno    syscall.Errno
	ArgIndex int
	ArgFlags uint32
	Reason   string
}

// Profile is an ordered list of rules; anything not refused is allowed.
type Profile struct{ rules []Rule }

// Rules returns the profile's rules, for documentation.
func (p Profile) Rules() []Rule { return append([]Rule(nil), p.rules...) }

func deny(reason string, errno syscall.Errno, names ...string) []Rule {
	out := make([]Rule, len(names))
	for i, n := range names {
		out[i] = Rule{Syscall: n, Errno: errno, Reason: reason}
	}
	return out
}

// Default is berth's profile for the native runtime.
func Default() Profile {
	var r []Rule
	r = append(r, deny("mounting is the host kernel's business; the sandbox's mounts are made before the filter", unix.EPERM,
		"mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr")...)
	r = append(r, deny("loading code into the kernel", unix.EPERM,
		"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf")...)
	r = append(r, deny("kernel observability leaks other tenants' activity", unix.EPERM, "perf_event_open", "syslog", "lookup_dcookie")...)
	r = append(r, deny("the kernel keyring is not namespaced", unix.EPERM, "keyctl", "add_key", "request_key")...)
	r = append(r, deny("userfaultfd widens kernel race windows used by exploits", unix.EPERM, "userfaultfd")...)
	r = append(r, deny("reading or steering other processes' memory (the guest's above all)", unix.EPERM,
		"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd")...)
	r = append(r, deny("file handles bypass path-based confinement", unix.EPERM, "open_by_handle_at", "name_to_handle_at")...)
	r = append(r, deny("host-wide settings: swap, reboot, accounting, clocks, quotas", unix.EPERM,
		"swapon", "swapoff", "reboot", "acct", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "quotactl", "nfsservctl")...)
	r = append(r, deny("joining other namespaces", unix.EPERM, "setns")...)
	r = append(r, deny("raw I/O port access", unix.EPERM, "iopl", "ioperm")...)
	r = append(r, Rule{Syscall: "clone3", Errno: unix.ENOSYS,
		Reason: "clone3 passes its flags in memory a filter cannot read; ENOSYS makes libc fall back to clone, whose flags are checked"})
	r = append(r, Rule{Syscall: "unshare", Errno: unix.EPERM, ArgIndex: 0, ArgFlags: unix.CLONE_NEWUSER,
		Reason: "a new user namespace re-grants every capability and exposes much more kernel surface"})
	r = append(r, Rule{Syscall: "clone", Errno: unix.EPERM, ArgIndex: 0, ArgFlags: unix.CLONE_NEWUSER,
		Reason: "a new user namespace re-grants every capability and exposes much more kernel surface"})
	return Profile{rules: r}
}

// Classic BPF opcodes and seccomp return values.
const (
	ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeqK = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	retK = unix.BPF_RET | unix.BPF_K

	retAllow       = unix.SECCOMP_RET_ALLOW
	retKillProcess = unix.SECCOMP_RET_KILL_PROCESS
	retErrno       = unix.SECCOMP_RET_ERRNO

	offNr   = 0
	offArch = 4
	offArgs = 16 // args[i] at 16+8*i; the low 32 bits first (little-endian)
)

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf}
}

// Assemble compiles the profile for this build's architecture. Syscalls the
// architecture does not have are skipped.
func (p Profile) Assemble() ([]unix.SockFilter, error) {
	prog := []unix.SockFilter{
		stmt(ldW, offArch),
		jump(jeqK, auditArch, 1, 0),
		stmt(retK, retKillProcess), // a foreign ABI could reach syscalls by other numbers
		stmt(ldW, offNr),
	}
	prog = append(prog, archPrologue()...)
	var argRules []Rule
	for _, r := range p.rules {
		nr, ok := syscallNumbers[r.Syscall]
		if !ok {
			if _, known := knownMissing[r.Syscall]; known {
				continue
			}
			return nil, fmt.Errorf("seccomp: unknown syscall %q on this architecture", r.Syscall)
		}
		if r.ArgFlags != 0 {
			argRules = append(argRules, r)
			continue
		}
		prog = append(prog, jump(jeqK, uint32(nr), 0, 1), stmt(retK, retErrno|uint32(r.Errno)))
	}
	for _, r := range argRules {
		nr := syscallNumbers[r.Syscall]
		prog = append(prog,
			jump(jeqK, uint32(nr), 0, 4),
			stmt(ldW, uint32(offArgs+8*r.ArgIndex)),
			jump(jset, r.ArgFlags, 0, 1),
			stmt(retK, retErrno|uint32(r.Errno)),
			stmt(ldW, offNr),
		)
	}
	prog = append(prog, stmt(retK, retAllow))
	return prog, nil
}

// Install sets no_new_privs and installs prog on every thread of the process.
func Install(prog []unix.SockFilter) error {
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		return fmt.Errorf("set no_new_privs: %w", e)
	}
	fprog := &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, e := syscall.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(fprog)))
	if e != 0 {
		return fmt.Errorf("seccomp(SET_MODE_FILTER, TSYNC): %w", e)
	}
	return nil
}
