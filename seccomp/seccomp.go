// Package seccomp builds and installs berth's seccomp filter, a documented deny-list that makes syscalls reaching shared kernel state fail with an errno while ordinary programs keep working.
package seccomp

import (
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Rule makes one syscall fail with an errno instead of running.
type Rule struct {
	// Syscall is the kernel's name for the call, as in unistd.h ("mount").
	Syscall string
	// Errno is what the caller gets back; the kernel's handler never runs.
	Errno syscall.Errno
	// Args narrow the rule to calls whose arguments match every one of
	// them. None refuses every call. A syscall may have several rules
	// when each has Args; the first that matches decides.
	Args []ArgMatch
	// Reason says in one sentence why the call is refused.
	Reason string
}

// ArgMatch narrows a Rule to calls whose argument Index matches AnyOf,
// Except or Equal (exactly one of them is set).
//
// seccomp hands a filter every argument as a 64-bit word, but classic BPF
// compares 32 bits at a time, so ArgMatch looks at the low 32 bits only.
// That is exact for the arguments berth filters: clone's and unshare's flags
// are all in the low word (the kernel truncates clone's flags to 32 bits and
// unshare rejects unknown high bits with EINVAL), and personality's argument
// is an unsigned int the kernel truncates the same way.
type ArgMatch struct {
	// Index is the argument's position, 0 to 5.
	Index int
	// Name is the argument's name in the man page, for documentation.
	Name string
	// AnyOf refuses the call when the argument has any of these bits set.
	AnyOf uint32
	// Except refuses the call unless the argument equals one of these values.
	Except []uint32
	// Equal refuses the call when the argument equals one of these values.
	Equal []uint32
}

// kinds counts how many of AnyOf, Except and Equal are set.
func (m ArgMatch) kinds() int {
	n := 0
	for _, set := range []bool{m.AnyOf != 0, len(m.Except) > 0, len(m.Equal) > 0} {
		if set {
			n++
		}
	}
	return n
}

func hexList(vs []uint32) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprintf("%#x", v)
	}
	return strings.Join(out, ", ")
}

// String describes the match, for documentation.
func (m ArgMatch) String() string {
	switch {
	case m.AnyOf != 0:
		return fmt.Sprintf("%s (argument %d) has any bit of %#x set", m.Name, m.Index, m.AnyOf)
	case len(m.Except) > 0:
		return fmt.Sprintf("%s (argument %d) is not one of %s", m.Name, m.Index, hexList(m.Except))
	case len(m.Equal) > 0:
		return fmt.Sprintf("%s (argument %d) is one of %s", m.Name, m.Index, hexList(m.Equal))
	}
	return ""
}

// Condition describes, for documentation, which calls the rule refuses: ""
// when it refuses every call.
func (r Rule) Condition() string {
	if len(r.Args) == 0 {
		return ""
	}
	parts := make([]string, len(r.Args))
	for i, m := range r.Args {
		parts[i] = m.String()
	}
	return "when " + strings.Join(parts, " and ")
}

// Profile is a deny-list filter: the syscalls its rules name fail with the
// rule's errno, everything else is allowed.
type Profile struct{ rules []Rule }

// Rules returns a copy of the profile's rules in filter order, for
// documentation.
func (p Profile) Rules() []Rule {
	out := make([]Rule, len(p.rules))
	for i, r := range p.rules {
		args := make([]ArgMatch, len(r.Args))
		for j, m := range r.Args {
			m.Except = append([]uint32(nil), m.Except...)
			m.Equal = append([]uint32(nil), m.Equal...)
			args[j] = m
		}
		r.Args = args
		out[i] = r
	}
	return out
}

// Personality values a sandbox may set (see personality(2)); everything
// else, ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC above all, is refused.
const (
	perLinux        = 0x0000     // PER_LINUX, the default
	perLinux32      = 0x0008     // PER_LINUX32: uname reports a 32-bit machine
	perUname26      = 0x0020000  // UNAME26: uname reports a 2.6 kernel version
	perLinux32Uname = 0x0020008  // PER_LINUX32 | UNAME26
	perQuery        = 0xffffffff // reads the current persona, changes nothing
)

