package proc

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testutil"
)

func ttySpec(rows, cols uint16, args ...string) guestapi.ProcessSpec {
	return guestapi.ProcessSpec{Args: args, TTY: &guestapi.TTY{Rows: rows, Cols: cols}}
}

// screen follows a process's attachment and collects its output.
type screen struct {
	mu   sync.Mutex
	out  bytes.Buffer
	exit *guestapi.Result
	done chan struct{}
}

func watch(ctx context.Context, p *Process) *screen {
	s := &screen{done: make(chan struct{})}
	ch := p.Attach(ctx)
	go func() {
		defer close(s.done)
		for ev := range ch {
			s.mu.Lock()
			if ev.Type == guestapi.EventExit {
				s.exit = ev.Result
			} else {
				s.out.Write(ev.Data)
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *screen) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// waitFor waits until the screen's text has want in it.
func (s *screen) waitFor(t *testing.T, want string) {
	t.Helper()
	if !eventually(10*time.Second, func() bool { return strings.Contains(s.text(), want) }) {
		t.Fatalf("no %q on the screen: %q", want, s.text())
	}
}

func (s *screen) end(t *testing.T) *guestapi.Result {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the attachment did not end: %q", s.text())
	}
	return s.exit
}

func TestTerminal(t *testing.T) {
	testutil.NoLeaks(t) // before newTable: cleanups run last first
	tb := newTable(t)
	r := run(t, tb, ttySpec(33, 101, "stty", "size"))
	if string(r.Stdout) != "33 101\r\n" || r.Stderr != nil || r.ExitCode != 0 {
		t.Fatalf("stty size: %+v", r)
	}
	r = run(t, tb, ttySpec(24, 80, "tty"))
	if !regexp.MustCompile(`^/dev/pts/[0-9]+\r\n$`).Match(r.Stdout) {
		t.Fatalf("tty: %q", r.Stdout)
	}
	// A session of its own, whose leader leads its group, on its terminal.
	r = run(t, tb, ttySpec(24, 80, "sh", "-c", `echo "$TERM"; ps -o pid=,pgid=,sid=,tty= -p $$ 2>/dev/null || echo nops; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-tty`))
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(string(r.Stdout), "\r", "")), "\n")
	if lines[0] != "xterm-256color" || lines[len(lines)-1] != "all-tty" {
		t.Fatalf("terminal: %q", r.Stdout)
	}
	if f := strings.Fields(lines[1]); len(f) == 4 && (f[0] != f[1] || f[1] != f[2] || !strings.HasPrefix(f[3], "pts/")) {
		t.Fatalf("session: %q", lines[1])
	}
	spec := ttySpec(24, 80, "sh", "-c", `echo "$TERM"`)
	spec.Env = []string{"TERM=dumb"}
	if r := run(t, tb, spec); string(r.Stdout) != "dumb\r\n" {
		t.Fatalf("TERM from the spec: %q", r.Stdout)
	}
	// Stdin is typed first.
	spec = ttySpec(24, 80, "sh", "-c", `read x; echo "got $x"`)
	spec.Stdin = []byte("hi\n")
	if r := run(t, tb, spec); !strings.Contains(string(r.Stdout), "got hi\r\n") { // and the echo, before or after
		t.Fatalf("stdin on a terminal: %q", r.Stdout)
	}
}

