package e2b

import (
	"cmp"
	"context"
	"errors"
	"math"
	"net/http"
	"path"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/e2b/envd/process"
	"github.com/berthsh/berth/api/e2b/envd/process/processconnect"
	"github.com/berthsh/berth/errdefs"
)

const (
	// procMaxOutput bounds each of a process's stdout and stderr: berth's
	// largest max_output_bytes.
	procMaxOutput = 64 << 20
	// procMaxInputWrite is the most the guest takes in one write of input;
	// larger input goes in parts, in order.
	procMaxInputWrite = 16 << 20
	// procResizeWait bounds how long Update waits to see a new terminal size
	// applied (the attachment that carries it does not acknowledge it).
	procResizeWait = 5 * time.Second
)

// processService is envd's process.Process over the manager's processes:
// Start is StartProcess then an attachment, whose replay of the output the
// guest kept means a process that exits before the attachment is made
// still gives all its output and its end.
type processService struct {
	processconnect.UnimplementedProcessHandler
	g *Group
}

func (s *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	e := envdOf(ctx)
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return errdefs.New(errdefs.InvalidArgument, "process.cmd: required")
	}
	cwd, err := s.cwd(ctx, e, cfg.GetCwd())
	if err != nil {
		return err
	}
	xr := api.ExecRequest{
		Cmd:  append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:  cfg.GetEnvs(),
		Cwd:  cwd,
		User: e.user,
		// envd kills the process when the request's timeout passes.
		TimeoutMs: s.timeoutMs(ctx, req.Header()),
		// Unset is open, envd's default for SDKs older than the field.
		OpenStdin: req.Msg.Stdin == nil || req.Msg.GetStdin(),
		// envd streams all output; berth keeps what it streams, so keep
		// the most berth allows (the guest's memory is the sandbox's).
		MaxOutputBytes: procMaxOutput,
	}
	if pty := req.Msg.GetPty(); pty != nil {
		rows, cols := int(pty.GetSize().GetRows()), int(pty.GetSize().GetCols())
		if rows == 0 && cols == 0 { // no size: a terminal's usual one
			rows, cols = 24, 80
		}
		xr.TTY = &api.TTY{Rows: rows, Cols: cols}
	}
	p, err := s.g.m.StartProcess(ctx, e.tenant, e.id, xr)
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if p.Pid <= 0 {
		// The program could not start (not found, not executable): the
		// guest's result says why, and no process is left to attach to.
		if p.Result == nil {
			return errdefs.New(errdefs.Unavailable, "sandbox %s: the guest started no process and gave no reason", e.id)
		}
		if err := send(procStartEvent(0)); err != nil {
			return err
		}
		if len(p.Result.Stderr) > 0 {
			if err := send(procDataEvent(api.EventStderr, p.Result.Stderr, false)); err != nil {
				return err
			}
		}
		return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: procEndEvent(p.Result)}})
	}
	s.g.procs.add(e.id, p.Pid, p.StartedAt, req.Msg.Tag, cfg)
	if err := send(procStartEvent(p.Pid)); err != nil {
		return err
	}
	ended, err := s.follow(ctx, e, p.Pid, xr.TTY != nil, keepaliveEvery(req.Header()), send)
	if ended {
		s.g.procs.forget(e.id, p.Pid, p.StartedAt)
	}
	return err
}

// Connect follows a process as Start does. One that has ended gives its
// kept output and its end: the guest keeps finished processes a while,
// where envd keeps only their end, for 30 seconds.
func (s *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	e := envdOf(ctx)
	p, err := s.lookup(ctx, e, req.Msg.GetProcess(), false)
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(procStartEvent(p.Pid)); err != nil {
		return err
	}
	ended, err := s.follow(ctx, e, p.Pid, p.TTY != nil, keepaliveEvery(req.Header()), send)
	if ended {
		s.g.procs.forget(e.id, p.Pid, p.StartedAt)
	}
	return err
}

