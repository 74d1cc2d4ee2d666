package seccomp

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
)

// seccompData is struct seccomp_data, the input of a seccomp filter.
type seccompData struct {
	nr   int32
	arch uint32
	ip   uint64
	args [6]uint64
}

// bytes lays d out as the kernel does on amd64 and arm64: little-endian.
func (d seccompData) bytes() []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b[0:], uint32(d.nr))
	binary.LittleEndian.PutUint32(b[4:], d.arch)
	binary.LittleEndian.PutUint64(b[8:], d.ip)
	for i, a := range d.args {
		binary.LittleEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// evaluate runs prog on d in golang.org/x/net/bpf's interpreter and returns
// the seccomp action.
func evaluate(t *testing.T, prog []unix.SockFilter, d seccompData) uint32 {
	t.Helper()
	raw := make([]bpf.RawInstruction, len(prog))
	for i, f := range prog {
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	ins, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the filter has an instruction x/net/bpf cannot decode")
	}
	vm, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatal(err)
	}
	// The interpreter loads words big-endian (packet order), the kernel
	// native-endian: reverse each 32-bit word so both read the same values.
	in := d.bytes()
	for i := 0; i < len(in); i += 4 {
		binary.BigEndian.PutUint32(in[i:], binary.LittleEndian.Uint32(in[i:]))
	}
	ret, err := vm.Run(in)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

func call(nr int, args ...uint64) seccompData {
	d := seccompData{nr: int32(nr), arch: auditArch}
	copy(d.args[:], args)
	return d
}

const allow = unix.SECCOMP_RET_ALLOW

// addrNoRandomize is the ADDR_NO_RANDOMIZE persona (personality(2)).
const addrNoRandomize = 0x0040000

func errnoAction(e syscall.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }

func actionName(a uint32) string {
	switch {
	case a == allow:
		return "ALLOW"
	case a == unix.SECCOMP_RET_KILL_PROCESS:
		return "KILL_PROCESS"
	case a&unix.SECCOMP_RET_ACTION_FULL == unix.SECCOMP_RET_ERRNO:
		return "ERRNO(" + unix.ErrnoName(syscall.Errno(a&unix.SECCOMP_RET_DATA)) + ")"
	}
	return "unexpected action"
}

func mustAssemble(t *testing.T, p Profile) []unix.SockFilter {
	t.Helper()
	prog, err := p.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	return prog
}

func TestDefaultDecisions(t *testing.T) {
	prog := mustAssemble(t, Default())
	for _, tc := range []struct {
		name string
		d    seccompData
		want uint32
	}{
		{"mount", call(unix.SYS_MOUNT), errnoAction(unix.EPERM)},
		{"getpid", call(unix.SYS_GETPID), allow},
		{"read", call(unix.SYS_READ, 0, 0, 4096), allow},
		{"openat", call(unix.SYS_OPENAT), allow},
		{"clone with CLONE_NEWUSER", call(unix.SYS_CLONE, unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), errnoAction(unix.EPERM)},
		{"clone for fork", call(unix.SYS_CLONE, uint64(unix.SIGCHLD)), allow},
		{"clone for a thread", call(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_FS|unix.CLONE_FILES|unix.CLONE_SIGHAND|unix.CLONE_THREAD), allow},
		{"clone with the other namespaces", call(unix.SYS_CLONE, unix.CLONE_NEWNS|unix.CLONE_NEWPID|unix.CLONE_NEWNET|unix.CLONE_NEWUTS|unix.CLONE_NEWIPC), allow},
		{"unshare CLONE_NEWUSER", call(unix.SYS_UNSHARE, unix.CLONE_NEWUSER), errnoAction(unix.EPERM)},
		{"unshare CLONE_NEWUSER|CLONE_NEWNS", call(unix.SYS_UNSHARE, unix.CLONE_NEWUSER|unix.CLONE_NEWNS), errnoAction(unix.EPERM)},
		{"unshare CLONE_NEWNS", call(unix.SYS_UNSHARE, unix.CLONE_NEWNS), allow},
		// Only the low 32 bits are compared: the high word cannot carry
		// CLONE_NEWUSER, and bits there do not hide it in the low word.
		{"unshare with only high bits", call(unix.SYS_UNSHARE, unix.CLONE_NEWUSER<<32), allow},
		{"clone with high bits and CLONE_NEWUSER", call(unix.SYS_CLONE, 1<<40|unix.CLONE_NEWUSER), errnoAction(unix.EPERM)},
		// CLONE_NEWUSER in another argument is not a flags argument.
		{"clone with CLONE_NEWUSER as its stack", call(unix.SYS_CLONE, uint64(unix.SIGCHLD), unix.CLONE_NEWUSER), allow},
		{"clone3", call(unix.SYS_CLONE3), errnoAction(unix.ENOSYS)},
		{"personality query", call(unix.SYS_PERSONALITY, 0xffffffff), allow},
		{"personality PER_LINUX", call(unix.SYS_PERSONALITY, 0), allow},
		{"personality PER_LINUX32", call(unix.SYS_PERSONALITY, 0x0008), allow},
		{"personality ADDR_NO_RANDOMIZE", call(unix.SYS_PERSONALITY, addrNoRandomize), errnoAction(unix.EPERM)},
		{"personality READ_IMPLIES_EXEC", call(unix.SYS_PERSONALITY, 0x0400000), errnoAction(unix.EPERM)},
		{"keyctl", call(unix.SYS_KEYCTL), errnoAction(unix.EPERM)},
		{"bpf", call(unix.SYS_BPF), errnoAction(unix.EPERM)},
		{"ptrace", call(unix.SYS_PTRACE, unix.PTRACE_TRACEME), errnoAction(unix.EPERM)},
		{"setns", call(unix.SYS_SETNS), errnoAction(unix.EPERM)},
		{"io_uring_setup", call(unix.SYS_IO_URING_SETUP, 8, 0), errnoAction(unix.ENOSYS)},
		{"io_uring_enter", call(unix.SYS_IO_URING_ENTER), errnoAction(unix.ENOSYS)},
		{"socket AF_INET", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0), allow},
		{"socket AF_INET6 UDP", call(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM, 0), allow},
		{"socket AF_UNIX", call(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0), allow},
		{"socket AF_VSOCK", call(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0), errnoAction(unix.EAFNOSUPPORT)},
		{"socket AF_PACKET", call(unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW, 0x300), errnoAction(unix.EAFNOSUPPORT)},
		{"socket AF_ALG", call(unix.SYS_SOCKET, unix.AF_ALG, unix.SOCK_SEQPACKET, 0), errnoAction(unix.EAFNOSUPPORT)},
		{"socket AF_BLUETOOTH", call(unix.SYS_SOCKET, unix.AF_BLUETOOTH, unix.SOCK_RAW, 0), errnoAction(unix.EAFNOSUPPORT)},
		{"socket AF_TIPC", call(unix.SYS_SOCKET, unix.AF_TIPC, unix.SOCK_RDM, 0), errnoAction(unix.EAFNOSUPPORT)},
		{"socket netlink route", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE), allow},
		{"socket netlink sock_diag", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_SOCK_DIAG), allow},
		{"socket netlink netfilter", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER), errnoAction(unix.EPROTONOSUPPORT)},
		{"socket netlink uevents", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT), errnoAction(unix.EPROTONOSUPPORT)},
		{"socket netlink generic", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC), errnoAction(unix.EPROTONOSUPPORT)},
		{"socket AF_INET with protocol 16", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_RAW, 16), allow},
		{"socketpair AF_UNIX", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0), allow},
		{"socketpair AF_TIPC", call(unix.SYS_SOCKETPAIR, unix.AF_TIPC, unix.SOCK_STREAM, 0), errnoAction(unix.EAFNOSUPPORT)},
		{"wrong arch", seccompData{nr: unix.SYS_GETPID, arch: unix.AUDIT_ARCH_I386}, unix.SECCOMP_RET_KILL_PROCESS},
		{"wrong arch, denied number", seccompData{nr: unix.SYS_MOUNT, arch: unix.AUDIT_ARCH_ARM}, unix.SECCOMP_RET_KILL_PROCESS},
	} {
		if got := evaluate(t, prog, tc.d); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, actionName(got), actionName(tc.want))
		}
	}
}

