package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

func secs(n int64) *int64 { return &n }

func TestStopStartKeepsFilesLabelsLimits(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"thread_id": "t1"},
		Limits: api.Limits{MemoryBytes: 256 << 20, Pids: 128}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo kept > /home/user/notes; echo root-file > /etc/berth-note", User: "root"}); err != nil {
		t.Fatal(err)
	}
	stopped, err := d.client.StopSandbox(ctx, sb.ID)
	if err != nil || stopped.State != api.StateStopped || stopped.StoppedAt == nil {
		t.Fatalf("stop: %+v %v", stopped, err)
	}
	if n := len(d.tracesRunning(sb.ID)); n != 0 {
		t.Fatalf("processes or cgroups left after stop: %v", d.tracesRunning(sb.ID))
	}
	_, err = d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
	if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "stopped") || !strings.Contains(err.Error(), "start") ||
		errdefs.ReasonOf(err) != errdefs.SandboxStopped {
		t.Fatalf("exec in a stopped sandbox: %v (reason %q)", err, errdefs.ReasonOf(err))
	}
	// A file call says it is the sandbox, not the path, that is the problem.
	if _, err := d.client.Stat(ctx, sb.ID, api.StatRequest{Path: "/etc/hostname"}); errdefs.ReasonOf(err) != errdefs.SandboxStopped {
		t.Fatalf("stat in a stopped sandbox: %v (reason %q)", err, errdefs.ReasonOf(err))
	}
	if _, err := d.client.StopSandbox(ctx, sb.ID); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("stop of a stopped sandbox: %v", err)
	}
	started, err := d.client.StartSandbox(ctx, sb.ID)
	if err != nil || started.State != api.StateRunning || started.StoppedAt != nil {
		t.Fatalf("start: %+v %v", started, err)
	}
	if _, err := d.client.StartSandbox(ctx, sb.ID); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "running") {
		t.Fatalf("start of a running sandbox: %v", err)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "cat /home/user/notes /etc/berth-note; hostname"})
	if err != nil || string(r.Stdout) != "kept\nroot-file\n"+sb.ID+"\n" {
		t.Fatalf("after start: %q %v", r.Stdout, err)
	}
	if started.Labels["thread_id"] != "t1" || started.Limits.MemoryBytes != 256<<20 || started.Limits.Pids != 128 {
		t.Fatalf("labels or limits changed: %+v", started)
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/pids/berth/" + sb.ID + "/pids.max"); err == nil && strings.TrimSpace(string(b)) != "128" {
		t.Fatalf("pids limit after start: %s", b)
	}
}

// tracesRunning lists a sandbox's processes and cgroups (its files may stay).
func (d *daemon) tracesRunning(id string) []string {
	var out []string
	for _, tr := range d.traces(id) {
		if !strings.HasPrefix(tr, "sandbox directory") {
			out = append(out, tr)
		}
	}
	return out
}

// TestHostRebootBringsSandboxesBackStopped simulates a reboot: the daemon and
// every sandbox process die; the next daemon finds the sandbox stopped with
// its files, labels and a reason, and start works.
func TestHostRebootBringsSandboxesBackStopped(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"app": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo survived > /home/user/f"}); err != nil {
		t.Fatal(err)
	}
	d.kill9()
	for _, pid := range sandboxPids(sb.ID) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	waitFor(t, 5*time.Second, func() bool { return len(sandboxPids(sb.ID)) == 0 })
	d.start()
	got, err := d.client.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateStopped || got.Error == "" || got.Labels["app"] != "x" {
		t.Fatalf("after the reboot: %+v %v", got, err)
	}
	if _, err := d.client.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "cat /home/user/f"})
	if err != nil || string(r.Stdout) != "survived\n" {
		t.Fatalf("file after the reboot: %q %v", r.Stdout, err)
	}
}

