package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/fds"
	"github.com/berthsh/berth/internal/testutil"
)

func TestMain(m *testing.M) {
	// Orphans come to the test process, as they come to the guest as PID 1.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
		os.Exit(1)
	}
	// As the guest's init does: what the test's parent leaked stays here.
	if err := fds.CloseOnExecFrom(3); err != nil {
		fmt.Fprintln(os.Stderr, "close-on-exec:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// newTable returns a table whose reaper runs until the test ends.
func newTable(t *testing.T) *Table {
	t.Helper()
	tb := NewTable(slog.New(slog.DiscardHandler), Defaults{Hostname: "test-host"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tb.Run(ctx); close(done) }()
	t.Cleanup(func() { tb.Close(); cancel(); <-done })
	return tb
}

func wait(t *testing.T, p *Process) guestapi.Result {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("process %d %v did not finish", p.Pid(), p.Info().Args)
	}
	return p.Result()
}

func run(t *testing.T, tb *Table, spec guestapi.ProcessSpec) guestapi.Result {
	t.Helper()
	p, err := tb.Start(spec)
	if err != nil {
		t.Fatalf("start %q: %v", spec.Args, err)
	}
	return wait(t, p)
}

func sh(script string) guestapi.ProcessSpec {
	return guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", script}}
}

func TestExitStdoutStderr(t *testing.T) {
	tb := newTable(t)
	r := run(t, tb, sh("echo out; echo err >&2; exit 3"))
	if r.ExitCode != 3 || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" || r.Pid == 0 || r.Signal != 0 || r.TimedOut {
		t.Fatalf("%+v", r)
	}
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"true"}}); r.ExitCode != 0 || r.Stdout != nil || r.Stderr != nil {
		t.Fatalf("true: %+v", r)
	}
	r = run(t, tb, sh("kill -TERM $$"))
	if r.Signal != 15 || r.ExitCode != 128+15 {
		t.Fatalf("signal: %+v", r)
	}
}

func TestStdin(t *testing.T) {
	tb := newTable(t)
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"cat"}, Stdin: []byte("from stdin")}); string(r.Stdout) != "from stdin" {
		t.Fatalf("stdin: %q", r.Stdout)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: more than a pipe holds
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"cat"}, Stdin: big}); !bytes.Equal(r.Stdout, big) {
		t.Fatalf("big stdin: got %d bytes back", len(r.Stdout))
	}
	// A process that reads none of it still ends.
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"true"}, Stdin: big}); r.ExitCode != 0 {
		t.Fatalf("unread stdin: %+v", r)
	}
	// Without stdin the process reads /dev/null.
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"cat"}}); r.ExitCode != 0 || len(r.Stdout) != 0 {
		t.Fatalf("no stdin: %+v", r)
	}
}

func TestEnvAndCwd(t *testing.T) {
	testutil.RequireRoot(t) // expects root's passwd entry
	tb := newTable(t)
	dir := t.TempDir()
	r := run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", "env; pwd"}, Env: []string{"A=1", "B=x=y", "A=2"}, Cwd: dir})
	lines := strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")
	for _, want := range []string{"A=2", "B=x=y", "HOSTNAME=test-host", "PATH=" + DefaultPath, "USER=root", "LOGNAME=root", "HOME=/root", dir} {
		if !slices.Contains(lines, want) {
			t.Errorf("missing %q in %q", want, lines)
		}
	}
	if slices.Contains(lines, "A=1") {
		t.Errorf("duplicate key kept: %q", lines)
	}
	// Default cwd: the user's home.
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"pwd"}}); string(r.Stdout) != "/root\n" {
		t.Errorf("default cwd %q", r.Stdout)
	}
	// PATH comes from the spec's env.
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	os.WriteFile(filepath.Join(bin, "hello-berth"), []byte("#!/bin/sh\necho hi from $0\n"), 0o755)
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"hello-berth"}, Env: []string{"PATH=/usr/bin:/bin:" + bin}})
	if string(r.Stdout) != "hi from "+filepath.Join(bin, "hello-berth")+"\n" {
		t.Errorf("PATH lookup: %+v", r)
	}
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"hello-berth"}}); r.ExitCode != 127 {
		t.Errorf("default PATH found %q: %+v", "hello-berth", r)
	}
}