func TestX32IsRefused(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("x32 exists on amd64 only")
	}
	prog := mustAssemble(t, Default())
	for _, nr := range []int{unix.SYS_GETPID, unix.SYS_MOUNT, unix.SYS_UNSHARE} {
		if got := evaluate(t, prog, call(0x40000000|nr, 0)); got != errnoAction(unix.ENOSYS) {
			t.Errorf("x32 syscall %d: %s, want ERRNO(ENOSYS)", nr, actionName(got))
		}
	}
}

// matches says, the way the filter should, whether argument value v
// matches m (low 32 bits).
func matches(m ArgMatch, v uint64) bool {
	w := uint32(v)
	switch {
	case m.AnyOf != 0:
		return w&m.AnyOf != 0
	case len(m.Except) > 0:
		return !slices.Contains(m.Except, w)
	default:
		return slices.Contains(m.Equal, w)
	}
}

// expect is the profile's decision for d, worked out from its rules
// without the BPF program: the first rule that matches decides.
func expect(p Profile, table map[string]int, d seccompData) uint32 {
	for _, r := range p.Rules() {
		if nr := table[r.Syscall]; nr == absent || int32(nr) != d.nr {
			continue
		}
		all := true
		for _, m := range r.Args {
			all = all && matches(m, d.args[m.Index])
		}
		if all {
			return errnoAction(r.Errno)
		}
	}
	return allow
}

