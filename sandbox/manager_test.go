package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/fake"
	"github.com/berthsh/berth/store"
)

// The tests in this file drive the manager over the fake runtime: a real
// SQLite store, a real guest protocol over in-memory pipes, no root.

// staticImages resolves "host" to a root named by the mapping it is made
// for, as the image package would.
type staticImages struct{}

func (staticImages) Ensure(_ context.Context, _, ref string) (api.Image, error) {
	return api.Image{}, errdefs.New(errdefs.NotFound, "image %q: no such image here", ref)
}

func (staticImages) Resolve(_ context.Context, ref string, ids runtime.IDMap) (image.Resolved, error) {
	if ref != image.Host {
		return image.Resolved{}, errdefs.New(errdefs.InvalidArgument, "image %q: no such image here", ref)
	}
	return image.Resolved{
		Root:   runtime.RootFS{Image: ref, Layers: []string{fmt.Sprintf("/images/host-%d", ids.HostID)}, IDMapped: ids == image.Unmapped},
		Mounts: []runtime.Mount{{Source: "/usr", Target: "/usr", ReadOnly: true}}}, nil
}

// fakeWorld is a manager over a fake runtime and a store in a temp dir.
type fakeWorld struct {
	m     *Manager
	rt    *fake.Runtime
	store *store.Store
	cfg   Config
}

func newFakeWorld(t *testing.T, caps runtime.Capabilities, cfg Config) *fakeWorld {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	w := &fakeWorld{rt: fake.New(caps), store: st, cfg: cfg}
	if w.cfg.DefaultRuntime == "" {
		w.cfg.DefaultRuntime = fake.Name
	}
	if w.cfg.SweepInterval == 0 {
		w.cfg.SweepInterval = time.Hour
	}
	w.m = w.start(t)
	return w
}