// Default is berth's profile for the sandbox init and everything it spawns.
// Its choices follow Docker's default profile for a container without
// CAP_SYS_ADMIN. Most of these calls would fail anyway once capabilities
// are dropped; refusing them here as well means a kernel bug in one
// capability check is not enough to reach them.
func Default() Profile {
	var rules []Rule
	deny := func(errno syscall.Errno, reason string, names ...string) {
		for _, n := range names {
			rules = append(rules, Rule{Syscall: n, Errno: errno, Reason: reason})
		}
	}

	// Mounting: the guest builds the sandbox's filesystem before the filter
	// goes on; afterwards nothing may rearrange it, and the filesystem
	// parsers behind these calls are a large kernel attack surface.
	deny(unix.EPERM, "mounting would rearrange the filesystem the guest built and reach filesystem code in the kernel",
		"mount", "umount2", "pivot_root", "move_mount", "open_tree",
		"fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr")

	// Code in the kernel: new kernels, modules and eBPF programs.
	deny(unix.EPERM, "loads code into the running kernel or replaces it",
		"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module")
	deny(unix.EPERM, "eBPF programs and maps run in the kernel, and its verifier is a frequent source of exploits",
		"bpf")

	// Observing the kernel and other tenants.
	deny(unix.EPERM, "performance counters observe the whole machine and have a long record of kernel bugs",
		"perf_event_open")
	deny(unix.EPERM, "reads the kernel log, which leaks addresses and other tenants' activity",
		"syslog")
	deny(unix.EPERM, "resolves kernel profiling cookies to paths outside the sandbox",
		"lookup_dcookie")

	// The key retention service is not namespaced.
	deny(unix.EPERM, "the kernel keyring is shared with the host and not namespaced",
		"keyctl", "add_key", "request_key")

	// userfaultfd lets a process stall a kernel copy at a page of its choice.
	deny(unix.EPERM, "lets a process pause the kernel mid-copy, widening race windows that exploits rely on",
		"userfaultfd")

	// Other processes' memory and descriptors, the guest's above all.
	deny(unix.EPERM, "reads or steers another process's memory or descriptors, the sandbox init's included",
		"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd")

	// File handles name inodes without a path.
	deny(unix.EPERM, "file handles open inodes by number, bypassing path-based confinement",
		"open_by_handle_at", "name_to_handle_at")

	// Machine-wide settings.
	deny(unix.EPERM, "changes machine-wide state: swap, reboot, process accounting, quotas or the NFS server",
		"swapon", "swapoff", "reboot", "acct", "quotactl", "nfsservctl")
	deny(unix.EPERM, "the system clock is shared with the host",
		"settimeofday", "clock_settime", "clock_adjtime", "adjtimex")

	// Namespaces.
	deny(unix.EPERM, "joins another namespace through a descriptor to it",
		"setns")

	// x86 port I/O (arm64 has no such calls; Assemble skips them there).
	deny(unix.EPERM, "gives direct access to hardware I/O ports",
		"iopl", "ioperm")

	// Execution domains.
	rules = append(rules, Rule{
		Syscall: "personality",
		Errno:   unix.EPERM,
		Args: []ArgMatch{{Index: 0, Name: "persona",
			Except: []uint32{perLinux, perLinux32, perUname26, perLinux32Uname, perQuery}}},
		Reason: "other personas turn off address-space randomisation or make readable memory executable; " +
			"PER_LINUX, PER_LINUX32, UNAME26 and the query stay allowed",
	})

	// New user namespaces. clone3 carries its flags in memory a filter cannot
	// read, so it fails with ENOSYS, as on a kernel older than 5.3: glibc,
	// musl and Go then fall back to clone, whose flags the next rule checks.
	// EPERM would not do: callers treat it as a real refusal and give up.
	rules = append(rules, Rule{
		Syscall: "clone3",
		Errno:   unix.ENOSYS,
		Reason:  "its flags live in memory a filter cannot read; ENOSYS makes libc fall back to clone, whose flags are checked",
	})
	for _, name := range []string{"clone", "unshare"} {
		// Both take their flags as argument 0 on amd64 and arm64 (s390x,
		// which swaps clone's first two arguments, is not supported).
		rules = append(rules, Rule{
			Syscall: name,
			Errno:   unix.EPERM,
			Args:    []ArgMatch{{Index: 0, Name: "flags", AnyOf: unix.CLONE_NEWUSER}},
			Reason: "CLONE_NEWUSER makes a user namespace in which the caller regains every capability, " +
				"exposing kernel code that is otherwise out of reach",
		})
	}

	// io_uring runs I/O on kernel threads on the process's behalf, outside
	// this filter, and has been a steady source of kernel exploits.
	// ENOSYS is what a kernel built without it answers: liburing, libuv and
	// the Go and Rust runtimes then fall back to ordinary syscalls.
	deny(unix.ENOSYS, "io_uring's operations run outside this filter and its code is a frequent exploit target; "+
		"ENOSYS makes programs fall back to ordinary syscalls",
		"io_uring_setup", "io_uring_enter", "io_uring_register")

	// Socket families: what programs in a sandbox use (unix sockets, IPv4,
	// IPv6 and routing netlink), nothing else. vsock is not namespaced (a
	// sandbox could take the host's ports); packet, bluetooth, alg, tipc,
	// rds, xdp and the rest are kernel attack surface no workload needs.
	// EAFNOSUPPORT is what a kernel without the family answers.
	rules = append(rules,
		Rule{Syscall: "socket", Errno: unix.EAFNOSUPPORT,
			Args: []ArgMatch{{Index: 0, Name: "domain", Except: []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}}},
			Reason: "only unix, IPv4, IPv6 and netlink sockets: vsock is not namespaced, and the other families " +
				"(packet, bluetooth, alg, tipc, rds, xdp, …) are kernel surface no workload needs"},
		Rule{Syscall: "socket", Errno: unix.EPROTONOSUPPORT,
			Args: []ArgMatch{{Index: 0, Name: "domain", Equal: []uint32{unix.AF_NETLINK}},
				{Index: 2, Name: "protocol", Except: []uint32{unix.NETLINK_ROUTE, unix.NETLINK_SOCK_DIAG, unix.NETLINK_AUDIT}}},
			Reason: "netlink only for routing (ip, ifconfig), socket diagnostics (ss) and audit (which the kernel refuses " +
				"from a user namespace anyway): not netfilter, xfrm, generic or uevents"},
		Rule{Syscall: "socketpair", Errno: unix.EAFNOSUPPORT,
			Args:   []ArgMatch{{Index: 0, Name: "domain", Except: []uint32{unix.AF_UNIX}}},
			Reason: "pairs of unix sockets only; no other family a sandbox may use makes pairs"},
	)
	return Profile{rules: rules}
}