// values are argument values that match m and that do not.
func values(m ArgMatch) (hit, miss []uint32) {
	switch {
	case m.AnyOf != 0:
		return []uint32{m.AnyOf, m.AnyOf | 1<<31}, []uint32{^m.AnyOf, 0}
	case len(m.Except) > 0:
		return []uint32{0x1234, 0xffffffff}, m.Except
	default:
		return m.Equal, []uint32{0x1234}
	}
}

// TestEveryRuleIsEnforced checks each rule of the default profile against
// the assembled program: for every argument match, calls whose argument
// matches it and calls whose argument does not, with the other arguments
// set to match theirs; the program must decide as the rules say, and each
// rule must be what refuses its fully matching call. So a rule cannot be
// documented and not compiled.
func TestEveryRuleIsEnforced(t *testing.T) {
	p := Default()
	prog := mustAssemble(t, p)
	table := syscallTable()
	for _, r := range p.Rules() {
		nr := table[r.Syscall]
		if nr == absent {
			continue
		}
		base := call(nr, 1, 2, 3, 4, 5, 6)
		for _, m := range r.Args {
			hit, _ := values(m)
			base.args[m.Index] = uint64(hit[0])
		}
		if got := evaluate(t, prog, base); got != errnoAction(r.Errno) {
			t.Errorf("%s %s: %s, want %s", r.Syscall, r.Condition(), actionName(got), actionName(errnoAction(r.Errno)))
		}
		for _, m := range r.Args {
			hit, miss := values(m)
			for _, v := range append(hit, miss...) {
				d := base
				d.args[m.Index] = uint64(v)
				if got, want := evaluate(t, prog, d), expect(p, table, d); got != want {
					t.Errorf("%s with %s = %#x: %s, want %s", r.Syscall, m.Name, v, actionName(got), actionName(want))
				}
			}
		}
	}
}

func TestAbsentSyscallsAreSkipped(t *testing.T) {
	table := syscallTable()
	for _, r := range Default().Rules() {
		if _, ok := table[r.Syscall]; !ok {
			t.Errorf("%s is not in the %s table", r.Syscall, runtime.GOARCH)
		}
	}
	prog := mustAssemble(t, Profile{rules: []Rule{{Syscall: "iopl", Errno: unix.EPERM, Reason: "test"}}})
	want := 5 + len(abiPrologue()) // arch check, load nr, allow
	if table["iopl"] != absent {
		want += 2
	}
	if len(prog) != want {
		t.Errorf("a profile of iopl alone has %d instructions on %s, want %d", len(prog), runtime.GOARCH, want)
	}
}

func TestAssembleRejectsBadRules(t *testing.T) {
	for name, rules := range map[string][]Rule{
		"unknown syscall": {{Syscall: "no_such_call", Errno: unix.EPERM}},
		"duplicate":       {{Syscall: "mount", Errno: unix.EPERM}, {Syscall: "mount", Errno: unix.EACCES}},
		"hidden by an unconditional rule": {{Syscall: "clone", Errno: unix.EPERM},
			{Syscall: "clone", Errno: unix.EPERM, Args: []ArgMatch{{AnyOf: 1}}}},
		"after a conditional one, unconditional": {{Syscall: "clone", Errno: unix.EPERM, Args: []ArgMatch{{AnyOf: 1}}},
			{Syscall: "clone", Errno: unix.EPERM}},
		"errno 0":         {{Syscall: "mount"}},
		"errno too large": {{Syscall: "mount", Errno: 0x10000}},
		"argument 6":      {{Syscall: "clone", Errno: unix.EPERM, Args: []ArgMatch{{Index: 6, AnyOf: 1}}}},
		"two kinds":       {{Syscall: "clone", Errno: unix.EPERM, Args: []ArgMatch{{AnyOf: 1, Except: []uint32{0}}}}},
		"no kind":         {{Syscall: "clone", Errno: unix.EPERM, Args: []ArgMatch{{Index: 1}}}},
	} {
		if _, err := (Profile{rules: rules}).Assemble(); err == nil {
			t.Errorf("%s: Assemble accepted it", name)
		}
	}
}