func TestTerminalResize(t *testing.T) {
	testutil.NoLeaks(t) // before newTable: cleanups run last first
	tb := newTable(t)
	p, err := tb.Start(ttySpec(24, 80, "sh", "-c", `trap 'echo WINCH' WINCH; stty size; until read x; do :; done; stty size`))
	if err != nil {
		t.Fatal(err)
	}
	s := watch(t.Context(), p)
	s.waitFor(t, "24 80\r\n")
	if info := p.Info(); info.TTY == nil || *info.TTY != (guestapi.TTY{Rows: 24, Cols: 80}) || !info.OpenStdin {
		t.Fatalf("info: %+v", info)
	}
	if err := p.Resize(guestapi.TTY{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	if info := p.Info(); *info.TTY != (guestapi.TTY{Rows: 40, Cols: 120}) {
		t.Fatalf("info after resize: %+v", info.TTY)
	}
	for field, size := range map[string]guestapi.TTY{
		"tty.rows": {Rows: 0, Cols: 80}, "tty.cols": {Rows: 24, Cols: 10001},
	} {
		if err := p.Resize(size); !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), field+":") {
			t.Errorf("resize to %+v: %v", size, err)
		}
	}
	s.waitFor(t, "WINCH") // the signal interrupts read, which the shell then runs again
	if err := p.WriteInput(t.Context(), []byte("\n")); err != nil {
		t.Fatal(err)
	}
	if r := s.end(t); r == nil || r.ExitCode != 0 {
		t.Fatalf("exit %+v", r)
	}
	// The terminal's echo of the input may come before or after.
	if out := s.text(); !strings.HasPrefix(out, "24 80\r\n") || !strings.Contains(out, "40 120\r\n") || !strings.Contains(out, "WINCH") {
		t.Fatalf("after the resize: %q", out)
	}
	if err := p.Resize(guestapi.TTY{Rows: 10, Cols: 10}); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("resize after the exit: %v", err)
	}
	if info := p.Info(); info.OpenStdin || info.TTY == nil {
		t.Fatalf("info after the exit: %+v", info)
	}
}

