package spawn_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/cgroup"
	"github.com/berthsh/berth/internal/fds"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/spawn"
)

// TestMain doubles as the spawner (BERTH_SPAWN_TEST_SERVE=1), as
// berth-guest's spawner mode runs it: every inherited descriptor marked
// close-on-exec, then Serve on descriptor 3.
func TestMain(m *testing.M) {
	if os.Getenv("BERTH_SPAWN_TEST_SERVE") == "1" {
		if err := fds.CloseOnExecFrom(3); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := spawn.Serve(os.NewFile(3, "spawner")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func newSpawner(t *testing.T) *spawn.Spawner {
	t.Helper()
	testutil.RequireRoot(t)
	s := spawn.New(os.Args[0], []string{"spawner", "-test.run=^$"}, []string{"BERTH_SPAWN_TEST_SERVE=1"},
		slog.New(slog.DiscardHandler))
	t.Cleanup(func() { s.Close() })
	return s
}

const nsFlags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
	syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP

// shell returns a request that runs script in sh, in every namespace
// berth's sandboxes get, mapped to range 300000…+65536 and owned by 300000.
func shell(script string) spawn.Request {
	return spawn.Request{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"},
		Dir: "/", Cloneflags: nsFlags, HostID: 300000, Size: 65536, Owner: 300000, Setsid: true}
}

// child is a started shell that waits on its descriptor 3 until release.
type child struct {
	pid     int
	pidfd   *os.File
	out     *os.File
	release *os.File
}

// exited waits up to d for the child to exit.
func (c *child) exited(d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(c.pidfd.Fd()), Events: unix.POLLIN}}
	n, _ := unix.Poll(fds, int(d.Milliseconds()))
	return n == 1
}

// startShell starts script (which should end with `read x <&3` to wait)
// with a pipe as its output and another as its descriptor 3.
func startShell(t *testing.T, s *spawn.Spawner, script string, cg spawn.Cgroup) *child {
	t.Helper()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	holdR, holdW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pid, pidfd, err := s.Start(shell(script), spawn.Files{Output: outW, Extra: []*os.File{holdR}, Cgroup: cg})
	outW.Close()
	holdR.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{pid: pid, pidfd: pidfd, out: outR, release: holdW}
	t.Cleanup(func() {
		c.release.Close()
		unix.PidfdSendSignal(int(c.pidfd.Fd()), unix.SIGKILL, nil, 0)
		c.exited(5 * time.Second)
		c.pidfd.Close()
		c.out.Close()
	})
	return c
}

// readLines reads the child's output until it has n lines.
func (c *child) readLines(t *testing.T, n int) []string {
	t.Helper()
	var buf bytes.Buffer
	b := make([]byte, 4096)
	for strings.Count(buf.String(), "\n") < n {
		k, err := c.out.Read(b)
		buf.Write(b[:k])
		if err != nil {
			t.Fatalf("child output: %v (so far %q)", err, buf.String())
		}
	}
	return strings.Split(strings.TrimSpace(buf.String()), "\n")
}

// TestSpawnedChildIsOurs: the child is the spawner's, in its namespaces
// with the id map asked for, in a user namespace owned by the range; it
// holds only the descriptors it was given, never the spawner's socket;
// its pidfd reports its exit, and the spawner reaps it.
func TestSpawnedChildIsOurs(t *testing.T) {
	s := newSpawner(t)
	c := startShell(t, s, `cat /proc/self/uid_map /proc/self/gid_map; id -u; ls /proc/$$/fd | sort -n | tr '\n' ' '; echo; read x <&3; `, spawn.Cgroup{})
	lines := c.readLines(t, 4)
	if f := strings.Fields(lines[0]); !slices.Equal(f, []string{"0", "300000", "65536"}) {
		t.Errorf("uid_map %q, want 0 300000 65536", lines[0])
	}
	if f := strings.Fields(lines[1]); !slices.Equal(f, []string{"0", "300000", "65536"}) {
		t.Errorf("gid_map %q, want 0 300000 65536", lines[1])
	}
	if lines[2] != "0" {
		t.Errorf("runs as uid %s inside, want 0", lines[2])
	}
	// The shell's own descriptors: 0–2 and 3 (the pipe given); dash keeps
	// a descriptor of its own at 10 or above, never the spawner's.
	for _, fd := range strings.Fields(lines[3]) {
		n, _ := strconv.Atoi(fd)
		if n > 3 && n < 10 {
			t.Errorf("the child holds descriptor %d besides those given: %s", n, lines[3])
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.pid))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("PPid:\t%d\n", s.Pid()); !strings.Contains(string(status), want) {
		t.Errorf("the child's parent is not the spawner (want %q):\n%s", want, status)
	}
	if !strings.Contains(string(status), "Uid:\t300000\t300000\t300000\t300000") {
		t.Errorf("the child's host uid is not the range's root:\n%s", status)
	}
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", c.pid))
	if err != nil {
		t.Fatal(err)
	}
	defer userns.Close()
	const nsGetOwnerUID = 0xb704
	var owner uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, userns.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&owner))); e != 0 {
		t.Fatal(e)
	}
	if owner != 300000 {
		t.Errorf("the user namespace is owned by %d, want 300000", owner)
	}
	c.release.Close()
	if !c.exited(5 * time.Second) {
		t.Fatal("the child's pidfd did not report its exit")
	}
	for i := 0; ; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", c.pid)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if i == 500 {
			t.Fatal("the spawner did not reap its exited child")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSpawnIntoCgroup: the child is born in the group it is given, on v1
