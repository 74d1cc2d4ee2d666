package sandbox

import (
	"context"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guestclient"
	"github.com/berthsh/berth/image"
)

// Exec runs a process and waits for its result. The output it holds until
// the end counts against the daemon's output budget (Config's
// ExecOutputBudget), shared by every running exec: past it, the exec fails
// with resource_exhausted and its process is killed, rather than the
// daemon's memory growing with what callers ask for. A streamed exec holds
// no output and has no such bound.
func (m *Manager) Exec(ctx context.Context, tenant, id string, req api.ExecRequest) (api.ExecResult, error) {
	var res api.ExecResult
	// Chunks as they came, joined once at the end: appending would copy
	// the output again each time the slice grew.
	var stdout, stderr [][]byte
	var held int64
	defer func() { m.outputs.give(held) }()
	err := m.execStream(ctx, tenant, id, req, true, func(ev api.ExecEvent) error {
		if ev.Type == api.EventStdout || ev.Type == api.EventStderr {
			n := int64(len(ev.Data))
			if !m.outputs.take(n) {
				return errdefs.New(errdefs.ResourceExhausted, "exec output: running execs hold the daemon's whole output budget of %d bytes; "+
					"retry, lower max_output_bytes, or stream the output (stream=true)", m.outputs.size)
			}
			held += n
		}
		switch ev.Type {
		case api.EventStdout:
			stdout = append(stdout, ev.Data)
		case api.EventStderr:
			stderr = append(stderr, ev.Data)
		case api.EventExit:
			res = *ev.Result
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.Stdout, res.Stderr = join(stdout), join(stderr)
	return res, nil
}

// join concatenates chunks into one exactly sized slice (never nil).
func join(chunks [][]byte) []byte {
	if len(chunks) == 1 {
		return chunks[0]
	}
	n := 0
	for _, c := range chunks {
		n += len(c)
	}
	out := make([]byte, 0, n)
	for i, c := range chunks {
		out = append(out, c...)
		chunks[i] = nil
	}
	return out
}

// budget is a count of bytes that callers take and give back.
type budget struct {
	mu         sync.Mutex
	size, used int64
}

// take takes n bytes if they are free.
func (b *budget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.size {
		return false
	}
	b.used += n
	return true
}

func (b *budget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// ExecStream runs a process and hands each event to emit: start, output
// chunks, then one exit. An error before the start event is returned; a
// failure after it is sent as an error event and also returned.
func (m *Manager) ExecStream(ctx context.Context, tenant, id string, req api.ExecRequest, emit func(api.ExecEvent) error) error {
	return m.execStream(ctx, tenant, id, req, false, emit)
}

// execStream is ExecStream; batch lets the guest send the events in one go
// at the end, for a caller that waits for the result anyway.
func (m *Manager) execStream(ctx context.Context, tenant, id string, req api.ExecRequest, batch bool, emit func(api.ExecEvent) error) error {
	req, err := m.imageCommand(ctx, tenant, id, req)
	if err != nil {
		return err
	}
	if err := m.validateExec(req); err != nil {
		return err
	}
	if req.TTY != nil || req.OpenStdin {
		return errdefs.New(errdefs.InvalidArgument, "tty, open_stdin: only for a background process (POST /v1/sandboxes/%s/processes, or /pty)", id)
	}
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return err
	}
	spec := processSpec(m.specOf(ls), req)
	spec.Batch = batch
	defer m.streaming(ls)()
	before, known := m.oomKills(ctx, ls, id)
	started := time.Now()
	st, err := ls.guest.Exec(ctx, spec)
	if err != nil {
		if r := m.endedByOOM(ctx, ls, id, before, known, err, started); r != nil {
			m.emitExit(id, r)
			return emit(api.ExecEvent{Type: api.EventExit, Result: r})
		}
		return m.gone(id, err)
	}
	defer st.Close() // closing early makes the guest kill the process group
	err = pump(id, st, spec.MaxOutputBytes, func(ev api.ExecEvent) error {
		switch ev.Type {
		case api.EventStart:
			m.emit(id, api.ProcessStarted, func(e *api.SandboxEvent) { e.Pid = ev.Pid })
		case api.EventExit:
			m.explain(ctx, ls, id, before, known, ev.Result)
			m.emitExit(id, ev.Result)
		}
		return emit(ev)
	})
	if r := m.endedByOOM(ctx, ls, id, before, known, err, started); r != nil {
		m.emitExit(id, r)
		return emit(api.ExecEvent{Type: api.EventExit, Result: r})
	}
	return m.gone(id, err)
}

// endedByOOM is the result of an exec whose guest went away (err) because
// the whole sandbox ran out of memory: where a runtime's memory limit
// bounds the sandbox as one (gvisor's: its kernel is in the cgroup), the
// host kills the sandbox, not one process. Nil when that is not what
// happened.
func (m *Manager) endedByOOM(ctx context.Context, ls *liveSandbox, id string, before int64, known bool, err error, started time.Time) *api.ExecResult {
	if !known || !errdefs.IsUnavailable(err) {
		return nil
	}
	if after, ok := m.oomKills(context.WithoutCancel(ctx), ls, id); !ok || after <= before {
		return nil
	}
	return &api.ExecResult{ExitCode: 137, Signal: 9, OOMKilled: true, DurationMs: time.Since(started).Milliseconds(),
		Error: "the sandbox ran out of memory and was stopped: on runtime " + ls.tier.name + " the memory limit bounds the whole sandbox"}
}

// streaming counts an open stream as activity for as long as it is open;
// call the returned func when it closes.
func (m *Manager) streaming(ls *liveSandbox) func() {
	ls.streams.Add(1)
	return func() {
		ls.lastActive.Store(m.cfg.Now().UnixNano())
		ls.streams.Add(-1)
	}
}

// pump relays a guest event stream to emit until its terminal event.
func pump(id string, st *guestclient.Stream, limit int64, emit func(api.ExecEvent) error) error {
	var sent [2]int64
	for {
		ev, err := st.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		out, err := relay(id, ev, limit, &sent)
		if err != nil {
			return err
		}
		if err := emit(out); err != nil {
			return err
		}
	}
}

// relay turns a guest event into an API event, enforcing the output bound
// itself: a guest's word on how much it sent is not trusted.
func relay(id string, ev guestapi.Event, limit int64, sent *[2]int64) (api.ExecEvent, error) {
	switch ev.Type {
	case guestapi.EventStart:
		return api.ExecEvent{Type: api.EventStart, Pid: ev.Pid}, nil
	case guestapi.EventStdout, guestapi.EventStderr:
		i := 0
		if ev.Type == guestapi.EventStderr {
			i = 1
		}
		data := ev.Data
		if room := limit - sent[i]; int64(len(data)) > room {
			data = data[:max(room, 0)]
		}
		sent[i] += int64(len(data))
		return api.ExecEvent{Type: ev.Type, Data: data}, nil
	case guestapi.EventExit:
		r := resultToAPI(*ev.Result)
		r.Stdout, r.Stderr = []byte{}, []byte{} // streamed already; never null on the wire
		return api.ExecEvent{Type: api.EventExit, Result: &r}, nil
	default:
		return api.ExecEvent{}, guestclient.EventError(id, ev)
	}
}

// imageCommand gives an exec that names no command its image's:
// Entrypoint then Cmd, as docker run does. Otherwise req is as it came.
func (m *Manager) imageCommand(ctx context.Context, tenant, id string, req api.ExecRequest) (api.ExecRequest, error) {
	if len(req.Cmd) > 0 || req.Shell != "" {
		return req, nil
	}
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return req, err
	}
	imageID := rec.ImageID
	if isSnapshotID(imageID) { // the snapshot's base image's command
		sn, err := m.store.GetSnapshot(ctx, imageID)
		if err != nil {
			return req, err
		}
		imageID = sn.Base
	}
	if imageID == "" || imageID == image.Host {
		return req, errdefs.New(errdefs.InvalidArgument, "cmd, shell: give one of them (sandbox %s's image %s has no default command)", id, rec.Image)
	}
	img, err := m.images.Ensure(ctx, tenant, imageID)
	if err != nil {
		return req, err
	}
	req.Cmd = append(slices.Clone(img.Config.Entrypoint), img.Config.Cmd...)
	if len(req.Cmd) == 0 {
		return req, errdefs.New(errdefs.InvalidArgument, "cmd, shell: give one of them (image %s has no Entrypoint or Cmd)", rec.Image)
	}
	return req, nil
}

// StartProcess starts a background process.
func (m *Manager) StartProcess(ctx context.Context, tenant, id string, req api.ExecRequest) (api.Process, error) {
	req, err := m.imageCommand(ctx, tenant, id, req)
	if err != nil {
		return api.Process{}, err
	}
	if err := m.validateExec(req); err != nil {
		return api.Process{}, err
	}
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return api.Process{}, err
	}
	if (req.TTY != nil || req.OpenStdin) && !slices.Contains(ls.features, guestapi.FeatureTerminals) {
		// An older guest would ignore them and run the process without.
		return api.Process{}, errdefs.New(errdefs.NotImplemented,
			"tty, open_stdin: the guest of sandbox %s predates terminals (a sandbox started by an older berth): stop and start it", id)
	}
	before, known := m.oomKills(ctx, ls, id)
	// An exit the exits follower reads meanwhile waits for this start.
	ls.starts.RLock()
	defer ls.starts.RUnlock()
	info, err := ls.guest.Start(ctx, processSpec(m.specOf(ls), req))
	if err != nil {
		return api.Process{}, m.gone(id, err)
	}
	ls.rememberStart(info.Pid, before, known)
	p := processToAPI(info)
	m.explain(ctx, ls, id, before, known, p.Result)
	m.emit(id, api.ProcessStarted, func(e *api.SandboxEvent) { e.Pid = p.Pid })
	return p, nil
}

// ListProcesses lists a sandbox's processes started through the API.
func (m *Manager) ListProcesses(ctx context.Context, tenant, id string) ([]api.Process, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	infos, err := ls.guest.List(ctx)
	if err != nil {
		return nil, m.gone(id, err)
	}
	out := make([]api.Process, 0, len(infos))
	for _, p := range infos {
		ap := processToAPI(p)
		m.explainBackground(ctx, id, ls, ap.Pid, ap.Result)
		out = append(out, ap)
	}
	return out, nil
}

// GetProcess describes one process.
func (m *Manager) GetProcess(ctx context.Context, tenant, id string, pid int) (api.Process, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return api.Process{}, err
	}
	info, err := ls.guest.Get(ctx, pid)
	if err != nil {
		return api.Process{}, m.gone(id, err)
	}
	p := processToAPI(info)
	m.explainBackground(ctx, id, ls, pid, p.Result)
	return p, nil
}