// sandboxPids lists host processes in a sandbox's cgroup.
func sandboxPids(id string) []int {
	var pids []int
	files, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), "/berth/"+id+"\n") {
			if pid, err := strconv.Atoi(strings.Split(f, "/")[2]); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestGetOrCreateIsAtomic(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	var wg sync.WaitGroup
	ids := make([]string, 50)
	created := make([]bool, 50)
	errs := make([]error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, c, err := d.client.GetOrCreate(ctx, api.CreateSandboxRequest{Labels: map[string]string{"thread_id": "conv-42"}})
			ids[i], created[i], errs[i] = sb.ID, c, err
		}()
	}
	wg.Wait()
	nCreated := 0
	for i := range 50 {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if ids[i] != ids[0] {
			t.Fatalf("call %d got %s, call 0 got %s", i, ids[i], ids[0])
		}
		if created[i] {
			nCreated++
		}
	}
	list, _ := d.client.ListSandboxes(ctx, map[string]string{"thread_id": "conv-42"})
	if nCreated != 1 || len(list) != 1 {
		t.Fatalf("%d created, %d listed; want exactly one", nCreated, len(list))
	}
	// A stopped match is started, not duplicated.
	if _, err := d.client.StopSandbox(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	sb, c, err := d.client.GetOrCreate(ctx, api.CreateSandboxRequest{Labels: map[string]string{"thread_id": "conv-42"}})
	if err != nil || c || sb.ID != ids[0] || sb.State != api.StateRunning {
		t.Fatalf("get-or-create of a stopped sandbox: %+v created=%v %v", sb, c, err)
	}
}

// TestIdleTimeoutSparesARunningProcess is the one real-time test: a 2 s idle
// timeout, a client-started `sleep 10`; the sandbox must not stop while it
// runs and must stop after it ends and 2 s pass.
func TestIdleTimeoutSparesARunningProcess(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Timeouts: api.Timeouts{IdleSeconds: secs(2)}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "10"}}); err != nil {
		t.Fatal(err)
	}
	var stoppedAfter time.Duration
	for time.Since(start) < 25*time.Second {
		got, err := d.client.GetSandbox(ctx, sb.ID) // reads the store: not activity
		if err != nil {
			t.Fatal(err)
		}
		if got.State == api.StateStopped {
			stoppedAfter = time.Since(start)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if stoppedAfter == 0 {
		t.Fatal("never stopped")
	}
	if stoppedAfter < 12*time.Second {
		t.Fatalf("stopped after %s: while `sleep 10` ran or before 2 s of idleness followed it", stoppedAfter)
	}
	got, _ := d.client.GetSandbox(ctx, sb.ID)
	if !strings.Contains(got.Error, "idle") {
		t.Fatalf("reason: %q", got.Error)
	}
}

// TestUpdateTimeouts: PATCH's timeouts replace the fields given, survive a
// daemon restart, and a lowered max_lifetime_s (counted from creation)
// stops the sandbox at the next sweep.
func TestUpdateTimeouts(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Timeouts: api.Timeouts{IdleSeconds: secs(0), MaxLifetimeSeconds: secs(3600)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Timeouts: &api.Timeouts{MaxLifetimeSeconds: secs(-1)}}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "max_lifetime_s") {
		t.Fatalf("negative max lifetime: %v", err)
	}
	got, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Timeouts: &api.Timeouts{DeleteAfterSeconds: secs(600)}})
	if err != nil || *got.Timeouts.DeleteAfterSeconds != 600 || *got.Timeouts.MaxLifetimeSeconds != 3600 {
		t.Fatalf("update delete_after: %+v %v", got.Timeouts, err)
	}
	d.stop()
	d.start()
	if got, err := d.client.GetSandbox(ctx, sb.ID); err != nil || *got.Timeouts.DeleteAfterSeconds != 600 || *got.Timeouts.MaxLifetimeSeconds != 3600 || got.State != api.StateRunning {
		t.Fatalf("after a restart: %+v %v", got, err)
	}
	age := int64(time.Since(sb.CreatedAt).Seconds())
	start := time.Now()
	if _, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Timeouts: &api.Timeouts{MaxLifetimeSeconds: secs(age + 2)}}); err != nil {
		t.Fatal(err)
	}
	for {
		got, err := d.client.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == api.StateStopped {
			if !strings.Contains(got.Error, "maximum lifetime") {
				t.Fatalf("reason: %q", got.Error)
			}
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("still %s 15 s after its lifetime was lowered to end in 2 s", got.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestLifecycleBadInput(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	for _, sel := range []string{"a=b,,c", "bad key=v", "k=" + strings.Repeat("v", 300)} {
		if _, err := d.client.ListSandboxesSelector(ctx, sel); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "selector") {
			t.Errorf("selector %.20q: %v", sel, err)
		}
	}
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("v", 300)
	if _, err := d.client.UpdateLabels(ctx, sb.ID, map[string]*string{"k": &long}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"k"`) {
		t.Errorf("over-long label value: %v", err)
	}
	bad := "v"
	if _, err := d.client.UpdateLabels(ctx, sb.ID, map[string]*string{"-bad-": &bad}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "-bad-") {
		t.Errorf("bad label key: %v", err)
	}
	if _, _, err := d.client.GetOrCreate(ctx, api.CreateSandboxRequest{}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "labels") {
		t.Errorf("get-or-create without labels: %v", err)
	}
	if _, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Timeouts: api.Timeouts{IdleSeconds: secs(-5)}}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "idle_timeout_s") {
		t.Errorf("negative timeout: %v", err)
	}
	// After a delete, a file call is about the sandbox, not the path.
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = d.client.Read(ctx, sb.ID, api.ReadRequest{Path: "/etc/hostname"})
	if !errdefs.IsNotFound(err) || errdefs.ReasonOf(err) != errdefs.SandboxGone || !strings.Contains(err.Error(), sb.ID) {
		t.Errorf("read in a deleted sandbox: %v (reason %q)", err, errdefs.ReasonOf(err))
	}
}

func TestCLILifecycleCommands(t *testing.T) {
	d := startDaemon(t, "")
	out, errOut, code := d.cli("", "get-or-create", "--label", "thread_id=cli-1", "--idle-timeout", "15m", "--delete-after", "24h", "--max-lifetime", "7d")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sb-") {
		t.Fatalf("get-or-create: %q %q", out, errOut)
	}
	again, _, _ := d.cli("", "get-or-create", "--label", "thread_id=cli-1")
	if strings.TrimSpace(again) != id {
		t.Fatalf("second get-or-create gave %q, want %s", again, id)
	}
	out, _, _ = d.cli("", "inspect", id)
	for _, want := range []string{`"idle_timeout_s": 900`, `"delete_after_s": 86400`, fmt.Sprintf(`"max_lifetime_s": %d`, 7*86400)} {
		if !strings.Contains(out, want) {
			t.Fatalf("inspect lacks %s:\n%s", want, out)
		}
	}
	out, errOut, code = d.cli("", "label", id, "team=ml", "thread_id-")
	if code != 0 || out != "team=ml\n" {
		t.Fatalf("label: %q %q", out, errOut)
	}
	if out, _, _ := d.cli("", "ls", "-q", "--selector", "team=ml,!thread_id"); strings.TrimSpace(out) != id {
		t.Fatalf("ls --selector: %q", out)
	}
	if _, _, code := d.cli("", "stop", id); code != 0 {
		t.Fatal("stop failed")
	}
	_, errOut, code = d.cli("", "exec", id, "--", "true")
	if code == 0 || !strings.Contains(errOut, "stopped") || !strings.Contains(errOut, "start") {
		t.Fatalf("exec in stopped: %d %q", code, errOut)
	}
	if _, _, code := d.cli("", "start", id); code != 0 {
		t.Fatal("start failed")
	}
	if out, _, code := d.cli("", "exec", id, "--", "echo", "back"); code != 0 || out != "back\n" {
		t.Fatalf("exec after start: %q", out)
	}
	_, errOut, code = d.cli("", "create", "--idle-timeout", "soon")
	if code == 0 || !strings.Contains(errOut, "--idle-timeout") {
		t.Fatalf("bad duration: %d %q", code, errOut)
	}
}
