package sandbox

import (
	"context"
	"fmt"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
)

// pauser returns the runtime's Pauser, or why it has none.
func (t *tier) pauser() (runtime.Pauser, error) {
	p, ok := t.rt.(runtime.Pauser)
	if !ok || !t.caps.Pause {
		return nil, t.lacks("pause", "pause a sandbox")
	}
	return p, nil
}

// Pause freezes every process of a running sandbox: they keep their
// memory, files and connections and get no CPU until Resume. Exec and file
// calls answer conflict meanwhile, and timeouts leave it alone. Pausing a
// paused sandbox is not an error.
func (m *Manager) Pause(ctx context.Context, tenant, id string) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	switch rec.State {
	case api.StatePaused:
		return recordToAPI(rec)
	case api.StateRunning:
	default:
		return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s; only a running sandbox can be paused", id, rec.State)
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return api.Sandbox{}, err
	}
	p, err := t.pauser()
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := p.Pause(ctx, id); err != nil {
		return api.Sandbox{}, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	if err := m.store.UpdateState(ctx, id, api.StatePaused, "", m.cfg.Now()); err != nil {
		if rerr := p.Resume(context.WithoutCancel(ctx), id); rerr != nil {
			m.log.Error("failed pause: resume", "sandbox", id, "err", rerr)
		}
		return api.Sandbox{}, err
	}
	m.emit(id, api.SandboxPaused)
	return m.Get(ctx, tenant, id)
}

// Resume thaws a paused sandbox's processes where they stopped. Resuming a
// running sandbox is not an error. A sandbox paused before a daemon
// restart gets its guest connection back here.
func (m *Manager) Resume(ctx context.Context, tenant, id string) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	switch rec.State {
	case api.StateRunning:
		return recordToAPI(rec)
	case api.StatePaused:
	default:
		return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s; only a paused sandbox can be resumed", id, rec.State)
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return api.Sandbox{}, err
	}
	p, err := t.pauser()
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := p.Resume(ctx, id); err != nil {
		return api.Sandbox{}, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	m.mu.Lock()
	ls := m.live[id]
	m.mu.Unlock()
	if ls == nil { // paused across a daemon restart
		if err := m.attach(ctx, rec); err != nil {
			m.settleStopped(ctx, rec, "its guest did not answer on resume: start it again ("+errdefs.Message(err)+")")
			return api.Sandbox{}, fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		m.mu.Lock()
		ls = m.live[id]
		m.mu.Unlock()
	}
	if err := m.store.UpdateState(ctx, id, api.StateRunning, "", m.cfg.Now()); err != nil {
		return api.Sandbox{}, err
	}
	if ls != nil {
		ls.lastActive.Store(m.cfg.Now().UnixNano())
	}
	m.emit(id, api.SandboxResumed)
	return m.Get(ctx, tenant, id)
}
