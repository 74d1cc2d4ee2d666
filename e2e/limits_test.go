package e2e

import (
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/errdefs"
)

const allocGiB = "b = bytearray(1 << 30); print(len(b))"

func TestOOMKilledIsReported(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{MemoryBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", allocGiB}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OOMKilled || r.Signal != 9 || r.ExitCode != 137 {
		t.Fatalf("1 GiB in 64 MiB: %+v (stderr %q)", r, r.Stderr)
	}
	// A shell whose command the OOM killer ended exits 137 itself, and is
	// reported as OOM-killed too; a plain exit 137 is not.
	r, err = d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "python3 -c '" + allocGiB + "'; exit $?"})
	if err != nil || !r.OOMKilled || r.Signal != 0 || r.ExitCode != 137 {
		t.Fatalf("a shell's command OOM-killed: %+v %v", r, err)
	}
	if r, _ = d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "exit 137"}); r.OOMKilled || r.ExitCode != 137 {
		t.Fatalf("plain exit 137: %+v", r)
	}
	// A process the user kills with SIGKILL is not reported as an OOM kill.
	r, _ = d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "kill -9 $$"})
	if r.OOMKilled || r.Signal != 9 {
		t.Fatalf("plain SIGKILL: %+v", r)
	}
	// The sandbox itself survives its process's OOM kill.
	if r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "alive"}}); err != nil || string(r.Stdout) != "alive\n" {
		t.Fatalf("after the OOM kill: %+v %v", r, err)
	}
	// Background processes are explained too.
	p, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", allocGiB}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := d.client.WaitProcess(ctx, sb.ID, p.Pid, 30*time.Second)
	if err != nil || !w.OOMKilled {
		t.Fatalf("background OOM: %+v %v", w, err)
	}
	u, err := d.client.Stats(ctx, sb.ID)
	if err != nil || u.OOMKills < 3 || u.MemoryPeakBytes > 64<<20 || u.Pids < 1 {
		t.Fatalf("stats after two OOM kills: %+v %v", u, err)
	}
}

