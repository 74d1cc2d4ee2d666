package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

// keyedMutex serializes work per key without a lock per key living forever.
type keyedMutex struct {
	mu   sync.Mutex
	keys map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks key and returns its unlock.
func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.keys == nil {
		k.keys = map[string]*keyLock{}
	}
	l := k.keys[key]
	if l == nil {
		l = &keyLock{}
		k.keys[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.keys, key)
		}
		k.mu.Unlock()
	}
}

func (m *Manager) stopper(rec store.Sandbox) (runtime.Stopper, error) {
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return nil, err
	}
	return t.stopper()
}

// Stop ends every process of a running sandbox and keeps its files.
func (m *Manager) Stop(ctx context.Context, tenant, id string) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	if err := m.stopLocked(ctx, tenant, id, ""); err != nil {
		return api.Sandbox{}, err
	}
	return m.Get(ctx, tenant, id)
}

// stopLocked stops a sandbox; the caller holds its operation lock. reason is
// recorded when berth (not a user) stopped it.
func (m *Manager) stopLocked(ctx context.Context, tenant, id, reason string) error {
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return err
	}
	if rec.State != api.StateRunning && rec.State != api.StatePaused {
		return errdefs.New(errdefs.Conflict, "sandbox %s is %s; only a running or paused sandbox can be stopped", id, rec.State)
	}
	if rec.State == api.StateRunning {
		m.meterOne(ctx, rec) // its last sample, before its processes go
	}
	st, err := m.stopper(rec)
	if err != nil {
		return err
	}
	if err := m.store.UpdateState(ctx, id, api.StateStopping, "", m.cfg.Now()); err != nil {
		return err
	}
	m.drop(id)
	if err := st.Stop(ctx, id, rec.RuntimeState); err != nil {
		m.setState(id, api.StateError, "stop failed: "+err.Error())
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	if err := m.store.UpdateState(ctx, id, api.StateStopped, reason, m.cfg.Now()); err != nil {
		return err
	}
	m.emit(id, api.SandboxStopped, func(ev *api.SandboxEvent) { ev.Reason = reason })
	return nil
}

// StartSandbox boots a stopped sandbox again with its files, labels and limits.
func (m *Manager) StartSandbox(ctx context.Context, tenant, id string) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	if err := m.startLocked(ctx, tenant, id); err != nil {
		return api.Sandbox{}, err
	}
	return m.Get(ctx, tenant, id)
}

func (m *Manager) startLocked(ctx context.Context, tenant, id string) error {
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return err
	}
	if rec.State != api.StateStopped {
		return errdefs.New(errdefs.Conflict, "sandbox %s is %s; only a stopped sandbox can be started", id, rec.State)
	}
	st, err := m.stopper(rec)
	if err != nil {
		return err
	}
	req, err := recordSpec(rec)
	if err != nil {
		return err
	}
	release, err := m.admit(ctx, rec.Tenant, req, false)
	if err != nil {
		return err
	}
	defer release()
	spec, err := m.resolve(ctx, id, rec.IDRange, req, imageRef(rec))
	if err != nil {
		return err
	}
	if rec.ArchiveBytes > 0 {
		if err := m.unarchive(ctx, rec, spec); err != nil {
			return err
		}
	}
	if err := m.store.UpdateState(ctx, id, api.StateStarting, "", m.cfg.Now()); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, m.cfg.CreateTimeout)
	defer cancel()
	fail := func(err error) error {
		m.setState(id, api.StateStopped, "start failed: "+errdefs.Message(err))
		return err
	}
	undo := func(inst *runtime.Instance) {
		if err := st.Stop(context.Background(), id, inst.State); err != nil {
			m.log.Error("failed start: stop", "sandbox", id, "err", err)
		}
	}
	inst, err := st.Start(cctx, spec)
	if err != nil {
		return fail(err)
	}
	if err := m.store.SetRuntimeState(ctx, id, inst.State); err != nil {
		undo(inst)
		return fail(err)
	}
	if err := m.connect(cctx, id, rec.Tenant, inst, req, spec.Root.Layers, runtime.LimitHits{}); err != nil {
		undo(inst)
		return fail(err)
	}
	if err := m.store.UpdateState(ctx, id, api.StateRunning, "", m.cfg.Now()); err != nil {
		return err
	}
	m.emit(id, api.SandboxStarted)
	// A start_cmd that does not start leaves the sandbox running: the
	// caller hears why and can exec, fix, stop.
	return m.runStartCmd(ctx, id, req)
}