// Classic BPF opcodes, and the layout of struct seccomp_data:
//
//	struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; };
const (
	opLoadWord = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	opJumpEq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	opJumpSet  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	opReturn   = unix.BPF_RET | unix.BPF_K

	offNr   = 0
	offArch = 4
	// offArgs is args[0]; args[i] is 8*i further on. amd64 and arm64 are
	// little-endian, so a word's low 32 bits come first.
	offArgs = 16
)

// absent marks, in an architecture's syscall table, a syscall that
// architecture never had.
const absent = -1

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

func retErrno(e syscall.Errno) unix.SockFilter {
	return stmt(opReturn, unix.SECCOMP_RET_ERRNO|uint32(e)&unix.SECCOMP_RET_DATA)
}

// Assemble compiles the profile to classic BPF for the architecture this
// binary was built for (amd64 or arm64). The program:
//
//   - kills the process when seccomp_data.arch is not this architecture's
//     audit arch (an i386 or arm32 entry point would reach the kernel by
//     other numbers and bypass every rule);
//   - on amd64, fails x32-ABI calls (numbers with bit 30 set) with ENOSYS,
//     for the same reason: they reach the same handlers by other numbers.
//     ENOSYS is what a kernel without x32 support answers (most
//     distributions' kernels), so a program probing for x32 falls back
//     instead of dying, as KILL would make it;
//   - compares the number against each rule's syscall, then the low 32 bits
//     of the rule's argument, and returns SECCOMP_RET_ERRNO with its errno;
//   - allows everything else.
//
// Syscalls the architecture never had (iopl and ioperm on arm64) are
// skipped; a name the architecture's table does not know is an error.
// Only the rules with an argument match read more than the syscall number,
// so the kernel (5.11 and later) caches "allow" for every other syscall and
// does not run the filter for them at all.
func (p Profile) Assemble() ([]unix.SockFilter, error) {
	table := syscallTable()
	if table == nil {
		return nil, fmt.Errorf("seccomp: architecture %s is not supported", runtime.GOARCH)
	}
	prog := []unix.SockFilter{
		stmt(opLoadWord, offArch),
		jump(opJumpEq, auditArch, 1, 0),
		stmt(opReturn, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(opLoadWord, offNr),
	}
	prog = append(prog, abiPrologue()...)

	unconditional := map[string]bool{}
	seen := map[string]bool{}
	for _, r := range p.rules {
		nr, known := table[r.Syscall]
		if !known {
			return nil, fmt.Errorf("seccomp: rule for %q: no such syscall in the %s table", r.Syscall, runtime.GOARCH)
		}
		// A rule that refuses every call would hide a later one, and one
		// after it would never be reached.
		if unconditional[r.Syscall] || (seen[r.Syscall] && len(r.Args) == 0) {
			return nil, fmt.Errorf("seccomp: more than one rule for %q, and one of them has no argument match", r.Syscall)
		}
		seen[r.Syscall] = true
		unconditional[r.Syscall] = len(r.Args) == 0
		if r.Errno == 0 || uint32(r.Errno) > unix.SECCOMP_RET_DATA {
			return nil, fmt.Errorf("seccomp: rule for %q: errno %d out of range", r.Syscall, r.Errno)
		}
		if nr == absent {
			continue
		}
		block, err := ruleBlock(uint32(nr), r)
		if err != nil {
			return nil, fmt.Errorf("seccomp: rule for %q: %w", r.Syscall, err)
		}
		prog = append(prog, block...)
	}
	prog = append(prog, stmt(opReturn, unix.SECCOMP_RET_ALLOW))
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program has %d instructions, the kernel takes at most %d", len(prog), unix.BPF_MAXINSNS)
	}
	return prog, nil
}

