package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testutil"
)

// termReader collects a terminal's output until what a test waits for.
type termReader struct {
	t    *testing.T
	term *client.Terminal
	out  strings.Builder
	exit *api.ExecResult
	errs []string
}

// until reads until the output (since the last until) holds want, or the
// deadline; it returns that output.
func (r *termReader) until(ctx context.Context, want string) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for !strings.Contains(r.out.String(), want) {
		ev, err := r.term.Next(ctx)
		if err != nil {
			r.t.Fatalf("waiting for %q: %v; output so far %q", want, err, r.out.String())
		}
		r.out.Write(ev.Stdout)
		r.out.Write(ev.Stderr)
		if ev.Error != nil {
			r.errs = append(r.errs, ev.Error.Class+": "+ev.Error.Message)
		}
		if ev.Exit != nil {
			r.exit = ev.Exit
			if !strings.Contains(r.out.String(), want) {
				r.t.Fatalf("exited (%+v) before %q; output %q", ev.Exit, want, r.out.String())
			}
		}
	}
	s := r.out.String()
	r.out.Reset()
	return s
}

// TestTerminal: a shell on a terminal over the WebSocket: its size, a
// resize, Ctrl-C, messages the daemon cannot take, a dropped connection
// and a reattach with the scrollback, and the exit code at the end.
func TestTerminal(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	term, err := d.client.OpenTerminal(ctx, sb.ID, client.TerminalOptions{Cmd: []string{"/bin/sh"}, Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	if term.Pid <= 0 || term.TTY == nil || *term.TTY != (api.TTY{Rows: 30, Cols: 100}) {
		t.Fatalf("attached: pid %d tty %+v", term.Pid, term.TTY)
	}
	r := &termReader{t: t, term: term}
	io := func(s string) { term.Write([]byte(s)) }

	io("stty size; tty; echo $TERM\n")
	if out := r.until(ctx, "xterm-256color"); !strings.Contains(out, "30 100") || !strings.Contains(out, "/dev/pts/") {
		t.Fatalf("stty size, tty: %q", out)
	}
	if err := term.Resize(ctx, 40, 120); err != nil {
		t.Fatal(err)
	}
	io("stty size\n")
	r.until(ctx, "40 120")

	// Ctrl-C reaches the foreground program through the terminal.
	// (An interactive shell drops the rest of a line ^C interrupted: $? is
	// asked for on the next line.)
	io("sleep 100\n")
	waitSleeping(t, d, sb.ID) // a ^C before sleep runs would reach the shell instead
	io("\x03")
	io("echo sleep-ended-$?\n")
	r.until(ctx, "sleep-ended-130")

	// Messages the daemon cannot take, on a second attachment: an error
	// each, the terminal goes on.
	raw, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(d.url, "http")+fmt.Sprintf("/v1/sandboxes/%s/processes/%d/attach", sb.ID, term.Pid),
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + d.key}}})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.CloseNow()
	raw.SetReadLimit(1 << 20)
	for _, bad := range []string{`{bad json`, `{"type":"resize","rows":0,"cols":80}`, `{"type":"resize","rows":24,"cols":100000}`, `{"type":"dance"}`} {
		if err := raw.Write(ctx, websocket.MessageText, []byte(bad)); err != nil {
			t.Fatal(err)
		}
		for {
			typ, b, err := raw.Read(ctx)
			if err != nil {
				t.Fatalf("%s: %v", bad, err)
			}
			var m api.TerminalMessage
			if typ != websocket.MessageText || json.Unmarshal(b, &m) != nil || m.Type != api.MsgError {
				continue // the scrollback, the attached message
			}
			if m.Error == nil || m.Error.Class != string(errdefs.InvalidArgument) {
				t.Fatalf("%s: %+v", bad, m.Error)
			}
			break
		}
	}
	raw.Close(websocket.StatusNormalClosure, "")
	io("echo still-here\n")
	r.until(ctx, "still-here")

	// A dropped connection leaves the shell running; a reattach shows the
	// recent screen first.
	io("echo before-detach\n")
	r.until(ctx, "before-detach")
	term.Close()
	p, err := d.client.GetProcess(ctx, sb.ID, term.Pid)
	if err != nil || !p.Running || p.TTY == nil || p.TTY.Rows != 40 {
		t.Fatalf("after detach: %+v %v", p, err)
	}
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "true"}); err != nil {
		t.Fatal(err)
	}
	term2, err := d.client.Attach(ctx, sb.ID, term.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer term2.Close()
	r2 := &termReader{t: t, term: term2}
	if out := r2.until(ctx, "before-detach"); !strings.Contains(out, "40 120") || !strings.Contains(out, "still-here") {
		t.Fatalf("scrollback: %q", out)
	}
	term2.Write([]byte("exit 3\n"))
	ctx2, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for r2.exit == nil {
		ev, err := term2.Next(ctx2)
		if err != nil {
			t.Fatalf("waiting for the exit: %v", err)
		}
		r2.exit = ev.Exit
	}
	if r2.exit.ExitCode != 3 {
		t.Fatalf("exit: %+v", r2.exit)
	}

	// Bad input before anything starts.
	if _, err := d.client.Attach(ctx, sb.ID, 99999); !errdefs.IsNotFound(err) {
		t.Fatalf("attach an unknown process: %v", err)
	}
	if _, err := d.client.OpenTerminal(ctx, sb.ID, client.TerminalOptions{Rows: 20000}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "tty.rows") {
		t.Fatalf("20000 rows: %v", err)
	}
	if _, err := d.client.OpenTerminal(ctx, "sb-nosuchsandbox", client.TerminalOptions{}); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}, TTY: &api.TTY{Rows: 1, Cols: 1}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("exec with a tty: %v", err)
	}
}