// Update applies a merge patch to a sandbox's labels (a value sets a label,
// nil removes it), changes its limits (running sandboxes only; a zero
// field keeps its value), its network, its public ports and whether it is
// public, and replaces the timeouts it gives. Nothing changes unless
// everything is valid.
func (m *Manager) Update(ctx context.Context, tenant, id string, req api.UpdateSandboxRequest) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	merged := map[string]string{}
	for k, v := range rec.Labels {
		merged[k] = v
	}
	for k, v := range req.Labels {
		if v == nil {
			delete(merged, k)
		} else {
			merged[k] = *v
		}
	}
	if err := labels.Validate(merged); err != nil {
		return api.Sandbox{}, err
	}
	if req.Limits != nil {
		if err := m.setLimits(ctx, rec, *req.Limits); err != nil {
			return api.Sandbox{}, err
		}
	}
	var publicPorts []int
	if req.PublicPorts != nil {
		if publicPorts, err = normalizePorts("public_ports", *req.PublicPorts); err != nil {
			return api.Sandbox{}, err
		}
	}
	if req.Timeouts != nil {
		if err := m.checkTimeouts(*req.Timeouts, rec.Runtime); err != nil {
			return api.Sandbox{}, err
		}
	}
	if req.Network != nil {
		if err := m.updateNetwork(ctx, rec, *req.Network); err != nil {
			return api.Sandbox{}, err
		}
	}
	if req.PublicPorts != nil || req.Public != nil || req.Timeouts != nil {
		err := m.patchSpec(ctx, tenant, id, func(spec *api.CreateSandboxRequest) {
			if req.PublicPorts != nil {
				spec.PublicPorts = publicPorts
			}
			if req.Public != nil {
				spec.Public = *req.Public
			}
			if t := req.Timeouts; t != nil {
				patchTimeouts(&spec.Timeouts, *t)
			}
		})
		if err != nil {
			return api.Sandbox{}, err
		}
		if t := req.Timeouts; t != nil && t.MaxLifetimeSeconds != nil && *t.MaxLifetimeSeconds > 0 {
			m.sweepAt(rec.CreatedAt.Add(time.Duration(*t.MaxLifetimeSeconds) * time.Second))
		}
	}
	if req.Labels != nil {
		if err := m.store.SetLabels(ctx, id, merged); err != nil {
			return api.Sandbox{}, err
		}
	}
	return m.Get(ctx, tenant, id)
}

// patchTimeouts replaces the timeouts in force with those p gives. The
// sweeper reads them from the stored spec, so the next sweep obeys them.
func patchTimeouts(t *api.Timeouts, p api.Timeouts) {
	for i, f := range timeoutFields(&p) {
		if *f.p != nil {
			v := **f.p
			*timeoutFields(t)[i].p = &v
		}
	}
	// A bool cannot say "absent": true turns auto-resume on, false keeps it.
	if p.AutoResume {
		t.AutoResume = true
	}
}

// patchSpec changes sandbox id's stored spec with change and, for a
// running sandbox, the live copy the same way.
func (m *Manager) patchSpec(ctx context.Context, tenant, id string, change func(*api.CreateSandboxRequest)) error {
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return err
	}
	spec, err := recordSpec(rec)
	if err != nil {
		return err
	}
	change(&spec)
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := m.store.SetSpec(ctx, id, b); err != nil {
		return err
	}
	m.mu.Lock()
	if ls := m.live[id]; ls != nil {
		change(&ls.spec)
	}
	m.mu.Unlock()
	return nil
}