func TestTerminalInterrupt(t *testing.T) {
	testutil.NoLeaks(t) // before newTable: cleanups run last first
	tb := newTable(t)
	p, err := tb.Start(ttySpec(24, 80, "sleep", "100"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteInput(t.Context(), []byte{0x03}); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, p); r.Signal != 2 || r.ExitCode != 130 {
		t.Fatalf("^C: %+v", r)
	}
	// A shell's trap, with a child in the foreground group.
	p, err = tb.Start(ttySpec(24, 80, "sh", "-c", `trap 'echo INT; exit 3' INT; echo ready; sleep 100 & wait`))
	if err != nil {
		t.Fatal(err)
	}
	s := watch(t.Context(), p)
	s.waitFor(t, "ready")
	if err := p.WriteInput(t.Context(), []byte{0x03}); err != nil {
		t.Fatal(err)
	}
	if r := s.end(t); r == nil || r.ExitCode != 3 || !strings.Contains(s.text(), "INT") {
		t.Fatalf("trap: %q %+v", s.text(), r)
	}
}

func TestTerminalCloseInput(t *testing.T) {
	testutil.NoLeaks(t) // before newTable: cleanups run last first
	tb := newTable(t)
	p, err := tb.Start(ttySpec(24, 80, "cat"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteInput(t.Context(), []byte("abc\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseInput(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseInput(t.Context()); err != nil && !errdefs.IsConflict(err) {
		t.Fatalf("second close: %v", err)
	}
	// Echoed by the terminal, then written by cat.
	if r := wait(t, p); r.ExitCode != 0 || string(r.Stdout) != "abc\r\nabc\r\n" {
		t.Fatalf("%q %+v", r.Stdout, r)
	}
}

func TestOpenStdin(t *testing.T) {
	testutil.NoLeaks(t) // before newTable: cleanups run last first
	tb := newTable(t)
	p, err := tb.Start(guestapi.ProcessSpec{Args: []string{"cat"}, OpenStdin: true, Stdin: []byte("first ")})
	if err != nil {
		t.Fatal(err)
	}
	if info := p.Info(); !info.OpenStdin || info.TTY != nil {
		t.Fatalf("info: %+v", info)
	}
	s := watch(t.Context(), p)
	if err := p.WriteInput(t.Context(), []byte("a")); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, "first a")
	if err := p.CloseInput(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteInput(t.Context(), []byte("b")); !errdefs.IsConflict(err) { // closed, or cat has exited already
		t.Fatalf("write after close: %v", err)
	}
	if err := p.CloseInput(t.Context()); err != nil {
		t.Fatalf("close again: %v", err)
	}
	if r := s.end(t); r == nil || r.ExitCode != 0 || s.text() != "first a" {
		t.Fatalf("%q %+v", s.text(), r)
	}
	if info := p.Info(); info.OpenStdin {
		t.Fatalf("info after the exit: %+v", info)
	}
	if err := p.WriteInput(t.Context(), []byte("late")); !errdefs.IsConflict(err) || err.Error() != fmt.Sprintf("process %d has exited", p.Pid()) {
		t.Fatalf("write after the exit: %v", err)
	}

	// Without open input: a conflict that says how to get it.
	p, err = tb.Start(guestapi.ProcessSpec{Args: []string{"sleep", "10"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Signal(9)
	want := fmt.Sprintf("process %d was not started with open stdin (open_stdin or tty)", p.Pid())
	for _, err := range []error{p.WriteInput(t.Context(), []byte("x")), p.CloseInput(t.Context())} {
		if !errdefs.IsConflict(err) || err.Error() != want {
			t.Fatalf("input to a process without open stdin: %v", err)
		}
	}
	if err := p.Resize(guestapi.TTY{Rows: 1, Cols: 1}); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "terminal") {
		t.Fatalf("resize without a terminal: %v", err)
	}
}

// TestInputRespectsContext: input to a process that does not read waits
// only as long as its context, and a process that exits ends the wait.
func TestInputRespectsContext(t *testing.T) {
	testutil.NoLeaks(t) // before newTable: cleanups run last first
	tb := newTable(t)
	big := bytes.Repeat([]byte("x"), 4<<20)
	for _, spec := range []guestapi.ProcessSpec{
		{Args: []string{"sleep", "100"}, OpenStdin: true},
		ttySpec(24, 80, "sleep", "100"),
	} {
		p, err := tb.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		start := time.Now()
		err = p.WriteInput(ctx, big)
		cancel()
		if err != context.DeadlineExceeded || time.Since(start) > 2*time.Second {
			t.Fatalf("tty=%v: %v after %v", spec.TTY != nil, err, time.Since(start))
		}
		// Another writer waits its turn; the exit ends both.
		errs := make(chan error, 2)
		for range 2 {
			go func() { errs <- p.WriteInput(context.Background(), big) }()
		}
		time.Sleep(20 * time.Millisecond)
		p.Signal(9)
		for range 2 {
			if err := <-errs; !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "exited") {
				t.Fatalf("tty=%v: write as the process exits: %v", spec.TTY != nil, err)
			}
		}
		wait(t, p)
	}
}

// TestScrollback: an attachment made later gets exactly the last
// ScrollbackBytes of a terminal's output, then what comes.
func TestScrollback(t *testing.T) {
	testutil.NoLeaks(t) // before newTable: cleanups run last first
	tb := newTable(t)
	p, err := tb.Start(ttySpec(24, 80, "sh", "-c", `seq 1 200000; echo MARK; read x; echo after $x`))
	if err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool {
		out, _ := collectNow(p)
		return strings.HasSuffix(out, "MARK\r\n")
	}) {
		t.Fatal("no MARK")
	}
	out, _ := collectNow(p)
	if len(out) < 1<<20 {
		t.Fatalf("only %d bytes of output", len(out))
	}
	s := watch(t.Context(), p)
	if !eventually(10*time.Second, func() bool { return len(s.text()) >= guestapi.ScrollbackBytes }) {
		t.Fatalf("attachment got %d bytes", len(s.text()))
	}
	if got := s.text(); got != out[len(out)-guestapi.ScrollbackBytes:] {
		t.Fatalf("scrollback: %d bytes, ending %q", len(got), got[max(0, len(got)-20):])
	}
	if err := p.WriteInput(t.Context(), []byte("now\n")); err != nil {
		t.Fatal(err)
	}
	if r := s.end(t); r == nil || r.ExitCode != 0 || !strings.Contains(s.text(), "after now\r\n") {
		t.Fatalf("%+v %q", r, s.text()[len(s.text())-30:])
	}
	// After the end: the scrollback, then the exit.
	s = watch(t.Context(), p)
	if r := s.end(t); r == nil || len(s.text()) != guestapi.ScrollbackBytes || !strings.Contains(s.text(), "after now\r\n") {
		t.Fatalf("after the end: %d bytes, %+v", len(s.text()), r)
	}
}

// collectNow is a process's kept output so far.
func collectNow(p *Process) (string, bool) {
	var b strings.Builder
	done := false
	for _, ev := range p.Snapshot() {
		b.Write(ev.Data)
		done = done || ev.Type == guestapi.EventExit
	}
	return b.String(), done
}

// TestAttachmentsFanOut: several attachments each get all the output, at
// their own pace; one that never reads holds up nobody, and ending one
// leaves the process running.
func TestAttachmentsFanOut(t *testing.T) {
	testutil.NoLeaks(t) // before newTable: cleanups run last first
	tb := newTable(t)
	for _, tty := range []bool{false, true} {
		// Less than the scrollback: an attachment of a terminal that falls
		// further behind may skip ahead.
		spec := guestapi.ProcessSpec{Args: []string{"sh", "-c", `seq 1 20000; read x; echo bye`}, OpenStdin: true}
		if tty {
			spec.TTY = &guestapi.TTY{Rows: 24, Cols: 80}
		}
		p, err := tb.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		stuck, unstick := context.WithCancel(context.Background())
		defer unstick()
		_ = p.Attach(stuck) // never read
		a, b := watch(t.Context(), p), watch(t.Context(), p)
		gone, cancel := context.WithCancel(context.Background())
		c := watch(gone, p)
		for _, s := range []*screen{a, b, c} {
			s.waitFor(t, "\n20000")
		}
		cancel()
		c.end(t)
		if !p.Running() {
			t.Fatal("ending an attachment ended the process")
		}
		if err := p.WriteInput(t.Context(), []byte("\n")); err != nil {
			t.Fatal(err)
		}
		r := wait(t, p)
		for _, s := range []*screen{a, b} {
			if e := s.end(t); e == nil || e.ExitCode != 0 || e.Stdout != nil || s.text() != string(r.Stdout) {
				t.Fatalf("tty=%v: attachment got %d bytes, the process wrote %d (%+v)", tty, len(s.text()), len(r.Stdout), e)
			}
		}
	}
}

func TestTerminalSpecs(t *testing.T) {
	tb := newTable(t)
	for field, size := range map[string]guestapi.TTY{
		"tty.rows": {Cols: 80}, "tty.cols": {Rows: 24}, "tty.rows:": {Rows: 10001, Cols: 80}, "tty.cols:": {Rows: 1, Cols: 65535},
	} {
		spec := guestapi.ProcessSpec{Args: []string{"true"}, TTY: &size}
		if _, err := tb.Start(spec); !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), strings.TrimSuffix(field, ":")+":") {
			t.Errorf("%+v: %v", size, err)
		}
	}
	// The largest is fine.
	if r := run(t, tb, ttySpec(MaxTTYSide, MaxTTYSide, "stty", "size")); string(r.Stdout) != "10000 10000\r\n" {
		t.Fatalf("largest: %q", r.Stdout)
	}
}

func TestScrollbackRing(t *testing.T) {
	var s scrollback
	if b, next := s.read(0, 10); b != nil || next != 0 {
		t.Fatalf("empty: %q %d", b, next)
	}
	var all []byte
	for i := range 3000 {
		chunk := bytes.Repeat([]byte{byte('a' + i%26)}, 1+i*7%500)
		s.write(chunk)
		all = append(all, chunk...)
	}
	s.write(bytes.Repeat([]byte("Z"), guestapi.ScrollbackBytes+5)) // more than the ring at once
	all = append(all, bytes.Repeat([]byte("Z"), guestapi.ScrollbackBytes+5)...)
	s.write([]byte("tail"))
	all = append(all, "tail"...)
	if s.total != int64(len(all)) || s.oldest() != int64(len(all)-guestapi.ScrollbackBytes) {
		t.Fatalf("total %d oldest %d", s.total, s.oldest())
	}
	// From far behind: skipped ahead to the oldest kept.
	var got []byte
	for at := int64(0); ; {
		b, next := s.read(at, 1000)
		if len(b) == 0 {
			break
		}
		got, at = append(got, b...), next
	}
	if !bytes.Equal(got, all[len(all)-guestapi.ScrollbackBytes:]) {
		t.Fatalf("read %d bytes, not the last %d", len(got), guestapi.ScrollbackBytes)
	}
}
