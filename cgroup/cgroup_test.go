package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/internal/testutil"
)

const testRoot = "berth-cgroup-test"

func manager(t *testing.T) Manager {
	t.Helper()
	testutil.RequireRoot(t)
	m, err := New(testRoot)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func group(t *testing.T, m Manager, id string) Group {
	t.Helper()
	g, err := m.Create(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Kill(); g.Remove() })
	return g
}

func TestLimitsAndPlacement(t *testing.T) {
	m := manager(t)
	g := group(t, m, fmt.Sprintf("t%d", time.Now().UnixNano()))
	if err := g.Set(Limits{CPUs: 0.5, MemoryBytes: 64 << 20, Pids: 100}); err != nil {
		t.Fatal(err)
	}
	if m.Version() == 1 {
		for file, want := range map[string]string{
			"/sys/fs/cgroup/cpu/" + testRoot + "/" + filepath.Base(g.Path()) + "/cpu.cfs_quota_us":         "50000",
			"/sys/fs/cgroup/memory/" + testRoot + "/" + filepath.Base(g.Path()) + "/memory.limit_in_bytes": fmt.Sprint(64 << 20),
			"/sys/fs/cgroup/pids/" + testRoot + "/" + filepath.Base(g.Path()) + "/pids.max":                "100",
		} {
			b, err := os.ReadFile(file)
			if err != nil || strings.TrimSpace(string(b)) != want {
				t.Errorf("%s = %q (%v), want %s", file, b, err, want)
			}
		}
	}
	cmd := exec.Command("/bin/sleep", "30")
	if err := g.Start(cmd); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.Contains(line, ":memory:") || strings.Contains(line, ":pids:") || strings.Contains(line, ":cpu:") || strings.HasPrefix(line, "0::") && m.Version() == 2 {
			if !strings.HasSuffix(line, "/"+testRoot+"/"+filepath.Base(g.Path())) {
				t.Errorf("child not in its group: %s", line)
			}
		}
	}
	// The daemon itself must never stay in a sandbox's group.
	procs, _ := g.Procs()
	for _, p := range procs {
		if p == os.Getpid() {
			t.Fatal("the test process (the daemon, in real life) is in the sandbox's group")
		}
	}
	if len(procs) != 1 || procs[0] != cmd.Process.Pid {
		t.Errorf("procs %v, want [%d]", procs, cmd.Process.Pid)
	}
	st, err := g.Stats()
	if err != nil || st.Pids != 1 {
		t.Errorf("stats %+v %v", st, err)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Load(filepath.Base(g.Path())); !os.IsNotExist(err) && !strings.Contains(fmt.Sprint(err), "not exist") {
		t.Errorf("load after remove: %v", err)
	}
}

func TestCgroupNamespaceRootedAtGroup(t *testing.T) {
	m := manager(t)
	g := group(t, m, fmt.Sprintf("ns%d", time.Now().UnixNano()))
	cmd := exec.Command("/bin/cat", "/proc/self/cgroup")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWCGROUP,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 1}},
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := g.Start(cmd); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if (strings.Contains(line, ":memory:") || strings.Contains(line, ":pids:")) && !strings.HasSuffix(line, ":/") {
			t.Errorf("cgroup namespace not rooted at the group: %s", line)
		}
	}
}

func TestMemoryLimitOOMKills(t *testing.T) {
	m := manager(t)
	g := group(t, m, fmt.Sprintf("oom%d", time.Now().UnixNano()))
	if err := g.Set(Limits{MemoryBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "-c", "b = bytearray(256 << 20); print(len(b))")
	if err := g.Start(cmd); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("want SIGKILL by the OOM killer, got %v", err)
	}
	st, err := g.Stats()
	if err != nil || st.OOMKills < 1 {
		t.Fatalf("stats %+v %v, want an oom kill", st, err)
	}
}

func TestInvalidIDLeavesNothing(t *testing.T) {
	m := manager(t)
	for _, id := range []string{"", "..", "a/b", "x\x00"} {
		if _, err := m.Create(id); err == nil {
			t.Errorf("Create(%q) succeeded", id)
		}
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup/memory/" + testRoot)
	for _, e := range entries {
		if e.IsDir() && (e.Name() == "a" || e.Name() == "..") {
			t.Errorf("left %s", e.Name())
		}
	}
}

// TestV2OnUnifiedMount exercises the v2 code on this host's hybrid cgroup2
// mount, which carries no controllers: groups, birth inside the group with
// CLONE_INTO_CGROUP, kill and removal. Limits need controllers and are only
// checked to fail clearly here.
func TestV2OnUnifiedMount(t *testing.T) {
	testutil.RequireRoot(t)
	mount := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(mount, "cgroup.procs")); err != nil {
		if m, err := New(testRoot); err == nil && m.Version() == 2 {
			mount = "/sys/fs/cgroup" // a pure v2 host: the main hierarchy
		} else {
			t.Fatalf("no cgroup2 mount to test on: %v", err)
		}
	}
	m, err := NewV2(mount, testRoot)
	if err != nil {
		t.Fatal(err)
	}
	g := group(t, m, fmt.Sprintf("v2%d", time.Now().UnixNano()))
	cmd := exec.Command("/bin/sleep", "30")
	if err := g.Start(cmd); err != nil {
		t.Fatal(err)
	}
	procs, err := g.Procs()
	if err != nil || len(procs) != 1 || procs[0] != cmd.Process.Pid {
		t.Fatalf("procs %v %v", procs, err)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Path()); !os.IsNotExist(err) {
		t.Fatalf("group still there: %v", err)
	}
}
