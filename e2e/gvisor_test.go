package e2e

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testnet"
	"github.com/berthsh/berth/internal/testutil"
)

// startGvisorDaemon is a daemon whose gvisor runtime must be available (the
// test fails, never skips, where CI=true and runsc cannot run).
func startGvisorDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	runsc := testutil.Runsc(t)
	t.Setenv("BERTH_RUNSC", runsc)
	d := startDaemon(t, "", args...)
	rts, err := d.client.Runtimes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range rts {
		if rt.Name == "gvisor" {
			if !rt.Available {
				t.Fatalf("the gvisor runtime cannot run here: %s", rt.Reason)
			}
			return d
		}
	}
	t.Fatalf("no gvisor runtime in %+v", rts)
	return nil
}

// TestGvisorThroughTheAPI drives a gvisor sandbox through the same API as
// a native one: create by name, exec, files, background processes, limits,
// stop and start, a daemon killed with -9 and restarted, delete.
func TestGvisorThroughTheAPI(t *testing.T) {
	d := startGvisorDaemon(t)
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor", Labels: map[string]string{"tier": "g"},
		Limits: api.Limits{MemoryBytes: 256 << 20, Pids: 128, OpenFiles: 512}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Runtime != "gvisor" {
		t.Fatalf("runtime %q", sb.Runtime)
	}
	// The kernel answering is gVisor's, not the host's.
	// (gVisor reports a release of its own, whatever the host runs.)
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "uname -r"})
	if err != nil || r.ExitCode != 0 || !strings.HasSuffix(string(r.Stdout), "gvisor\n") || strings.Contains(unix.ByteSliceToString(host.Release[:]), "gvisor") {
		t.Fatalf("the kernel inside: %q %v", r.Stdout, err)
	}
	r, err = d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "id -un; hostname; ulimit -n"})
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "user\n"+sb.ID+"\n512\n" {
		t.Fatalf("exec: %+v %v", r, err)
	}
	if _, err := d.client.Write(ctx, sb.ID, api.WriteRequest{Path: "/home/user/notes.txt", Content: "line one\n"}); err != nil {
		t.Fatal(err)
	}
	if ed, err := d.client.Edit(ctx, sb.ID, api.EditRequest{Path: "/home/user/notes.txt", Old: "one", New: "two"}); err != nil || ed.Occurrences != 1 {
		t.Fatalf("edit: %+v %v", ed, err)
	}
	if g, err := d.client.Grep(ctx, sb.ID, api.GrepRequest{Pattern: "two", Path: "/home/user"}); err != nil || len(g.Matches) != 1 {
		t.Fatalf("grep: %+v %v", g, err)
	}
	p, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := d.client.Stats(ctx, sb.ID); err != nil || st.MemoryBytes <= 0 || st.Pids <= 0 {
		t.Fatalf("stats: %+v %v", st, err)
	}

	// A daemon killed with -9 finds the sandbox running when it comes back:
	// the process still counts, the files are there.
	d.kill9()
	d.start()
	got, err := d.client.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if pr, err := d.client.GetProcess(ctx, sb.ID, p.Pid); err != nil || !pr.Running {
		t.Fatalf("background process after restart: %+v %v", pr, err)
	}
	before := readCount(t, d, sb.ID)
	time.Sleep(300 * time.Millisecond)
	if after := readCount(t, d, sb.ID); after <= before {
		t.Fatalf("the loop stopped counting after the restart: %d then %d", before, after)
	}

	if _, err := d.client.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if tr := d.tracesRunning(sb.ID); len(tr) != 0 {
		t.Fatalf("left running after stop: %v", tr)
	}
	if _, err := d.client.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	b, err := d.client.ReadFile(ctx, sb.ID, "/home/user/notes.txt")
	if err != nil || string(b) != "line two\n" {
		t.Fatalf("after start: %q %v", b, err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if tr := d.traces(sb.ID); len(tr) != 0 {
		t.Fatalf("traces after delete: %v", tr)
	}
}

// TestGvisorDeletePausedAndStop deletes a paused (frozen) gvisor sandbox,
// which once hung in runsc delete and left it in state error, and checks
// that a daemon stopped gracefully leaves no mount in its state directory
// (runsc pins an empty network namespace in its root).
func TestGvisorDeletePausedAndStop(t *testing.T) {
	d := startGvisorDaemon(t)
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("delete of a paused sandbox: %v", err)
	}
	if tr := d.traces(sb.ID); len(tr) != 0 {
		t.Fatalf("traces after delete: %v", tr)
	}
	d.stop()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, " "+d.state+"/") {
			t.Errorf("mounted after the daemon stopped: %s", line)
		}
	}
}

