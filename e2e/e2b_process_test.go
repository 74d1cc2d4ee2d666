package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/e2b/envd/process"
	"github.com/berthsh/berth/api/e2b/envd/process/processconnect"
)

// procStream reads a process stream (Start's or Connect's) in the
// background, so that a test waits for output while it sends input.
type procStream struct {
	t      *testing.T
	events chan *process.ProcessEvent
	errc   chan error // the stream's end: nil, or its error
	done   chan struct{}

	started    bool
	pid        uint32
	out        strings.Builder // stdout, or a terminal's output
	stderr     strings.Builder
	keepalives int
	end        *process.ProcessEvent_EndEvent
	err        error
	over       bool
}

// readProcStream follows s until it ends or the test does.
func readProcStream[T any](t *testing.T, s *connect.ServerStreamForClient[T], event func(*T) *process.ProcessEvent) *procStream {
	ps := &procStream{t: t, events: make(chan *process.ProcessEvent), errc: make(chan error, 1), done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(ps.events)
		for s.Receive() {
			select {
			case ps.events <- event(s.Msg()):
			case <-ps.done:
				return
			}
		}
		ps.errc <- s.Err()
	})
	t.Cleanup(func() {
		close(ps.done)
		s.Close()
		wg.Wait()
	})
	return ps
}

// startProc starts a process as user and follows its stream.
func startProc(t *testing.T, ctx context.Context, c processconnect.ProcessClient, user string, req *process.StartRequest) *procStream {
	t.Helper()
	s, err := c.Start(ctx, asUser(req, user))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	return readProcStream(t, s, (*process.StartResponse).GetEvent)
}

// connectProc follows a process that is already there.
func connectProc(t *testing.T, ctx context.Context, c processconnect.ProcessClient, sel *process.ProcessSelector) *procStream {
	t.Helper()
	s, err := c.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return readProcStream(t, s, (*process.ConnectResponse).GetEvent)
}

// next takes one event into ps; false once the stream is over.
func (ps *procStream) next(ctx context.Context) bool {
	ps.t.Helper()
	if ps.over {
		return false
	}
	select {
	case ev, ok := <-ps.events:
		if !ok {
			ps.err, ps.over = <-ps.errc, true
			return false
		}
		switch ev := ev.GetEvent().(type) {
		case *process.ProcessEvent_Start:
			if ps.started {
				ps.t.Fatalf("a second start event: %v", ev)
			}
			ps.started, ps.pid = true, ev.Start.GetPid()
		case *process.ProcessEvent_Data:
			if !ps.started || ps.end != nil {
				ps.t.Fatalf("data outside start and end: %v", ev)
			}
			ps.out.Write(ev.Data.GetStdout())
			ps.out.Write(ev.Data.GetPty())
			ps.stderr.Write(ev.Data.GetStderr())
		case *process.ProcessEvent_End:
			if !ps.started || ps.end != nil {
				ps.t.Fatalf("end before start, or twice: %v", ev)
			}
			ps.end = ev.End
		case *process.ProcessEvent_Keepalive:
			ps.keepalives++
		default:
			ps.t.Fatalf("an event of no kind: %v", ev)
		}
		return true
	case <-ctx.Done():
		ps.t.Fatalf("stream: %v; output so far %q, stderr %q", ctx.Err(), ps.out.String(), ps.stderr.String())
		return false
	}
}

// until reads until the output holds want; it returns the output.
func (ps *procStream) until(want string) string {
	ps.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !strings.Contains(ps.out.String(), want) {
		if !ps.next(ctx) {
			ps.t.Fatalf("stream over (%v, end %v) before %q; output %q, stderr %q", ps.err, ps.end, want, ps.out.String(), ps.stderr.String())
		}
	}
	return ps.out.String()
}

// pidOf reads up to the start event and returns its pid.
func (ps *procStream) pidOf() uint32 {
	ps.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !ps.started {
		if !ps.next(ctx) {
			ps.t.Fatalf("stream over before its start event: %v", ps.err)
		}
	}
	return ps.pid
}

// wait reads to the stream's end and returns its end event; err is the
// stream's error.
func (ps *procStream) wait() (*process.ProcessEvent_EndEvent, error) {
	ps.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for ps.next(ctx) {
	}
	return ps.end, ps.err
}

