package proc

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testutil"
)

func TestMain(m *testing.M) {
	// Orphans come to us, as they come to the guest as PID 1.
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	os.Exit(m.Run())
}

func table(t *testing.T) *Table {
	t.Helper()
	tb := NewTable(slog.New(slog.DiscardHandler), Defaults{Hostname: "test"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tb.Run(ctx); close(done) }()
	t.Cleanup(func() { tb.Close(); cancel(); <-done })
	return tb
}

func run(t *testing.T, tb *Table, spec guestapi.ProcessSpec) guestapi.Result {
	t.Helper()
	p, err := tb.Start(spec)
	if err != nil {
		t.Fatalf("start %v: %v", spec.Args, err)
	}
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("%v did not finish", spec.Args)
	}
	return p.Result()
}

func sh(script string) guestapi.ProcessSpec {
	return guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", script}}
}

func TestResults(t *testing.T) {
	tb := table(t)
	r := run(t, tb, sh("echo out; echo err >&2; exit 3"))
	if r.ExitCode != 3 || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" || r.Pid == 0 {
		t.Fatalf("%+v", r)
	}
	r = run(t, tb, sh("kill -TERM $$"))
	if r.Signal != 15 || r.ExitCode != 143 {
		t.Fatalf("signal: %+v", r)
	}
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"cat"}, Stdin: []byte("from stdin")})
	if string(r.Stdout) != "from stdin" {
		t.Fatalf("stdin: %q", r.Stdout)
	}
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", "echo $A; pwd"}, Env: []string{"A=1"}, Cwd: "/tmp"})
	if string(r.Stdout) != "1\n/tmp\n" {
		t.Fatalf("env/cwd: %q", r.Stdout)
	}
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"no-such-program-xyz"}})
	if r.ExitCode != 127 || !strings.Contains(r.StartError, "not found") || !strings.Contains(string(r.Stderr), "no-such-program-xyz") {
		t.Fatalf("missing: %+v", r)
	}
	f := filepath.Join(t.TempDir(), "notexec")
	os.WriteFile(f, []byte("#!/bin/sh\n"), 0o644)
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{f}})
	if r.ExitCode != 126 {
		t.Fatalf("not executable: %+v", r)
	}
}

func TestUsers(t *testing.T) {
	testutil.RequireRoot(t)
	tb := table(t)
	r := run(t, tb, guestapi.ProcessSpec{Args: []string{"id", "-u"}, User: "nobody"})
	if strings.TrimSpace(string(r.Stdout)) != "65534" {
		t.Fatalf("nobody: %q %q", r.Stdout, r.Stderr)
	}
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", "id -u; id -g"}, User: "4242:4343"})
	if string(r.Stdout) != "4242\n4343\n" {
		t.Fatalf("numeric: %q", r.Stdout)
	}
	if _, err := tb.Start(guestapi.ProcessSpec{Args: []string{"true"}, User: "no-such-user"}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "user") {
		t.Fatalf("unknown user: %v", err)
	}
}

func TestBadSpecs(t *testing.T) {
	tb := table(t)
	for field, spec := range map[string]guestapi.ProcessSpec{
		"args":    {},
		"args[1]": {Args: []string{"echo", "a\x00b"}},
		"env[0]":  {Args: []string{"true"}, Env: []string{"NOEQUALS"}},
		"cwd":     {Args: []string{"true"}, Cwd: "/no/such/dir"},
	} {
		if _, err := tb.Start(spec); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
}

func TestTimeoutKillsTheGroup(t *testing.T) {
	tb := table(t)
	marker := fmt.Sprintf("sleep %d", 100+time.Now().UnixNano()%800)
	start := time.Now()
	r := run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", marker + " & " + marker}, TimeoutMs: 200})
	if !r.TimedOut || r.Signal != 9 {
		t.Fatalf("%+v", r)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
	time.Sleep(50 * time.Millisecond)
	if n := countCmdline(marker); n != 0 {
		t.Fatalf("%d %q left after the timeout", n, marker)
	}
}

func countCmdline(cmd string) int {
	n := 0
	files, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")) == cmd {
			n++
		}
	}
	return n
}

