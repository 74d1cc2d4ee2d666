package capability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
)

func TestDefaultLeavesOutDangerousCaps(t *testing.T) {
	m, err := mask(Default(), 63)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Cap{unix.CAP_SYS_ADMIN, unix.CAP_NET_RAW, unix.CAP_SYS_PTRACE, unix.CAP_SYS_MODULE,
		unix.CAP_NET_ADMIN, unix.CAP_SYS_RAWIO, unix.CAP_BPF, unix.CAP_PERFMON, unix.CAP_DAC_READ_SEARCH} {
		if m&(1<<uint(c)) != 0 {
			t.Errorf("Default keeps %s", Name(c))
		}
	}
	if got := len(Default()); got != 13 {
		t.Errorf("Default has %d capabilities, want 13", got)
	}
}

func TestName(t *testing.T) {
	seen := map[string]Cap{}
	for c := Cap(0); c <= unix.CAP_LAST_CAP; c++ {
		n := Name(c)
		if n == "" || strings.HasPrefix(n, "cap(") {
			t.Errorf("capability %d has no name", c)
		}
		if prev, dup := seen[n]; dup {
			t.Errorf("capabilities %d and %d are both named %s", prev, c, n)
		}
		seen[n] = c
	}
	for c, want := range map[Cap]string{unix.CAP_SYS_ADMIN: "SYS_ADMIN", unix.CAP_NET_RAW: "NET_RAW", 64: "cap(64)", -1: "cap(-1)"} {
		if got := Name(c); got != want {
			t.Errorf("Name(%d) = %q, want %q", c, got, want)
		}
	}
}

func TestRestrictRefusesUnknownCaps(t *testing.T) {
	// Validation comes before any change, so this is safe in the test process.
	for _, c := range []Cap{-1, 64, 1000} {
		if err := Restrict([]Cap{unix.CAP_CHOWN, c}); err == nil {
			t.Errorf("Restrict accepted %s", Name(c))
		}
	}
}

// Child modes of the test binary, selected by modeEnv in TestMain.
const (
	modeEnv      = "BERTH_CAP_TEST_MODE"
	modeRestrict = "restrict" // call Restrict(Default()) and report
	modeProbe    = "probe"    // report the sets this process inherited (run by the restrict child)
)

func TestMain(m *testing.M) {
	switch os.Getenv(modeEnv) {
	case modeRestrict:
		restrictChild()
	case modeProbe:
		s, err := setsOf("/proc/self/status")
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		json.NewEncoder(os.Stdout).Encode(childReport{Threads: map[string]capSets{"probe": s}})
	default:
		os.Exit(m.Run())
	}
}

// capSets holds the capability lines of one status file, by field name.
type capSets map[string]string

func setsOf(path string) (capSets, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := capSets{}
	for _, line := range strings.Split(string(b), "\n") {
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if v, ok := strings.CutPrefix(line, k+":"); ok {
				s[k] = strings.TrimSpace(v)
			}
		}
	}
	return s, nil
}

// childReport is what a child process prints.
type childReport struct {
	Threads map[string]capSets // by status file, or "probe"
	Results map[string]string  // by operation: "ok" or an errno's name
	Probe   *childReport       // what an exec'd child saw
}

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