// mustEnd waits for the stream's end, which must end it cleanly.
func (ps *procStream) mustEnd() *process.ProcessEvent_EndEvent {
	ps.t.Helper()
	end, err := ps.wait()
	if err != nil || end == nil {
		ps.t.Fatalf("stream: end %v, err %v; output %q, stderr %q", end, err, ps.out.String(), ps.stderr.String())
	}
	return end
}

func bash(script string) *process.ProcessConfig {
	return &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}
}

func pidSel(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

func tagSel(tag string) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: tag}}
}

func stdinInput(b string) *process.ProcessInput {
	return &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(b)}}
}

func ptyInput(b string) *process.ProcessInput {
	return &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(b)}}
}

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("%s: %v (code %v), want %v", what, err, connect.CodeOf(err), code)
	}
}

func newE2BSandbox(t *testing.T, d *daemon) api.Sandbox {
	t.Helper()
	sb, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.AccessToken == "" {
		t.Fatalf("sandbox %s has no access token", sb.ID)
	}
	return sb
}

// TestE2BProcessStart: commands.run's Start: output on its streams, the
// config's env, cwd and the request's user, exit codes and the status and
// error envd gives them, a program that cannot start, all the output of a
// process that exits at once, the notice for output past berth's bound,
// keepalives, and a request without a command.
func TestE2BProcessStart(t *testing.T) {
	d := startDaemon(t, "")
	sb := newE2BSandbox(t, d)
	c := newEnvdClient(t, d, sb).proc
	ctx := t.Context()

	t.Run("output", func(t *testing.T) {
		cfg := bash("echo $GREETING; pwd; id -un; echo oops >&2")
		cwd := "/tmp"
		cfg.Envs, cfg.Cwd = map[string]string{"GREETING": "hello"}, &cwd
		ps := startProc(t, ctx, c, "root", &process.StartRequest{Process: cfg, Stdin: new(bool)})
		end := ps.mustEnd()
		if ps.pid == 0 || ps.out.String() != "hello\n/tmp\nroot\n" || ps.stderr.String() != "oops\n" {
			t.Fatalf("pid %d stdout %q stderr %q", ps.pid, ps.out.String(), ps.stderr.String())
		}
		if end.GetExitCode() != 0 || !end.GetExited() || end.GetStatus() != "exit status 0" || end.Error != nil {
			t.Fatalf("end %v", end)
		}
	})
	t.Run("default user", func(t *testing.T) {
		ps := startProc(t, ctx, c, "", &process.StartRequest{Process: bash("id -un"), Stdin: new(bool)})
		if ps.mustEnd(); ps.out.String() != "user\n" {
			t.Fatalf("id -un: %q", ps.out.String())
		}
	})
	t.Run("exit code", func(t *testing.T) {
		ps := startProc(t, ctx, c, "", &process.StartRequest{Process: bash("echo partial; exit 3"), Stdin: new(bool)})
		end := ps.mustEnd()
		if end.GetExitCode() != 3 || !end.GetExited() || end.GetStatus() != "exit status 3" || end.GetError() != "exit status 3" || ps.out.String() != "partial\n" {
			t.Fatalf("end %v, stdout %q", end, ps.out.String())
		}
	})
	t.Run("cannot start", func(t *testing.T) {
		ps := startProc(t, ctx, c, "", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/no/such/program"}, Stdin: new(bool)})
		end := ps.mustEnd()
		if end.GetExitCode() != 127 || end.Error == nil || !strings.Contains(end.GetError(), "/no/such/program") || !strings.Contains(ps.stderr.String(), "/no/such/program") {
			t.Fatalf("end %v, stderr %q", end, ps.stderr.String())
		}
	})
	t.Run("exits at once", func(t *testing.T) {
		// Its output is all there although the process may be gone before
		// the daemon attaches to it.
		for range 5 {
			ps := startProc(t, ctx, c, "", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "seq", Args: []string{"1", "100000"}}, Stdin: new(bool)})
			end := ps.mustEnd()
			lines := strings.Split(strings.TrimSuffix(ps.out.String(), "\n"), "\n")
			if end.GetExitCode() != 0 || len(lines) != 100000 || lines[99999] != "100000" {
				t.Fatalf("end %v, %d lines", end, len(lines))
			}
		}
	})
	t.Run("output past the bound", func(t *testing.T) {
		// envd streams everything; berth keeps and streams 64 MiB a stream.
		ps := startProc(t, ctx, c, "", &process.StartRequest{Process: bash("head -c 70000000 /dev/zero"), Stdin: new(bool)})
		end := ps.mustEnd()
		if end.GetExitCode() != 0 || ps.out.Len() != 64<<20 || !strings.Contains(ps.stderr.String(), "dropped") {
			t.Fatalf("end %v, %d bytes of stdout, stderr %q", end, ps.out.Len(), ps.stderr.String())
		}
	})
	t.Run("keepalive", func(t *testing.T) {
		req := asUser(&process.StartRequest{Process: bash("sleep 2.5"), Stdin: new(bool)}, "")
		req.Header().Set("Keepalive-Ping-Interval", "1")
		s, err := c.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ps := readProcStream(t, s, (*process.StartResponse).GetEvent)
		if end := ps.mustEnd(); end.GetExitCode() != 0 || ps.keepalives < 1 {
			t.Fatalf("end %v, %d keepalives", end, ps.keepalives)
		}
	})
	t.Run("no command", func(t *testing.T) {
		ps := startProc(t, ctx, c, "", &process.StartRequest{Process: &process.ProcessConfig{Args: []string{"x"}}})
		_, err := ps.wait()
		wantCode(t, "start without cmd", err, connect.CodeInvalidArgument)
	})
}