// TestGvisorPauseInItsKernel pauses a gvisor sandbox inside gVisor's
// kernel (runsc pause), never with the host's cgroup freezer: under
// systrap a host freeze interrupts the stubs' seccomp notifications, and
// gVisor then killed a process with SIGSEGV once in CI (after pause, fork
// and resume; google/gvisor#14429). Each of several rounds pauses while a
// counter runs, finds the host group unfrozen and the counter still, forks
// the paused sandbox, resumes, and finds the counter moving and a process
// started before the first pause alive. The last pause outlives a daemon
// killed with -9. (TestGvisorDeletePausedAndStop deletes a paused one.)
func TestGvisorPauseInItsKernel(t *testing.T) {
	d := startGvisorDaemon(t)
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	sleeper, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "i=0; while :; do i=$((i+1)); echo $i > /home/user/n; mv /home/user/n /home/user/count; sleep 0.02; done"}); err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(d.state, "runtimes", "gvisor", "sandboxes", sb.ID, "upper", "home", "user", "count")
	read := func() string {
		b, _ := os.ReadFile(count)
		return string(b)
	}
	waitFor(t, 10*time.Second, func() bool { return read() != "" })
	const rounds = 5
	for round := range rounds {
		if got, err := c.Pause(ctx, sb.ID); err != nil || got.State != api.StatePaused {
			t.Fatalf("round %d: pause: %+v %v", round, got, err)
		}
		if frozen := hostFrozen(t, sb.ID); frozen != "" {
			t.Fatalf("round %d: the host's freezer holds the paused sandbox: %s", round, frozen)
		}
		before := read()
		time.Sleep(150 * time.Millisecond)
		if after := read(); after != before {
			t.Fatalf("round %d: the counter ran while paused: %q → %q", round, before, after)
		}
		forks, err := c.Fork(ctx, sb.ID, api.ForkRequest{})
		if err != nil || len(forks.Sandboxes) != 1 {
			t.Fatalf("round %d: fork of the paused sandbox: %+v %v", round, forks, err)
		}
		if out := mustExec(t, c, forks.Sandboxes[0].ID, "cat /home/user/count"); out != before {
			t.Fatalf("round %d: the fork's counter is %q, the source's %q", round, out, before)
		}
		if err := c.DeleteSandbox(ctx, forks.Sandboxes[0].ID); err != nil {
			t.Fatal(err)
		}
		if round == rounds-1 {
			d.kill9()
			d.start()
			if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StatePaused {
				t.Fatalf("after a restart: %+v %v", got, err)
			}
			if after := read(); after != before {
				t.Fatalf("the counter ran across the restart: %q → %q", before, after)
			}
		}
		if got, err := c.Resume(ctx, sb.ID); err != nil || got.State != api.StateRunning {
			t.Fatalf("round %d: resume: %+v %v", round, got, err)
		}
		waitFor(t, 5*time.Second, func() bool { return read() != before })
		if p, err := c.GetProcess(ctx, sb.ID, sleeper.Pid); err != nil || !p.Running {
			t.Fatalf("round %d: the process started before the pauses: %+v %v", round, p, err)
		}
	}
	if out := mustExec(t, c, sb.ID, "echo alive"); out != "alive\n" {
		t.Fatalf("exec after the last resume: %q", out)
	}
}