// follow sends process pid's output, then its end, through an attachment.
// It reports whether the end was sent. The client's going away (ctx) ends
// the attachment, never the process.
func (s *processService) follow(ctx context.Context, e envdRequest, pid int, tty bool, keepalive time.Duration, send func(*process.ProcessEvent) error) (bool, error) {
	a, err := s.g.m.Attach(ctx, e.tenant, e.id, pid)
	if err != nil {
		return false, err
	}
	type output struct {
		stream string
		data   []byte
		res    *api.ExecResult
		err    error
	}
	// Next blocks on the guest; it is read apart so that ctx and the
	// keepalive are seen meanwhile. Closing the attachment ends it.
	next := make(chan output)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			var o output
			o.stream, o.data, o.res, o.err = a.Next()
			select {
			case next <- o:
			case <-stop:
				return
			}
			if o.res != nil || o.err != nil {
				return
			}
		}
	})
	defer func() {
		close(stop)
		a.Close()
		wg.Wait()
	}()
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-tick.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return false, err
			}
		case o := <-next:
			switch {
			case o.err != nil:
				// The sandbox went away mid-stream (stopped, deleted): envd's
				// stream would break, which the SDKs read as unavailable and
				// then ask /health whether the sandbox is gone.
				return false, connect.NewError(connect.CodeUnavailable, errors.New(errdefs.Message(o.err)))
			case o.res != nil:
				if !tty && (o.res.StdoutTruncated || o.res.StderrTruncated) {
					// envd streams all output; berth's guest keeps a bounded
					// amount of a process's stdout and stderr, and streams
					// what it keeps (a terminal's output is streamed whole).
					notice := []byte("berth: output past the sandbox's per-process bound was dropped\n")
					if err := send(procDataEvent(api.EventStderr, notice, false)); err != nil {
						return false, err
					}
				}
				return true, send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: procEndEvent(o.res)}})
			case len(o.data) > 0:
				if err := send(procDataEvent(o.stream, o.data, tty)); err != nil {
					return false, err
				}
				tick.Reset(keepalive)
			}
		}
	}
}