// TestE2BProcessStdin: a process that reads its stdin, fed by SendInput and
// StreamInput and ended by CloseStdin.
func TestE2BProcessStdin(t *testing.T) {
	d := startDaemon(t, "")
	sb := newE2BSandbox(t, d)
	c := newEnvdClient(t, d, sb).proc
	ctx := t.Context()

	stdin := true
	ps := startProc(t, ctx, c, "", &process.StartRequest{Process: bash("cat; echo done"), Stdin: &stdin})
	pid := ps.pidOf()
	for _, s := range []string{"hello\n", "again\n"} {
		if _, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: stdinInput(s)})); err != nil {
			t.Fatalf("send input: %v", err)
		}
	}
	ps.until("hello\nagain\n")
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	if end := ps.mustEnd(); end.GetExitCode() != 0 || ps.out.String() != "hello\nagain\ndone\n" {
		t.Fatalf("end %v, stdout %q", end, ps.out.String())
	}
	// Input to a process that has exited: it is not found, as in envd.
	_, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: stdinInput("late\n")}))
	wantCode(t, "input after the exit", err, connect.CodeNotFound)

	// StreamInput: ordered input on one client stream, selected by tag.
	tag := "reader"
	ps = startProc(t, ctx, c, "", &process.StartRequest{Process: bash("tr a-z A-Z"), Stdin: &stdin, Tag: &tag})
	pid = ps.pidOf()
	in := c.StreamInput(ctx)
	msgs := []*process.StreamInputRequest{
		{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: tagSel(tag)}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: stdinInput("one ")}}},
		{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: stdinInput("two\n")}}},
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatalf("stream input: %v", err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatalf("stream input: %v", err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	if end := ps.mustEnd(); end.GetExitCode() != 0 || ps.out.String() != "ONE TWO\n" {
		t.Fatalf("end %v, stdout %q", end, ps.out.String())
	}

	// Data before the start event that selects the process.
	in = c.StreamInput(ctx)
	in.Send(msgs[1])
	_, err = in.CloseAndReceive()
	wantCode(t, "stream input without start", err, connect.CodeInvalidArgument)
}

// TestE2BProcessPTY: pty.create's shell on a terminal: input as pty bytes,
// its output as pty data, a resize by Update that the next command sees,
// and its exit.
func TestE2BProcessPTY(t *testing.T) {
	d := startDaemon(t, "")
	sb := newE2BSandbox(t, d)
	c := newEnvdClient(t, d, sb).proc
	ctx := t.Context()

	ps := startProc(t, ctx, c, "", &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": "xterm-256color"}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Rows: 24, Cols: 80}},
	})
	pid := ps.pidOf()
	input := func(s string) {
		t.Helper()
		if _, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: ptyInput(s)})); err != nil {
			t.Fatalf("pty input %q: %v", s, err)
		}
	}
	input("echo $((40+2)); stty size\n")
	ps.until("42\r\n24 80\r\n")

	size := &process.PTY{Size: &process.PTY_Size{Rows: 30, Cols: 100}}
	if _, err := c.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: pidSel(pid), Pty: size})); err != nil {
		t.Fatalf("update: %v", err)
	}
	input("stty size\n")
	ps.until("30 100\r\n")

	// A terminal has no stdin to close; the process goes on.
	_, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)}))
	wantCode(t, "close stdin of a terminal", err, connect.CodeInvalidArgument)

	input("exit 7\n")
	if end := ps.mustEnd(); end.GetExitCode() != 7 || !end.GetExited() {
		t.Fatalf("end %v", end)
	}
	if ps.stderr.Len() != 0 {
		t.Fatalf("a terminal's output came as stderr: %q", ps.stderr.String())
	}
}