func TestUsers(t *testing.T) {
	testutil.RequireRoot(t)
	tb := newTable(t)
	r := run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", `id -u; id -g; id -G; echo "$USER $LOGNAME $HOME"; pwd`}, User: "nobody"})
	if got := string(r.Stdout); got != "65534\n65534\n65534\nnobody nobody /nonexistent\n/\n" {
		t.Fatalf("nobody: %q %q", got, r.Stderr)
	}
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", "id -u; id -g; id -G"}, User: "4242:4343"})
	if string(r.Stdout) != "4242\n4343\n4343\n" {
		t.Fatalf("uid:gid: %q %q", r.Stdout, r.Stderr)
	}
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", "id -u; id -g"}, User: "65534"})
	if string(r.Stdout) != "65534\n65534\n" {
		t.Fatalf("uid: %q %q", r.Stdout, r.Stderr)
	}
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"id", "-u"}})
	if string(r.Stdout) != fmt.Sprintf("%d\n", os.Getuid()) {
		t.Fatalf("own user: %q", r.Stdout)
	}
	for _, u := range []string{"no-such-user", "nobody:nogroup", "1:x", "4294967295"} {
		if _, err := tb.Start(guestapi.ProcessSpec{Args: []string{"true"}, User: u}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "user") {
			t.Errorf("user %q: %v", u, err)
		}
	}
}

func TestStartErrors(t *testing.T) {
	tb := newTable(t)
	r := run(t, tb, guestapi.ProcessSpec{Args: []string{"no-such-program-xyz"}})
	want := `exec: "no-such-program-xyz": executable file not found in $PATH`
	if r.ExitCode != 127 || r.StartError != want || string(r.Stderr) != want+"\n" || r.Pid != 0 {
		t.Fatalf("missing: %+v", r)
	}
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"/no/such/program"}}); r.ExitCode != 127 || r.StartError == "" {
		t.Fatalf("missing path: %+v", r)
	}
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644)
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte{0x7f, 'E', 'L', 'F', 0, 0, 0, 0}, 0o755)
	for _, prog := range []string{plain, dir, garbage} {
		r := run(t, tb, guestapi.ProcessSpec{Args: []string{prog}})
		if r.ExitCode != 126 || !strings.Contains(r.StartError, prog) || len(r.Stderr) == 0 {
			t.Errorf("%s: %+v", prog, r)
		}
	}
}

func TestBadSpecs(t *testing.T) {
	tb := newTable(t)
	for field, spec := range map[string]guestapi.ProcessSpec{
		"args":             {},
		"args[0]":          {Args: []string{""}},
		"args[1]":          {Args: []string{"echo", "a\x00b"}},
		"env[0]":           {Args: []string{"true"}, Env: []string{"NOEQUALS"}},
		"env[1]":           {Args: []string{"true"}, Env: []string{"A=1", "B=\x00"}},
		"env[2]":           {Args: []string{"true"}, Env: []string{"A=1", "B=2", "=3"}},
		"cwd":              {Args: []string{"true"}, Cwd: "/no/such/dir"},
		"cwd:":             {Args: []string{"true"}, Cwd: "relative"},
		"timeout_ms":       {Args: []string{"true"}, TimeoutMs: -1},
		"max_output_bytes": {Args: []string{"true"}, MaxOutputBytes: -1},
	} {
		field = strings.TrimSuffix(field, ":")
		if _, err := tb.Start(spec); !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), field+":") {
			t.Errorf("%s: %v", field, err)
		}
	}
	if _, err := tb.Start(guestapi.ProcessSpec{Args: []string{"true"}, Cwd: "/etc/passwd"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("cwd not a directory: %v", err)
	}
}

func TestTimeoutKillsTheGroup(t *testing.T) {
	tb := newTable(t)
	marker := fmt.Sprintf("sleep %d", 100+time.Now().UnixNano()%800) // unique enough to find in /proc
	start := time.Now()
	r := run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", marker + " & " + marker}, TimeoutMs: 200})
	if !r.TimedOut || r.Signal != 9 || r.ExitCode != 137 {
		t.Fatalf("%+v", r)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
	if !eventually(2*time.Second, func() bool { return countCmdline(marker) == 0 }) {
		t.Fatalf("%q still running after the timeout", marker)
	}
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"true"}, TimeoutMs: 5000}); r.TimedOut || r.ExitCode != 0 {
		t.Fatalf("in time: %+v", r)
	}
}