func (s *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	e := envdOf(ctx)
	ps, err := s.g.m.ListProcesses(ctx, e.tenant, e.id)
	if err != nil {
		return nil, err
	}
	live := make(map[int]time.Time, len(ps))
	out := &process.ListResponse{Processes: []*process.ProcessInfo{}}
	for _, p := range ps {
		if !p.Running || p.Pid <= 0 {
			continue
		}
		live[p.Pid] = p.StartedAt
		info := &process.ProcessInfo{Pid: uint32(p.Pid)}
		if en, ok := s.g.procs.get(e.id, p.Pid, p.StartedAt); ok {
			info.Config, info.Tag = en.config, en.tag
		} else if len(p.Cmd) > 0 {
			// Started otherwise (berth's own API, or before the daemon
			// restarted): berth knows its argv alone.
			info.Config = &process.ProcessConfig{Cmd: p.Cmd[0], Args: p.Cmd[1:]}
		}
		out.Processes = append(out.Processes, info)
	}
	s.g.procs.prune(e.id, live)
	return connect.NewResponse(out), nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	e := envdOf(ctx)
	pid, err := s.target(ctx, e, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.input(ctx, e, pid, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput writes each data event, in order, to the process its start
// event selected.
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	e := envdOf(ctx)
	pid := 0
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			p, err := s.lookup(ctx, e, ev.Start.GetProcess(), true)
			if err != nil {
				return nil, err
			}
			pid = p.Pid
		case *process.StreamInputRequest_Data:
			if pid == 0 {
				return nil, errdefs.New(errdefs.InvalidArgument, "data: before the start event that selects the process")
			}
			if err := s.input(ctx, e, pid, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Keepalive:
		default:
			return nil, errdefs.New(errdefs.InvalidArgument, "event: none of start, data or keepalive")
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// input writes in to process pid's input: a terminal's for pty bytes, the
// stdin pipe's for stdin bytes (berth's guest writes to whichever the
// process has).
func (s *processService) input(ctx context.Context, e envdRequest, pid int, in *process.ProcessInput) error {
	var data []byte
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = v.Stdin
	case *process.ProcessInput_Pty:
		data = v.Pty
	default:
		return errdefs.New(errdefs.InvalidArgument, "input: neither stdin nor pty")
	}
	for {
		part := data[:min(len(data), procMaxInputWrite)]
		if err := s.g.m.WriteStdin(ctx, e.tenant, e.id, pid, part, false); err != nil {
			return s.ended(ctx, e, pid, err)
		}
		data = data[len(part):]
		if len(data) == 0 {
			return nil
		}
	}
}

// CloseStdin closes a process's stdin pipe. A terminal has none (send
// Ctrl-D, 0x04, as pty input); a process whose input is not open has
// nothing to close, which is done, as envd has it.
func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	e := envdOf(ctx)
	p, err := s.lookup(ctx, e, req.Msg.GetProcess(), true)
	if err != nil {
		return nil, err
	}
	if p.TTY != nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "process %d runs on a terminal, which has no stdin to close: send Ctrl-D (0x04) as pty input", p.Pid)
	}
	if p.OpenStdin {
		if err := s.g.m.WriteStdin(ctx, e.tenant, e.id, p.Pid, nil, true); err != nil {
			return nil, s.ended(ctx, e, p.Pid, err)
		}
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	e := envdOf(ctx)
	var sig string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	case process.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	default:
		return nil, errdefs.New(errdefs.InvalidArgument, "signal: %v; want SIGNAL_SIGTERM or SIGNAL_SIGKILL", req.Msg.GetSignal())
	}
	pid, err := s.target(ctx, e, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.g.m.SignalProcess(ctx, e.tenant, e.id, pid, sig); err != nil {
		return nil, s.ended(ctx, e, pid, err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// Update resizes a process's terminal. The manager resizes through an
// attachment, which does not say when the guest applied it, so Update
// waits until the process reports the new size: a command run after
// Update returns sees it.
func (s *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	e := envdOf(ctx)
	p, err := s.lookup(ctx, e, req.Msg.GetProcess(), true)
	if err != nil {
		return nil, err
	}
	pty := req.Msg.GetPty()
	if pty == nil {
		return connect.NewResponse(&process.UpdateResponse{}), nil
	}
	if p.TTY == nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "pty: process %d has no terminal (it was started without pty)", p.Pid)
	}
	want := api.TTY{Rows: int(pty.GetSize().GetRows()), Cols: int(pty.GetSize().GetCols())}
	if want.Rows < 1 || want.Rows > api.MaxTTY || want.Cols < 1 || want.Cols > api.MaxTTY {
		return nil, errdefs.New(errdefs.InvalidArgument, "pty.size: rows %d, cols %d; each must be 1 to %d", want.Rows, want.Cols, api.MaxTTY)
	}
	if *p.TTY == want {
		return connect.NewResponse(&process.UpdateResponse{}), nil
	}
	a, err := s.g.m.Attach(ctx, e.tenant, e.id, p.Pid)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	if err := a.Resize(want.Rows, want.Cols); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(procResizeWait)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		cur, err := s.g.m.GetProcess(ctx, e.tenant, e.id, p.Pid)
		switch {
		case err != nil:
			return nil, err
		case !cur.StartedAt.Equal(p.StartedAt) || !cur.Running:
			return nil, errdefs.New(errdefs.NotFound, "process %d not found: it has exited", p.Pid)
		case cur.TTY != nil && *cur.TTY == want:
			return connect.NewResponse(&process.UpdateResponse{}), nil
		case time.Now().After(deadline):
			return nil, errdefs.New(errdefs.Unavailable, "process %d: the terminal's new size was not applied within %v", p.Pid, procResizeWait)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// lookup resolves a selector to its process: a pid to that process, a tag
// to the newest running process started with it, else (without live) the
// newest that ended. An unknown process is not_found; with live, so is one
// that has ended, since envd forgets a process once it exits.
func (s *processService) lookup(ctx context.Context, e envdRequest, sel *process.ProcessSelector, live bool) (api.Process, error) {
	var p api.Process
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if v.Pid == 0 || v.Pid > math.MaxInt32 {
			return p, errdefs.New(errdefs.NotFound, "process with pid %d not found", v.Pid)
		}
		var err error
		if p, err = s.g.m.GetProcess(ctx, e.tenant, e.id, int(v.Pid)); err != nil {
			return p, err
		}
	case *process.ProcessSelector_Tag:
		var ended *api.Process
		for _, c := range s.g.procs.tagged(e.id, v.Tag) {
			cur, err := s.g.m.GetProcess(ctx, e.tenant, e.id, c.pid)
			if err != nil && !errdefs.IsNotFound(err) {
				return p, err
			}
			switch {
			case err != nil || !cur.StartedAt.Equal(c.started):
				s.g.procs.forget(e.id, c.pid, c.started)
			case cur.Running:
				return cur, nil
			case ended == nil && !live:
				ended = &cur
			}
		}
		if ended == nil {
			return p, errdefs.New(errdefs.NotFound, "process with tag %q not found", v.Tag)
		}
		p = *ended
	default:
		return p, errdefs.New(errdefs.InvalidArgument, "process: give a pid or a tag")
	}
	if live && !p.Running {
		s.g.procs.forget(e.id, p.Pid, p.StartedAt)
		return p, errdefs.New(errdefs.NotFound, "process with pid %d not found: it has exited", p.Pid)
	}
	return p, nil
}

// target is the pid an operation on a running process acts on. A pid is
// taken as it is, sparing a round trip to the guest: the operation's own
// error says whether it exists (see ended).
func (s *processService) target(ctx context.Context, e envdRequest, sel *process.ProcessSelector) (int, error) {
	if v, ok := sel.GetSelector().(*process.ProcessSelector_Pid); ok {
		if v.Pid == 0 || v.Pid > math.MaxInt32 {
			return 0, errdefs.New(errdefs.NotFound, "process with pid %d not found", v.Pid)
		}
		return int(v.Pid), nil
	}
	p, err := s.lookup(ctx, e, sel, true)
	return p.Pid, err
}

// ended turns an operation's conflict on a process that has exited into
// envd's answer for it, not_found (the SDKs' kill then reports false).
func (s *processService) ended(ctx context.Context, e envdRequest, pid int, err error) error {
	if !errdefs.IsConflict(err) {
		return err
	}
	if p, gerr := s.g.m.GetProcess(ctx, e.tenant, e.id, pid); gerr == nil && !p.Running {
		s.g.procs.forget(e.id, pid, p.StartedAt)
		return errdefs.New(errdefs.NotFound, "process with pid %d not found: it has exited", pid)
	}
	return err
}

// timeoutMs is how long a started process may run: the request's timeout,
// as envd has it (Connect-Timeout-Ms, else the deadline another protocol's
// header gave ctx); 0 for none.
func (s *processService) timeoutMs(ctx context.Context, h http.Header) int64 {
	if ms, err := strconv.ParseInt(h.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		return ms
	}
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d).Milliseconds(), 1)
	}
	return 0
}

