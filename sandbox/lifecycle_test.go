package sandbox

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/native"
	"github.com/berthsh/berth/store"
)

func TestDecide(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	idle := timeouts{idle: time.Minute}
	never := func() bool { t.Fatal("busy asked before the idle time ran out"); return false }
	for _, tc := range []struct {
		name       string
		state      string
		t          timeouts
		now        time.Time
		lastActive time.Time
		stoppedAt  time.Time
		busy       func() bool
		want       string
		archived   bool
	}{
		{"fresh", api.StateRunning, idle, t0.Add(30 * time.Second), t0, time.Time{}, never, "", false},
		{"idle", api.StateRunning, idle, t0.Add(time.Minute), t0, time.Time{}, func() bool { return false }, "stop", false},
		{"idle but busy", api.StateRunning, idle, t0.Add(time.Hour), t0, time.Time{}, func() bool { return true }, "", false},
		{"idle off", api.StateRunning, timeouts{}, t0.Add(1000 * time.Hour), t0, time.Time{}, never, "", false},
		{"max lifetime even if busy", api.StateRunning, timeouts{maxLifetime: time.Hour}, t0.Add(time.Hour), t0.Add(time.Hour), time.Time{}, func() bool { return true }, "stop", false},
		{"stopped, delete after", api.StateStopped, timeouts{deleteAfter: time.Hour}, t0.Add(2 * time.Hour), t0, t0.Add(time.Hour), never, "delete", false},
		{"stopped, not yet", api.StateStopped, timeouts{deleteAfter: time.Hour}, t0.Add(90 * time.Minute), t0, t0.Add(time.Hour), never, "", false},
		{"stopped, delete off", api.StateStopped, timeouts{idle: time.Second}, t0.Add(1000 * time.Hour), t0, t0, never, "", false},
		{"starting is left alone", api.StateStarting, timeouts{idle: time.Second, maxLifetime: time.Second}, t0.Add(time.Hour), t0, time.Time{}, never, "", false},
		{"stopped, archive after", api.StateStopped, timeouts{archiveAfter: time.Hour}, t0.Add(2 * time.Hour), t0, t0.Add(time.Hour), never, "archive", false},
		{"stopped, archived already", api.StateStopped, timeouts{archiveAfter: time.Hour}, t0.Add(2 * time.Hour), t0, t0.Add(time.Hour), never, "", true},
		{"stopped, delete due before archive", api.StateStopped, timeouts{archiveAfter: time.Hour, deleteAfter: time.Hour}, t0.Add(2 * time.Hour), t0, t0.Add(time.Hour), never, "delete", false},
		{"paused is left alone", api.StatePaused, timeouts{idle: time.Second, maxLifetime: time.Second, archiveAfter: time.Second}, t0.Add(time.Hour), t0, time.Time{}, never, "", false},
	} {
		got := decide(tc.now, tc.state, tc.archived, tc.t, t0, tc.stoppedAt, tc.lastActive, tc.busy)
		if got.kind != tc.want {
			t.Errorf("%s: %q (%s), want %q", tc.name, got.kind, got.reason, tc.want)
		}
	}
}

// clock is a manual clock for the manager.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newManager builds a manager over a real store and the real native runtime,
// with a manual clock and no background sweeper.
func newManager(t *testing.T) (*Manager, *clock) {
	t.Helper()
	testutil.RequireRoot(t)
	state := testutil.StateDir(t)
	log := slog.New(slog.DiscardHandler)
	rt, err := native.New(runtime.Config{StateDir: filepath.Join(state, "native"), GuestBinary: testutil.Berth(t), Log: log},
		native.Options{CgroupRoot: "berth-test"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), filepath.Join(state, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: time.Now()}
	images, err := image.New(filepath.Join(state, "images"), log)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{DefaultRuntime: native.Name, Now: clk.Now, SweepInterval: time.Hour,
		DefaultTimeouts: TimeoutDefaults{Idle: 15 * time.Minute}}, st, map[string]runtime.Runtime{native.Name: rt}, images, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		list, _ := m.List(context.Background(), "", labels.Selector{})
		for _, sb := range list {
			m.Delete(context.Background(), "", sb.ID)
		}
		m.Close()
		rt.Close()
		st.Close()
	})
	return m, clk
}

