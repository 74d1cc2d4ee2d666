package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testutil"
)

func TestCLIRunEchoHello(t *testing.T) {
	d := startDaemon(t, "")
	out, errOut, code := d.cli("", "run", "--", "echo", "hello")
	if out != "hello\n" || code != 0 {
		t.Fatalf("berth run -- echo hello: stdout %q stderr %q exit %d", out, errOut, code)
	}
	_, _, code = d.cli("", "run", "--", "sh", "-c", "exit 7")
	if code != 7 {
		t.Fatalf("exit code %d, want 7", code)
	}
	list, err := d.client.ListSandboxes(t.Context(), nil)
	if err != nil || len(list) != 0 {
		t.Fatalf("berth run left sandboxes behind: %v %v", list, err)
	}
}

func TestCLILifecycle(t *testing.T) {
	d := startDaemon(t, "")
	out, errOut, code := d.cli("", "create", "--label", "thread_id=t1", "--env", "GREETING=hi", "--memory", "256M", "--cpus", "1", "--pids", "256")
	if code != 0 {
		t.Fatalf("create: %s %s", out, errOut)
	}
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "sb-") || strings.Contains(id, "\n") {
		t.Fatalf("create printed %q, want the id alone", out)
	}
	out, errOut, code = d.cli("", "exec", "-e", "NAME=berth", id, "--", "sh", "-c", "echo $GREETING $NAME; echo oops >&2; exit 3")
	if out != "hi berth\n" || errOut != "oops\n" || code != 3 {
		t.Fatalf("exec: stdout %q stderr %q exit %d", out, errOut, code)
	}
	out, _, code = d.cli("piped input", "exec", "-i", id, "--", "cat")
	if out != "piped input" || code != 0 {
		t.Fatalf("exec -i: %q %d", out, code)
	}
	// -d: a background process, which ps, logs and kill then act on.
	out, errOut, code = d.cli("", "exec", "-d", id, "--", "sh", "-c", "echo started; exec sleep 60")
	pid := strings.TrimSpace(out)
	if _, err := strconv.Atoi(pid); err != nil || code != 0 {
		t.Fatalf("exec -d: stdout %q stderr %q exit %d", out, errOut, code)
	}
	if out, _, _ = d.cli("", "ps", id); !strings.Contains(out, pid) || !strings.Contains(out, "running") {
		t.Fatalf("ps after exec -d:\n%s", out)
	}
	waitFor(t, 5*time.Second, func() bool { out, _, _ = d.cli("", "logs", id, pid); return out == "started\n" })
	if _, errOut, code = d.cli("", "kill", id, pid); code != 0 {
		t.Fatalf("kill: %s", errOut)
	}
	out, _, _ = d.cli("", "ls", "--label", "thread_id=t1")
	if !strings.Contains(out, id) {
		t.Fatalf("ls --label thread_id=t1 misses %s:\n%s", id, out)
	}
	out, _, _ = d.cli("", "ls", "--label", "thread_id=other")
	if strings.Contains(out, id) {
		t.Fatalf("ls --label thread_id=other lists %s", id)
	}
	out, _, code = d.cli("", "inspect", id)
	if code != 0 || !strings.Contains(out, `"memory_bytes": 268435456`) || !strings.Contains(out, `"thread_id": "t1"`) {
		t.Fatalf("inspect:\n%s", out)
	}
	_, _, code = d.cli("", "rm", id)
	if code != 0 {
		t.Fatal("rm failed")
	}
	if tr := d.traces(id); len(tr) > 0 {
		t.Fatalf("traces after rm: %v", tr)
	}
	_, errOut, code = d.cli("", "inspect", id)
	if code == 0 || !strings.Contains(errOut, id) {
		t.Fatalf("inspect of a removed sandbox: exit %d, stderr %q", code, errOut)
	}
}

func TestCLINoDaemon(t *testing.T) {
	d := &daemon{t: t, bin: testutil.Berth(t), url: "http://" + testutil.FreeAddr(t)}
	_, errOut, code := d.cli("", "ls")
	if code == 0 || !strings.Contains(errOut, "not reachable") || !strings.Contains(errOut, d.url) {
		t.Fatalf("no daemon: exit %d stderr %q", code, errOut)
	}
}