// cwd is a process's working directory as envd reads it: a relative one
// or "~" starts at the user's home (the sandbox's workdir for the default
// user), which berth's exec, taking absolute ones only, is given.
func (s *processService) cwd(ctx context.Context, e envdRequest, cwd string) (string, error) {
	if cwd == "" || path.IsAbs(cwd) {
		return cwd, nil
	}
	w, err := s.g.resolve(ctx, e, e.user, &cwd)
	if err != nil || path.IsAbs(cwd) {
		return cwd, err
	}
	base := w.Cwd
	if base == "" {
		sb, err := s.g.m.Get(ctx, e.tenant, e.id)
		if err != nil {
			return "", err
		}
		base = sb.Workdir
	}
	return path.Join(base, cwd), nil
}

func procStartEvent(pid int) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(pid)}}}
}

// procDataEvent carries output: a terminal's as pty bytes (the guest gives it
// as stdout), else stdout or stderr.
func procDataEvent(stream string, data []byte, tty bool) *process.ProcessEvent {
	ev := &process.ProcessEvent_DataEvent{}
	switch {
	case tty:
		ev.Output = &process.ProcessEvent_DataEvent_Pty{Pty: data}
	case stream == api.EventStderr:
		ev.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: data}
	default:
		ev.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: data}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: ev}}
}

// procEndEvent says how a process ended as envd does, from Go's
// os.ProcessState: a process ended by a signal did not exit, has exit code
// -1 (berth's own API says 128+signal) and the status "signal: killed".
// Error is the start failure, or for any other failure the status, as
// envd's error from Wait reads (with berth's reason, if it has one).
func procEndEvent(r *api.ExecResult) *process.ProcessEvent_EndEvent {
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(r.ExitCode), Exited: r.Signal == 0}
	if r.Signal != 0 {
		end.ExitCode = -1
		end.Status = "signal: " + syscall.Signal(r.Signal).String()
	} else {
		end.Status = "exit status " + strconv.Itoa(r.ExitCode)
	}
	var msg string
	switch {
	case r.Error != "":
		msg = r.Error
	case r.TimedOut:
		msg = end.Status + " (the request's timeout passed)"
	case r.OOMKilled:
		msg = end.Status + " (out of memory)"
	case !end.Exited || end.ExitCode != 0:
		msg = end.Status
	}
	if msg != "" {
		end.Error = &msg
	}
	return end
}

