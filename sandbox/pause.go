package sandbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
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

// checkpointer returns the runtime's Checkpointer, or why it has none.
func (t *tier) checkpointer() (runtime.Checkpointer, error) {
	c, ok := t.rt.(runtime.Checkpointer)
	if !ok || !t.caps.MemoryCheckpoint {
		return nil, t.lacks("memory_checkpoint", "pause a sandbox with its memory")
	}
	return c, nil
}

// Pause freezes every process of a running sandbox: they keep their
// memory, files and connections and get no CPU until Resume. Exec and file
// calls answer conflict meanwhile, and timeouts leave it alone. Pausing a
// paused sandbox is not an error. With memory, the runtime saves the
// processes with their memory instead (a checkpoint) and frees the
// sandbox's CPU and memory; Resume restores them.
func (m *Manager) Pause(ctx context.Context, tenant, id string, memory bool) (api.Sandbox, error) {
	if memory {
		return m.checkpoint(ctx, tenant, id)
	}
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
	if rec, err := m.record(ctx, tenant, id); err == nil && rec.State == api.StatePaused && m.checkpointed(rec) {
		return m.restore(ctx, tenant, id)
	}
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
			// Connections that sat idle through the freeze may not have
			// survived it (gVisor's, under load): the next call dials anew.
			ls.guest.Close()
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

// checkpointed says whether rec is a sandbox paused with its memory.
func (m *Manager) checkpointed(rec store.Sandbox) bool {
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return false
	}
	c, ok := t.rt.(runtime.Checkpointer)
	return ok && c.Checkpointed(rec.RuntimeState)
}

// checkpointerOf reads sandbox id and its runtime's Checkpointer (or why
// the runtime has none).
func (m *Manager) checkpointerOf(ctx context.Context, tenant, id string) (store.Sandbox, runtime.Checkpointer, error) {
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return rec, nil, err
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return rec, nil, err
	}
	cp, err := t.checkpointer()
	return rec, cp, err
}

// checkpoint pauses a running sandbox with its memory: the guest lets go of
// its connections, the runtime saves the sandbox and ends it. On failure
// the sandbox runs on as it was.
func (m *Manager) checkpoint(ctx context.Context, tenant, id string) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, cp, err := m.checkpointerOf(ctx, tenant, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	switch {
	case rec.State == api.StatePaused && cp.Checkpointed(rec.RuntimeState):
		return recordToAPI(rec)
	case rec.State != api.StateRunning:
		return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s; only a running sandbox can be paused with its memory", id, rec.State)
	}
	m.mu.Lock()
	ls := m.live[id]
	m.mu.Unlock()
	if ls == nil {
		return api.Sandbox{}, errdefs.New(errdefs.Unavailable, "sandbox %s has no guest connection", id)
	}
	if !slices.Contains(ls.features, guestapi.FeatureSuspend) {
		return api.Sandbox{}, errdefs.New(errdefs.NotImplemented, "sandbox %s: its guest cannot be suspended for a checkpoint (a sandbox started by an older berth): stop and start it", id)
	}
	if ls.net != nil {
		return api.Sandbox{}, errdefs.New(errdefs.NotImplemented, "sandbox %s: a sandbox with a network link cannot be paused with its memory yet", id)
	}
	t0 := m.cfg.Now()
	if err := ls.guest.Suspend(ctx); err != nil {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: suspend its guest: %w", id, err)
	}
	// From here its exit is on purpose: the watcher leaves it alone.
	m.mu.Lock()
	delete(m.live, id)
	m.mu.Unlock()
	ls.endExits()
	state, err := cp.Checkpoint(ctx, id, rec.RuntimeState)
	if err != nil {
		if aerr := m.attach(context.WithoutCancel(ctx), rec); aerr != nil {
			m.log.Error("failed checkpoint: attach again", "sandbox", id, "err", aerr)
		}
		return api.Sandbox{}, err
	}
	ls.guest.Close()
	if err := m.store.SetRuntimeState(ctx, id, state); err != nil {
		return api.Sandbox{}, err
	}
	if err := m.store.UpdateState(ctx, id, api.StatePaused, "", m.cfg.Now()); err != nil {
		return api.Sandbox{}, err
	}
	m.log.Info("checkpointed", "sandbox", id, "took", m.cfg.Now().Sub(t0))
	m.emit(id, api.SandboxPaused)
	return m.Get(ctx, tenant, id)
}

// restore resumes a sandbox paused with its memory: the runtime brings its
// processes back and the guest answers again. On failure it stays paused.
func (m *Manager) restore(ctx context.Context, tenant, id string) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, cp, err := m.checkpointerOf(ctx, tenant, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	if rec.State != api.StatePaused || !cp.Checkpointed(rec.RuntimeState) {
		return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s, not paused with its memory", id, rec.State)
	}
	req, err := recordSpec(rec)
	if err != nil {
		return api.Sandbox{}, err
	}
	spec, err := m.resolve(ctx, id, rec.IDRange, req, imageRef(rec))
	if err != nil {
		return api.Sandbox{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, m.cfg.CreateTimeout)
	defer cancel()
	inst, err := cp.Restore(cctx, spec, rec.RuntimeState)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	if err := m.store.SetRuntimeState(ctx, id, inst.State); err != nil {
		return api.Sandbox{}, err
	}
	if err := m.connect(cctx, id, rec.Tenant, inst, req, spec.Root.Layers, runtime.LimitHits{}); err != nil {
		m.settleStopped(context.WithoutCancel(ctx), rec, "its guest did not answer after a restore: start it again ("+errdefs.Message(err)+")")
		return api.Sandbox{}, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	if err := m.store.UpdateState(ctx, id, api.StateRunning, "", m.cfg.Now()); err != nil {
		return api.Sandbox{}, err
	}
	m.emit(id, api.SandboxResumed)
	return m.Get(ctx, tenant, id)
}