// TestGvisorPausesKillNothing pauses and resumes a gvisor sandbox many
// times while it starts processes in a loop, and finds every one of them
// exited 0. With the host's cgroup freezer as the pause, this loop lost
// about one process in twenty cycles (killed by SIGSEGV or SIGKILL:
// 51 in 1000 cycles, against 0 in 995 with runsc pause).
func TestGvisorPausesKillNothing(t *testing.T) {
	d := startGvisorDaemon(t)
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "while :; do /bin/true || echo \"exit $?\" >> /tmp/lost; done"}); err != nil {
		t.Fatal(err)
	}
	const cycles = 120
	for range cycles {
		if _, err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		if _, err := c.Resume(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out := mustExec(t, c, sb.ID, "cat /tmp/lost 2>/dev/null | sort | uniq -c"); out != "" {
		t.Fatalf("processes lost across %d pauses:\n%s", cycles, out)
	}
}

// TestGvisorResumesAnOlderPause resumes a sandbox the way a berth from
// before runsc pause left it paused: held by its cgroup's freezer, running
// by runsc's word. The new daemon thaws it.
func TestGvisorResumesAnOlderPause(t *testing.T) {
	d := startGvisorDaemon(t)
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	d.kill9()
	runsc := exec.Command(testutil.Runsc(t), "--root="+filepath.Join(d.state, "runtimes", "gvisor", "runsc"), "resume", sb.ID)
	if out, err := runsc.CombinedOutput(); err != nil {
		t.Fatalf("runsc resume: %v: %s", err, out)
	}
	v1, v2 := "/sys/fs/cgroup/freezer/berth/"+sb.ID+"/freezer.state", "/sys/fs/cgroup/berth/"+sb.ID+"/cgroup.freeze"
	if err := os.WriteFile(v1, []byte("FROZEN"), 0); err != nil {
		if err := os.WriteFile(v2, []byte("1"), 0); err != nil {
			t.Fatalf("no freezer to hold the sandbox: %v", err)
		}
	}
	waitFor(t, 5*time.Second, func() bool { return hostFrozen(t, sb.ID) != "" })
	d.start()
	if got, err := c.Resume(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("resume: %+v %v", got, err)
	}
	if frozen := hostFrozen(t, sb.ID); frozen != "" {
		t.Fatalf("resumed and still %s", frozen)
	}
	if out := mustExec(t, c, sb.ID, "echo alive"); out != "alive\n" {
		t.Fatalf("exec after resume: %q", out)
	}
}

// hostFrozen says how the host's cgroup freezer holds sandbox id (v1's
// freezer.state, v2's cgroup.freeze), or "" when it does not.
func hostFrozen(t *testing.T, id string) string {
	t.Helper()
	if b, err := os.ReadFile("/sys/fs/cgroup/freezer/berth/" + id + "/freezer.state"); err == nil {
		if s := strings.TrimSpace(string(b)); s != "THAWED" {
			return "freezer.state " + s
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/berth/" + id + "/cgroup.freeze"); err == nil {
		if s := strings.TrimSpace(string(b)); s != "0" {
			return "cgroup.freeze " + s
		}
	}
	return ""
}

func readCount(t *testing.T, d *daemon, id string) int {
	t.Helper()
	r, err := d.client.Exec(t.Context(), id, api.ExecRequest{Shell: "cat /tmp/count"})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("read count: %+v %v", r, err)
	}
	return atoiOr(strings.TrimSpace(string(r.Stdout)))
}

// TestRuntimeChoice covers how a runtime is named: the list with
// capabilities and reasons, a daemon default, and the 400s that name the
// runtimes there are.
func TestRuntimeChoice(t *testing.T) {
	d := startGvisorDaemon(t, "--default-runtime", "gvisor")
	ctx := t.Context()
	rts, err := d.client.Runtimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]api.Runtime{}
	for _, rt := range rts {
		byName[rt.Name] = rt
	}
	g, n := byName["gvisor"], byName["native"]
	if !g.Default || n.Default || !g.Available || !n.Available {
		t.Fatalf("runtimes: %+v", rts)
	}
	if c := g.Capabilities; c == nil || !c.StopStart || !c.Snapshot || c.IDMappedLayers || c.Missing["idmapped_layers"] == "" {
		t.Fatalf("gvisor capabilities: %+v", g.Capabilities)
	}
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil || sb.Runtime != "gvisor" {
		t.Fatalf("create with the default: %+v %v", sb, err)
	}
	out, stderr, code := d.cli("", "create", "--runtime", "native")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "sb-") {
		t.Fatalf("berth create --runtime native: %d %q %q", code, out, stderr)
	}
	if nsb, err := d.client.GetSandbox(ctx, strings.TrimSpace(out)); err != nil || nsb.Runtime != "native" {
		t.Fatalf("created by the CLI: %+v %v", nsb, err)
	}
	_, err = d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "kata"})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "runtime") || !strings.Contains(err.Error(), "gvisor") || !strings.Contains(err.Error(), "native") {
		t.Fatalf("an unknown runtime: %v", err)
	}

	// A runtime that cannot run here says why, at start and at create.
	d2 := startDaemon(t, "", "--runsc", "/nonexistent/runsc")
	_, err = d2.client.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor"})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "cannot run on this host") || !strings.Contains(err.Error(), "runsc") {
		t.Fatalf("gvisor without runsc: %v", err)
	}
	if d2.sandboxDirs() != 0 {
		t.Fatal("a refused create left a sandbox directory")
	}
	if _, err := os.Stat(d2.state + "/runtimes/gvisor/sandboxes"); err == nil {
		t.Fatal("an unavailable runtime made its state directory")
	}
}