// TestTerminalDefaultShellAndDelete: the default is a login bash; a
// sandbox deleted under an open terminal closes it with the reason and
// leaves no goroutine behind.
func TestTerminalDefaultShellAndDelete(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	base := d.goroutines(t)
	term, err := d.client.OpenTerminal(ctx, sb.ID, client.TerminalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := &termReader{t: t, term: term}
	term.Write([]byte("echo shell=$0 size=$(stty size)\n"))
	if out := r.until(ctx, "size=24 80"); !strings.Contains(out, "shell=-bash") && !strings.Contains(out, "shell=bash") {
		t.Fatalf("default shell: %q", out)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		ev, err := term.Next(rctx)
		if err != nil {
			if rctx.Err() != nil {
				t.Fatal("the terminal of a deleted sandbox stayed open")
			}
			break
		}
		if ev.Exit != nil {
			break // the shell died with the sandbox and said so first
		}
	}
	term.Close()
	d.noLeak(t, base)
}

// TestInteractiveStdin: a background process started with open stdin is
// fed later, over HTTP and over an attachment, until its input closes.
func TestInteractiveStdin(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-u", "-i", "-q"}, OpenStdin: true})
	if err != nil || !p.OpenStdin {
		t.Fatalf("start: %+v %v", p, err)
	}
	if err := d.client.WriteStdin(ctx, sb.ID, p.Pid, []byte("x = 6 * 7\n"), false); err != nil {
		t.Fatal(err)
	}
	term, err := d.client.Attach(ctx, sb.ID, p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if term.TTY != nil {
		t.Fatalf("a process without a terminal attached with tty %+v", term.TTY)
	}
	r := &termReader{t: t, term: term}
	term.Write([]byte("print(x)\n"))
	r.until(ctx, "42")
	term.Write([]byte("import sys; print('to-stderr', file=sys.stderr)\n"))
	r.until(ctx, "to-stderr")
	if err := d.client.WriteStdin(ctx, sb.ID, p.Pid, []byte("print('bye')\n"), true); err != nil {
		t.Fatal(err)
	}
	r.until(ctx, "bye")
	res, err := d.client.WaitProcess(ctx, sb.ID, p.Pid, 10*time.Second)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("after EOF: %+v %v", res, err)
	}
	// A closed input, and a process that never had one: conflict.
	if err := d.client.WriteStdin(ctx, sb.ID, p.Pid, []byte("x"), false); !errdefs.IsConflict(err) {
		t.Fatalf("stdin of an exited process: %v", err)
	}
	q, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.client.WriteStdin(ctx, sb.ID, q.Pid, []byte("x"), false); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "stdin") {
		t.Fatalf("stdin of a process without open stdin: %v", err)
	}
}

// TestShellInTmux: berth shell in a real terminal (tmux): the size of the
// pane, a resize of the window, Ctrl-C to the program, the exit code back.
func TestShellInTmux(t *testing.T) {
	testutil.RequireProgram(t, "tmux")
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sock := fmt.Sprintf("berth-test-%d", time.Now().UnixNano())
	tmux := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", append([]string{"-L", sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	shell := fmt.Sprintf("BERTH_API_KEY=%s %s --url %s shell %s; echo BERTH-EXIT=$?; sleep 60", d.key, d.bin, d.url, sb.ID)
	tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", "sh", "-c", shell)
	t.Cleanup(func() { exec.Command("tmux", "-L", sock, "kill-server").Run() })
	tmux("set-option", "-t", "t", "status", "off")
	screen := func(want string) string {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			s := tmux("capture-pane", "-p", "-t", "t")
			if strings.Contains(s, want) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("the screen never showed %q:\n%s", want, s)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	size := func() string {
		return strings.TrimSpace(tmux("display-message", "-p", "-t", "t", "#{pane_height} #{pane_width}"))
	}
	// The login shell's prompt, then the pane's size inside.
	tmux("send-keys", "-t", "t", "echo ready-$((6*7))", "Enter")
	screen("ready-42")
	want := size()
	tmux("send-keys", "-t", "t", "stty size", "Enter")
	screen("\n" + want)
	tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
	want2 := size()
	if want2 == want {
		t.Fatalf("tmux did not resize: %s", want2)
	}
	// SIGWINCH reaches berth, which resizes the sandbox's terminal.
	deadline := time.Now().Add(10 * time.Second)
	for {
		tmux("send-keys", "-t", "t", "clear; stty size", "Enter")
		time.Sleep(200 * time.Millisecond)
		if strings.Contains(tmux("capture-pane", "-p", "-t", "t"), want2) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the resize never reached the sandbox: want %s", want2)
		}
	}
	tmux("send-keys", "-t", "t", "sleep 100", "Enter")
	waitSleeping(t, d, sb.ID)
	tmux("send-keys", "-t", "t", "C-c")
	tmux("send-keys", "-t", "t", "echo after-$?", "Enter")
	screen("after-130")
	tmux("send-keys", "-t", "t", "exit 3", "Enter")
	screen("BERTH-EXIT=3")
}

// waitSleeping waits until a sleep runs in the sandbox.
func waitSleeping(t *testing.T, d *daemon, id string) {
	t.Helper()
	waitFor(t, 10*time.Second, func() bool {
		r, err := d.client.Exec(t.Context(), id, api.ExecRequest{Cmd: []string{"pgrep", "-x", "sleep"}})
		return err == nil && r.ExitCode == 0
	})
}