// TestE2BProcessBackground: a background command outlives its Start
// stream; List shows it with its tag and config, Connect (by tag or pid)
// follows it from its kept output, SIGKILL ends it (exited false), and
// once it has ended it is gone from List and signals find it no more.
func TestE2BProcessBackground(t *testing.T) {
	d := startDaemon(t, "")
	sb := newE2BSandbox(t, d)
	c := newEnvdClient(t, d, sb).proc
	ctx := t.Context()

	tag, cwd := "server", "/tmp"
	cfg := bash("echo ready; exec sleep 300")
	cfg.Envs, cfg.Cwd = map[string]string{"MODE": "bg"}, &cwd
	startCtx, disconnect := context.WithCancel(ctx)
	ps := startProc(t, startCtx, c, "", &process.StartRequest{Process: cfg, Tag: &tag, Stdin: new(bool)})
	ps.until("ready")
	pid := ps.pid
	disconnect() // the client goes away; the process stays

	time.Sleep(200 * time.Millisecond)
	res, err := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(res.Msg.GetProcesses(), func(p *process.ProcessInfo) bool { return p.GetPid() == pid })
	if i < 0 {
		t.Fatalf("list: %v lacks pid %d", res.Msg.GetProcesses(), pid)
	}
	got := res.Msg.GetProcesses()[i]
	if got.GetTag() != tag || got.GetConfig().GetCmd() != "/bin/bash" || !slices.Equal(got.GetConfig().GetArgs(), cfg.Args) ||
		got.GetConfig().GetEnvs()["MODE"] != "bg" || got.GetConfig().GetCwd() != cwd {
		t.Fatalf("listed %v", got)
	}

	byTag := connectProc(t, ctx, c, tagSel(tag))
	if byTag.pidOf() != pid {
		t.Fatalf("connect by tag: pid %d, want %d", byTag.pid, pid)
	}
	byTag.until("ready") // kept output comes first
	byPid := connectProc(t, ctx, c, pidSel(pid))
	byPid.until("ready")

	if _, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid)})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("signal unspecified: %v", err)
	}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	for _, s := range []*procStream{byTag, byPid} {
		if end := s.mustEnd(); end.GetExited() || end.GetExitCode() != -1 || end.GetStatus() != "signal: killed" || end.GetError() != "signal: killed" {
			t.Fatalf("end after SIGKILL: %v", end)
		}
	}

	res, err = c.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(res.Msg.GetProcesses(), func(p *process.ProcessInfo) bool { return p.GetPid() == pid }) {
		t.Fatalf("list after the kill still has %d: %v", pid, res.Msg.GetProcesses())
	}
	// The SDKs' kill of an ended process reports false: not_found.
	_, err = c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGTERM}))
	wantCode(t, "signal an ended process", err, connect.CodeNotFound)
	_, err = connectProc(t, ctx, c, tagSel(tag)).wait()
	wantCode(t, "connect by the tag of an ended process", err, connect.CodeNotFound)
	// By pid, an ended process the guest still keeps gives its output and end.
	late := connectProc(t, ctx, c, pidSel(pid))
	if end := late.mustEnd(); late.out.String() != "ready\n" || end.GetExited() {
		t.Fatalf("late connect: %q, end %v", late.out.String(), end)
	}
}