func TestExecResults(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.User != "user" || sb.Workdir != "/home/user" {
		t.Fatalf("created sandbox: %+v", sb)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"no-such-program"}})
	if err != nil || r.ExitCode != 127 || r.Error == "" {
		t.Fatalf("missing binary: %+v %v", r, err)
	}
	r, err = d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "head -c 50000000 /dev/zero", MaxOutputBytes: 1 << 20})
	if err != nil || !r.StdoutTruncated || len(r.Stdout) != 1<<20 || r.ExitCode != 0 {
		t.Fatalf("big output: %d bytes truncated=%v exit=%d err=%v", len(r.Stdout), r.StdoutTruncated, r.ExitCode, err)
	}
	r, err = d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "sleep 30 & sleep 30", TimeoutMs: 300})
	if err != nil || !r.TimedOut {
		t.Fatalf("timeout: %+v %v", r, err)
	}
	if r.DurationMs > 5000 {
		t.Fatalf("timeout took %d ms", r.DurationMs)
	}
	// The timeout killed the whole process group: no sleep is left.
	r, _ = d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "ps -eo stat=,comm= | grep -v '^Z' | grep -c sleep || true"})
	if strings.TrimSpace(string(r.Stdout)) != "0" {
		t.Fatalf("sleeps left after the timeout: %s", r.Stdout)
	}
	r, err = d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "cat; id -un; pwd"}, Stdin: []byte("in\n"), User: "root", Cwd: "/tmp"})
	if err != nil || string(r.Stdout) != "in\nroot\n/tmp\n" {
		t.Fatalf("stdin/user/cwd: %q %v", r.Stdout, err)
	}
	// Binary output comes back byte-exact.
	r, err = d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "printf '\\000\\377\\376abc'"})
	if err != nil || !bytes.Equal(r.Stdout, []byte{0, 0xff, 0xfe, 'a', 'b', 'c'}) {
		t.Fatalf("binary output: %q %v", r.Stdout, err)
	}
}

func TestExecStream(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.client.ExecStream(ctx, sb.ID, api.ExecRequest{Shell: "echo one; sleep 0.2; echo two >&2; exit 4"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var types []string
	var res *api.ExecResult
	for {
		ev, err := st.Next()
		if err != nil {
			break
		}
		types = append(types, ev.Type)
		if ev.Type == api.EventExit {
			res = ev.Result
		}
	}
	got := strings.Join(types, ",")
	if got != "start,stdout,stderr,exit" || res == nil || res.ExitCode != 4 {
		t.Fatalf("events %s result %+v", got, res)
	}
}

func TestBackgroundProcesses(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "echo started; sleep 60"})
	if err != nil || !p.Running || p.Pid == 0 {
		t.Fatalf("start: %+v %v", p, err)
	}
	list, err := d.client.ListProcesses(ctx, sb.ID)
	if err != nil || len(list) != 1 || list[0].Pid != p.Pid {
		t.Fatalf("list: %+v %v", list, err)
	}
	// Its output so far can be read while it runs (and it must have printed before the signal).
	waitFor(t, 5*time.Second, func() bool {
		st, err := d.client.ProcessOutput(ctx, sb.ID, p.Pid, false)
		if err != nil {
			return false
		}
		defer st.Close()
		ev, err := st.Next()
		return err == nil && ev.Type == api.EventStdout && string(ev.Data) == "started\n"
	})
	if err := d.client.SignalProcess(ctx, sb.ID, p.Pid, "TERM"); err != nil {
		t.Fatal(err)
	}
	r, err := d.client.WaitProcess(ctx, sb.ID, p.Pid, 10*time.Second)
	if err != nil || r.Signal != 15 || string(r.Stdout) != "started\n" {
		t.Fatalf("wait: %+v %v", r, err)
	}
	if err := d.client.RemoveProcess(ctx, sb.ID, p.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.GetProcess(ctx, sb.ID, p.Pid); !errdefs.IsNotFound(err) {
		t.Fatalf("removed process: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	_, err := d.client.GetSandbox(ctx, "sb-nosuchsandbox")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "sb-nosuchsandbox") {
		t.Fatalf("unknown id: %v", err)
	}
	for field, req := range map[string]api.CreateSandboxRequest{
		"limits.memory_bytes": {Limits: api.Limits{MemoryBytes: 1024}},
		"limits.cpus":         {Limits: api.Limits{CPUs: 1000}},
		"limits.pids":         {Limits: api.Limits{Pids: 2}},
		"env":                 {Env: map[string]string{"BAD=KEY": "x"}},
		"workdir":             {Workdir: "relative/dir"},
		"user":                {User: "not a user!"},
		"runtime":             {Runtime: "no-such-runtime"},
	} {
		_, err := d.client.CreateSandbox(ctx, req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: got %v, want invalid_argument naming the field", field, err)
		}
	}
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for field, req := range map[string]api.ExecRequest{
		"cmd":        {},
		"cwd":        {Cmd: []string{"true"}, Cwd: "rel"},
		"timeout_ms": {Cmd: []string{"true"}, TimeoutMs: -1},
		"user":       {Cmd: []string{"true"}, User: "nosuchuser"},
	} {
		_, err := d.client.Exec(ctx, sb.ID, req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), field) {
			t.Errorf("exec %s: got %v, want invalid_argument naming the field", field, err)
		}
	}
	if _, err := d.client.Exec(ctx, "sb-nosuchsandbox", api.ExecRequest{Cmd: []string{"true"}}); !errdefs.IsNotFound(err) {
		t.Errorf("exec in unknown sandbox: %v", err)
	}
	// Nothing half-made is left by the refused creates.
	list, _ := d.client.ListSandboxes(ctx, nil)
	if len(list) != 1 {
		t.Fatalf("%d sandboxes after refused creates, want 1", len(list))
	}
	entries, _ := os.ReadDir(filepath.Join(d.state, "runtimes", "native", "sandboxes"))
	if len(entries) != 1 {
		t.Fatalf("%d sandbox dirs after refused creates, want 1", len(entries))
	}
}

// TestRestartSurvival kills the daemon with SIGKILL while a sandbox runs a
// background process; a new daemon on the same state dir re-attaches.
func TestRestartSurvival(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"keep": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo before > /home/user/file"}); err != nil {
		t.Fatal(err)
	}
	marker := fmt.Sprintf("sleep %d", 600+time.Now().UnixNano()%1000) // unique on this host
	p, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "echo tick; exec " + marker})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { return countProcs(marker) == 1 }) // the shell has exec'd it
	d.kill9()
	// While no daemon runs, the sandbox's processes live on.
	time.Sleep(100 * time.Millisecond)
	if n := countProcs(marker); n != 1 {
		t.Fatalf("%d %q processes while the daemon is down, want 1", n, marker)
	}
	d.start()
	got, err := d.client.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning || got.Labels["keep"] != "yes" {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "cat /home/user/file"})
	if err != nil || string(r.Stdout) != "before\n" {
		t.Fatalf("exec after restart: %+v %v", r, err)
	}
	proc, err := d.client.GetProcess(ctx, sb.ID, p.Pid)
	if err != nil || !proc.Running {
		t.Fatalf("background process after restart: %+v %v", proc, err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if tr := d.traces(sb.ID); len(tr) > 0 {
		t.Fatalf("traces after delete: %v", tr)
	}
	if n := countProcs(marker); n != 0 {
		t.Fatalf("%d %q processes after delete", n, marker)
	}
}

// TestNoRouteToHostLoopback checks that a sandbox cannot reach the daemon's
// API on the host's loopback.
func TestNoRouteToHostLoopback(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(d.listen, ":")
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"bash", "-c", "echo > /dev/tcp/127.0.0.1/" + port}, TimeoutMs: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 {
		t.Fatal("the sandbox reached the daemon's API on 127.0.0.1:" + port)
	}
}