func TestOutputBound(t *testing.T) {
	tb := table(t)
	r := run(t, tb, guestapi.ProcessSpec{Args: []string{"head", "-c", "50000000", "/dev/zero"}, MaxOutputBytes: 1 << 20})
	if !r.StdoutTruncated || len(r.Stdout) != 1<<20 || r.ExitCode != 0 {
		t.Fatalf("kept %d truncated %v exit %d", len(r.Stdout), r.StdoutTruncated, r.ExitCode)
	}
}

func TestBackgroundChildHoldingPipeDoesNotHang(t *testing.T) {
	tb := table(t)
	start := time.Now()
	r := run(t, tb, sh("sleep 30 & echo done"))
	if string(r.Stdout) != "done\n" || time.Since(start) > 5*time.Second {
		t.Fatalf("%q after %v", r.Stdout, time.Since(start))
	}
	unix.Kill(-r.Pid, unix.SIGKILL) // the sleep is still in the process group
}

func TestConcurrentAndOrphansReaped(t *testing.T) {
	tb := table(t)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := run(t, tb, guestapi.ProcessSpec{Args: []string{"echo", fmt.Sprint(i)}})
			if strings.TrimSpace(string(r.Stdout)) != fmt.Sprint(i) {
				t.Errorf("exec %d: %q", i, r.Stdout)
			}
		}()
	}
	wg.Wait()
	// A grandchild orphaned to us is reaped: no zombie children remain.
	run(t, tb, sh("(sleep 0.1 &) ; true"))
	time.Sleep(1500 * time.Millisecond) // the reaper's tick catches the orphan's exit
	if z := zombies(); z > 0 {
		t.Fatalf("%d zombie children", z)
	}
}

func zombies() int {
	n := 0
	me := fmt.Sprint(os.Getpid())
	files, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) > 1 && fields[0] == "Z" && fields[1] == me {
			n++
		}
	}
	return n
}

func TestSubscribeReplayAndFollow(t *testing.T) {
	tb := table(t)
	p, err := tb.Start(sh("echo one; sleep 0.3; echo two"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // "one" is already out: replay must deliver it
	var got bytes.Buffer
	var exit *guestapi.Result
	for ev := range p.Subscribe(t.Context()) {
		switch ev.Type {
		case guestapi.EventStdout:
			got.Write(ev.Data)
		case guestapi.EventExit:
			exit = ev.Result
		}
	}
	if got.String() != "one\ntwo\n" || exit == nil || exit.ExitCode != 0 {
		t.Fatalf("got %q exit %+v", got.String(), exit)
	}
	// A subscriber that never reads does not block the process or others.
	p2, _ := tb.Start(sh("seq 1 20000"))
	stuck, cancel := context.WithCancel(context.Background())
	_ = p2.Subscribe(stuck)
	select {
	case <-p2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a stuck subscriber blocked the process")
	}
	cancel()
	if !strings.HasSuffix(string(p2.Result().Stdout), "20000\n") {
		t.Fatal("output incomplete")
	}
}

func TestSignalListRemove(t *testing.T) {
	tb := table(t)
	p, err := tb.Start(guestapi.ProcessSpec{Args: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Remove(p.Pid()); !errdefs.IsConflict(err) {
		t.Fatalf("remove running: %v", err)
	}
	if list := tb.List(); len(list) != 1 || !list[0].Running {
		t.Fatalf("list: %+v", list)
	}
	if err := tb.Signal(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if r := p.Result(); r.Signal != 9 {
		t.Fatalf("%+v", r)
	}
	if err := tb.Remove(p.Pid()); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Get(p.Pid()); !errdefs.IsNotFound(err) {
		t.Fatalf("get removed: %v", err)
	}
}