// ins is one entry of a block being laid out: an instruction whose jump
// targets may be labels, or (label set) the position of a label.
type ins struct {
	label  string
	f      unix.SockFilter
	jt, jf string // a label to jump to when true or false; "" falls through
}

// ruleBlock compiles one rule. It starts and ends with the syscall number in
// the accumulator, so blocks chain:
//
//	nr == the rule's?   no: to end
//	for each argument match: load the argument; no match: to nomatch
//	return the errno
//	nomatch: reload nr
//	end:
func ruleBlock(nr uint32, r Rule) ([]unix.SockFilter, error) {
	if len(r.Args) == 0 {
		return []unix.SockFilter{
			jump(opJumpEq, nr, 0, 1),
			retErrno(r.Errno),
		}, nil
	}
	code := []ins{{f: jump(opJumpEq, nr, 0, 0), jf: "end"}}
	for k, m := range r.Args {
		if m.Index < 0 || m.Index > 5 {
			return nil, fmt.Errorf("argument index %d out of range", m.Index)
		}
		if m.kinds() != 1 {
			return nil, fmt.Errorf("argument match %d sets %d of AnyOf, Except and Equal, want one", k, m.kinds())
		}
		if len(m.Except) > 250 || len(m.Equal) > 250 {
			return nil, fmt.Errorf("argument match %d: at most 250 values fit in a jump", k)
		}
		code = append(code, ins{f: stmt(opLoadWord, uint32(offArgs+8*m.Index))})
		switch {
		case m.AnyOf != 0: // any bit set: matched (fall through)
			code = append(code, ins{f: jump(opJumpSet, m.AnyOf, 0, 0), jf: "nomatch"})
		case len(m.Except) > 0: // an allowed value: no match
			for _, v := range m.Except {
				code = append(code, ins{f: jump(opJumpEq, v, 0, 0), jt: "nomatch"})
			}
		default: // one of the values: matched; none of them: no match
			matched := fmt.Sprintf("matched%d", k)
			for i, v := range m.Equal {
				if i == len(m.Equal)-1 {
					code = append(code, ins{f: jump(opJumpEq, v, 0, 0), jf: "nomatch"})
				} else {
					code = append(code, ins{f: jump(opJumpEq, v, 0, 0), jt: matched})
				}
			}
			code = append(code, ins{label: matched})
		}
	}
	code = append(code,
		ins{f: retErrno(r.Errno)},
		ins{label: "nomatch"}, ins{f: stmt(opLoadWord, offNr)},
		ins{label: "end"})
	at := map[string]int{}
	pc := 0
	for _, c := range code {
		if c.label != "" {
			at[c.label] = pc
		} else {
			pc++
		}
	}
	var prog []unix.SockFilter
	for _, c := range code {
		if c.label != "" {
			continue
		}
		f := c.f
		for _, j := range []struct {
			label string
			off   *uint8
		}{{c.jt, &f.Jt}, {c.jf, &f.Jf}} {
			if j.label == "" {
				continue
			}
			off := at[j.label] - len(prog) - 1
			if off < 0 || off > 255 {
				return nil, fmt.Errorf("jump to %s out of reach", j.label)
			}
			*j.off = uint8(off)
		}
		prog = append(prog, f)
	}
	return prog, nil
}

// Install sets no_new_privs and installs prog on every thread of the
// process (SECCOMP_FILTER_FLAG_TSYNC, which also carries the installing
// thread's no_new_privs to every other thread, so that one system call
// does for all of them what would otherwise stop the world); threads and
// processes created afterwards inherit both.
//
// Once installed the filter cannot be removed. Go's syscall.ForkExec uses
// clone3 only for SysProcAttr.UseCgroupFD and CLONE_NEWTIME, which then
// fail with ENOSYS; every other spawn uses clone and works.
func Install(prog []unix.SockFilter) error {
	if len(prog) == 0 || len(prog) > unix.BPF_MAXINSNS {
		return fmt.Errorf("seccomp: program has %d instructions, want 1 to %d", len(prog), unix.BPF_MAXINSNS)
	}
	// no_new_privs, which the filter needs on the installing thread, and
	// the filter itself on the same one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, _, e := syscall.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("seccomp: set no_new_privs: %w", e)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	tid, _, e := syscall.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if e != 0 {
		return fmt.Errorf("seccomp: install filter: %w", e)
	}
	if tid != 0 {
		// TSYNC answers with the id of a thread it could not move onto the filter.
		return fmt.Errorf("seccomp: install filter: thread %d could not be synchronised", tid)
	}
	return nil
}