func TestDeletedSandboxLeavesNothing(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{MemoryBytes: 128 << 20, Pids: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "sleep 1000 & sleep 1000"}); err != nil {
		t.Fatal(err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if tr := d.traces(sb.ID); len(tr) > 0 {
		t.Fatalf("traces: %v", tr)
	}
	if _, err := d.client.GetSandbox(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
}

// countProcs counts host processes whose command line is exactly cmdline.
func countProcs(cmdline string) int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ") == cmdline {
			n++
		}
	}
	return n
}

// TestOutputOfARunningProcess reads a running process's output without
// follow: what it printed so far, then a clean end (CLI `logs` without -f).
func TestOutputOfARunningProcess(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "echo early; exec sleep 60"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		out, _, code := d.cli("", "logs", sb.ID, fmt.Sprint(p.Pid))
		return code == 0 && out == "early\n"
	})
	out, errOut, code := d.cli("", "logs", sb.ID, fmt.Sprint(p.Pid))
	if code != 0 || out != "early\n" {
		t.Fatalf("logs of a running process: %q %q exit %d", out, errOut, code)
	}
}

// TestGracefulStopLeavesSandboxesRunning: SIGTERM stops the daemon at once
// although sandboxes run (it used to wait for them to exit), they keep
// running, and the next daemon re-attaches.
func TestGracefulStopLeavesSandboxesRunning(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { d.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		d.kill9()
		t.Fatal("graceful stop hangs while a sandbox runs")
	}
	d.start()
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "still here"}})
	if err != nil || string(r.Stdout) != "still here\n" {
		t.Fatalf("after a graceful restart: %+v %v", r, err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
