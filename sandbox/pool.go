package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

// statePooled is the store state of a warm-pool sandbox: booted, connected,
// owned by no tenant, invisible to the API until a create claims it.
const statePooled = "pooled"

// pool keeps sandboxes of one image and runtime (the daemon's defaults)
// booted ahead of time, so that a create of them is a hand-over instead of
// a boot.
type pool struct {
	size  int
	image string // what the pooled sandboxes are made of
	rt    string
	mu    sync.Mutex
	ready []string      // ids, oldest first
	kick  chan struct{} // wakes the refiller
}

// startPool starts the refiller when a pool is configured.
func (m *Manager) startPool() {
	m.pool.kick = make(chan struct{}, 1)
	m.pool.image, m.pool.rt = m.cfg.DefaultImage, m.cfg.DefaultRuntime
	if m.pool.size == 0 {
		return
	}
	// A hand-over applies the request's limits to a running sandbox.
	if _, err := m.tiers[m.pool.rt].updater(); err != nil {
		m.log.Warn("warm pool off", "runtime", m.pool.rt, "why", errdefs.Message(err))
		m.pool.size = 0
		return
	}
	m.wg.Add(1)
	go m.refiller()
}

// refiller boots sandboxes until the pool is full, then waits for a take.
func (m *Manager) refiller() {
	defer m.wg.Done()
	for {
		for m.poolShort() {
			if err := m.fillOne(m.ctx); err != nil {
				if m.ctx.Err() != nil {
					return
				}
				m.log.Warn("warm pool: boot failed", "err", err)
				select {
				case <-m.ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		}
		select {
		case <-m.ctx.Done():
			return
		case <-m.pool.kick:
		}
	}
}

func (m *Manager) poolShort() bool {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	return len(m.pool.ready) < m.pool.size
}

// fillOne boots one pooled sandbox with the daemon's defaults.
func (m *Manager) fillOne(ctx context.Context) error {
	req, err := m.normalize(api.CreateSandboxRequest{Image: m.pool.image, Runtime: m.pool.rt})
	if err != nil {
		return err
	}
	if err := m.normalizeRequestNetwork(ctx, "", &req); err != nil {
		return err
	}
	_, id, err := m.boot(ctx, "", statePooled, req)
	if err != nil {
		return fmt.Errorf("warm pool: %w", err)
	}
	m.pool.mu.Lock()
	m.pool.ready = append(m.pool.ready, id)
	m.pool.mu.Unlock()
	return nil
}

// takePooled hands out a pooled sandbox for req, if req fits the pool.
func (m *Manager) takePooled(req api.CreateSandboxRequest) (string, bool) {
	// A disk limit is a file system made at create: pooled sandboxes have none.
	if m.pool.size == 0 || req.Image != m.pool.image || req.Runtime != m.pool.rt || req.Limits.DiskBytes != 0 {
		return "", false
	}
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	if len(m.pool.ready) == 0 {
		return "", false
	}
	id := m.pool.ready[0]
	m.pool.ready = m.pool.ready[1:]
	select {
	case m.pool.kick <- struct{}{}:
	default:
	}
	return id, true
}

// claim turns pooled sandbox id into the tenant's sandbox for req: limits,
// then the store row (spec, labels, owner, creation time) in one step.
func (m *Manager) claim(ctx context.Context, tenant, id string, req api.CreateSandboxRequest) (api.Sandbox, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	t, err := m.tier(req.Runtime)
	if err != nil {
		return api.Sandbox{}, err
	}
	upd, err := t.updater()
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := upd.SetLimits(ctx, id, runtime.Limits(req.Limits)); err != nil {
		return api.Sandbox{}, err
	}
	m.mu.Lock()
	ls := m.live[id]
	m.mu.Unlock()
	if ls == nil {
		return api.Sandbox{}, fmt.Errorf("pooled sandbox %s is gone", id)
	}
	// The pooled sandbox had the daemon's default network: now the request's.
	if err := m.setNetwork(ctx, ls, id, tenant, networkOf(req)); err != nil {
		return api.Sandbox{}, err
	}
	specJSON, err := json.Marshal(req)
	if err != nil {
		return api.Sandbox{}, err
	}
	// A new owner, a new token: the pool's was never shown to anyone, but
	// a token is the caller's alone.
	token, err := newAccessToken()
	if err != nil {
		return api.Sandbox{}, err
	}
	now := m.cfg.Now().UTC()
	rec := store.Sandbox{ID: id, Tenant: tenant, State: api.StateRunning, Image: req.Image, Runtime: req.Runtime,
		Spec: specJSON, Labels: req.Labels, CreatedAt: now, UpdatedAt: now, AccessToken: token}
	m.mu.Lock()
	ls.spec = req
	m.mu.Unlock()
	ls.token.Store(&token)
	ls.lastActive.Store(now.UnixNano())
	if err := m.store.ReplaceSandbox(ctx, statePooled, rec); err != nil {
		return api.Sandbox{}, err
	}
	m.emit(id, api.SandboxCreated)
	return toAPI(rec, req), nil
}

// discard deletes a pooled sandbox (a failed hand-over, an init that died,
// shutdown).
func (m *Manager) discard(ctx context.Context, id string) {
	m.pool.mu.Lock()
	for i, r := range m.pool.ready {
		if r == id {
			m.pool.ready = append(m.pool.ready[:i], m.pool.ready[i+1:]...)
			break
		}
	}
	m.pool.mu.Unlock()
	m.drop(id)
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil || rec.State != statePooled {
		return
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		m.log.Error("warm pool: delete failed", "sandbox", id, "err", err)
		return
	}
	if err := t.rt.Delete(ctx, id, rec.RuntimeState); err != nil {
		m.log.Error("warm pool: delete failed", "sandbox", id, "err", err)
		return
	}
	m.forget(id)
}

// drainPool deletes every pooled sandbox (at shutdown).
func (m *Manager) drainPool(ctx context.Context) {
	m.pool.mu.Lock()
	ids := append([]string(nil), m.pool.ready...)
	m.pool.mu.Unlock()
	for _, id := range ids {
		m.discard(ctx, id)
	}
}