func secs(n int64) *int64 { return &n }

func state(t *testing.T, m *Manager, id string) api.Sandbox {
	t.Helper()
	sb, err := m.Get(t.Context(), "", id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestIdleStopNeverKillsAWorkingSandbox drives the timeouts with the manual
// clock: a running background process keeps the sandbox alive past its idle
// timeout; once it ends and the idle time passes, the sandbox stops; after
// delete_after it is deleted.
func TestIdleStopNeverKillsAWorkingSandbox(t *testing.T) {
	m, clk := newManager(t)
	ctx := t.Context()
	sb, err := m.Create(ctx, "", api.CreateSandboxRequest{Timeouts: api.Timeouts{IdleSeconds: secs(60), DeleteAfterSeconds: secs(3600)}})
	if err != nil {
		t.Fatal(err)
	}
	if *sb.Timeouts.IdleSeconds != 60 || *sb.Timeouts.MaxLifetimeSeconds != 0 {
		t.Fatalf("timeouts in force: %+v", sb.Timeouts)
	}
	p, err := m.StartProcess(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Minute)
	m.Sweep(ctx)
	if got := state(t, m, sb.ID); got.State != api.StateRunning {
		t.Fatalf("stopped while a process ran: %+v", got)
	}
	if err := m.SignalProcess(ctx, "", sb.ID, p.Pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitProcess(ctx, "", sb.ID, p.Pid, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Second) // the wait was activity: not idle long enough yet
	m.Sweep(ctx)
	if got := state(t, m, sb.ID); got.State != api.StateRunning {
		t.Fatalf("stopped 30s after the last activity: %+v", got)
	}
	clk.Advance(31 * time.Second)
	m.Sweep(ctx)
	got := state(t, m, sb.ID)
	if got.State != api.StateStopped || got.StoppedAt == nil || got.Error == "" {
		t.Fatalf("want stopped with a reason: %+v", got)
	}
	if _, err := m.Exec(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"true"}}); !errdefs.IsConflict(err) {
		t.Fatalf("exec in a stopped sandbox: %v", err)
	}
	clk.Advance(59 * time.Minute)
	m.Sweep(ctx)
	if got := state(t, m, sb.ID); got.State != api.StateStopped {
		t.Fatalf("deleted too early: %+v", got)
	}
	clk.Advance(2 * time.Minute)
	m.Sweep(ctx)
	if _, err := m.Get(ctx, "", sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("not deleted after delete_after: %v", err)
	}
}

func TestKeepaliveAndMaxLifetime(t *testing.T) {
	m, clk := newManager(t)
	ctx := t.Context()
	sb, err := m.Create(ctx, "", api.CreateSandboxRequest{Timeouts: api.Timeouts{IdleSeconds: secs(60), MaxLifetimeSeconds: secs(600)}})
	if err != nil {
		t.Fatal(err)
	}
	for range 9 { // 9 × 50 s with a keepalive each time: never idle for 60 s
		clk.Advance(50 * time.Second)
		if err := m.Keepalive(ctx, "", sb.ID); err != nil {
			t.Fatal(err)
		}
		m.Sweep(ctx)
	}
	if got := state(t, m, sb.ID); got.State != api.StateRunning {
		t.Fatalf("stopped despite keepalives: %+v", got)
	}
	clk.Advance(160 * time.Second) // past the 600 s lifetime
	m.Keepalive(ctx, "", sb.ID)
	m.Sweep(ctx)
	if got := state(t, m, sb.ID); got.State != api.StateStopped {
		t.Fatalf("running past its maximum lifetime: %+v", got)
	}
}

func TestTimeoutValidation(t *testing.T) {
	m, _ := newManager(t)
	_, err := m.Create(t.Context(), "", api.CreateSandboxRequest{Timeouts: api.Timeouts{IdleSeconds: secs(-1)}})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative timeout: %v", err)
	}
}