func eventually(d time.Duration, ok func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if ok() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
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
	tb := newTable(t)
	p, err := tb.Start(guestapi.ProcessSpec{Args: []string{"head", "-c", "50000000", "/dev/zero"}, MaxOutputBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	streamed := 0
	for ev := range p.Subscribe(t.Context()) {
		streamed += len(ev.Data)
	}
	r := wait(t, p)
	if !r.StdoutTruncated || len(r.Stdout) != 1<<20 || r.ExitCode != 0 || r.Signal != 0 || streamed != 1<<20 {
		t.Fatalf("kept %d streamed %d truncated %v exit %d signal %d", len(r.Stdout), streamed, r.StdoutTruncated, r.ExitCode, r.Signal)
	}
	r = run(t, tb, guestapi.ProcessSpec{Args: []string{"sh", "-c", "head -c 100000 /dev/zero >&2; echo ok"}, MaxOutputBytes: 1000})
	if !r.StderrTruncated || len(r.Stderr) != 1000 || r.StdoutTruncated || string(r.Stdout) != "ok\n" {
		t.Fatalf("stderr: kept %d truncated %v, stdout %q", len(r.Stderr), r.StderrTruncated, r.Stdout)
	}
	// Exactly the bound is not truncated.
	if r := run(t, tb, guestapi.ProcessSpec{Args: []string{"head", "-c", "1000", "/dev/zero"}, MaxOutputBytes: 1000}); r.StdoutTruncated || len(r.Stdout) != 1000 {
		t.Fatalf("at the bound: kept %d truncated %v", len(r.Stdout), r.StdoutTruncated)
	}
}

func TestBackgroundChildHoldingPipeDoesNotHang(t *testing.T) {
	tb := newTable(t)
	start := time.Now()
	r := run(t, tb, sh("sleep 30 & echo done"))
	if string(r.Stdout) != "done\n" || r.ExitCode != 0 || time.Since(start) > 2*time.Second {
		t.Fatalf("%+v after %v", r, time.Since(start))
	}
	unix.Kill(-r.Pid, unix.SIGKILL) // the sleep is still in the process group
}

func TestConcurrentExecs(t *testing.T) {
	tb := newTable(t)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			p, err := tb.Start(guestapi.ProcessSpec{Args: []string{"sh", "-c", "echo $0; echo e$0 >&2", fmt.Sprint(i)}})
			if err != nil {
				t.Error(err)
				return
			}
			r := wait(t, p)
			if string(r.Stdout) != fmt.Sprintf("%d\n", i) || string(r.Stderr) != fmt.Sprintf("e%d\n", i) || r.ExitCode != 0 {
				t.Errorf("exec %d: %+v", i, r)
			}
		})
	}
	wg.Wait()
}

func TestOrphansReaped(t *testing.T) {
	tb := newTable(t)
	// The subshell exits at once; its sleep is orphaned to us and exits later.
	for range 5 {
		run(t, tb, sh("(sleep 0.2 &) ; true"))
	}
	if !eventually(3*time.Second, func() bool { return zombies() == 0 && countCmdline("sleep 0.2") == 0 }) {
		t.Fatalf("%d zombie children left", zombies())
	}
}

// zombies counts the test process's children in Z state.
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
		if fields := strings.Fields(s[i+1:]); len(fields) > 1 && fields[0] == "Z" && fields[1] == me {
			n++
		}
	}
	return n
}

func collect(ch <-chan guestapi.Event) (out string, exit *guestapi.Result) {
	var b strings.Builder
	for ev := range ch {
		switch ev.Type {
		case guestapi.EventStdout, guestapi.EventStderr:
			b.Write(ev.Data)
		case guestapi.EventExit:
			exit = ev.Result
		}
	}
	return b.String(), exit
}