// start makes a manager over the world's store and runtime, as a daemon
// (re)start does.
func (w *fakeWorld) start(t *testing.T) *Manager {
	t.Helper()
	m, err := New(w.cfg, w.store, map[string]runtime.Runtime{fake.Name: w.rt}, staticImages{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func calls(rt *fake.Runtime, op string) []fake.Call {
	var out []fake.Call
	for _, c := range rt.Calls() {
		if c.Op == op {
			out = append(out, c)
		}
	}
	return out
}

// TestOneResolvedSpec: create and start hand the runtime the same spec,
// resolved in one place from the request and the daemon's settings.
func TestOneResolvedSpec(t *testing.T) {
	w := newFakeWorld(t, fake.Capabilities(), Config{DefaultLimits: api.Limits{Pids: 512}})
	ctx := t.Context()
	sb, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Limits: api.Limits{MemoryBytes: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	created := calls(w.rt, "create")
	if len(created) != 1 {
		t.Fatalf("creates: %+v", created)
	}
	want := runtime.Spec{ID: sb.ID, Hostname: sb.ID,
		Root:    runtime.RootFS{Image: "host", Layers: []string{"/images/host-1000065536"}},
		Mounts:  []runtime.Mount{{Source: "/usr", Target: "/usr", ReadOnly: true}},
		Users:   runtime.IDMap{HostID: 1_000_065_536, Size: 65536},
		Network: runtime.Network{Mode: runtime.NetworkNone},
		Limits:  runtime.Limits{MemoryBytes: 256 << 20, Pids: 512},
		Files:   []runtime.File{{Path: "/etc/resolv.conf", Data: []byte("nameserver 100.64.0.1\noptions edns0\n"), Mode: 0o644}}}
	if !reflect.DeepEqual(created[0].Spec, want) {
		t.Fatalf("create spec\n got %+v\nwant %+v", created[0].Spec, want)
	}
	if _, err := w.m.Stop(ctx, "", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.m.StartSandbox(ctx, "", sb.ID); err != nil {
		t.Fatal(err)
	}
	started := calls(w.rt, "start")
	if len(started) != 1 || !reflect.DeepEqual(started[0].Spec, want) {
		t.Fatalf("start spec %+v, want the create's", started)
	}
	if res, err := w.m.Exec(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"echo", "back"}}); err != nil || string(res.Stdout) != "back\n" {
		t.Fatalf("exec after start: %+v %v", res, err)
	}
}

// TestEachSandboxHasItsOwnIDRange: sandboxes get distinct ranges of host
// ids, lowest free first; a range comes free when its sandbox is deleted
// or its create fails, not when it stops; the store keeps ranges across a
// restart, and a sandbox from before ranges keeps range 0. A runtime that
// idmaps layers gets one unmapped copy of the image for all.
func TestEachSandboxHasItsOwnIDRange(t *testing.T) {
	w := newFakeWorld(t, fake.Capabilities(), Config{})
	ctx := t.Context()
	base := runtime.DefaultIDMap
	specOf := func(id string) runtime.Spec {
		t.Helper()
		var last runtime.Spec
		for _, c := range w.rt.Calls() {
			if (c.Op == "create" || c.Op == "start") && c.Spec.ID == id {
				last = c.Spec
			}
		}
		if last.ID == "" {
			t.Fatalf("no spec for %s", id)
		}
		return last
	}
	create := func() api.Sandbox {
		t.Helper()
		sb, err := w.m.Create(ctx, "", api.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	wantRange := func(id string, n uint32) {
		t.Helper()
		spec := specOf(id)
		want := base.Range(n)
		if spec.Users != want || spec.Root.IDMapped || spec.Root.Layers[0] != fmt.Sprintf("/images/host-%d", want.HostID) {
			t.Fatalf("%s: users %+v root %+v, want range %d (%+v) with an image owned by it", id, spec.Users, spec.Root, n, want)
		}
		rec, err := w.store.GetSandbox(ctx, id)
		if err != nil || rec.IDRange != n {
			t.Fatalf("%s: stored range %d (%v), want %d", id, rec.IDRange, err, n)
		}
	}
	a, b := create(), create()
	wantRange(a.ID, 1)
	wantRange(b.ID, 2)
	if _, err := w.m.Stop(ctx, "", a.ID); err != nil {
		t.Fatal(err)
	}
	c := create()
	wantRange(c.ID, 3) // a stopped sandbox keeps its files, owned by its range
	if _, err := w.m.StartSandbox(ctx, "", a.ID); err != nil {
		t.Fatal(err)
	}
	wantRange(a.ID, 1)
	if err := w.m.Delete(ctx, "", b.ID); err != nil {
		t.Fatal(err)
	}
	w.rt.Fail("create", errors.New("boom"))
	if _, err := w.m.Create(ctx, "", api.CreateSandboxRequest{}); err == nil {
		t.Fatal("create did not fail")
	}
	w.rt.Fail("create", nil)
	d := create()
	wantRange(d.ID, 2) // b's, and not lost to the failed create

	// A sandbox made before ranges were per sandbox (its row says range
	// 0), and a restart.
	old := create()
	wantRange(old.ID, 4)
	if _, err := w.m.Stop(ctx, "", old.ID); err != nil {
		t.Fatal(err)
	}
	rec, err := w.store.GetSandbox(ctx, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.IDRange = 0
	if err := w.store.DeleteSandbox(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.store.CreateSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	w.m.Close()
	w.m = w.start(t)
	if _, err := w.m.StartSandbox(ctx, "", old.ID); err != nil {
		t.Fatal(err)
	}
	if got := specOf(old.ID).Users; got != base {
		t.Fatalf("a sandbox from before ranges: users %+v, want the shared range %+v", got, base)
	}
	e := create()
	wantRange(e.ID, 4) // 1, 2 and 3 are held, as the store says

	// A runtime that idmaps layers: one image, unmapped, for every range.
	caps := fake.Capabilities()
	caps.IDMappedLayers = true
	w2 := newFakeWorld(t, caps, Config{})
	sb, err := w2.m.Create(ctx, "", api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	spec := calls(w2.rt, "create")[0].Spec
	if spec.Users != base.Range(1) || !spec.Root.IDMapped || spec.Root.Layers[0] != "/images/host-0" {
		t.Fatalf("%s on a runtime that idmaps layers: users %+v root %+v", sb.ID, spec.Users, spec.Root)
	}
}

func TestIDRangesRunOut(t *testing.T) {
	r := newIDRanges(3) // ranges 1 and 2
	for i, id := range []string{"a", "b"} {
		if n, err := r.take(id); err != nil || n != uint32(i+1) {
			t.Fatalf("take %s: %d %v", id, n, err)
		}
	}
	if _, err := r.take("c"); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "2 id ranges") {
		t.Fatalf("third take: %v, want resource_exhausted naming the count", err)
	}
	r.release("a")
	if n, err := r.take("c"); err != nil || n != 1 {
		t.Fatalf("take after a release: %d %v", n, err)
	}
	if _, err := New(Config{DefaultRuntime: fake.Name, IDMap: runtime.IDMap{HostID: 0, Size: 65536}}, nil,
		map[string]runtime.Runtime{fake.Name: fake.New(fake.Capabilities())}, staticImages{}, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("an id map based at host uid 0 was accepted")
	}
}

// TestFailedCreatesLeaveNothing: a create that fails in the image, in the
// runtime or at the guest's hello leaves no row and no runtime sandbox.
func TestFailedCreatesLeaveNothing(t *testing.T) {
	w := newFakeWorld(t, fake.Capabilities(), Config{})
	ctx := t.Context()
	noRows := func(what string) {
		t.Helper()
		all, err := w.store.ListSandboxes(ctx, "", labels.Selector{})
		if err != nil || len(all) != 0 {
			t.Fatalf("%s: rows left: %+v %v", what, all, err)
		}
		if ids := w.rt.IDs(); len(ids) != 0 {
			t.Fatalf("%s: runtime sandboxes left: %v", what, ids)
		}
	}
	_, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Image: "python:3.12"})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), `"python:3.12"`) {
		t.Fatalf("unknown image: %v", err)
	}
	if len(calls(w.rt, "create")) != 0 {
		t.Fatal("an unknown image reached the runtime")
	}
	noRows("unknown image")

	w.rt.Fail("create", errors.New("boom"))
	if _, err := w.m.Create(ctx, "", api.CreateSandboxRequest{}); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("runtime failure: %v", err)
	}
	w.rt.Fail("create", nil)
	noRows("runtime failure")

	w.rt.Fail("hello", errdefs.New(errdefs.Unavailable, "guest is broken"))
	_, err = w.m.Create(ctx, "", api.CreateSandboxRequest{})
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("guest failure: %v", err)
	}
	w.rt.Fail("hello", nil)
	if len(calls(w.rt, "delete")) != 1 {
		t.Fatalf("the half-made sandbox was not deleted from the runtime: %+v", w.rt.Calls())
	}
	noRows("guest failure")
}

// TestCapabilitiesAreChecked: what a runtime declares it cannot do is
// refused with its reason, before it is asked; limits are checked against
// its host's ceilings, not the daemon's machine.
func TestCapabilitiesAreChecked(t *testing.T) {
	caps := fake.Capabilities()
	caps.StopStart, caps.UpdateLimits, caps.Limits.Disk = false, false, false
	caps.Missing = map[string]string{"stop_start": "the fake keeps no files", "disk_bytes": "no loop devices here"}
	w := newFakeWorld(t, caps, Config{WarmPool: 1})
	ctx := t.Context()
	if len(w.m.Pools()) != 0 {
		t.Fatal("a warm pool on a runtime that cannot change limits of a running sandbox")
	}
	sb, err := w.m.Create(ctx, "", api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		class      errdefs.Class
		call       func() error
	}{
		{"stop", `runtime "fake" cannot stop and start sandboxes: the fake keeps no files`, errdefs.NotImplemented,
			func() error { _, err := w.m.Stop(ctx, "", sb.ID); return err }},
		{"update limits", `runtime "fake" cannot change limits of a running sandbox`, errdefs.NotImplemented,
			func() error {
				_, err := w.m.Update(ctx, "", sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{Pids: 100}})
				return err
			}},
		{"disk", "limits.disk_bytes: no loop devices here", errdefs.NotImplemented,
			func() error {
				_, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Limits: api.Limits{DiskBytes: 1 << 30}})
				return err
			}},
		{"cpus above the host's", "limits.cpus: 5 is outside 0.01..4", errdefs.InvalidArgument,
			func() error {
				_, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Limits: api.Limits{CPUs: 5}})
				return err
			}},
		{"memory above the host's", "limits.memory_bytes: 17179869184 is outside 33554432..8589934592", errdefs.InvalidArgument,
			func() error {
				_, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Limits: api.Limits{MemoryBytes: 16 << 30}})
				return err
			}},
		{"unknown runtime", `runtime: "gvisor" is not one berth has (available: [fake])`, errdefs.InvalidArgument,
			func() error { _, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Runtime: "gvisor"}); return err }},
	} {
		err := tc.call()
		if errdefs.ClassOf(err) != tc.class || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v (class %s), want %s: %q", tc.name, err, errdefs.ClassOf(err), tc.class, tc.want)
		}
	}
	for _, op := range []string{"stop", "set_limits"} {
		if len(calls(w.rt, op)) != 0 {
			t.Errorf("the runtime was asked to %s although it declared it cannot", op)
		}
	}
	info := w.m.RuntimeInfo()
	if len(info) != 1 || info[0].Capabilities.StopStart || info[0].Capabilities.Missing["stop_start"] == "" ||
		strings.Join(info[0].Capabilities.Limits, ",") != "cpus,memory_bytes,pids,open_files" || info[0].Capabilities.Max.CPUs != 4 {
		t.Fatalf("runtime info: %+v %+v", info, info[0].Capabilities)
	}
}