// (tasks files) and on v2 (the directory), with its cgroup namespace
// rooted there; no thread of the spawner is left in the group.
func TestSpawnIntoCgroup(t *testing.T) {
	s := newSpawner(t)
	t.Run("host", func(t *testing.T) {
		m, err := cgroup.New("berth-spawn-test")
		if err != nil {
			t.Fatal(err)
		}
		g, err := m.Create(fmt.Sprintf("spawn-%d-%d", os.Getpid(), time.Now().UnixNano()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			g.Kill()
			if err := g.Remove(); err != nil {
				t.Error(err)
			}
		})
		e, err := g.Entry()
		if err != nil {
			t.Fatal(err)
		}
		c := startShell(t, s, `while read -r l; do echo "$l"; done </proc/self/cgroup; echo end; read x <&3`, e)
		e.Close()
		lines := c.readLines(t, 2)
		procs, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(procs, []int{c.pid}) {
			t.Errorf("the group holds %v, want only the child %d", procs, c.pid)
		}
		for _, l := range lines {
			if l != "end" && !strings.HasSuffix(l, ":/") {
				t.Errorf("the child's cgroup namespace is not rooted at its group: %q", l)
			}
		}
		checkNoSpawnerThreadIn(t, s, "berth-spawn-test")
	})
	t.Run("v2", func(t *testing.T) {
		mount := ""
		for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
			var st syscall.Statfs_t
			if syscall.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
				mount = dir
			}
		}
		if mount == "" {
			t.Fatal("this host has no cgroup2 mount")
		}
		dir := filepath.Join(mount, fmt.Sprintf("berth-spawn-test-%d", os.Getpid()))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for i := 0; os.Remove(dir) != nil && i < 200; i++ {
				time.Sleep(10 * time.Millisecond)
			}
		})
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		c := startShell(t, s, `while read -r l; do echo "$l"; done </proc/self/cgroup; echo end; read x <&3`, spawn.Cgroup{Dir: f})
		f.Close()
		c.readLines(t, 2)
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(procs)) != strconv.Itoa(c.pid) {
			t.Errorf("the group holds %q, want only the child %d", procs, c.pid)
		}
		c.release.Close()
		c.exited(5 * time.Second)
	})
}

// checkNoSpawnerThreadIn fails if a thread of the spawner is in a group
// under root.
func checkNoSpawnerThreadIn(t *testing.T, s *spawn.Spawner, root string) {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/cgroup", s.Pid()))
	if len(tasks) == 0 {
		t.Fatal("the spawner has no threads to check")
	}
	for _, f := range tasks {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), "/"+root+"/") {
			t.Errorf("a thread of the spawner is left in the group: %s:\n%s", f, b)
		}
	}
}