// restrictChild runs in a child process with full capabilities: it pins
// goroutines to extra OS threads, calls Restrict(Default()), and reports
// every thread's sets, what privileged calls return, and what an exec'd
// child inherits.
func restrictChild() {
	fail := func(err error) {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
	// Threads that exist before Restrict and are blocked in Go code must
	// be restricted too; each then checks its own sets.
	const extra = 3
	start, finish, own := make(chan struct{}), make(chan struct{}), make(chan string, extra)
	ready := make(chan struct{}, extra)
	for range extra {
		go func() {
			runtime.LockOSThread()
			ready <- struct{}{}
			<-start
			s, _ := setsOf("/proc/thread-self/status")
			own <- fmt.Sprintf("thread %d: %s %s %s", unix.Gettid(), s["CapPrm"], s["CapEff"], s["CapBnd"])
			<-finish // stay alive, and listed, until every thread is read
		}()
	}
	for range extra {
		<-ready
	}

	if err := Restrict(Default()); err != nil {
		fail(err)
	}
	close(start)

	report := childReport{Threads: map[string]capSets{}, Results: map[string]string{}}
	paths, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		fail(err)
	}
	for _, p := range paths {
		s, err := setsOf(p)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue // a Go runtime thread may end between Glob and read
		}
		if err != nil {
			fail(err)
		}
		report.Threads[p] = s
	}
	for range extra {
		report.Results[<-own] = "self"
	}
	close(finish)

	// CAP_SYS_ADMIN: unsharing a UTS namespace needs it. Done on a thread
	// that ends with its goroutine, so even a success would change nothing.
	uts := make(chan string)
	go func() {
		runtime.LockOSThread()
		uts <- result(unix.Unshare(unix.CLONE_NEWUTS))
	}()
	report.Results["unshare CLONE_NEWUTS"] = <-uts
	// CAP_NET_RAW.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if err == nil {
		unix.Close(fd)
	}
	report.Results["raw socket"] = result(err)
	// A kept capability still works: CAP_CHOWN on a file of our own.
	f, err := os.CreateTemp("", "berth-cap-test-")
	if err != nil {
		fail(err)
	}
	f.Close()
	report.Results["chown to 12345"] = result(os.Chown(f.Name(), 12345, 12345))
	os.Remove(f.Name())

	probe := exec.Command(os.Args[0])
	probe.Env = append(os.Environ(), modeEnv+"="+modeProbe)
	out, err := probe.Output()
	if err != nil {
		fail(fmt.Errorf("probe: %w", err))
	}
	report.Probe = &childReport{}
	if err := json.Unmarshal(out, report.Probe); err != nil {
		fail(fmt.Errorf("probe printed %q: %w", out, err))
	}
	if err := json.NewEncoder(os.Stdout).Encode(report); err != nil {
		fail(err)
	}
}

func TestRestrictAllThreadsAndChildren(t *testing.T) {
	testutil.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), modeEnv+"="+modeRestrict)
	// The child starts with capabilities beyond Default in its inheritable
	// and ambient sets (as a guest the spawner started holds every one in
	// its inheritable set): Restrict must empty both on every thread.
	cmd.SysProcAttr = &syscall.SysProcAttr{AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_RAW}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	var report childReport
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("child printed %q: %v", out, err)
	}

	m, err := mask(Default(), 63)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%016x", m)
	checkSets := func(who string, s capSets) {
		t.Helper()
		for _, k := range []string{"CapBnd", "CapPrm", "CapEff"} {
			if s[k] != want {
				t.Errorf("%s: %s = %q, want %s", who, k, s[k], want)
			}
		}
		for _, k := range []string{"CapInh", "CapAmb"} {
			if s[k] != fmt.Sprintf("%016x", 0) {
				t.Errorf("%s: %s = %q, want 0", who, k, s[k])
			}
		}
	}
	if len(report.Threads) < 4 {
		t.Errorf("the child listed %d threads, want at least 4 (main and 3 pinned)", len(report.Threads))
	}
	for path, s := range report.Threads {
		checkSets(path, s)
	}
	selfChecks := 0
	for k, v := range report.Results {
		if v != "self" {
			continue
		}
		selfChecks++
		if !strings.HasSuffix(k, ": "+want+" "+want+" "+want) {
			t.Errorf("a pinned thread read its own sets as %q, want %s for each", k, want)
		}
	}
	if selfChecks != 3 {
		t.Errorf("%d pinned threads reported, want 3", selfChecks)
	}
	if report.Probe == nil {
		t.Fatal("no report from the exec'd child")
	}
	checkSets("exec'd child", report.Probe.Threads["probe"])

	for op, w := range map[string]string{
		"unshare CLONE_NEWUTS": "EPERM",
		"raw socket":           "EPERM",
		"chown to 12345":       "ok",
	} {
		if got := report.Results[op]; got != w {
			t.Errorf("%s: %q, want %q", op, got, w)
		}
	}
}