// updateNetwork replaces a sandbox's network policy: at once for a running
// sandbox (new connections obey it), at its next start for a stopped one.
// If anything fails, the old policy stays in force and on record.
func (m *Manager) updateNetwork(ctx context.Context, rec store.Sandbox, n api.Network) error {
	switch rec.State {
	case api.StateRunning, api.StateStopped:
	default:
		return errdefs.New(errdefs.Conflict, "sandbox %s is %s: its network changes once that has finished", rec.ID, rec.State)
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return err
	}
	spec, err := recordSpec(rec)
	if err != nil {
		return err
	}
	old := networkOf(spec)
	if _, err := m.normalizeNetwork(ctx, rec.Tenant, t, &n, &old); err != nil {
		return err
	}
	var ls *liveSandbox
	if rec.State == api.StateRunning {
		m.mu.Lock()
		ls = m.live[rec.ID]
		m.mu.Unlock()
		if ls == nil {
			return errdefs.New(errdefs.Unavailable, "sandbox %s: no connection to its guest", rec.ID)
		}
		if err := m.setNetwork(ctx, ls, rec.ID, rec.Tenant, n); err != nil {
			return err
		}
	}
	spec.Network = &n
	specJSON, err := json.Marshal(spec)
	if err == nil {
		err = m.store.SetSpec(ctx, rec.ID, specJSON)
	}
	if err != nil {
		if ls != nil {
			if rerr := m.setNetwork(context.Background(), ls, rec.ID, rec.Tenant, old); rerr != nil {
				m.log.Error("restore the old network policy", "sandbox", rec.ID, "err", rerr)
			}
		}
		return err
	}
	if ls != nil {
		m.mu.Lock()
		ls.spec.Network = &n
		m.mu.Unlock()
	}
	return nil
}