// TestPauseWithMemory saves a gvisor sandbox whole and brings it back: a
// counting loop resumes where it stopped with its pid, a file and a TCP
// listener are there, and a daemon killed with -9 while the sandbox is
// saved restores it after its restart. A runtime without checkpoints
// refuses, and nothing of a saved sandbox runs.
func TestPauseWithMemory(t *testing.T) {
	d := startGvisorDaemon(t)
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	loop, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.02; done"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-m", "http.server", "--bind", "127.0.0.1", "8123"}}); err != nil {
		t.Fatal(err)
	}
	if r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo kept > /home/user/f; for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8123/ && exit 0; sleep 0.05; done; exit 1"}); err != nil || r.ExitCode != 0 {
		t.Fatalf("prepare: %+v %v", r, err)
	}
	paused, err := d.client.PauseMemory(ctx, sb.ID)
	if err != nil || paused.State != api.StatePaused || !paused.Checkpointed {
		t.Fatalf("pause with memory: %+v %v", paused, err)
	}
	if tr := d.tracesRunning(sb.ID); len(tr) != 0 {
		t.Fatalf("still running after a checkpoint: %v", tr)
	}
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("exec while checkpointed: %v", err)
	}
	before := readCountFile(t, d, sb.ID)

	d.kill9()
	d.start()
	got, err := d.client.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StatePaused || !got.Checkpointed {
		t.Fatalf("after a daemon restart: %+v %v", got, err)
	}
	resumed, err := d.client.Resume(ctx, sb.ID)
	if err != nil || resumed.State != api.StateRunning || resumed.Checkpointed {
		t.Fatalf("resume: %+v %v", resumed, err)
	}
	if p, err := d.client.GetProcess(ctx, sb.ID, loop.Pid); err != nil || !p.Running {
		t.Fatalf("the loop after resume (pid %d): %+v %v", loop.Pid, p, err)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "cat /tmp/count; sleep 0.3; cat /tmp/count /home/user/f; curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8123/"})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("after resume: %+v %v", r, err)
	}
	f := strings.Fields(string(r.Stdout))
	if len(f) != 4 || atoiOr(f[0]) < before || atoiOr(f[1]) <= atoiOr(f[0]) || f[2] != "kept" || f[3] != "200" {
		t.Fatalf("after resume (count %d when saved): %q", before, r.Stdout)
	}

	// Stop discards a checkpoint; delete leaves nothing.
	if _, err := d.client.PauseMemory(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if st, err := d.client.StopSandbox(ctx, sb.ID); err != nil || st.State != api.StateStopped {
		t.Fatalf("stop a checkpointed sandbox: %+v %v", st, err)
	}
	if _, err := d.client.PauseMemory(ctx, sb.ID); !errdefs.IsConflict(err) {
		t.Fatalf("pause with memory of a stopped sandbox: %v", err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if tr := d.traces(sb.ID); len(tr) != 0 {
		t.Fatalf("traces after delete: %v", tr)
	}

	nsb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "native"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.client.PauseMemory(ctx, nsb.ID)
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "native") || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("pause with memory on native: %v", err)
	}
	if got, err := d.client.GetSandbox(ctx, nsb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("native sandbox after a refused pause: %+v %v", got, err)
	}
}

func readCountFile(t *testing.T, d *daemon, id string) int {
	t.Helper()
	b, err := os.ReadFile(d.state + "/runtimes/gvisor/sandboxes/" + id + "/upper/tmp/count")
	if err != nil {
		t.Fatal(err)
	}
	return atoiOr(strings.TrimSpace(string(b)))
}