// TestSpawnerEndsAndComesBack: a spawner that dies is started again at the
// next request; a closed one starts nothing, and children it started live.
func TestSpawnerEndsAndComesBack(t *testing.T) {
	s := newSpawner(t)
	c := startShell(t, s, `echo up; read x <&3`, spawn.Cgroup{})
	c.readLines(t, 1)
	first := s.Pid()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Wait until it is reaped, so the next Start meets a dead spawner.
	for i := 0; s.Pid() != 0 && i < 500; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	c2 := startShell(t, s, `echo up; read x <&3`, spawn.Cgroup{})
	c2.readLines(t, 1)
	if s.Pid() == first || s.Pid() == 0 {
		t.Errorf("spawner pid %d after the first (%d) was killed", s.Pid(), first)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Start(shell("true"), spawn.Files{}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Start after Close: %v, want an error that says closed", err)
	}
	if c.exited(0) {
		t.Error("a child did not outlive the spawner's death")
	}
	if c2.exited(0) {
		t.Error("a child did not outlive the spawner's close")
	}
}

// TestSpawnRefusals: a request that cannot start fails with a clear error
// and leaves no child (not even a zombie of this process).
func TestSpawnRefusals(t *testing.T) {
	s := newSpawner(t)
	missing := shell("true")
	missing.Path = "/nonexistent/berth-guest"
	if _, _, err := s.Start(missing, spawn.Files{}); err == nil || !strings.Contains(err.Error(), "/nonexistent/berth-guest") {
		t.Errorf("a missing binary: %v, want an error naming it", err)
	}
	dir := shell("true")
	dir.Path = "/usr"
	if _, _, err := s.Start(dir, spawn.Files{}); err == nil || !strings.Contains(err.Error(), "/usr") {
		t.Errorf("a directory: %v, want an error naming it", err)
	}
	nouser := shell("true")
	nouser.Cloneflags = syscall.CLONE_NEWNS
	if _, _, err := s.Start(nouser, spawn.Files{}); err == nil || !strings.Contains(err.Error(), "user namespace") {
		t.Errorf("no user namespace: %v", err)
	}
	if z := zombies(t, s.Pid()); len(z) > 0 {
		t.Errorf("children of the spawner exited unreaped: %v", z)
	}
}

// zombies lists parent's children that exited and wait to be reaped.
func zombies(t *testing.T, parent int) []int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[0] == "Z" && fields[1] == strconv.Itoa(parent) {
			pid, _ := strconv.Atoi(strings.Fields(s)[0])
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestSpawnSideBySide: concurrent requests each get their own child.
func TestSpawnSideBySide(t *testing.T) {
	s := newSpawner(t)
	const n = 16
	pids := make([]int, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			r, w, err := os.Pipe()
			if err != nil {
				errs[i] = err
				return
			}
			defer r.Close()
			pid, pidfd, err := s.Start(shell(fmt.Sprintf("echo %d", i)), spawn.Files{Output: w})
			w.Close()
			if err != nil {
				errs[i] = err
				return
			}
			pidfd.Close()
			out, _ := io.ReadAll(r)
			if strings.TrimSpace(string(out)) != strconv.Itoa(i) {
				errs[i] = fmt.Errorf("child %d wrote %q", i, out)
			}
			pids[i] = pid
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	slices.Sort(pids)
	if len(slices.Compact(pids)) != n {
		t.Errorf("pids %v are not %d distinct children", pids, n)
	}
}

// capLine reads a capability set ("CapBnd") from lines of a status file.
func capLine(t *testing.T, lines []string, set string) uint64 {
	t.Helper()
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, set+":"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in %q", set, lines)
	return 0
}

// TestSpawnNarrowsTheBoundingSet: with Bounding, the child execs with only
// those capabilities in its bounding set, yet still holds every capability
// (carried by its inheritable set); once a program empties its
// inheritable set, what it execs has the bounding set's alone. Without
// Bounding the sets are as a new user namespace leaves them.
func TestSpawnNarrowsTheBoundingSet(t *testing.T) {
	s := newSpawner(t)
	_, last, err := capability.Mask(nil)
	if err != nil {
		t.Fatal(err)
	}
	full := uint64(1)<<(last+1) - 1
	const show = `grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status`
	run := func(req spawn.Request) []string {
		t.Helper()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		_, pidfd, err := s.Start(req, spawn.Files{Output: w})
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer pidfd.Close()
		out, _ := io.ReadAll(r)
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	narrow := shell(show + `; echo --; setpriv --inh-caps=-all ` + show)
	narrow.Bounding = []capability.Cap{unix.CAP_CHOWN, unix.CAP_KILL}
	lines := run(narrow)
	i := slices.Index(lines, "--")
	if i < 0 {
		t.Fatalf("output %q", lines)
	}
	before, after := lines[:i], lines[i+1:]
	keep := uint64(1<<unix.CAP_CHOWN | 1<<unix.CAP_KILL)
	for set, want := range map[string]uint64{"CapBnd": keep, "CapPrm": full, "CapEff": full, "CapInh": full, "CapAmb": 0} {
		if got := capLine(t, before, set); got != want {
			t.Errorf("the child's %s = %x, want %x", set, got, want)
		}
	}
	for set, want := range map[string]uint64{"CapBnd": keep, "CapPrm": keep, "CapEff": keep, "CapInh": 0} {
		if got := capLine(t, after, set); got != want {
			t.Errorf("after an empty inheritable set, %s = %x, want %x", set, got, want)
		}
	}
	plain := run(shell(show))
	for set, want := range map[string]uint64{"CapBnd": full, "CapPrm": full, "CapInh": 0} {
		if got := capLine(t, plain, set); got != want {
			t.Errorf("without Bounding, %s = %x, want %x", set, got, want)
		}
	}
	bad := shell("true")
	bad.Bounding = []capability.Cap{capability.Cap(last + 1)}
	if _, _, err := s.Start(bad, spawn.Files{}); err == nil || !strings.Contains(err.Error(), "bounding") {
		t.Errorf("a capability the kernel lacks: %v, want an error naming the bounding set", err)
	}
}

// TestSpawnedChildHasDefaultSignals: the child execs with no signal
// blocked (the spawner blocks them all across its fork) and none ignored,
// even one the spawner itself was started with ignored (as make starts
// its children with 32 and 33).
func TestSpawnedChildHasDefaultSignals(t *testing.T) {
	s := newSpawner(t)
	signal.Ignore(unix.SIGPIPE, unix.SIGHUP) // inherited by the spawner this test starts
	defer signal.Reset(unix.SIGPIPE, unix.SIGHUP)
	// The shell's own status, read with builtins.
	c := startShell(t, s, `while read -r k v; do case $k in SigBlk:|SigIgn:) echo "$k$v";; esac; done </proc/self/status; read x <&3`, spawn.Cgroup{})
	for _, l := range c.readLines(t, 2) {
		name, v, _ := strings.Cut(l, ":")
		if strings.Trim(v, "0") != "" {
			t.Errorf("the child's %s: %s", name, v)
		}
	}
}
