package spawn

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/internal/testutil"
)

// forkShell forks sh running script from the test process itself (a
// multi-threaded Go program, as the spawner is) in a new user namespace,
// with files as its descriptors, and returns its pidfd.
func forkShell(t *testing.T, script string, files []int) (int, error) {
	t.Helper()
	c, err := newChild(Request{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	c.files = files
	_, pidfd, err := forkExec(&c.child, syscall.CLONE_NEWUSER|syscall.CLONE_NEWPID, 300000, 65536, -1)
	if err == nil {
		t.Cleanup(func() {
			unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
			unix.Waitid(unix.P_PIDFD, pidfd, nil, unix.WEXITED, nil)
			unix.Close(pidfd)
		})
	}
	return pidfd, err
}

// eachWay runs fn with the test process dumpable, where its children are
// forked, and not, where they are cloned into its memory if the build can
// (sharesMemory).
func eachWay(t *testing.T, fn func(t *testing.T)) {
	for _, way := range []struct {
		name     string
		dumpable int
	}{{"forked", 1}, {"cloned", 0}} {
		t.Run(way.name, func(t *testing.T) {
			if err := unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(way.dumpable), 0, 0, 0); err != nil {
				t.Fatal(err)
			}
			defer unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
			if want := cloneVM && way.dumpable == 0; sharesMemory() != want {
				t.Fatalf("sharesMemory %v with dumpable %d, want %v", sharesMemory(), way.dumpable, want)
			}
			fn(t)
		})
	}
}

// TestPlaceFilesMovesWhatATargetWouldReplace: a source descriptor whose
// number is a lower target's is moved before that target is replaced, and
// so is the report pipe, so that a failed exec is still reported when the
// child gets more descriptors than the pipe's number. The child moves its
// own copy: the caller's list stays as it was.
func TestPlaceFilesMovesWhatATargetWouldReplace(t *testing.T) {
	testutil.RequireRoot(t)
	eachWay(t, placeFiles)
}

func placeFiles(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	marker, err := os.Create(filepath.Join(t.TempDir(), "marker"))
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()
	// The marker's number is a target, and it goes to a higher one.
	m := int(marker.Fd())
	files := make([]int, m+8)
	for i := range files {
		files[i] = int(null.Fd())
	}
	files[1], files[len(files)-1] = int(outW.Fd()), m
	last := strconv.Itoa(len(files) - 1)
	given := slices.Clone(files)
	if _, err := forkShell(t, `readlink /proc/self/fd/`+last+` /proc/self/fd/`+strconv.Itoa(m)+`; echo done`, files); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(files, given) {
		t.Fatalf("the child changed the caller's descriptor list: %v, was %v", files, given)
	}
	outW.Close()
	out, _ := io.ReadAll(outR)
	want := marker.Name() + "\n/dev/null\ndone\n"
	if string(out) != want {
		t.Fatalf("the child's descriptors %s and %d: %q, want %q", last, m, out, want)
	}
	// The same descriptors with a program that cannot be run: the report
	// pipe's number is among the targets, and the failure still comes back.
	c, err := newChild(Request{Path: "/nonexistent/prog", Args: []string{"prog"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	c.files = files
	_, _, err = forkExec(&c.child, syscall.CLONE_NEWUSER, 300000, 65536, -1)
	if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "execve") {
		t.Fatalf("exec of a missing program: %v, want execve's ENOENT", err)
	}
}

// TestChildFailuresNameTheStep: a child that cannot chdir or exec reports
// which, with the errno, and is waited for (no zombie stays).
func TestChildFailuresNameTheStep(t *testing.T) {
	testutil.RequireRoot(t)
	eachWay(t, childFailures)
}

func childFailures(t *testing.T) {
	for _, tc := range []struct {
		req  Request
		step string
		err  error
	}{
		{Request{Path: "/bin/true", Args: []string{"true"}, Dir: "/nonexistent"}, "chdir", unix.ENOENT},
		{Request{Path: "/etc/passwd", Args: []string{"passwd"}}, "execve", unix.EACCES},
	} {
		c, err := newChild(tc.req, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = forkExec(&c.child, syscall.CLONE_NEWUSER, 300000, 65536, -1)
		c.close()
		if !errors.Is(err, tc.err) || !strings.HasPrefix(err.Error(), tc.step+":") {
			t.Errorf("%+v: %v, want %s: %v", tc.req, err, tc.step, tc.err)
		}
	}
	if children := childrenOf(t, os.Getpid()); children != "" {
		t.Fatalf("children left: %s", children)
	}
}

// childrenOf lists the children of every thread of process pid.
func childrenOf(t *testing.T, pid int) string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		all = append(all, strings.Fields(string(b))...)
	}
	return strings.Join(all, " ")
}

// TestBadRequestsAreRefusedBeforeTheFork: what newChild refuses.
func TestBadRequestsAreRefusedBeforeTheFork(t *testing.T) {
	for _, tc := range []struct {
		req  Request
		want string
	}{
		{Request{Args: []string{"x"}}, "no path"},
		{Request{Path: "/bin/true"}, "no arguments"},
		{Request{Path: "/bin/\x00true", Args: []string{"true"}}, "path"},
		{Request{Path: "/bin/true", Args: []string{"true", "a\x00b"}}, "args"},
		{Request{Path: "/bin/true", Args: []string{"true"}, Env: []string{"A=\x00"}}, "env"},
		{Request{Path: "/bin/true", Args: []string{"true"}, Dir: "/\x00"}, "dir"},
		{Request{Path: "/bin/true", Args: []string{"true"}, Bounding: []capability.Cap{99}}, "bounding"},
	} {
		c, err := newChild(tc.req, nil, nil)
		if err == nil {
			c.close()
			t.Errorf("%+v: accepted", tc.req)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want it to name %s", tc.req, err, tc.want)
		}
	}
}