// ProcessOutput streams a process's kept output (and live output if follow).
func (m *Manager) ProcessOutput(ctx context.Context, tenant, id string, pid int, follow bool, emit func(api.ExecEvent) error) error {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return err
	}
	defer m.streaming(ls)()
	st, err := ls.guest.Output(ctx, pid, follow)
	if err != nil {
		return m.gone(id, err)
	}
	defer st.Close()
	return m.gone(id, pump(id, st, maxOutput, func(ev api.ExecEvent) error {
		if ev.Type == api.EventExit {
			m.explainBackground(ctx, id, ls, pid, ev.Result)
		}
		return emit(ev)
	}))
}

// WaitProcess waits for a process to end.
func (m *Manager) WaitProcess(ctx context.Context, tenant, id string, pid int, timeout time.Duration) (api.ExecResult, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return api.ExecResult{}, err
	}
	r, err := ls.guest.Wait(ctx, pid, timeout)
	if err != nil {
		return api.ExecResult{}, m.gone(id, err)
	}
	res := resultToAPI(r)
	m.explainBackground(ctx, id, ls, pid, &res)
	return res, nil
}

// SignalProcess sends a signal, by name ("TERM", "SIGKILL") or number, to a process's group.
func (m *Manager) SignalProcess(ctx context.Context, tenant, id string, pid int, signal string) error {
	sig, err := parseSignal(signal)
	if err != nil {
		return err
	}
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return err
	}
	return m.gone(id, ls.guest.Signal(ctx, pid, int(sig)))
}

// RemoveProcess forgets a finished process.
func (m *Manager) RemoveProcess(ctx context.Context, tenant, id string, pid int) error {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return err
	}
	return m.gone(id, ls.guest.Remove(ctx, pid))
}

// explainBackground sets OOMKilled on a background process's result and,
// the first time the daemon sees that result, publishes its exit.
func (m *Manager) explainBackground(ctx context.Context, id string, ls *liveSandbox, pid int, r *api.ExecResult) {
	if r == nil {
		return
	}
	before, ok := ls.startCount(pid)
	m.explain(ctx, ls, id, before, ok, r)
	if ls.firstSight(pid) {
		m.emitExit(id, r)
	}
}

func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, errdefs.New(errdefs.InvalidArgument, "signal: %d is outside 1..64", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, errdefs.New(errdefs.InvalidArgument, "signal: unknown signal %q", s)
}