// TestE2BProcessTimeout: the request's Connect-Timeout-Ms kills the
// process when it passes, as envd's does.
func TestE2BProcessTimeout(t *testing.T) {
	d := startDaemon(t, "")
	sb := newE2BSandbox(t, d)
	c := newEnvdClient(t, d, sb).proc

	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	ps := startProc(t, ctx, c, "", &process.StartRequest{Process: bash("echo up; exec sleep 300"), Stdin: new(bool)})
	ps.until("up")
	pid := ps.pid
	_, err := ps.wait()
	wantCode(t, "stream past its timeout", err, connect.CodeDeadlineExceeded)

	late := connectProc(t, t.Context(), c, pidSel(pid))
	end := late.mustEnd()
	if end.GetExited() || end.GetStatus() != "signal: killed" || !strings.Contains(end.GetError(), "timeout") {
		t.Fatalf("end of a process past its timeout: %v", end)
	}
}

// TestE2BProcessErrors: the Connect codes the SDKs turn into their
// exceptions, for a wrong token, an unknown sandbox and unknown processes.
func TestE2BProcessErrors(t *testing.T) {
	d := startDaemon(t, "")
	sb := newE2BSandbox(t, d)
	c := newEnvdClient(t, d, sb).proc
	ctx := t.Context()

	wrong := sb
	wrong.AccessToken = "not-the-token"
	_, err := newEnvdClient(t, d, wrong).proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	wantCode(t, "wrong token", err, connect.CodeUnauthenticated)
	_, err = startProc(t, ctx, newEnvdClient(t, d, wrong).proc, "", &process.StartRequest{Process: bash("true")}).wait()
	wantCode(t, "start with a wrong token", err, connect.CodeUnauthenticated)

	// An unknown sandbox is answered before Connect as E2B's proxy
	// answers it (502, "The sandbox was not found"), which the SDKs turn
	// into their sandbox-gone error.
	req, _ := http.NewRequestWithContext(ctx, "POST", d.url+"/process.Process/List", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Sandbox-Id", "sb-does-not-exist")
	req.Header.Set("X-Access-Token", sb.AccessToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	json.NewDecoder(res.Body).Decode(&body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadGateway || body.Code != http.StatusBadGateway || body.Message != "The sandbox was not found" {
		t.Fatalf("unknown sandbox: %s %+v", res.Status, body)
	}

	const nope = 999999
	_, err = c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(nope), Signal: process.Signal_SIGNAL_SIGKILL}))
	wantCode(t, "signal an unknown pid", err, connect.CodeNotFound)
	_, err = c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(nope), Input: stdinInput("x")}))
	wantCode(t, "input to an unknown pid", err, connect.CodeNotFound)
	_, err = c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(nope)}))
	wantCode(t, "close stdin of an unknown pid", err, connect.CodeNotFound)
	_, err = c.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: pidSel(nope), Pty: &process.PTY{Size: &process.PTY_Size{Rows: 1, Cols: 1}}}))
	wantCode(t, "update an unknown pid", err, connect.CodeNotFound)
	_, err = c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(0), Signal: process.Signal_SIGNAL_SIGKILL}))
	wantCode(t, "signal pid 0", err, connect.CodeNotFound)
	_, err = connectProc(t, ctx, c, pidSel(nope)).wait()
	wantCode(t, "connect to an unknown pid", err, connect.CodeNotFound)
	_, err = connectProc(t, ctx, c, tagSel("no-such-tag")).wait()
	wantCode(t, "connect to an unknown tag", err, connect.CodeNotFound)
	_, err = connectProc(t, ctx, c, nil).wait()
	wantCode(t, "connect without a selector", err, connect.CodeInvalidArgument)
	_, err = c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: tagSel("no-such-tag"), Input: stdinInput("x")}))
	wantCode(t, "input to an unknown tag", err, connect.CodeNotFound)

	// A resize of a process without a terminal.
	ps := startProc(t, ctx, c, "", &process.StartRequest{Process: bash("exec sleep 300"), Stdin: new(bool)})
	pid := ps.pidOf()
	_, err = c.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: pidSel(pid), Pty: &process.PTY{Size: &process.PTY_Size{Rows: 10, Cols: 10}}}))
	wantCode(t, "resize without a terminal", err, connect.CodeInvalidArgument)
	if _, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if end := ps.mustEnd(); end.GetStatus() != "signal: terminated" {
		t.Fatalf("end after SIGTERM: %v", end)
	}
}