// TestWarmPoolHandsOver: a pooled sandbox of the default image and runtime
// is handed over with the request's limits applied, not booted again.
func TestWarmPoolHandsOver(t *testing.T) {
	w := newFakeWorld(t, fake.Capabilities(), Config{WarmPool: 1})
	ctx := t.Context()
	waitFor(t, func() bool { return w.m.pooled() == 1 })
	pooled := calls(w.rt, "create")[0].ID
	sb, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Labels: map[string]string{"k": "v"}, Limits: api.Limits{MemoryBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != pooled || sb.Labels["k"] != "v" {
		t.Fatalf("created %s, the pool held %s", sb.ID, pooled)
	}
	if lim, _ := w.rt.Limits(sb.ID); lim.MemoryBytes != 64<<20 {
		t.Fatalf("limits in force after the hand-over: %+v", lim)
	}
	waitFor(t, func() bool { return w.m.pooled() == 1 }) // refilled
	if n := len(calls(w.rt, "create")); n != 2 {
		t.Fatalf("%d creates: the hand-over booted a sandbox", n)
	}
	// A request the pool does not fit (a disk) boots its own.
	if _, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Limits: api.Limits{DiskBytes: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	if n := len(calls(w.rt, "create")); n != 3 {
		t.Fatalf("%d creates, want 3", n)
	}
}

func (m *Manager) pooled() int {
	n := 0
	for _, p := range m.Pools() {
		n += p.Ready
	}
	return n
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
	}
}

// TestRestartReattachesOrSettles: a new manager over the same store finds
// running sandboxes again, and records one whose init died meanwhile as
// stopped with the reason.
func TestRestartReattachesOrSettles(t *testing.T) {
	w := newFakeWorld(t, fake.Capabilities(), Config{})
	ctx := t.Context()
	alive, err := w.m.Create(ctx, "", api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := w.m.Create(ctx, "", api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	w.m.Close()
	w.rt.Kill(dead.ID)
	m2 := w.start(t)
	if res, err := m2.Exec(ctx, "", alive.ID, api.ExecRequest{Shell: "echo again"}); err != nil || string(res.Stdout) != "again\n" {
		t.Fatalf("exec after re-attach: %+v %v", res, err)
	}
	got, err := m2.Get(ctx, "", dead.ID)
	if err != nil || got.State != api.StateStopped || !strings.Contains(got.Error, "init was gone") {
		t.Fatalf("a sandbox whose init died before the restart: %+v %v", got, err)
	}
	// An init that dies while the manager runs is noticed too.
	w.rt.Kill(alive.ID)
	waitFor(t, func() bool {
		sb, err := m2.Get(ctx, "", alive.ID)
		return err == nil && sb.State == api.StateStopped && strings.Contains(sb.Error, "exited unexpectedly")
	})
}

// TestExecOverTheGuestProtocol: results, streams and background processes
// reach the API through the guest protocol, with the sandbox's defaults.
func TestExecOverTheGuestProtocol(t *testing.T) {
	w := newFakeWorld(t, fake.Capabilities(), Config{})
	ctx := t.Context()
	sb, err := w.m.Create(ctx, "", api.CreateSandboxRequest{Workdir: "/srv", User: "root", Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  api.ExecRequest
		out  string
		code int
	}{
		{api.ExecRequest{Cmd: []string{"pwd"}}, "/srv\n", 0},
		{api.ExecRequest{Cmd: []string{"whoami"}, User: "user"}, "user\n", 0},
		{api.ExecRequest{Cmd: []string{"env"}, Env: map[string]string{"B": "2"}}, "A=1\nB=2\n", 0},
		{api.ExecRequest{Shell: "exit 3"}, "", 3},
		{api.ExecRequest{Cmd: []string{"cat"}, Stdin: []byte("in")}, "in", 0},
	} {
		res, err := w.m.Exec(ctx, "", sb.ID, tc.req)
		if err != nil || string(res.Stdout) != tc.out || res.ExitCode != tc.code {
			t.Errorf("%+v: %+v %v", tc.req, res, err)
		}
	}
	res, err := w.m.Exec(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"nope"}})
	if err != nil || res.ExitCode != 127 || res.Error == "" {
		t.Fatalf("missing program: %+v %v", res, err)
	}
	res, err = w.m.Exec(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "30"}, TimeoutMs: 50})
	if err != nil || !res.TimedOut {
		t.Fatalf("timeout: %+v %v", res, err)
	}
	p, err := w.m.StartProcess(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "30"}})
	if err != nil || !p.Running {
		t.Fatalf("background: %+v %v", p, err)
	}
	if err := w.m.SignalProcess(ctx, "", sb.ID, p.Pid, "TERM"); err != nil {
		t.Fatal(err)
	}
	r, err := w.m.WaitProcess(ctx, "", sb.ID, p.Pid, 5*time.Second)
	if err != nil || r.Signal != 15 {
		t.Fatalf("signalled: %+v %v", r, err)
	}
	var types []string
	err = w.m.ExecStream(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"echo", "hi"}}, func(ev api.ExecEvent) error {
		types = append(types, ev.Type)
		return nil
	})
	if err != nil || strings.Join(types, ",") != "start,stdout,exit" {
		t.Fatalf("stream: %v %v", types, err)
	}
	if _, err := w.m.Exec(ctx, "", "sb-nonexistent", api.ExecRequest{Cmd: []string{"true"}}); !errdefs.IsNotFound(err) {
		t.Fatalf("exec in a sandbox that does not exist: %v", err)
	}
}