// processes keeps what envd knows of processes and berth's manager does
// not: the tag and the config (argv, environment, cwd) each was started
// with, per sandbox and pid, with the process's start time, so a pid that
// another process reused does not inherit them. It lives in the daemon's
// memory alone: after a restart, processes list with their argv and no
// tag. An entry goes when its process is seen ended, and past the bounds
// the oldest go first.
type processes struct {
	mu        sync.Mutex
	bySandbox map[string]map[int]*procEntry
	n, bytes  int
	seq       uint64
}

// Bounds on processes: past them the oldest entries go, and their
// processes list as those started otherwise do.
const (
	maxProcEntries    = 4096
	maxProcEntryBytes = 32 << 20
	procEntryOverhead = 128
)

type procEntry struct {
	started time.Time
	tag     *string
	config  *process.ProcessConfig
	size    int
	seq     uint64
}

// procRef names one process of a sandbox.
type procRef struct {
	pid     int
	started time.Time
}

func newProcesses() *processes {
	return &processes{bySandbox: make(map[string]map[int]*procEntry)}
}

func (ps *processes) add(id string, pid int, started time.Time, tag *string, cfg *process.ProcessConfig) {
	size := procEntryOverhead + len(cfg.GetCmd()) + len(cfg.GetCwd())
	for _, a := range cfg.GetArgs() {
		size += len(a)
	}
	for k, v := range cfg.GetEnvs() {
		size += len(k) + len(v)
	}
	if tag != nil {
		size += len(*tag)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	m := ps.bySandbox[id]
	if m == nil {
		m = make(map[int]*procEntry)
		ps.bySandbox[id] = m
	}
	if old := m[pid]; old != nil { // the pid's earlier process
		ps.n--
		ps.bytes -= old.size
	}
	ps.seq++
	m[pid] = &procEntry{started: started, tag: tag, config: cfg, size: size, seq: ps.seq}
	ps.n++
	ps.bytes += size
	for ps.n > 1 && (ps.n > maxProcEntries || ps.bytes > maxProcEntryBytes) {
		ps.evictOldestLocked()
	}
}

// get returns copies of the tag and config kept for a process.
func (ps *processes) get(id string, pid int, started time.Time) (procEntry, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	en := ps.bySandbox[id][pid]
	if en == nil || !en.started.Equal(started) {
		return procEntry{}, false
	}
	out := procEntry{started: en.started, config: proto.Clone(en.config).(*process.ProcessConfig)}
	if en.tag != nil {
		tag := *en.tag
		out.tag = &tag
	}
	return out, true
}

// tagged lists a sandbox's processes started with tag, newest first.
func (ps *processes) tagged(id, tag string) []procRef {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	type ref struct {
		procRef
		seq uint64
	}
	var refs []ref
	for pid, en := range ps.bySandbox[id] {
		if en.tag != nil && *en.tag == tag {
			refs = append(refs, ref{procRef{pid, en.started}, en.seq})
		}
	}
	slices.SortFunc(refs, func(a, b ref) int { return cmp.Compare(b.seq, a.seq) })
	out := make([]procRef, len(refs))
	for i, r := range refs {
		out[i] = r.procRef
	}
	return out
}

// forget drops a process's entry, if it is still that process's.
func (ps *processes) forget(id string, pid int, started time.Time) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if en := ps.bySandbox[id][pid]; en != nil && en.started.Equal(started) {
		ps.dropLocked(id, pid, en)
	}
}

// prune drops a sandbox's entries whose processes are not in live, the
// sandbox's running processes by pid with their start times.
func (ps *processes) prune(id string, live map[int]time.Time) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for pid, en := range ps.bySandbox[id] {
		if started, ok := live[pid]; !ok || !started.Equal(en.started) {
			ps.dropLocked(id, pid, en)
		}
	}
}

func (ps *processes) evictOldestLocked() {
	var oldID string
	var oldPid int
	var old *procEntry
	for id, m := range ps.bySandbox {
		for pid, en := range m {
			if old == nil || en.seq < old.seq {
				oldID, oldPid, old = id, pid, en
			}
		}
	}
	if old != nil {
		ps.dropLocked(oldID, oldPid, old)
	}
}

func (ps *processes) dropLocked(id string, pid int, en *procEntry) {
	m := ps.bySandbox[id]
	delete(m, pid)
	if len(m) == 0 {
		delete(ps.bySandbox, id)
	}
	ps.n--
	ps.bytes -= en.size
}
