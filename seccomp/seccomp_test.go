package seccomp

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
)

// run evaluates the assembled filter for one syscall in a userspace BPF VM.
func run(t *testing.T, prog []unix.SockFilter, arch uint32, nr int, arg0 uint64) uint32 {
	t.Helper()
	ins := make([]bpf.RawInstruction, len(prog))
	for i, f := range prog {
		ins[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	decoded, ok := bpf.Disassemble(ins)
	if !ok {
		t.Fatal("filter does not disassemble")
	}
	vm, err := bpf.NewVM(decoded)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 64) // struct seccomp_data
	binary.LittleEndian.PutUint32(data[0:], uint32(nr))
	binary.LittleEndian.PutUint32(data[4:], arch)
	binary.LittleEndian.PutUint64(data[16:], arg0)
	// bpf.VM loads are big-endian (network order); seccomp's are native.
	// Swap every 32-bit word so the VM reads what the kernel would.
	for i := 0; i < len(data); i += 4 {
		data[i], data[i+1], data[i+2], data[i+3] = data[i+3], data[i+2], data[i+1], data[i]
	}
	ret, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

func TestFilterDecisions(t *testing.T) {
	prog, err := Default().Assemble()
	if err != nil {
		t.Fatal(err)
	}
	errno := func(e syscall.Errno) uint32 { return retErrno | uint32(e) }
	for _, tc := range []struct {
		name string
		nr   int
		arg0 uint64
		want uint32
	}{
		{"mount", unix.SYS_MOUNT, 0, errno(unix.EPERM)},
		{"getpid", unix.SYS_GETPID, 0, retAllow},
		{"bpf", unix.SYS_BPF, 0, errno(unix.EPERM)},
		{"keyctl", unix.SYS_KEYCTL, 0, errno(unix.EPERM)},
		{"ptrace", unix.SYS_PTRACE, 0, errno(unix.EPERM)},
		{"clone newuser", unix.SYS_CLONE, unix.CLONE_NEWUSER | uint64(unix.SIGCHLD), errno(unix.EPERM)},
		{"clone plain", unix.SYS_CLONE, uint64(unix.SIGCHLD), retAllow},
		{"clone thread", unix.SYS_CLONE, unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND, retAllow},
		{"unshare newuser", unix.SYS_UNSHARE, unix.CLONE_NEWUSER, errno(unix.EPERM)},
		{"unshare newns", unix.SYS_UNSHARE, unix.CLONE_NEWNS, retAllow},
		{"clone3", unix.SYS_CLONE3, 0, errno(unix.ENOSYS)},
		{"openat", unix.SYS_OPENAT, 0, retAllow},
	} {
		if got := run(t, prog, auditArch, tc.nr, tc.arg0); got != tc.want {
			t.Errorf("%s: got %#x, want %#x", tc.name, got, tc.want)
		}
	}
	if got := run(t, prog, 0x40000003 /* i386 */, unix.SYS_GETPID, 0); got != retKillProcess {
		t.Errorf("foreign arch: got %#x, want kill", got)
	}
	if runtime.GOARCH == "amd64" {
		if got := run(t, prog, auditArch, 0x40000000|unix.SYS_GETPID, 0); got != errno(unix.ENOSYS) {
			t.Errorf("x32 syscall: got %#x", got)
		}
	}
	for _, r := range Default().Rules() {
		if r.Reason == "" {
			t.Errorf("rule %s has no reason", r.Syscall)
		}
	}
}

const childEnv = "BERTH_SECCOMP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		child()
		return
	}
	os.Exit(m.Run())
}

// child installs the filter and reports what each attack got.
func child() {
	prog, err := Default().Assemble()
	if err != nil {
		panic(err)
	}
	if err := Install(prog); err != nil {
		panic(err)
	}
	res := map[string]string{}
	errStr := func(err error) string {
		if err == nil {
			return "ok"
		}
		return err.Error()
	}
	res["mount"] = errStr(unix.Mount("none", "/mnt", "tmpfs", 0, ""))
	res["unshare_user"] = errStr(unix.Unshare(unix.CLONE_NEWUSER))
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	res["keyctl"] = errStr(err)
	_, _, e := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
	res["ptrace"] = errStr(errnoErr(e))
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
	if err == nil {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	}
	res["forkexec"] = errStr(err)
	done := make(chan string)
	go func() { // another OS thread sees the filter too (TSYNC)
		runtime.LockOSThread()
		done <- errStr(unix.Mount("none", "/mnt", "tmpfs", 0, ""))
	}()
	res["mount_other_thread"] = <-done
	json.NewEncoder(os.Stdout).Encode(res)
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func TestInstalledFilterRefusesAttacks(t *testing.T) {
	testutil.RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v %s", err, out)
	}
	var res map[string]string
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("child output %q: %v", out, err)
	}
	perm := unix.EPERM.Error()
	for k, want := range map[string]string{"mount": perm, "unshare_user": perm, "keyctl": perm, "ptrace": perm,
		"forkexec": "ok", "mount_other_thread": perm} {
		if res[k] != want {
			t.Errorf("%s: %q, want %q", k, res[k], want)
		}
	}
}

// TestSecurityDocListsEveryRule keeps docs/security.md honest: every refused
// syscall appears in its table with the errno the filter returns.
func TestSecurityDocListsEveryRule(t *testing.T) {
	b, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, r := range Default().Rules() {
		found := false
		for _, line := range strings.Split(doc, "\n") {
			if strings.Contains(line, "`"+r.Syscall+"`") && strings.Contains(line, errnoName(r.Errno)) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("docs/security.md has no table row with `%s` and %s", r.Syscall, errnoName(r.Errno))
		}
	}
}

func errnoName(e syscall.Errno) string {
	switch e {
	case unix.EPERM:
		return "EPERM"
	case unix.ENOSYS:
		return "ENOSYS"
	}
	return e.Error()
}