// TestUpdateTimeoutsAndPublic: PATCH's timeouts replace the given fields
// only, are checked as at create (nothing changes on a bad one), and the
// sweeper obeys them at once; max_lifetime_s still counts from creation.
// public opens every port without the token, and closes them again.
func TestUpdateTimeoutsAndPublic(t *testing.T) {
	m, clk := newManager(t)
	ctx := t.Context()
	sb, err := m.Create(ctx, "", api.CreateSandboxRequest{Timeouts: api.Timeouts{IdleSeconds: secs(60), MaxLifetimeSeconds: secs(3600)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []api.Timeouts{{MaxLifetimeSeconds: secs(-1)}, {IdleSeconds: secs(0), DeleteAfterSeconds: secs(maxTimeout + 1)}} {
		pub := true
		_, err := m.Update(ctx, "", sb.ID, api.UpdateSandboxRequest{Timeouts: &bad, Public: &pub})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "timeouts.") {
			t.Fatalf("timeouts %+v: %v", bad, err)
		}
	}
	if got := state(t, m, sb.ID); *got.Timeouts.IdleSeconds != 60 || got.Public {
		t.Fatalf("a refused update changed the sandbox: %+v", got)
	}

	clk.Advance(5 * time.Minute)
	got, err := m.Update(ctx, "", sb.ID, api.UpdateSandboxRequest{Timeouts: &api.Timeouts{IdleSeconds: secs(0), MaxLifetimeSeconds: secs(400)}})
	if err != nil {
		t.Fatal(err)
	}
	if to := got.Timeouts; *to.IdleSeconds != 0 || *to.MaxLifetimeSeconds != 400 || *to.DeleteAfterSeconds != 0 {
		t.Fatalf("timeouts after the update: idle %d max %d delete %d", *to.IdleSeconds, *to.MaxLifetimeSeconds, *to.DeleteAfterSeconds)
	}
	clk.Advance(90 * time.Second) // 390 s old, idle for 390 s: idle is off
	m.Sweep(ctx)
	if got := state(t, m, sb.ID); got.State != api.StateRunning {
		t.Fatalf("stopped with the idle timeout off: %+v", got)
	}
	clk.Advance(20 * time.Second) // 410 s old
	m.Sweep(ctx)
	if got := state(t, m, sb.ID); got.State != api.StateStopped || !strings.Contains(got.Error, "maximum lifetime") {
		t.Fatalf("running past the lowered lifetime: %+v", got)
	}

	// A stopped sandbox's timeouts change too: delete it a minute on.
	if _, err := m.Update(ctx, "", sb.ID, api.UpdateSandboxRequest{Timeouts: &api.Timeouts{DeleteAfterSeconds: secs(60)}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	m.Sweep(ctx)
	if _, err := m.Get(ctx, "", sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("not deleted after the new delete_after: %v", err)
	}

	sb, err = m.Create(ctx, "", api.CreateSandboxRequest{Public: true})
	if err != nil || !sb.Public {
		t.Fatalf("create public: %+v %v", sb.Public, err)
	}
	done, err := m.AuthorizePort(ctx, "", sb.ID, 8123, "", false)
	if err != nil {
		t.Fatalf("a public sandbox's port without a token: %v", err)
	}
	done()
	off := false
	if got, err := m.Update(ctx, "", sb.ID, api.UpdateSandboxRequest{Public: &off}); err != nil || got.Public {
		t.Fatalf("public off: %+v %v", got.Public, err)
	}
	if _, err := m.AuthorizePort(ctx, "", sb.ID, 8123, "", false); errdefs.ClassOf(err) != errdefs.Unauthenticated {
		t.Fatalf("no longer public, no token: %v", err)
	}
	if _, err := m.Stop(ctx, "", sb.ID); err != nil {
		t.Fatal(err)
	}
	on := true
	if _, err := m.Update(ctx, "", sb.ID, api.UpdateSandboxRequest{Public: &on}); err != nil {
		t.Fatal(err)
	}
	// Stopped: the token check passes (public on record), the state does not.
	if _, err := m.AuthorizePort(ctx, "", sb.ID, 8123, "", false); !errdefs.IsConflict(err) {
		t.Fatalf("public and stopped, no token: %v", err)
	}
}