func TestLimitsChangeOnARunningSandbox(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{Pids: 64, MemoryBytes: 128 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{Pids: 200}})
	if err != nil || got.Limits.Pids != 200 || got.Limits.MemoryBytes != 128<<20 {
		t.Fatalf("update: %+v %v", got.Limits, err)
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/pids/berth/" + sb.ID + "/pids.max"); err == nil && strings.TrimSpace(string(b)) != "200" {
		t.Fatalf("pids.max = %s after the update", b)
	}
	for field, l := range map[string]api.Limits{
		"limits.memory_bytes": {MemoryBytes: 1 << 20},
		"limits.pids":         {Pids: 1},
		"limits.cpus":         {CPUs: 1e6},
	} {
		_, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &l})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), "outside") {
			t.Errorf("%s: %v, want invalid_argument with the range", field, err)
		}
	}
	if _, err := d.client.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{Pids: 300}})
	if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("limits on a stopped sandbox: %v", err)
	}
	// The stored limits (200) come back with start.
	started, err := d.client.StartSandbox(ctx, sb.ID)
	if err != nil || started.Limits.Pids != 200 {
		t.Fatalf("after start: %+v %v", started.Limits, err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{Pids: 300}}); !errdefs.IsNotFound(err) {
		t.Fatalf("limits on a deleted sandbox: %v", err)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := d.get(t, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	body := string(b)
	for _, want := range []string{`berth_sandboxes{state="running"} 1`, `berth_sandbox_memory_bytes{sandbox="` + sb.ID + `"}`,
		`# TYPE berth_sandbox_cpu_seconds_total counter`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	out, _, code := d.cli("", "stats", sb.ID)
	if code != 0 || !strings.Contains(out, `"memory_bytes"`) {
		t.Fatalf("berth stats: %q", out)
	}
	out, errOut, code := d.cli("", "update", "--pids", "99", sb.ID)
	if code != 0 || !strings.Contains(out, "pids=99") {
		t.Fatalf("berth update: %q %q", out, errOut)
	}
	out, errOut, code = d.cli("", "update", "--max-lifetime", "2h", "--idle-timeout", "0", "--public", sb.ID)
	if code != 0 || !strings.Contains(out, "idle_timeout_s=0 ") || !strings.Contains(out, "max_lifetime_s=7200") || !strings.Contains(out, "public=true") {
		t.Fatalf("berth update of timeouts and public: %q %q", out, errOut)
	}
	if got, err := d.client.GetSandbox(t.Context(), sb.ID); err != nil || !got.Public || got.Timeouts.MaxLifetimeSeconds == nil || *got.Timeouts.MaxLifetimeSeconds != 7200 {
		t.Fatalf("the sandbox after berth update: %+v %v", got, err)
	}
	if _, errOut, code = d.cli("", "update", sb.ID); code == 0 || !strings.Contains(errOut, "nothing to change") {
		t.Fatalf("berth update with nothing: %d %q", code, errOut)
	}
	if _, errOut, code = d.cli("", "update", "--max-lifetime", "soon", sb.ID); code == 0 || !strings.Contains(errOut, "--max-lifetime") {
		t.Fatalf("berth update with a bad duration: %d %q", code, errOut)
	}
}

// TestBombsExplainTheirEnd runs a fork bomb, a memory bomb, a disk fill and
// a CPU spin, each in its own sandbox at its ceiling, while a fifth sandbox
// keeps executing: every bomb's exec says why it ended (its result, and a
// limit_hit event naming the limit where one applies), and the quiet
// sandbox's results stay correct. (Its latency is measured by
// BenchmarkExecUnderBombs, not asserted here.)
func TestBombsExplainTheirEnd(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	type bomb struct {
		name   string
		limits api.Limits
		req    api.ExecRequest
		check  func(api.ExecResult) bool
		limit  string // the limit_hit event expected, if any
	}
	bombs := []bomb{
		{"fork bomb", api.Limits{Pids: 128}, api.ExecRequest{Shell: "while true; do sleep 60 & done", TimeoutMs: 3000},
			func(r api.ExecResult) bool {
				// The shell gives up when fork fails, or the timeout ends it.
				return r.TimedOut && r.Signal == 9 || r.ExitCode != 0 && strings.Contains(string(r.Stderr), "fork")
			}, "pids"},
		{"memory bomb", api.Limits{MemoryBytes: 64 << 20}, api.ExecRequest{Cmd: []string{"python3", "-c", "b = bytearray(1 << 30)"}, TimeoutMs: 30000},
			func(r api.ExecResult) bool { return r.OOMKilled && r.ExitCode == 137 }, ""},
		{"disk fill", api.Limits{DiskBytes: 64 << 20}, api.ExecRequest{Shell: "dd if=/dev/zero of=/tmp/fill bs=1M count=1000; sleep 2", TimeoutMs: 30000},
			func(r api.ExecResult) bool {
				return r.ExitCode == 0 && strings.Contains(string(r.Stderr), "No space left on device")
			}, "disk"},
		{"cpu spin", api.Limits{CPUs: 0.5}, api.ExecRequest{Shell: "while true; do :; done", TimeoutMs: 2000},
			func(r api.ExecResult) bool { return r.TimedOut && r.DurationMs >= 2000 }, "cpu"},
	}
	victim, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	results := make([]api.ExecResult, len(bombs))
	errs := make([]error, len(bombs))
	hits := make([]chan string, len(bombs))
	var wg sync.WaitGroup
	for i, b := range bombs {
		sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: b.limits, User: "root"})
		if err != nil {
			t.Fatal(err)
		}
		st, err := d.client.Events(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		hits[i] = make(chan string, 64)
		go func() {
			for {
				ev, err := st.Next()
				if err != nil {
					return
				}
				if ev.Type == api.LimitHit && ev.Count > 0 {
					select {
					case hits[i] <- ev.Limit:
					default:
					}
				}
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = d.client.Exec(ctx, sb.ID, b.req)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	execs := 0
	for running := true; running; execs++ {
		select {
		case <-done:
			running = false
		default:
		}
		r, err := d.client.Exec(ctx, victim.ID, api.ExecRequest{Shell: "echo $((6 * 7))"})
		if err != nil || string(r.Stdout) != "42\n" || r.ExitCode != 0 {
			t.Fatalf("quiet sandbox's exec %d among the bombs: %+v %v", execs, r, err)
		}
	}
	for i, b := range bombs {
		r := results[i]
		if errs[i] != nil || !b.check(r) {
			t.Errorf("%s: exec ended without its reason: exit %d signal %d timed_out %v oom_killed %v stderr %q err %v",
				b.name, r.ExitCode, r.Signal, r.TimedOut, r.OOMKilled, r.Stderr, errs[i])
		}
	}
	if execs < 5 {
		t.Fatalf("only %d execs in the quiet sandbox while the bombs ran", execs)
	}
	for i, b := range bombs {
		if b.limit == "" {
			continue
		}
		deadline := time.After(5 * time.Second)
	wait:
		for {
			select {
			case l := <-hits[i]:
				if l == b.limit {
					break wait
				}
			case <-deadline:
				t.Errorf("%s: no limit_hit event for %s", b.name, b.limit)
				break wait
			}
		}
	}
}

// TestOpenFilesLimit: RLIMIT_NOFILE binds every process of the sandbox,
// root included, cannot be raised inside, and changes for new processes.
func TestOpenFilesLimit(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{OpenFiles: 100}})
	if err != nil || sb.Limits.OpenFiles != 100 {
		t.Fatalf("create: %+v %v", sb.Limits, err)
	}
	open200 := "import os\ntry:\n    fs = [open('/dev/null') for _ in range(200)]\n    print('opened', len(fs))\nexcept OSError as e:\n    print('refused', e.errno)\n"
	for _, user := range []string{"user", "root"} {
		r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "ulimit -Sn; ulimit -Hn; ulimit -n 5000 2>&1 || echo cannot-raise", User: user})
		if err != nil || !strings.HasPrefix(string(r.Stdout), "100\n100\n") || !strings.Contains(string(r.Stdout), "cannot-raise") {
			t.Fatalf("%s: ulimit: %q %v", user, r.Stdout, err)
		}
		r, err = d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", open200}, User: user})
		if err != nil || string(r.Stdout) != "refused 24\n" { // EMFILE
			t.Fatalf("%s: opening 200 files: %q %q %v", user, r.Stdout, r.Stderr, err)
		}
	}
	// Lowering works everywhere; raising needs CAP_SYS_RESOURCE (a hard
	// limit only goes up with it), which this project's VM withholds.
	if _, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{OpenFiles: 80}}); err != nil {
		t.Fatal(err)
	}
	if r, _ := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "ulimit -Hn"}); string(r.Stdout) != "80\n" {
		t.Fatalf("after lowering to 80: %q", r.Stdout)
	}
	_, err = d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{OpenFiles: 300}})
	if canRaise, _ := capability.Effective(unix.CAP_SYS_RESOURCE); canRaise {
		r, err2 := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", open200}})
		if err != nil || err2 != nil || string(r.Stdout) != "opened 200\n" {
			t.Fatalf("after raising to 300: %q %v %v", r.Stdout, err, err2)
		}
	} else if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
		t.Fatalf("raising without CAP_SYS_RESOURCE: %v", err)
	} else if got, _ := d.client.GetSandbox(ctx, sb.ID); got.Limits.OpenFiles != 80 {
		t.Fatalf("a refused raise changed the recorded limit: %+v", got.Limits)
	}
	for _, n := range []int64{10, 1 << 40} {
		_, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{OpenFiles: n}})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "limits.open_files") || !strings.Contains(err.Error(), "outside") {
			t.Fatalf("open_files %d: %v", n, err)
		}
	}
}