func TestRulesAreDocumentedCopies(t *testing.T) {
	rules := Default().Rules()
	for _, r := range rules {
		if r.Reason == "" {
			t.Errorf("rule for %s has no reason", r.Syscall)
		}
		if (len(r.Args) == 0) != (r.Condition() == "") {
			t.Errorf("rule for %s: condition %q does not match its argument matches", r.Syscall, r.Condition())
		}
	}
	for i := range rules {
		for j := range rules[i].Args {
			if len(rules[i].Args[j].Except) > 0 {
				rules[i].Args[j].Except[0] = 0x1234
			}
		}
		rules[i].Syscall = "changed"
	}
	for _, r := range Default().Rules() {
		if r.Syscall == "changed" {
			t.Fatal("changing what Rules returned changed the profile")
		}
		for _, m := range r.Args {
			if len(m.Except) > 0 && m.Except[0] == 0x1234 {
				t.Fatal("changing what Rules returned changed the profile")
			}
		}
	}
}

// Child modes of the test binary, selected by modeEnv in TestMain.
const (
	modeEnv     = "BERTH_SECCOMP_TEST_MODE"
	modeInstall = "install" // install the default filter and try what it refuses
	modeProbe   = "probe"   // report this process's seccomp state (run by the install child)
)

func TestMain(m *testing.M) {
	switch os.Getenv(modeEnv) {
	case modeInstall:
		installChild()
	case modeProbe:
		probeChild()
	default:
		os.Exit(m.Run())
	}
}

// result names what a syscall returned: "ok", an errno's name, or an error.
func result(err error) string {
	var e syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &e):
		return unix.ErrnoName(e)
	}
	return err.Error()
}

func rawResult(_, _ uintptr, e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	return unix.ErrnoName(e)
}

// missing is a path that does not exist: a mount on it fails with ENOENT
// when the filter lets the call through, so nothing is ever mounted.
const missing = "/nonexistent-berth-seccomp-test"

// installChild runs in a child process: it installs the default filter and
// prints, as JSON, what each refused or allowed operation returned.
func installChild() {
	fail := func(err error) {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
	// Pin this goroutine and a second one to distinct OS threads before the
	// filter goes on, so the second thread exists only thanks to TSYNC.
	runtime.LockOSThread()
	type other struct {
		tid   int
		mount string
	}
	ready, start, done := make(chan int), make(chan struct{}), make(chan other)
	go func() {
		runtime.LockOSThread()
		ready <- unix.Gettid()
		<-start
		done <- other{unix.Gettid(), result(unix.Mount("none", missing, "tmpfs", 0, ""))}
	}()
	otherTid := <-ready

	prog, err := Default().Assemble()
	if err != nil {
		fail(err)
	}
	if err := Install(prog); err != nil {
		fail(err)
	}

	res := map[string]string{}
	res["mount"] = result(unix.Mount("none", missing, "tmpfs", 0, ""))
	res["umount2"] = result(unix.Unmount(missing, 0))
	res["unshare CLONE_NEWUSER"] = result(unix.Unshare(unix.CLONE_NEWUSER))
	res["unshare CLONE_NEWNS"] = onFreshThread(func() error { return unix.Unshare(unix.CLONE_NEWNS) })
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	res["keyctl"] = result(err)
	res["bpf"] = rawResult(unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, 0, 0))
	res["ptrace TRACEME"] = rawResult(unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0))
	res["clone3"] = rawResult(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0))
	res["personality ADDR_NO_RANDOMIZE"] = rawResult(unix.Syscall(unix.SYS_PERSONALITY, addrNoRandomize, 0, 0))
	res["personality query"] = rawResult(unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0))
	res["io_uring_setup"] = rawResult(unix.Syscall(unix.SYS_IO_URING_SETUP, 8, 0, 0))
	socket := func(domain, typ, proto int) string {
		fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
		if err == nil {
			unix.Close(fd)
		}
		return result(err)
	}
	res["socket AF_INET"] = socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	res["socket AF_VSOCK"] = socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	res["socket AF_ALG"] = socket(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)
	res["socket netlink route"] = socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
	res["socket netlink netfilter"] = socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER)

	res["ForkExec /bin/true"] = forkExecTrue(nil)
	res["ForkExec with CLONE_NEWUSER"] = forkExecTrue(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER})

	probe := exec.Command(os.Args[0]) // os/exec: clone with CLONE_PIDFD
	probe.Env = append(os.Environ(), modeEnv+"="+modeProbe)
	out, err := probe.Output()
	if err != nil {
		res["exec probe"] = result(err)
	} else {
		res["exec probe"] = strings.TrimSpace(string(out))
	}

	close(start)
	o := <-done
	res["mount on another thread"] = o.mount
	if o.tid == unix.Gettid() || o.tid != otherTid {
		res["mount on another thread"] = "ran on the installing thread"
	}
	res["threads"] = threadStates()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fail(err)
	}
}