func TestSubscribeReplayAndFollow(t *testing.T) {
	tb := newTable(t)
	p, err := tb.Start(sh("echo one; sleep 0.3; echo two >&2; exit 4"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // "one" is out already: the replay must deliver it
	got, exit := collect(p.Subscribe(t.Context()))
	if got != "one\ntwo\n" || exit == nil || exit.ExitCode != 4 || exit.Stdout != nil || exit.Pid != p.Pid() {
		t.Fatalf("got %q exit %+v", got, exit)
	}
	// After the end: a full replay and the exit event.
	if got, exit := collect(p.Subscribe(t.Context())); got != "one\ntwo\n" || exit == nil {
		t.Fatalf("replay after exit: %q %+v", got, exit)
	}
	if evs := p.Snapshot(); len(evs) != 3 || evs[2].Type != guestapi.EventExit {
		t.Fatalf("snapshot: %+v", evs)
	}
}

func TestSlowSubscribers(t *testing.T) {
	tb := newTable(t)
	p, err := tb.Start(sh("seq 1 100000"))
	if err != nil {
		t.Fatal(err)
	}
	// One subscriber never reads; another reads slowly; a third reads at once.
	stuck, cancel := context.WithCancel(context.Background())
	defer cancel()
	_ = p.Subscribe(stuck)
	slow := p.Subscribe(t.Context())
	<-slow
	fast, _ := collect(p.Subscribe(t.Context()))
	r := wait(t, p)
	if !strings.HasSuffix(fast, "\n100000\n") || string(r.Stdout) != fast {
		t.Fatalf("fast subscriber got %d bytes, result %d", len(fast), len(r.Stdout))
	}
	time.Sleep(20 * time.Millisecond)
	rest, exit := collect(slow)
	if exit == nil || !strings.HasSuffix(rest, "\n100000\n") {
		t.Fatalf("slow subscriber: %d bytes, exit %+v", len(rest), exit)
	}
	// Ending ctx closes a subscription early.
	ctx, stop := context.WithCancel(context.Background())
	ch := p.Subscribe(ctx)
	stop()
	for range ch {
	}
}

func TestSignalListRemove(t *testing.T) {
	tb := newTable(t)
	p, err := tb.Start(guestapi.ProcessSpec{Args: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tb.Get(p.Pid()); err != nil || got != p {
		t.Fatalf("get: %v", err)
	}
	if err := tb.Remove(p.Pid()); !errdefs.IsConflict(err) {
		t.Fatalf("remove running: %v", err)
	}
	if list := tb.List(); len(list) != 1 || !list[0].Running || list[0].Result != nil || list[0].Args[0] != "sleep" {
		t.Fatalf("list: %+v", list)
	}
	if info := p.Info(); !info.Running || info.StartedUnixMs == 0 {
		t.Fatalf("info: %+v", info)
	}
	if err := tb.Signal(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, p); r.Signal != 9 || r.ExitCode != 137 {
		t.Fatalf("%+v", r)
	}
	if err := tb.Signal(p.Pid(), syscall.SIGTERM); !errdefs.IsConflict(err) {
		t.Fatalf("signal finished: %v", err)
	}
	if list := tb.List(); len(list) != 1 || list[0].Running || list[0].Result == nil || list[0].Result.Signal != 9 {
		t.Fatalf("list after exit: %+v", list)
	}
	if err := tb.Remove(p.Pid()); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Get(p.Pid()); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), fmt.Sprint(p.Pid())) {
		t.Fatalf("get removed: %v", err)
	}
	if err := tb.Signal(p.Pid(), syscall.SIGKILL); !errdefs.IsNotFound(err) {
		t.Fatalf("signal removed: %v", err)
	}
}

func TestFinishedCaps(t *testing.T) {
	tb := newTable(t)
	tb.maxFinished = 3
	var pids []int
	for range 5 {
		p, err := tb.Start(guestapi.ProcessSpec{Args: []string{"echo", "1234567"}})
		if err != nil {
			t.Fatal(err)
		}
		wait(t, p)
		pids = append(pids, p.Pid())
	}
	if !eventually(time.Second, func() bool { return len(tb.List()) == 3 }) {
		t.Fatalf("kept %d, want 3", len(tb.List()))
	}
	for i, pid := range pids {
		if _, err := tb.Get(pid); (err == nil) != (i >= 2) {
			t.Errorf("process %d (#%d): %v", pid, i, err)
		}
	}
	tb.maxFinishedBytes = 20 // two processes' 8 bytes each
	p, _ := tb.Start(guestapi.ProcessSpec{Args: []string{"echo", "1234567"}})
	wait(t, p)
	if !eventually(time.Second, func() bool { return len(tb.List()) == 2 }) {
		t.Fatalf("kept %d, want 2", len(tb.List()))
	}
}

func TestCloseKillsWithoutReaper(t *testing.T) {
	tb := NewTable(slog.New(slog.DiscardHandler), Defaults{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tb.Run(ctx); close(done) }()
	var ps []*Process
	for _, spec := range []guestapi.ProcessSpec{sh("sleep 100 & sleep 100"), {Args: []string{"sleep", "100"}}} {
		p, err := tb.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	cancel() // the reaper is gone, as in the guest's shutdown
	<-done
	start := time.Now()
	tb.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("close took %v", d)
	}
	for _, p := range ps {
		if r := wait(t, p); r.Signal != 9 {
			t.Errorf("%+v", r)
		}
	}
	if _, err := tb.Start(guestapi.ProcessSpec{Args: []string{"true"}}); !errdefs.IsUnavailable(err) {
		t.Fatalf("start after close: %v", err)
	}
}

func TestOnlyStdioInherited(t *testing.T) {
	tb := newTable(t)
	// Descriptors the table opens for other processes meanwhile must not leak in.
	other, err := tb.Start(guestapi.ProcessSpec{Args: []string{"sleep", "10"}, Stdin: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Signal(syscall.SIGKILL)
	r := run(t, tb, sh("ls /proc/$$/fd"))
	if got := strings.Fields(string(r.Stdout)); !slices.Equal(got, []string{"0", "1", "2"}) {
		t.Fatalf("descriptors in the child: %q %q", got, r.Stderr)
	}
}

func TestTinyWritesCoalesce(t *testing.T) {
	tb := newTable(t)
	// One byte per write: kept as one run, not one record per read.
	p, err := tb.Start(sh(`i=0; while [ $i -lt 20000 ]; do printf a; i=$((i+1)); done`))
	if err != nil {
		t.Fatal(err)
	}
	r := wait(t, p)
	if string(r.Stdout) != strings.Repeat("a", 20000) || len(p.segs) != 1 {
		t.Fatalf("kept %d bytes in %d segments", len(r.Stdout), len(p.segs))
	}
	n := 0
	for ev := range p.Subscribe(t.Context()) {
		if ev.Type == guestapi.EventStdout {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("replayed in %d events", n)
	}
	// Output switching streams every byte is bounded by the order log too.
	p, err = tb.Start(guestapi.ProcessSpec{Args: []string{"sh", "-c", `i=0; while [ $i -lt 5000 ]; do printf a; printf b >&2; i=$((i+1)); done`}, MaxOutputBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	r = wait(t, p)
	if most := 2 * 1000 / segmentCost; len(p.segs) > most {
		t.Fatalf("%d segments, want at most %d", len(p.segs), most)
	}
	if !r.StdoutTruncated || !r.StderrTruncated || strings.Trim(string(r.Stdout), "a") != "" || strings.Trim(string(r.Stderr), "b") != "" {
		t.Fatalf("%+v", r)
	}
}

func TestInterleavingKept(t *testing.T) {
	tb := newTable(t)
	p, err := tb.Start(sh("echo a; sleep 0.05; echo b >&2; sleep 0.05; echo c; sleep 0.05; echo d >&2"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for ev := range p.Subscribe(t.Context()) {
		got = append(got, ev.Type+":"+string(ev.Data))
	}
	want := []string{"stdout:a\n", "stderr:b\n", "stdout:c\n", "stderr:d\n", "exit:"}
	if !slices.Equal(got, want) {
		t.Fatalf("live: %q", got)
	}
	got = got[:0]
	for _, ev := range p.Snapshot() {
		got = append(got, ev.Type+":"+string(ev.Data))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("replay: %q", got)
	}
}

// TestDrainAfterTheDeadline: output a process wrote before it exited is
// kept though the reader comes to it only after the exit's grace set the
// pipe's deadline (a reader scheduled late, under load); and a writer that
// goes on writing cannot keep the drain going.
func TestDrainAfterTheDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.Write([]byte("written before the exit\n")); err != nil {
		t.Fatal(err)
	}
	r.SetReadDeadline(time.Now())
	buf := make([]byte, readChunk)
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after the deadline: %v, want it exceeded", err)
	}
	var got []byte
	drainBuffered(r, buf, func(b []byte) { got = append(got, b...) })
	if string(got) != "written before the exit\n" {
		t.Fatalf("drained %q", got)
	}
	// An endless writer: the drain stops at its bound.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		chunk := make([]byte, 4096)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}()
	n := 0
	drainBuffered(r, buf, func(b []byte) { n += len(b) })
	if n > drainMost+readChunk {
		t.Fatalf("drained %d bytes from an endless writer, bound %d", n, drainMost)
	}
}
