package cgroup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
)

const testRoot = "berth-cgroup-test"

// TestMain doubles as two helpers that the tests re-execute the test
// binary as: a memory hog (BERTH_CGROUP_TEST_HOG=MiB touches that many MiB)
// and a v1 Start from the main goroutine (BERTH_CGROUP_TEST_MAIN=1).
func TestMain(m *testing.M) {
	if s := os.Getenv("BERTH_CGROUP_TEST_HOG"); s != "" {
		mib, _ := strconv.Atoi(s)
		b := make([]byte, mib<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		os.Exit(0)
	}
	if os.Getenv("BERTH_CGROUP_TEST_MAIN") != "" {
		if err := startsFromMainGoroutine(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startsFromMainGoroutine calls Start from the main goroutine, whose
// forking goroutine then often lands on the main thread, which the runtime
// cannot retire: no thread of this process may be left in the group.
func startsFromMainGoroutine() error {
	m, err := New(testRoot)
	if err != nil {
		return err
	}
	for range 10 {
		g, err := m.Create(uniqueID("main"))
		if err != nil {
			return err
		}
		cmd := exec.Command("/bin/sleep", "30")
		err = g.Start(cmd, nil)
		var left []string
		tasks, _ := filepath.Glob("/proc/self/task/*/cgroup")
		for _, f := range tasks {
			if b, _ := os.ReadFile(f); strings.Contains(string(b), "/"+testRoot+"/") {
				left = append(left, f)
			}
		}
		if err == nil {
			err = g.Kill()
			cmd.Wait()
		}
		err = errors.Join(err, g.Remove())
		if len(left) > 0 {
			return fmt.Errorf("threads left in %s after Start: %v", g.Path(), left)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// uniqueID is a group name no other test run uses.
func uniqueID(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano())
}

// hostManager is New's manager for this host.
func hostManager(t *testing.T) Manager {
	t.Helper()
	testutil.RequireRoot(t)
	m, err := New(testRoot)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// hostV1 is a manager over this host's v1 hierarchies; it skips where
// the host has none (a pure v2 host).
func hostV1(t testing.TB) (Manager, map[string]string) {
	t.Helper()
	testutil.RequireRoot(t)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mounts, err := v1Mounts(f)
	if err != nil {
		t.Fatal(err)
	}
	if mounts["memory"] == "" {
		t.Skip("this host has no cgroup v1 hierarchies")
	}
	m, err := NewV1(mounts, testRoot)
	if err != nil {
		t.Fatal(err)
	}
	return m, mounts
}

// hostV2Mount is a cgroup2 mount of this host: /sys/fs/cgroup on a pure v2
// host, the hybrid /sys/fs/cgroup/unified otherwise.
func hostV2Mount(t testing.TB) string {
	t.Helper()
	testutil.RequireRoot(t)
	for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st syscall.Statfs_t
		if syscall.Statfs(dir, &st) == nil && st.Type == 0x63677270 { // CGROUP2_SUPER_MAGIC
			return dir
		}
	}
	t.Skip("this host has no cgroup2 mount")
	return ""
}

// create makes a group that the test's cleanup kills and removes.
func create(t *testing.T, m Manager, prefix string) (Group, string) {
	t.Helper()
	id := uniqueID(prefix)
	g, err := m.Create(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Kill(); err != nil {
			t.Error(err)
		}
		if err := g.Remove(); err != nil {
			t.Error(err)
		}
	})
	return g, id
}

// start starts cmd in g; the test's cleanup thaws the group (a frozen
// process may not die of SIGKILL), kills its processes and reaps cmd.
func start(t *testing.T, g Group, cmd *exec.Cmd) {
	t.Helper()
	if err := g.Start(cmd, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Thaw(); g.Kill(); cmd.Process.Kill(); cmd.Wait() })
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// cgroupLines maps each controller (v2: "") of /proc/<pid>/cgroup to its path.
func cgroupLines(t *testing.T, pid string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for line := range strings.Lines(readTrim(t, "/proc/"+pid+"/cgroup")) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			t.Fatalf("odd cgroup line %q", line)
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

// checkNotInGroup fails if a thread of the test process is in dir's group.
func checkNotInGroup(t *testing.T, g Group) {
	t.Helper()
	procs, err := g.Procs()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(procs, os.Getpid()) {
		t.Fatalf("the test process (the daemon, in real life) is in %s: %v", g.Path(), procs)
	}
}

func TestV1Mounts(t *testing.T) {
	info := `22 27 0:20 / /sys rw,nosuid shared:7 - sysfs sysfs rw
30 22 0:25 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:26 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:27 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,xattr,name=systemd
35 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw shared:15 - cgroup cgroup rw,cpu,cpuacct
36 30 0:31 / /sys/fs/cgroup/my\040memory rw shared:16 - cgroup cgroup rw,memory
37 30 0:32 / /sys/fs/cgroup/pids rw shared:17 - cgroup cgroup rw,pids
38 30 0:32 / /mnt/pids-again rw shared:17 - cgroup cgroup rw,pids
39 30 0:33 / /sys/fs/cgroup/net_cls,net_prio rw shared:18 - cgroup cgroup rw,net_cls,net_prio
40 30 0:34 / /sys/fs/cgroup/freezer rw shared:19 - cgroup cgroup rw,freezer
`
	got, err := v1Mounts(strings.NewReader(info))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"cpu":     "/sys/fs/cgroup/cpu,cpuacct",
		"cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
		"freezer": "/sys/fs/cgroup/freezer",
		"memory":  "/sys/fs/cgroup/my memory",
		"pids":    "/sys/fs/cgroup/pids",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestValidation(t *testing.T) {
	for _, id := range []string{"", ".", "..", "a/b", "../x", "x\x00", strings.Repeat("x", 256)} {
		if validName(id) == nil {
			t.Errorf("validName(%q) accepted", id)
		}
	}
	for _, id := range []string{"sb-1", "a.b", "..x", strings.Repeat("x", 255)} {
		if err := validName(id); err != nil {
			t.Errorf("validName(%q): %v", id, err)
		}
	}
	for _, l := range []Limits{{CPUs: -1}, {MemoryBytes: -1}, {Pids: -1}} {
		if validLimits(l) == nil {
			t.Errorf("validLimits(%+v) accepted", l)
		}
	}
	for cpus, want := range map[float64]int64{0: -1, 0.5: 50000, 2: 200000, 0.001: minQuota} {
		if got := cpuQuota(cpus); got != want {
			t.Errorf("cpuQuota(%v) = %d, want %d", cpus, got, want)
		}
	}
}

// TestV2FilesOnPlainDir checks what the v2 code writes and reads against a
// temporary directory of plain files standing in for a cgroup2 hierarchy
// with controllers (this host's only cgroup2 mount has none). Needs no root.
func TestV2FilesOnPlainDir(t *testing.T) {
	mount := t.TempDir()
	touch := func(dir string, files map[string]string) {
		t.Helper()
		for name, val := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(val), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	touch(mount, map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n", "cgroup.subtree_control": ""})
	if err := os.Mkdir(filepath.Join(mount, "berth"), 0o755); err != nil {
		t.Fatal(err)
	}
	touch(filepath.Join(mount, "berth"), map[string]string{"cgroup.subtree_control": ""})
	m, err := NewV2(mount, "berth")
	if err != nil {
		t.Fatal(err)
	}
	if m.Version() != 2 {
		t.Fatalf("version %d", m.Version())
	}
	g, err := m.Create("sb")
	if err != nil {
		t.Fatal(err)
	}
	// No controller files yet: Set says which controller is missing.
	if err := g.Set(Limits{CPUs: 1}); err == nil || !strings.Contains(err.Error(), "controller cpu is not enabled") {
		t.Fatalf("Set without controllers: %v", err)
	}
	touch(g.Path(), map[string]string{
		"cpu.max": "", "memory.max": "", "memory.swap.max": "", "pids.max": "",
		"cpu.stat":       "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 10\nnr_throttled 4\nthrottled_usec 9\n",
		"pids.events":    "max 12\n",
		"memory.current": "4096\n", "memory.peak": "8192\n", "pids.current": "3\n",
		"memory.events": "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n",
	})
	check := func(want map[string]string) {
		t.Helper()
		for name, val := range want {
			if got := readTrim(t, filepath.Join(g.Path(), name)); got != val {
				t.Errorf("%s = %q, want %q", name, got, val)
			}
		}
	}
	if err := g.Set(Limits{CPUs: 1.5, MemoryBytes: 64 << 20, Pids: 50}); err != nil {
		t.Fatal(err)
	}
	check(map[string]string{"cpu.max": "150000 100000", "memory.max": "67108864", "memory.swap.max": "0", "pids.max": "50"})
	if err := g.Set(Limits{}); err != nil {
		t.Fatal(err)
	}
	check(map[string]string{"cpu.max": "max 100000", "memory.max": "max", "memory.swap.max": "0", "pids.max": "max"})
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if want := (Stats{CPUUsageNs: 1500000, MemoryCurrent: 4096, MemoryPeak: 8192, Pids: 3, OOMKills: 2}); st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	if h, err := g.LimitHits(); err != nil || h != (LimitHits{Pids: 12, CPUThrottled: 4}) {
		t.Errorf("limit hits %+v %v", h, err)
	}
	os.Remove(filepath.Join(g.Path(), "pids.events")) // pids controller off
	if h, err := g.LimitHits(); err != nil || h != (LimitHits{CPUThrottled: 4}) {
		t.Errorf("limit hits without pids.events: %+v %v", h, err)
	}
	os.Remove(filepath.Join(g.Path(), "memory.peak")) // before Linux 5.19
	if st, err := g.Stats(); err != nil || st.MemoryPeak != 0 || st.MemoryCurrent != 4096 {
		t.Errorf("stats without memory.peak: %+v %v", st, err)
	}
	if _, err := m.Load("absent"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(absent): %v", err)
	}
	if _, err := m.Load("sb"); err != nil {
		t.Errorf("Load(sb): %v", err)
	}

	// A kernel before 5.2 has no cgroup.freeze: no group is frozen, and
	// Freeze says why it cannot freeze one.
	if why := m.CanFreeze(); why != noV2Freezer {
		t.Errorf("CanFreeze without cgroup.freeze: %q", why)
	}
	if err := g.Freeze(t.Context()); !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "Linux 5.2") {
		t.Errorf("Freeze without cgroup.freeze: %v, want ErrUnsupported saying why", err)
	}
	if frozen, err := g.Frozen(); err != nil || frozen {
		t.Errorf("Frozen without cgroup.freeze: %v %v", frozen, err)
	}
	if err := g.Thaw(); err != nil {
		t.Errorf("Thaw without cgroup.freeze: %v", err)
	}
	touch(filepath.Join(mount, "berth"), map[string]string{"cgroup.freeze": "0\n"})
	touch(g.Path(), map[string]string{"cgroup.freeze": "0\n", "cgroup.events": "populated 1\nfrozen 1\n"})
	if why := m.CanFreeze(); why != "" {
		t.Errorf("CanFreeze: %q", why)
	}
	if err := g.Freeze(t.Context()); err != nil {
		t.Errorf("Freeze: %v", err)
	}
	check(map[string]string{"cgroup.freeze": "1"})
	if frozen, err := g.Frozen(); err != nil || !frozen {
		t.Errorf("Frozen after Freeze: %v %v", frozen, err)
	}
	touch(g.Path(), map[string]string{"cgroup.events": "populated 1\nfrozen 0\n"})
	if err := g.Thaw(); err != nil {
		t.Errorf("Thaw: %v", err)
	}
	check(map[string]string{"cgroup.freeze": "0"})
}

// TestLifecycle runs a group of New's kind (v1 on this host) through
// Create, Set, Start, Procs, Stats, Kill and Remove.
func TestLifecycle(t *testing.T) {
	m := hostManager(t)
	g, id := create(t, m, "life")
	if err := g.Set(Limits{CPUs: 0.5, MemoryBytes: 64 << 20, Pids: 100}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{} // file -> value
	var controllers []string
	if m.Version() == 1 {
		_, mounts := hostV1(t)
		dir := func(c string) string { return filepath.Join(mounts[c], testRoot, id) }
		want[filepath.Join(dir("cpu"), "cpu.cfs_period_us")] = "100000"
		want[filepath.Join(dir("cpu"), "cpu.cfs_quota_us")] = "50000"
		want[filepath.Join(dir("memory"), "memory.limit_in_bytes")] = "67108864"
		if exists(filepath.Join(dir("memory"), "memory.memsw.limit_in_bytes")) {
			want[filepath.Join(dir("memory"), "memory.memsw.limit_in_bytes")] = "67108864"
		}
		want[filepath.Join(dir("pids"), "pids.max")] = "100"
		for c := range mounts {
			controllers = append(controllers, c)
		}
	} else {
		want[filepath.Join(g.Path(), "cpu.max")] = "50000 100000"
		want[filepath.Join(g.Path(), "memory.max")] = "67108864"
		want[filepath.Join(g.Path(), "pids.max")] = "100"
		controllers = []string{""}
	}
	for file, val := range want {
		if got := readTrim(t, file); got != val {
			t.Errorf("%s = %q, want %q", file, got, val)
		}
	}

	cmd := exec.Command("/bin/sleep", "30")
	start(t, g, cmd)
	checkNotInGroup(t, g)
	pid := strconv.Itoa(cmd.Process.Pid)
	lines := cgroupLines(t, pid)
	for _, c := range controllers {
		if p := lines[c]; !strings.HasSuffix(p, "/"+testRoot+"/"+id) {
			t.Errorf("child's %q cgroup is %q, want the group", c, p)
		}
	}
	procs, err := g.Procs()
	if err != nil || !slices.Equal(procs, []int{cmd.Process.Pid}) {
		t.Errorf("procs %v %v, want [%d]", procs, err, cmd.Process.Pid)
	}
	st, err := g.Stats()
	if err != nil || st.Pids != 1 || st.MemoryCurrent <= 0 || st.MemoryPeak < st.MemoryCurrent {
		t.Errorf("stats %+v %v", st, err)
	}

	loaded, err := m.Load(id)
	if err != nil || loaded.Path() != g.Path() {
		t.Fatalf("Load: %v %v", loaded, err)
	}
	if err := loaded.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("after Kill: %v, want SIGKILL", err)
	}
	if procs, err := g.Procs(); err != nil || len(procs) != 0 {
		t.Errorf("procs after Kill: %v %v", procs, err)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for file := range want {
		if _, err := os.Stat(filepath.Dir(file)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Remove: %v", filepath.Dir(file), err)
		}
	}
	if err := g.Remove(); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if _, err := m.Load(id); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load after Remove: %v", err)
	}
}

// TestV1SetRaisesAndLowers changes a limit both ways: with swap accounting
// the memory and memory+swap limits must be written in the right order.
func TestV1SetRaisesAndLowers(t *testing.T) {
	m, mounts := hostV1(t)
	g, id := create(t, m, "raise")
	mem := filepath.Join(mounts["memory"], testRoot, id)
	for _, l := range []Limits{{MemoryBytes: 32 << 20}, {MemoryBytes: 64 << 20, CPUs: 2}, {MemoryBytes: 16 << 20}, {}} {
		if err := g.Set(l); err != nil {
			t.Fatalf("Set(%+v): %v", l, err)
		}
		got := readTrim(t, filepath.Join(mem, "memory.limit_in_bytes"))
		if l.MemoryBytes > 0 && got != strconv.FormatInt(l.MemoryBytes, 10) {
			t.Errorf("Set(%+v): memory.limit_in_bytes %s", l, got)
		}
		if sw := filepath.Join(mem, "memory.memsw.limit_in_bytes"); exists(sw) && readTrim(t, sw) != got {
			t.Errorf("Set(%+v): memsw %s, limit %s", l, readTrim(t, sw), got)
		}
	}
	if q := readTrim(t, filepath.Join(mounts["cpu"], testRoot, id, "cpu.cfs_quota_us")); q != "-1" {
		t.Errorf("unlimited cpu quota %s, want -1", q)
	}
}

// TestV1CreateFailureLeavesNothing makes Create fail half-way, in the last
// hierarchy, and checks that the ones before it are cleaned up.
func TestV1CreateFailureLeavesNothing(t *testing.T) {
	m, mounts := hostV1(t)
	id := uniqueID("half")
	var dirs []string
	for _, mount := range mounts {
		real, err := filepath.EvalSymlinks(mount)
		if err != nil {
			t.Fatal(err)
		}
		if d := filepath.Join(real, testRoot, id); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs)
	last := dirs[len(dirs)-1]
	if err := os.Mkdir(last, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(last) })
	if _, err := m.Create(id); !errors.Is(err, os.ErrExist) {
		t.Fatalf("Create over an existing dir: %v", err)
	}
	for _, d := range dirs[:len(dirs)-1] {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", d, err)
		}
	}
	if !exists(last) {
		t.Errorf("Create removed %s, which it did not make", last)
	}
	for _, bad := range []string{"", "..", "a/b", "../../escape"} {
		if _, err := m.Create(bad); err == nil {
			t.Errorf("Create(%q) succeeded", bad)
		}
	}
	if exists(filepath.Join(mounts["memory"], "escape")) || exists(filepath.Join(mounts["memory"], testRoot, "a")) {
		t.Error("an invalid id made a directory")
	}
}

// TestOOMKill runs a process that touches 256 MiB in a group limited to
// 32 MiB: the OOM killer kills it and Stats counts it.
func TestOOMKill(t *testing.T) {
	m := hostManager(t)
	g, _ := create(t, m, "oom")
	if err := g.Set(Limits{MemoryBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "BERTH_CGROUP_TEST_HOG=256")
	start(t, g, cmd)
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("hog ended with %v, want SIGKILL from the OOM killer", err)
	}
	st, err := g.Stats()
	// The kernel's high-water mark may pass the limit by a few pages while
	// it charges and reclaims; 256 KiB of slack still proves the 256 MiB
	// allocation was stopped at the limit.
	if err != nil || st.OOMKills < 1 || st.MemoryPeak > 32<<20+256<<10 {
		t.Fatalf("stats %+v %v, want an OOM kill and a peak within 32 MiB (+256 KiB)", st, err)
	}
	if n, err := g.OOMKills(); err != nil || n != st.OOMKills {
		t.Errorf("OOMKills %d %v, Stats %d", n, err, st.OOMKills)
	}
}

// startReporter starts in g a shell that prints its own /proc/self/cgroup
// with builtins only (so no other process of it exists), then execs sleep;
// with ns it is started in new user and cgroup namespaces, root inside
// mapped to uid 100000 outside. It returns the lines the child printed.
func startReporter(t *testing.T, g Group, ns bool) (*exec.Cmd, []string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `while read -r l; do echo "$l"; done </proc/self/cgroup; echo end; exec /bin/sleep 30`)
	if ns {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWCGROUP,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 1}},
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd.Stdout, cmd.Stderr = w, w
	start(t, g, cmd)
	w.Close()
	var lines []string
	sc := bufio.NewScanner(r)
	for sc.Scan() && sc.Text() != "end" {
		lines = append(lines, sc.Text())
	}
	if len(lines) == 0 {
		t.Fatalf("the child printed no cgroups (%v)", sc.Err())
	}
	return cmd, lines
}

// checkNamespaceRoot starts a child with CLONE_NEWCGROUP in g and checks
// that it sees itself at the root of every hierarchy while the host sees it
// in g (in each of controllers).
func checkNamespaceRoot(t *testing.T, g Group, id string, controllers []string) {
	t.Helper()
	cmd, lines := startReporter(t, g, true)
	for _, line := range lines {
		if !strings.HasSuffix(line, ":/") {
			t.Errorf("cgroup namespace not rooted at the group: %q", line)
		}
	}
	host := cgroupLines(t, strconv.Itoa(cmd.Process.Pid))
	for _, c := range controllers {
		if p := host[c]; !strings.HasSuffix(p, "/"+testRoot+"/"+id) {
			t.Errorf("child's %q cgroup is %q, want the group", c, p)
		}
	}
}

// TestV1CgroupNamespaceRootedAtGroup: a child started with CLONE_NEWCGROUP
// sees itself at the root of every hierarchy.
func TestV1CgroupNamespaceRootedAtGroup(t *testing.T) {
	m, mounts := hostV1(t)
	g, id := create(t, m, "ns")
	controllers := []string{"cpu", "memory", "pids"}
	for _, c := range []string{"cpuacct", "freezer"} {
		if mounts[c] != "" {
			controllers = append(controllers, c)
		}
	}
	checkNamespaceRoot(t, g, id, controllers)
}

// TestV2CgroupNamespaceRootedAtGroup: the same for a child born with
// CLONE_INTO_CGROUP on a cgroup2 mount.
func TestV2CgroupNamespaceRootedAtGroup(t *testing.T) {
	m, err := NewV2(hostV2Mount(t), testRoot)
	if err != nil {
		t.Fatal(err)
	}
	g, id := create(t, m, "v2ns")
	checkNamespaceRoot(t, g, id, []string{""})
}

// TestV2OnHostMount runs the v2 code on this host's cgroup2 mount (on this
// host the hybrid /sys/fs/cgroup/unified, which has no controllers: Set
// must fail there naming the controller; TestV2FilesOnPlainDir covers the
// files it writes and reads against plain files). The child, born inside
// the group through CLONE_INTO_CGROUP, reports its own cgroup.
func TestV2OnHostMount(t *testing.T) {
	mount := hostV2Mount(t)
	m, err := NewV2(mount, testRoot)
	if err != nil {
		t.Fatal(err)
	}
	g, id := create(t, m, "v2")
	err = g.Set(Limits{MemoryBytes: 64 << 20})
	if !exists(filepath.Join(g.Path(), "memory.max")) {
		if err == nil || !strings.Contains(err.Error(), "controller cpu is not enabled") {
			t.Errorf("Set without controllers: %v, want an error naming the controller", err)
		}
	} else if err != nil {
		t.Errorf("Set: %v", err)
	}

	cmd, lines := startReporter(t, g, false)
	if !slices.Contains(lines, "0::/"+testRoot+"/"+id) {
		t.Errorf("child's cgroups %q, want 0::/%s/%s", lines, testRoot, id)
	}
	checkNotInGroup(t, g)
	procs, err := g.Procs()
	if err != nil || !slices.Equal(procs, []int{cmd.Process.Pid}) {
		t.Fatalf("procs %v %v, want [%d]", procs, err, cmd.Process.Pid)
	}
	if _, err := g.Stats(); err != nil {
		t.Errorf("Stats: %v", err)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("after Kill: %v, want SIGKILL", err)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("group still there: %v", err)
	}
	if _, err := m.Load(id); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load after Remove: %v", err)
	}
}

// TestKillManyAndRemoveSubgroups kills a group with a tree of processes
// and removes it although it holds a subgroup.
func TestKillManyAndRemoveSubgroups(t *testing.T) {
	m := hostManager(t)
	g, _ := create(t, m, "many")
	cmd := exec.Command("/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; wait")
	start(t, g, cmd)
	deadline := time.Now().Add(2 * time.Second)
	for {
		procs, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		if len(procs) == 9 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("procs %v, want 9", procs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if procs, err := g.Procs(); err != nil || len(procs) != 0 {
		t.Fatalf("procs after Kill %v %v", procs, err)
	}
	if err := os.Mkdir(filepath.Join(g.Path(), "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if exists(g.Path()) {
		t.Fatal("group left after Remove")
	}
}

// TestStartFromMainThread runs startsFromMainGoroutine in a fresh process.
func TestStartFromMainThread(t *testing.T) {
	testutil.RequireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "BERTH_CGROUP_TEST_MAIN=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// TestConcurrentStarts starts processes in many groups at once and checks
// that no thread of the daemon is left in any of them.
func TestConcurrentStarts(t *testing.T) {
	m := hostManager(t)
	const n = 16
	groups := make([]Group, n)
	cmds := make([]*exec.Cmd, n)
	for i := range n {
		groups[i], _ = create(t, m, fmt.Sprintf("conc%d", i))
		cmds[i] = exec.Command("/bin/sleep", "30")
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = groups[i].Start(cmds[i], nil) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		t.Cleanup(func() { cmds[i].Process.Kill(); cmds[i].Wait() })
	}
	for i, g := range groups {
		checkNotInGroup(t, g)
		procs, err := g.Procs()
		if err != nil || !slices.Equal(procs, []int{cmds[i].Process.Pid}) {
			t.Errorf("group %d procs %v %v, want [%d]", i, procs, err, cmds[i].Process.Pid)
		}
	}
	// Every thread of this process is back outside berth's groups.
	tasks, err := filepath.Glob("/proc/self/task/*/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), "/"+testRoot+"/") {
			t.Errorf("%s: %s", f, b)
		}
	}
}

// TestStartOnThread: onThread runs on the forking thread just before the
// fork (the child is born with the credentials it gave that thread), no
// thread of this process keeps them, and its error fails Start with
// nothing started. On v1 and v2.
func TestStartOnThread(t *testing.T) {
	v1, _ := hostV1(t)
	v2, err := NewV2(hostV2Mount(t), testRoot)
	if err != nil {
		t.Fatal(err)
	}
	const gid = 4242
	egid := func(t *testing.T, status string) string {
		t.Helper()
		for line := range strings.Lines(readTrim(t, status)) {
			if rest, ok := strings.CutPrefix(line, "Gid:"); ok {
				return strings.Fields(rest)[1]
			}
		}
		t.Fatalf("%s: no Gid line", status)
		return ""
	}
	for name, m := range map[string]Manager{"v1": v1, "v2": v2} {
		t.Run(name, func(t *testing.T) {
			g, _ := create(t, m, "onthread")
			cmd := exec.Command("/bin/sleep", "30")
			err := g.Start(cmd, func() error {
				// This thread's alone: the syscall package's Setresgid would change every thread.
				if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), gid, ^uintptr(0)); e != 0 {
					return e
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			if got := egid(t, fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)); got != fmt.Sprint(gid) {
				t.Errorf("the child's effective gid is %s, want the forking thread's %d", got, gid)
			}
			// The forking thread is thrown away: its goroutine ends locked, and
			// the runtime ends the thread right after, which may be a moment
			// after Start returned; no goroutine can run on it meanwhile.
			kept := func() (found []string) {
				tasks, _ := filepath.Glob("/proc/self/task/*/status")
				for _, task := range tasks {
					b, err := os.ReadFile(task) // gone: the thread has exited
					for line := range strings.Lines(string(b)) {
						if rest, ok := strings.CutPrefix(line, "Gid:"); ok && err == nil && strings.Fields(rest)[1] == fmt.Sprint(gid) {
							found = append(found, task)
						}
					}
				}
				return found
			}
			deadline := time.Now().Add(2 * time.Second)
			for len(kept()) > 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if left := kept(); len(left) > 0 {
				t.Errorf("%v kept the forking thread's credentials", left)
			}
			refused := exec.Command("/bin/sleep", "30")
			if err := g.Start(refused, func() error { return errors.New("not on this thread") }); err == nil ||
				!strings.Contains(err.Error(), "not on this thread") || refused.Process != nil {
				t.Errorf("Start after onThread failed: %v, process %v", err, refused.Process)
			}
		})
	}
}

// requireOrFail skips a test that this host cannot run, or fails it where
// CI=true, so that nothing skips silently there.
func requireOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s, and CI=true turns the skip into a failure", why)
	}
	t.Skip(why)
}

// eachFreezer runs test once for each kind of group this host can freeze:
// "v1" in its v1 hierarchies, "v2" on its cgroup2 mount (on this hybrid
// host the unified mount, whose groups have cgroup.freeze although no
// controller is enabled there).
func eachFreezer(t *testing.T, test func(t *testing.T, m Manager)) {
	t.Run("v1", func(t *testing.T) {
		m, _ := hostV1(t)
		if why := m.CanFreeze(); why != "" {
			requireOrFail(t, why)
		}
		test(t, m)
	})
	t.Run("v2", func(t *testing.T) {
		m, err := NewV2(hostV2Mount(t), testRoot)
		if err != nil {
			t.Fatal(err)
		}
		if why := m.CanFreeze(); why != "" {
			requireOrFail(t, why)
		}
		test(t, m)
	})
}

// waitProcs waits (up to 2 s) until g holds n processes, and returns them.
func waitProcs(t *testing.T, g Group, n int) []int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		procs, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		if len(procs) == n {
			return procs
		}
		if time.Now().After(deadline) {
			t.Fatalf("procs %v, want %d", procs, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cpuTicks is the CPU time (utime+stime, in clock ticks) that pids have
// used, from /proc/<pid>/stat.
func cpuTicks(t *testing.T, pids []int) int64 {
	t.Helper()
	var sum int64
	for _, pid := range pids {
		stat := readTrim(t, fmt.Sprintf("/proc/%d/stat", pid))
		// pid (comm) state ppid ... utime stime: fields 14 and 15, the
		// 12th and 13th after the comm, which may hold spaces.
		fields := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
		for _, f := range fields[11:13] {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/stat: %v", pid, err)
			}
			sum += n
		}
	}
	return sum
}

// waitRunning waits (up to 5 s) until pids have used 10 more ticks of CPU.
func waitRunning(t *testing.T, pids []int) {
	t.Helper()
	from := cpuTicks(t, pids)
	deadline := time.Now().Add(5 * time.Second)
	for cpuTicks(t, pids) < from+10 {
		if time.Now().After(deadline) {
			t.Fatalf("%v used %d ticks of CPU in 5 s, want 10: not running", pids, cpuTicks(t, pids)-from)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freezerState is what the kernel's own file says of g: v1's freezer.state,
// or v2's cgroup.events "frozen 0" or "frozen 1".
func freezerState(t *testing.T, m Manager, g Group, id string) string {
	t.Helper()
	if m.Version() == 1 {
		_, mounts := hostV1(t)
		return readTrim(t, filepath.Join(mounts["freezer"], testRoot, id, "freezer.state"))
	}
	n, err := readKeyed(g.Path(), "cgroup.events", "frozen")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint("frozen ", n)
}

// thawedState and frozenState are freezerState's answers for a thawed and
// a frozen group.
func thawedState(m Manager) string {
	if m.Version() == 1 {
		return "THAWED"
	}
	return "frozen 0"
}

func frozenState(m Manager) string {
	if m.Version() == 1 {
		return "FROZEN"
	}
	return "frozen 1"
}

// TestFreezeAndThaw freezes a group whose shell forked a busy loop: neither
// uses CPU while frozen, Start refuses the group, and both run again after
// Thaw. Freeze and Thaw twice do nothing more.
func TestFreezeAndThaw(t *testing.T) {
	eachFreezer(t, func(t *testing.T, m Manager) {
		g, id := create(t, m, "freeze")
		cmd := exec.Command("/bin/sh", "-c", "while :; do :; done & wait")
		start(t, g, cmd)
		procs := waitProcs(t, g, 2) // the shell and the loop it forked
		if frozen, err := g.Frozen(); err != nil || frozen {
			t.Fatalf("Frozen before Freeze: %v %v", frozen, err)
		}
		waitRunning(t, procs)

		if err := g.Freeze(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got, want := freezerState(t, m, g, id), frozenState(m); got != want {
			t.Errorf("after Freeze the kernel says %q, want %q", got, want)
		}
		if frozen, err := g.Frozen(); err != nil || !frozen {
			t.Errorf("Frozen after Freeze: %v %v", frozen, err)
		}
		ticks := cpuTicks(t, procs)
		before, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if got := cpuTicks(t, procs); got != ticks {
			t.Errorf("frozen processes used %d ticks of CPU in 300 ms", got-ticks)
		}
		if after, err := g.Stats(); err != nil || after.CPUUsageNs != before.CPUUsageNs {
			t.Errorf("frozen group's CPU usage went from %d to %d ns (%v)", before.CPUUsageNs, after.CPUUsageNs, err)
		}
		refused := exec.Command("/bin/true")
		if err := g.Start(refused, nil); err == nil || !strings.Contains(err.Error(), "frozen") || refused.Process != nil {
			t.Errorf("Start in a frozen group: %v, process %v", err, refused.Process)
		}
		checkNotInGroup(t, g)
		if err := g.Freeze(t.Context()); err != nil {
			t.Errorf("second Freeze: %v", err)
		}

		if err := g.Thaw(); err != nil {
			t.Fatal(err)
		}
		if got, want := freezerState(t, m, g, id), thawedState(m); got != want {
			t.Errorf("after Thaw the kernel says %q, want %q", got, want)
		}
		if frozen, err := g.Frozen(); err != nil || frozen {
			t.Errorf("Frozen after Thaw: %v %v", frozen, err)
		}
		waitRunning(t, procs)
		if err := g.Thaw(); err != nil {
			t.Errorf("second Thaw: %v", err)
		}
	})
}

// TestKillFrozen kills a frozen group, loaded afresh as after a daemon
// restart: every process dies (on v1 only once thawed), the group is left
// thawed and empty, and Remove deletes it. Remove deletes a frozen empty
// group too.
func TestKillFrozen(t *testing.T) {
	eachFreezer(t, func(t *testing.T, m Manager) {
		g, id := create(t, m, "killfrozen")
		cmd := exec.Command("/bin/sh", "-c", "for i in 1 2 3; do sleep 30 & done; while :; do :; done & wait")
		start(t, g, cmd)
		waitProcs(t, g, 5)
		if err := g.Freeze(t.Context()); err != nil {
			t.Fatal(err)
		}
		loaded, err := m.Load(id)
		if err != nil {
			t.Fatal(err)
		}
		if frozen, err := loaded.Frozen(); err != nil || !frozen {
			t.Fatalf("Frozen of the loaded group: %v %v", frozen, err)
		}
		if err := loaded.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("after Kill: %v, want SIGKILL", err)
		}
		if procs, err := g.Procs(); err != nil || len(procs) != 0 {
			t.Errorf("procs after Kill: %v %v", procs, err)
		}
		if frozen, err := g.Frozen(); err != nil || frozen {
			t.Errorf("Frozen after Kill: %v %v", frozen, err)
		}
		if err := g.Remove(); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Load(id); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Load after Remove: %v", err)
		}

		empty, id := create(t, m, "frozenempty")
		if err := empty.Freeze(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got, want := freezerState(t, m, empty, id), frozenState(m); got != want {
			t.Errorf("an empty group after Freeze: the kernel says %q, want %q", got, want)
		}
		if err := empty.Remove(); err != nil {
			t.Fatalf("Remove of a frozen empty group: %v", err)
		}
		if _, err := m.Load(id); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Load after Remove: %v", err)
		}
	})
}

// TestFreezeCanceled: Freeze with a context already canceled fails and
// leaves the group running.
func TestFreezeCanceled(t *testing.T) {
	eachFreezer(t, func(t *testing.T, m Manager) {
		g, id := create(t, m, "canceled")
		cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
		start(t, g, cmd)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := g.Freeze(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Freeze with a canceled context: %v, want context.Canceled", err)
		}
		if frozen, err := g.Frozen(); err != nil || frozen {
			t.Errorf("Frozen: %v %v", frozen, err)
		}
		if got, want := freezerState(t, m, g, id), thawedState(m); got != want {
			t.Errorf("the kernel says %q, want %q", got, want)
		}
		waitRunning(t, []int{cmd.Process.Pid})
	})
}

// unfreezable starts in g a process that no freezer can stop: mkdir on a
// FUSE mount waits, uninterruptibly, for the lock of the mount's root
// directory, which another process (outside g) holds while it waits to
// look up a file for a server that never answers (the kernel holds
// requests until the server's INIT reply). The test's cleanup aborts the
// FUSE connection, which ends both waits, and unmounts.
func unfreezable(t *testing.T, g Group) *exec.Cmd {
	t.Helper()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) {
		requireOrFail(t, "this host has no /dev/fuse")
	}
	if err != nil {
		t.Fatal(err)
	}
	abort := sync.OnceFunc(func() { unix.Close(fd) }) // the server's last close aborts the connection
	dir := t.TempDir()
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := unix.Mount("berth-test", dir, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		abort()
		t.Fatalf("mount fuse: %v", err)
	}
	t.Cleanup(func() {
		abort()
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	holder := exec.Command("/bin/cat", filepath.Join(dir, "x"))
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	waitBlocked(t, holder.Process.Pid)
	cmd := exec.Command("/bin/mkdir", filepath.Join(dir, "y"))
	start(t, g, cmd)
	// Runs before start's cleanup, which cannot kill mkdir while it waits.
	t.Cleanup(abort)
	waitBlocked(t, cmd.Process.Pid)
	return cmd
}

// waitBlocked waits (up to 2 s) until pid has slept uninterruptibly (state
// D) for 50 ms, which a page fault's short wait does not.
func waitBlocked(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	var since time.Time
	for {
		stat := readTrim(t, fmt.Sprintf("/proc/%d/stat", pid))
		switch {
		case strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])[0] != "D":
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= 50*time.Millisecond:
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d never blocked on the FUSE mount: %s, wchan %q", pid, stat, readTrim(t, fmt.Sprintf("/proc/%d/wchan", pid)))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFreezeTimeoutThaws: a group that cannot freeze, for one of its
// processes cannot stop, stays FREEZING (v1) or "frozen 0" (v2) with the
// others stopped; when Freeze's context ends it thaws the group again, so
// the others run.
func TestFreezeTimeoutThaws(t *testing.T) {
	eachFreezer(t, func(t *testing.T, m Manager) {
		g, id := create(t, m, "unfreezable")
		busy := exec.Command("/bin/sh", "-c", "while :; do :; done")
		start(t, g, busy)
		unfreezable(t, g)
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		began := time.Now()
		err := g.Freeze(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Freeze of an unfreezable group: %v, want context.DeadlineExceeded", err)
		}
		if took := time.Since(began); took > time.Second {
			t.Errorf("Freeze returned %v after a 200 ms deadline", took)
		}
		if m.Version() == 1 && !strings.Contains(err.Error(), "FREEZING") {
			t.Errorf("Freeze's error %q does not say the group was still FREEZING", err)
		}
		if frozen, err := g.Frozen(); err != nil || frozen {
			t.Errorf("Frozen after the failed Freeze: %v %v", frozen, err)
		}
		if got, want := freezerState(t, m, g, id), thawedState(m); got != want {
			t.Errorf("after the failed Freeze the kernel says %q, want %q", got, want)
		}
		waitRunning(t, []int{busy.Process.Pid})
	})
}

// TestV1WithoutFreezer: on a v1 host without the freezer hierarchy, groups
// work as before and Freeze says why it cannot freeze them.
func TestV1WithoutFreezer(t *testing.T) {
	_, mounts := hostV1(t)
	for name, freezer := range map[string]string{"absent": "", "not mounted": "/nonexistent/freezer"} {
		t.Run(name, func(t *testing.T) {
			without := maps.Clone(mounts)
			delete(without, "freezer")
			if freezer != "" {
				without["freezer"] = freezer
			}
			m, err := NewV1(without, testRoot)
			if err != nil {
				t.Fatal(err)
			}
			if why := m.CanFreeze(); why != noV1Freezer {
				t.Errorf("CanFreeze: %q, want %q", why, noV1Freezer)
			}
			g, _ := create(t, m, "nofreezer")
			cmd := exec.Command("/bin/sleep", "30")
			start(t, g, cmd)
			err = g.Freeze(t.Context())
			if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), noV1Freezer) {
				t.Errorf("Freeze: %v, want ErrUnsupported saying %q", err, noV1Freezer)
			}
			if frozen, err := g.Frozen(); err != nil || frozen {
				t.Errorf("Frozen: %v %v", frozen, err)
			}
			if err := g.Thaw(); err != nil {
				t.Errorf("Thaw: %v", err)
			}
			if p := cgroupLines(t, strconv.Itoa(cmd.Process.Pid))["freezer"]; strings.Contains(p, testRoot) {
				t.Errorf("the child is in freezer group %s of a manager without the freezer", p)
			}
			if err := g.Kill(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// benchManagers are the managers the benchmarks compare: v1 with and
// without the freezer hierarchy, and v2 on the host's cgroup2 mount.
func benchManagers(b *testing.B) []struct {
	name string
	m    Manager
} {
	b.Helper()
	v1, mounts := hostV1(b)
	without := maps.Clone(mounts)
	delete(without, "freezer")
	v1NoFreezer, err := NewV1(without, testRoot)
	if err != nil {
		b.Fatal(err)
	}
	v2, err := NewV2(hostV2Mount(b), testRoot)
	if err != nil {
		b.Fatal(err)
	}
	return []struct {
		name string
		m    Manager
	}{{"v1", v1}, {"v1-no-freezer", v1NoFreezer}, {"v2", v2}}
}

// BenchmarkStartInGroup is a sandbox group's life: Create, Start of
// /bin/sleep, Kill, Wait and Remove.
func BenchmarkStartInGroup(b *testing.B) {
	for _, bm := range benchManagers(b) {
		b.Run(bm.name, func(b *testing.B) {
			prefix := uniqueID("bench")
			i := 0
			for b.Loop() {
				i++
				g, err := bm.m.Create(fmt.Sprintf("%s-%d", prefix, i))
				if err != nil {
					b.Fatal(err)
				}
				cmd := exec.Command("/bin/sleep", "30")
				if err := g.Start(cmd, nil); err != nil {
					b.Fatal(err)
				}
				if err := g.Kill(); err != nil {
					b.Fatal(err)
				}
				cmd.Wait()
				if err := g.Remove(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFreezeThaw freezes and thaws a group that runs one busy loop.
func BenchmarkFreezeThaw(b *testing.B) {
	for _, bm := range benchManagers(b) {
		if bm.m.CanFreeze() != "" {
			continue
		}
		b.Run(bm.name, func(b *testing.B) {
			g, err := bm.m.Create(uniqueID("benchfreeze"))
			if err != nil {
				b.Fatal(err)
			}
			cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
			if err := g.Start(cmd, nil); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				if err := errors.Join(g.Kill(), g.Remove()); err != nil {
					b.Error(err)
				}
				cmd.Wait()
			})
			for b.Loop() {
				if err := g.Freeze(b.Context()); err != nil {
					b.Fatal(err)
				}
				if err := g.Thaw(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