// onFreshThread runs f on a new goroutine locked to its thread; the thread
// ends with the goroutine, so what f changes (a namespace) ends with it.
func onFreshThread(f func() error) string {
	c := make(chan string)
	go func() {
		runtime.LockOSThread()
		c <- result(f())
	}()
	return <-c
}

// forkExecTrue spawns /bin/true and reports whether it ran and exited 0.
func forkExecTrue(sys *syscall.SysProcAttr) string {
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Sys: sys})
	if err != nil {
		return result(err)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return result(err)
	}
	if !ws.Exited() || ws.ExitStatus() != 0 {
		return "true did not exit 0"
	}
	return "ok"
}

// threadStates summarises the seccomp state of every thread of this
// process: "N threads filtered", or the first thread that is not.
func threadStates() string {
	paths, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(paths) == 0 {
		return "no threads listed"
	}
	for _, p := range paths {
		s := statusOf(p)
		if errors.Is(s.err, os.ErrNotExist) {
			continue // the thread ended between Glob and read
		}
		if s.String() != "Seccomp=2 NoNewPrivs=1" {
			return p + ": " + s.String()
		}
	}
	return "all filtered"
}

// filterState is the Seccomp and NoNewPrivs fields of a status file.
type filterState struct {
	seccomp, noNewPrivs string
	err                 error
}

func (s filterState) String() string {
	if s.err != nil {
		return s.err.Error()
	}
	return "Seccomp=" + s.seccomp + " NoNewPrivs=" + s.noNewPrivs
}

func statusOf(path string) filterState {
	b, err := os.ReadFile(path)
	if err != nil {
		return filterState{err: err}
	}
	var s filterState
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Seccomp:"); ok {
			s.seccomp = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
			s.noNewPrivs = strings.TrimSpace(v)
		}
	}
	return s
}

// probeChild runs in a process the install child spawned: it reports the
// filter state it inherited and whether mount is refused.
func probeChild() {
	os.Stdout.WriteString(statusOf("/proc/self/status").String() + " mount=" +
		result(unix.Mount("none", missing, "tmpfs", 0, "")) + "\n")
}

func TestInstallRefusesInEveryThreadAndChild(t *testing.T) {
	testutil.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), modeEnv+"="+modeInstall)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	var res map[string]string
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("child printed %q: %v", out, err)
	}
	want := map[string]string{
		"mount":                         "EPERM",
		"umount2":                       "EPERM",
		"unshare CLONE_NEWUSER":         "EPERM",
		"unshare CLONE_NEWNS":           "ok",
		"keyctl":                        "EPERM",
		"bpf":                           "EPERM",
		"ptrace TRACEME":                "EPERM",
		"clone3":                        "ENOSYS",
		"personality ADDR_NO_RANDOMIZE": "EPERM",
		"personality query":             "ok",
		"io_uring_setup":                "ENOSYS",
		"socket AF_INET":                "ok",
		"socket AF_VSOCK":               "EAFNOSUPPORT",
		"socket AF_ALG":                 "EAFNOSUPPORT",
		"socket netlink route":          "ok",
		"socket netlink netfilter":      "EPROTONOSUPPORT",
		"ForkExec /bin/true":            "ok",
		"ForkExec with CLONE_NEWUSER":   "EPERM",
		"exec probe":                    "Seccomp=2 NoNewPrivs=1 mount=EPERM",
		"mount on another thread":       "EPERM",
		"threads":                       "all filtered",
	}
	for k, w := range want {
		if res[k] != w {
			t.Errorf("%s: %q, want %q", k, res[k], w)
		}
	}
}

// TestSecurityDocListsEveryRule keeps docs/security.md honest: every refused
// syscall appears in a row of its table with the errno the filter returns.
func TestSecurityDocListsEveryRule(t *testing.T) {
	b, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for _, r := range Default().Rules() {
		found := false
		for _, line := range lines {
			if strings.HasPrefix(line, "|") && strings.Contains(line, "`"+r.Syscall+"`") &&
				strings.Contains(line, unix.ErrnoName(r.Errno)) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("docs/security.md has no table row with `%s` and %s (%s%s)", r.Syscall, unix.ErrnoName(r.Errno),
				r.Reason, strings.TrimSuffix(" "+r.Condition(), " "))
		}
	}
}
