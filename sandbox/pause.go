package sandbox

import (
	"context"
	"fmt"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
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
	return m.turn(ctx, tenant, id, api.StateRunning, api.StatePaused, "paused", func(rec store.Sandbox, p runtime.Pauser) error {
		if err := p.Pause(ctx, id); err != nil {
			return fmt.Errorf("pause sandbox %s: %w", id, err)
		}
		if err := m.store.UpdateState(ctx, id, api.StatePaused, "", m.cfg.Now()); err != nil {
			if rerr := p.Resume(context.WithoutCancel(ctx), id); rerr != nil {
				m.log.Error("failed pause: resume", "sandbox", id, "err", rerr)
			}
			return err
		}
		m.emit(id, api.SandboxPaused)
		return nil
	})
}

// Resume thaws a paused sandbox's processes where they stopped. Resuming a
// running sandbox is not an error. A sandbox paused before a daemon
// restart gets its guest connection back here.
func (m *Manager) Resume(ctx context.Context, tenant, id string) (api.Sandbox, error) {
	return m.turn(ctx, tenant, id, api.StatePaused, api.StateRunning, "resumed", func(rec store.Sandbox, p runtime.Pauser) error {
		if err := p.Resume(ctx, id); err != nil {
			return fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		m.mu.Lock()
		ls := m.live[id]
		m.mu.Unlock()
		if ls == nil { // paused across a daemon restart
			if err := m.attach(ctx, rec); err != nil {
				m.settleStopped(ctx, rec, "its guest did not answer on resume: start it again ("+errdefs.Message(err)+")")
				return fmt.Errorf("resume sandbox %s: %w", id, err)
			}
			m.mu.Lock()
			ls = m.live[id]
			m.mu.Unlock()
		}
		if err := m.store.UpdateState(ctx, id, api.StateRunning, "", m.cfg.Now()); err != nil {
			return err
		}
		if ls != nil {
			ls.lastActive.Store(m.cfg.Now().UnixNano())
		}
		m.emit(id, api.SandboxResumed)
		return nil
	})
}

// turn runs fn, under the sandbox's operation lock, to take it from state
// from to state to (what verb does) with its runtime's Pauser; a sandbox
// already in state to is left as it is, one in any other state is a
// conflict.
func (m *Manager) turn(ctx context.Context, tenant, id, from, to, verb string, fn func(store.Sandbox, runtime.Pauser) error) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	switch rec.State {
	case to:
		return recordToAPI(rec)
	case from:
	default:
		return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s; only a %s sandbox can be %s", id, rec.State, from, verb)
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return api.Sandbox{}, err
	}
	p, err := t.pauser()
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := fn(rec, p); err != nil {
		return api.Sandbox{}, err
	}
	return m.Get(ctx, tenant, id)
}
