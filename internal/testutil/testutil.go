// Package testutil holds helpers shared by berth's tests.
package testutil

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireRoot skips a test that needs root on a developer's machine and fails
// it where CI=true (CI runs as root, so a skip there would hide a broken test).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root, and CI=true turns the skip into a failure")
	}
	t.Skip("needs root")
}

// RequireProgram skips a test that needs program (a C compiler, say) where
// it is missing, and fails it where CI=true.
func RequireProgram(t testing.TB, program string) {
	t.Helper()
	if _, err := exec.LookPath(program); err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s on PATH, and CI=true turns the skip into a failure", program)
	}
	t.Skipf("needs %s", program)
}

// Runsc returns the runsc binary for tests of the gvisor runtime:
// $BERTH_RUNSC when set (make test installs a pinned one and sets it), else
// runsc on PATH. Where there is none the test is skipped, and fails where
// CI=true.
func Runsc(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	if p := os.Getenv("BERTH_RUNSC"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("BERTH_RUNSC: %v", err)
		}
		return p
	}
	RequireProgram(t, "runsc")
	p, _ := exec.LookPath("runsc")
	return p
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Berth returns the path of a berth binary for tests that start sandboxes or
// daemons: $BERTH_BINARY when set (make test builds it), else one built once
// per test process the way make build does it (the lean guest first, then
// berth with it embedded). Its directory is world-traversable because a
// sandbox's init runs as an unprivileged host uid.
func Berth(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("BERTH_BINARY"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			tb.Fatal(err)
		}
		return abs
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berth-bin-")
		if err != nil {
			buildErr = err
			return
		}
		os.Chmod(dir, 0o755)
		buildPath = filepath.Join(dir, "berth")
		buildErr = build(buildPath)
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return buildPath
}

// build builds berth at path as make build does. The lean guest is written
// into the source tree (internal/guestbin, git-ignored) for go:embed to find;
// a lock keeps test processes of several packages from writing it at once.
func build(path string) error {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return fmt.Errorf("find the module: %v", err)
	}
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "berth-test-build.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	guest := filepath.Join(strings.TrimSpace(string(root)), "internal", "guestbin", "berth-guest")
	for _, args := range [][]string{
		{"build", "-o", guest, "github.com/berthsh/berth/cmd/berth-guest"},
		{"build", "-tags", "berth_guest_embedded", "-o", path, "github.com/berthsh/berth/cmd/berth"},
	} {
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// StateDir returns a fresh state directory whose parents a sandbox's init can
// traverse (t.TempDir's parents are 0700), removed at the end of the test.
// It lives under $BERTH_TEST_STATE_ROOT, default /var/tmp/berth-test: on
// disk like the daemon's /var/lib/berth (some hosts' /tmp is a tmpfs or, on
// this project's VMs, a slow region of the disk).
func StateDir(tb testing.TB) string {
	tb.Helper()
	base := os.Getenv("BERTH_TEST_STATE_ROOT")
	if base == "" {
		base = "/var/tmp/berth-test"
	}
	if err := os.MkdirAll(base, 0o711); err != nil {
		tb.Fatal(err)
	}
	os.Chmod(base, 0o711)
	dir, err := os.MkdirTemp(base, "state-")
	if err != nil {
		tb.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

var (
	programsMu sync.Mutex
	programs   = map[string]string{}
)

// Program returns a static binary of the Go main package pkg (an import
// path of this module, such as github.com/berthsh/berth/internal/testapp),
// built once per test process, for tests to copy into sandboxes.
func Program(tb testing.TB, pkg string) string {
	tb.Helper()
	programsMu.Lock()
	defer programsMu.Unlock()
	if p, ok := programs[pkg]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "berth-program-")
	if err != nil {
		tb.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", path, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	programs[pkg] = path
	return path
}

// NoLeaks checks, when the test ends, that it left no goroutine and no
// descriptor behind (waiting up to 5 s for them to go). Call it before
// what it checks is made: cleanups run last first. Goroutines and
// descriptors that the runtime keeps for good once used (os/signal's
// goroutine for a reaper's SIGCHLD, the poller's descriptors) are started
// first, so they do not count.
func NoLeaks(t testing.TB) {
	t.Helper()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	signal.Stop(sig)
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)
	t.Cleanup(func() {
		for end := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > goroutines || openFDs(t) > fds; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				buf := make([]byte, 1<<20)
				t.Errorf("leaked: %d goroutines (had %d), %d descriptors (had %d)\n%s",
					runtime.NumGoroutine(), goroutines, openFDs(t), fds, buf[:runtime.Stack(buf, true)])
				return
			}
		}
	})
}

func openFDs(t testing.TB) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// Buffer collects a process's output (its stdout and stderr may write at
// once) for a test's failure log.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreeAddr is a loopback address with a port that nothing listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// AdminKey is the admin API key a daemon wrote to admin.key in its state
// dir on its first start.
func AdminKey(t testing.TB, state string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "admin.key"))
	if err != nil {
		t.Fatalf("the daemon's first admin key: %v", err)
	}
	return strings.TrimSpace(string(b))
}