// setLimits applies new limits to a running sandbox and records them.
func (m *Manager) setLimits(ctx context.Context, rec store.Sandbox, l api.Limits) error {
	if rec.State != api.StateRunning {
		return errdefs.New(errdefs.Conflict, "sandbox %s is %s: limits change only while it runs", rec.ID, rec.State)
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return err
	}
	upd, err := t.updater()
	if err != nil {
		return err
	}
	spec, err := recordSpec(rec)
	if err != nil {
		return err
	}
	if l.CPUs != 0 {
		spec.Limits.CPUs = l.CPUs
	}
	if l.MemoryBytes != 0 {
		spec.Limits.MemoryBytes = l.MemoryBytes
	}
	if l.Pids != 0 {
		spec.Limits.Pids = l.Pids
	}
	if l.OpenFiles != 0 {
		spec.Limits.OpenFiles = l.OpenFiles
	}
	if l.DiskBytes != 0 {
		if spec.Limits.DiskBytes == 0 {
			return errdefs.New(errdefs.InvalidArgument, "limits.disk_bytes: sandbox %s was created without a disk limit; one cannot be added to a running sandbox", rec.ID)
		}
		if l.DiskBytes < spec.Limits.DiskBytes {
			return errdefs.New(errdefs.InvalidArgument, "limits.disk_bytes: %d is outside %d..%d (a disk only grows)", l.DiskBytes, spec.Limits.DiskBytes, t.caps.Host.DiskBytes)
		}
		if l.DiskBytes > spec.Limits.DiskBytes && !t.caps.GrowDisk {
			if why := t.caps.Missing["grow_disk"]; why != "" {
				return errdefs.New(errdefs.NotImplemented, "limits.disk_bytes: %s", why)
			}
			return t.lacks("grow_disk", "grow a running sandbox's disk")
		}
		spec.Limits.DiskBytes = l.DiskBytes
	}
	if err := validateLimits(spec.Limits, t.caps); err != nil {
		return err
	}
	// Held until the new limits are stored, so that no create is admitted
	// against the old ones meanwhile.
	release, err := m.admitLimits(ctx, rec, spec.Limits)
	if err != nil {
		return err
	}
	defer release()
	if err := upd.SetLimits(ctx, rec.ID, runtime.Limits(spec.Limits)); err != nil {
		return err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := m.store.SetSpec(ctx, rec.ID, b); err != nil {
		return err
	}
	m.mu.Lock()
	if ls := m.live[rec.ID]; ls != nil {
		ls.spec = spec
	}
	m.mu.Unlock()
	return nil
}

// GetOrCreate returns the oldest sandbox of tenant that carries every label
// of req, starting it if it is stopped, or creates one from req. Concurrent
// calls with the same labels get the same sandbox. created says which.
func (m *Manager) GetOrCreate(ctx context.Context, tenant string, req api.CreateSandboxRequest) (sb api.Sandbox, created bool, err error) {
	if len(req.Labels) == 0 {
		return api.Sandbox{}, false, errdefs.New(errdefs.InvalidArgument, "labels: get-or-create needs at least one label to look up")
	}
	if err := labels.Validate(req.Labels); err != nil {
		return api.Sandbox{}, false, err
	}
	sel := labels.SelectorFromMap(req.Labels)
	unlock := m.goc.lock(tenant + "\x00" + sel.String())
	defer unlock()
	found, err := m.store.ListSandboxes(ctx, tenant, sel)
	if err != nil {
		return api.Sandbox{}, false, err
	}
	for _, rec := range found {
		switch rec.State {
		case api.StateRunning:
			if ls, err := m.guest(ctx, tenant, rec.ID); err == nil {
				ls.lastActive.Store(m.cfg.Now().UnixNano())
			}
			sb, err := recordToAPI(rec)
			return sb, false, err
		case api.StateStopped:
			sb, err := m.StartSandbox(ctx, tenant, rec.ID)
			return sb, false, err
		case api.StatePaused:
			sb, err := m.Resume(ctx, tenant, rec.ID)
			return sb, false, err
		case api.StateStarting, api.StateStopping, api.StateCreating:
			return api.Sandbox{}, false, errdefs.New(errdefs.Conflict, "sandbox %s with these labels is %s; try again", rec.ID, rec.State)
		}
		// deleting or error: not a usable match; look further or create.
	}
	sb, err = m.Create(ctx, tenant, req)
	return sb, err == nil, err
}

// Keepalive counts as activity: it pushes a running sandbox's idle stop back.
func (m *Manager) Keepalive(ctx context.Context, tenant, id string) error {
	_, err := m.guest(ctx, tenant, id) // records the activity
	return err
}

// idleStop begins the reason of a stop for idleness (auto-resume looks
// for it).
const idleStop = "stopped by berth: idle for "

// action is what the sweeper does to one sandbox.
type action struct {
	kind   string // "", "stop" or "delete"
	reason string
}

// timeouts is a sandbox's timeouts in force (zero: off).
type timeouts struct {
	idle, deleteAfter, archiveAfter, maxLifetime time.Duration
}

func timeoutsOf(t api.Timeouts) timeouts {
	d := func(p *int64) time.Duration {
		if p == nil {
			return 0
		}
		return time.Duration(*p) * time.Second
	}
	return timeouts{idle: d(t.IdleSeconds), deleteAfter: d(t.DeleteAfterSeconds), archiveAfter: d(t.ArchiveAfterSeconds), maxLifetime: d(t.MaxLifetimeSeconds)}
}

// decide is the whole timeout policy, free of I/O: busy (is the sandbox
// still active, on a closer look) is asked only when the idle time seems to
// have run out, and an active sandbox is never stopped for idleness.
func decide(now time.Time, state string, archived bool, t timeouts, created, stoppedAt, lastActive time.Time, busy func() bool) action {
	switch state {
	case api.StateRunning:
		if t.maxLifetime > 0 && now.Sub(created) >= t.maxLifetime {
			return action{"stop", fmt.Sprintf("stopped by berth: reached its maximum lifetime of %s", t.maxLifetime)}
		}
		if t.idle > 0 && now.Sub(lastActive) >= t.idle && !busy() {
			return action{"stop", idleStop + t.idle.String()}
		}
	case api.StateStopped:
		if t.deleteAfter > 0 && !stoppedAt.IsZero() && now.Sub(stoppedAt) >= t.deleteAfter {
			return action{"delete", ""}
		}
		if t.archiveAfter > 0 && !archived && !stoppedAt.IsZero() && now.Sub(stoppedAt) >= t.archiveAfter {
			return action{"archive", ""}
		}
	}
	return action{}
}

// sweeper applies timeouts until the manager closes: every
// SweepInterval, and at a deadline sweepAt asked for.
func (m *Manager) sweeper() {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.SweepInterval)
	defer tick.Stop()
	at := time.NewTimer(time.Hour)
	at.Stop()
	defer at.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
			m.Sweep(m.ctx)
		case <-m.wake:
			m.sweepMu.Lock()
			next := m.nextSweep
			m.sweepMu.Unlock()
			at.Reset(max(next.Sub(m.cfg.Now()), 0))
		case <-at.C:
			m.sweepMu.Lock()
			m.nextSweep = time.Time{}
			m.sweepMu.Unlock()
			m.Sweep(m.ctx)
		}
	}
}