func atoiOr(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// TestE2BPauseKeepsMemoryOnGvisor: E2B's pause keeps a sandbox's memory;
// on gvisor it is berth's pause with memory (the processes saved, CPU and
// memory freed), and E2B's connect restores them.
func TestE2BPauseKeepsMemoryOnGvisor(t *testing.T) {
	d := startGvisorDaemon(t, "--default-runtime", "gvisor")
	c := e2bControl{t, d}
	ctx := t.Context()
	id := c.create(map[string]any{"templateID": "base", "timeout": 300}).SandboxID
	p, err := d.client.StartProcess(ctx, id, api.ExecRequest{Cmd: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	c.json("POST", "/sandboxes/"+id+"/pause", nil, http.StatusNoContent, nil)
	if b, err := d.client.GetSandbox(ctx, id); err != nil || b.State != api.StatePaused || !b.Checkpointed {
		t.Fatalf("berth's view after E2B's pause: %+v %v", b, err)
	}
	if info := c.get(id); info.State != "paused" {
		t.Fatalf("E2B's view after pause: %s", info.State)
	}
	var got e2bSandbox
	c.json("POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 60}, http.StatusCreated, &got)
	if pr, err := d.client.GetProcess(ctx, id, p.Pid); err != nil || !pr.Running {
		t.Fatalf("the process after connect: %+v %v", pr, err)
	}
}

// TestGvisorBootLimits: pids and open files are rlimits of gVisor's kernel,
// fixed at boot. A create from the warm pool with other values gets a
// sandbox booted with them, and a change on a running sandbox is refused.
func TestGvisorBootLimits(t *testing.T) {
	d := startGvisorDaemon(t, "--default-runtime", "gvisor", "--warm-pool", "1")
	ctx := t.Context()
	waitFor(t, 30*time.Second, func() bool {
		pools, err := d.client.Pools(ctx)
		return err == nil && len(pools) == 1 && pools[0].Ready == 1
	})
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{Pids: 100, OpenFiles: 300}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "awk '/Max processes/{print $3}' /proc/self/limits; ulimit -n"})
	if err != nil || string(r.Stdout) != "100\n300\n" {
		t.Fatalf("rlimits inside: %q %v", r.Stdout, err)
	}
	_, err = d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{Pids: 200}})
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "limits.pids") || !strings.Contains(err.Error(), "gvisor") {
		t.Fatalf("a pids change on gvisor: %v", err)
	}
}

// TestGvisorNetwork: a gvisor sandbox's network goes through the same link
// and policy as native's: open and allowlist, a refusal logged, HTTPS,
// none and back, stop and start, a daemon killed with -9; and a sandbox
// booted without a link is told it cannot get one.
func TestGvisorNetwork(t *testing.T) {
	inet := newInternet(t)
	d := startGvisorDaemon(t, "--default-runtime", "gvisor")
	d.stop()
	d.args = append(d.args, d.withInternet(inet)...)
	d.start()
	curl := func(id, when string) {
		t.Helper()
		if out, code := sh(t, d, id, "curl -sS -m 5 http://web.test/hello"); code != 0 || out != "web web.test /hello\n" {
			// Where the query was lost (it failed once in CI, "Resolving
			// timed out", and never here): the daemon's records of the
			// sandbox's queries and the upstream's.
			recs, _ := d.client.Egress(t.Context(), id, client.EgressQuery{})
			t.Fatalf("%s: %q %d\negress: %+v\nupstream queries: %q", when, out, code, recs, inet.Queries())
		}
	}
	open := createWith(t, d, api.Network{Mode: api.NetworkOpen})
	curl(open, "open")
	py := `python3 -c "import urllib.request; print(urllib.request.urlopen('https://api.test/', timeout=5).status)"`
	if out, code := sh(t, d, open, py); code != 0 || strings.TrimSpace(out) != "200" {
		t.Fatalf("https in open mode: %q %d", out, code)
	}
	al := createWith(t, d, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test:80"}})
	curl(al, "allowlist")
	if out, code := sh(t, d, al, "curl -sS -m 5 http://evil.test/"); code != 6 {
		t.Fatalf("a name not allowed: %q %d, want curl's 6", out, code)
	}
	waitEgress(t, d, al, "the refused query", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressDNS && r.Name == "evil.test" && !r.Allowed
	})
	if _, err := d.client.SetNetwork(t.Context(), al, api.Network{Mode: api.NetworkNone}); err != nil {
		t.Fatal(err)
	}
	if _, code := sh(t, d, al, "curl -sS -m 3 http://web.test/"); code == 0 {
		t.Fatal("mode none still reached the test net")
	}
	if _, err := d.client.SetNetwork(t.Context(), al, api.Network{Mode: api.NetworkOpen}); err != nil {
		t.Fatal(err)
	}
	curl(al, "none and back to open")
	if _, err := d.client.StopSandbox(t.Context(), open); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StartSandbox(t.Context(), open); err != nil {
		t.Fatal(err)
	}
	curl(open, "after stop and start")
	d.kill9()
	d.start()
	if err := testnet.WaitFor(t.Context(), 5*time.Second, func() bool {
		_, code := sh(t, d, open, "curl -sS -m 1 http://web.test/")
		return code == 0
	}); err != nil {
		t.Fatal("egress not back after the daemon's restart")
	}
	none := createWith(t, d, api.Network{Mode: api.NetworkNone})
	_, err := d.client.SetNetwork(t.Context(), none, api.Network{Mode: api.NetworkOpen})
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "boots") {
		t.Fatalf("a link for a gvisor sandbox booted without one: %v", err)
	}
	for _, id := range []string{open, al, none} {
		if err := d.client.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if tr := d.traces(id); len(tr) != 0 {
			t.Fatalf("traces of %s: %v", id, tr)
		}
	}
}