// wireRecorder notes the protocol and content type of each response.
type wireRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (w *wireRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := w.next.RoundTrip(r)
	if err == nil {
		w.mu.Lock()
		w.seen = append(w.seen, res.Proto+" "+res.Header.Get("Content-Type"))
		w.mu.Unlock()
	}
	return res, err
}

// TestE2BProcessWire: the service speaks Connect's JSON codec (the SDKs')
// and its binary one, over HTTP/1.1 and over HTTP/2 without TLS.
func TestE2BProcessWire(t *testing.T) {
	d := startDaemon(t, "")
	sb := newE2BSandbox(t, d)
	ctx := t.Context()
	for _, tc := range []struct {
		name      string
		json, h2c bool
		proto     string
		unary     string
	}{
		{"json over HTTP/1.1", true, false, "HTTP/1.1", "application/json"},
		{"proto over HTTP/1.1", false, false, "HTTP/1.1", "application/proto"},
		{"proto over h2c", false, true, "HTTP/2.0", "application/proto"},
		{"json over h2c", true, true, "HTTP/2.0", "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var base http.RoundTripper = http.DefaultTransport
			if tc.h2c {
				protocols := new(http.Protocols)
				protocols.SetUnencryptedHTTP2(true)
				tr := &http.Transport{Protocols: protocols}
				t.Cleanup(tr.CloseIdleConnections)
				base = tr
			}
			rec := &wireRecorder{next: base}
			h := http.Header{}
			h.Set("E2b-Sandbox-Id", sb.ID)
			h.Set("X-Access-Token", sb.AccessToken)
			var opts []connect.ClientOption
			if tc.json {
				opts = append(opts, connect.WithProtoJSON())
			}
			c := processconnect.NewProcessClient(&http.Client{Transport: headerTransport{h: h, next: rec}}, d.url, opts...)

			ps := startProc(t, ctx, c, "", &process.StartRequest{Process: bash("echo $((6*7))"), Stdin: new(bool)})
			if end := ps.mustEnd(); end.GetExitCode() != 0 || ps.out.String() != "42\n" {
				t.Fatalf("end %v, stdout %q", end, ps.out.String())
			}
			if _, err := c.List(ctx, connect.NewRequest(&process.ListRequest{})); err != nil {
				t.Fatalf("list: %v", err)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			want := []string{tc.proto + " " + strings.Replace(tc.unary, "/", "/connect+", 1), tc.proto + " " + tc.unary}
			if !slices.Equal(rec.seen, want) {
				t.Fatalf("responses %q, want %q", rec.seen, want)
			}
		})
	}
}

// TestE2BProcessListManyTags: tags pick the newest running process that
// has them, and List shows each tagged process once.
func TestE2BProcessListManyTags(t *testing.T) {
	d := startDaemon(t, "")
	sb := newE2BSandbox(t, d)
	c := newEnvdClient(t, d, sb).proc
	ctx := t.Context()

	tag := "worker"
	var pids []uint32
	for i := range 3 {
		ps := startProc(t, ctx, c, "", &process.StartRequest{Process: bash("echo " + strconv.Itoa(i) + "; exec sleep 300"), Tag: &tag, Stdin: new(bool)})
		ps.until(strconv.Itoa(i))
		pids = append(pids, ps.pid)
	}
	newest := pids[2]
	if p := connectProc(t, ctx, c, tagSel(tag)).pidOf(); p != newest {
		t.Fatalf("tag picked %d, want the newest %d", p, newest)
	}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: tagSel(tag), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	// The newest is gone: the tag now picks the one before it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		p := connectProc(t, ctx, c, tagSel(tag)).pidOf()
		if p == pids[1] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tag still picks %d after its kill", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res, err := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var tagged []uint32
	for _, p := range res.Msg.GetProcesses() {
		if p.GetTag() == tag {
			tagged = append(tagged, p.GetPid())
		}
	}
	slices.Sort(tagged)
	want := slices.Sorted(slices.Values(pids[:2]))
	if !slices.Equal(tagged, want) {
		t.Fatalf("tagged processes listed %v, want %v", tagged, want)
	}
}