// sweepAt asks for a sweep at t (a maximum lifetime's end), so that a
// sandbox stops then rather than at the next tick. Only the earliest
// pending request is kept; the ticks catch the rest.
func (m *Manager) sweepAt(t time.Time) {
	m.sweepMu.Lock()
	if !m.nextSweep.IsZero() && m.nextSweep.Before(t) {
		m.sweepMu.Unlock()
		return
	}
	m.nextSweep = t
	m.sweepMu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default: // a wake is pending; it reads nextSweep
	}
}

// Sweep applies every sandbox's timeouts once, at the manager clock's now.
func (m *Manager) Sweep(ctx context.Context) {
	all, err := m.store.ListSandboxes(ctx, "", labels.Selector{})
	if err != nil {
		m.log.Error("sweep: list sandboxes", "err", err)
		return
	}
	now := m.cfg.Now()
	for _, rec := range all {
		spec, err := recordSpec(rec)
		if err != nil {
			continue
		}
		m.mu.Lock()
		ls := m.live[rec.ID]
		m.mu.Unlock()
		lastActive := rec.CreatedAt
		if ls != nil {
			lastActive = time.Unix(0, ls.lastActive.Load())
		}
		if ls != nil && rec.State == api.StateRunning {
			m.watchLimits(ctx, rec, ls)
		}
		t := timeoutsOf(spec.Timeouts)
		busy := func() bool { return ls != nil && m.active(ctx, ls, t.idle) }
		act := decide(now, rec.State, rec.ArchiveBytes > 0, t, rec.CreatedAt, rec.StoppedAt, lastActive, busy)
		switch act.kind {
		case "stop":
			unlock := m.ops.lock(rec.ID)
			err := m.stopLocked(ctx, rec.Tenant, rec.ID, act.reason)
			unlock()
			m.log.Info("timeout", "sandbox", rec.ID, "action", "stop", "reason", act.reason, "err", err)
		case "delete":
			err := m.Delete(ctx, rec.Tenant, rec.ID)
			m.log.Info("timeout", "sandbox", rec.ID, "action", "delete", "err", err)
		case "archive":
			err := m.archiveLayer(ctx, rec.ID)
			m.log.Info("timeout", "sandbox", rec.ID, "action", "archive", "err", err)
		}
	}
}

// active reports whether a sandbox still counts as active for an idle
// timeout of idle: an open stream, a running process started through the
// API (not the start_cmd's), or one that ended less than idle ago (its end
// is activity). It
// refreshes the sandbox's last activity from what it finds. Process times
// come from the guest and are not believed beyond the manager's now.
func (m *Manager) active(ctx context.Context, ls *liveSandbox, idle time.Duration) bool {
	now := m.cfg.Now()
	touch := func(t time.Time) {
		if t.After(now) {
			t = now
		}
		if t.UnixNano() > ls.lastActive.Load() {
			ls.lastActive.Store(t.UnixNano())
		}
	}
	if ls.streams.Load() > 0 {
		touch(now)
		return true
	}
	procs, err := ls.guest.List(ctx)
	if err != nil {
		return true // when in doubt, do not stop a sandbox
	}
	m.mu.Lock()
	startCmd := ls.spec.StartCmd
	m.mu.Unlock()
	for _, p := range procs {
		if startCmd != "" && slices.Equal(p.Args, []string{"/bin/sh", "-c", startCmd}) {
			// The start_cmd's server runs for good: traffic to its ports
			// is activity, its running is not (after a daemon restart too).
			continue
		}
		if p.Running {
			touch(now)
			return true
		}
		if p.Result != nil {
			touch(time.UnixMilli(p.StartedUnixMs + p.Result.DurationMs))
		}
	}
	return now.Sub(time.Unix(0, ls.lastActive.Load())) < idle
}

func recordSpec(rec store.Sandbox) (api.CreateSandboxRequest, error) {
	var spec api.CreateSandboxRequest
	if err := json.Unmarshal(rec.Spec, &spec); err != nil {
		return spec, fmt.Errorf("sandbox %s: bad stored spec: %w", rec.ID, err)
	}
	return spec, nil
}
