package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
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

// A warm pool keeps sandboxes of one image and runtime booted ahead of
// time, so that a create of them is a hand-over instead of a boot. The
// daemon has one for its default image (Config.WarmPool) and one for each
// image in Config.WarmPools or set through SetPool. A create matches a pool
// by the stored image it resolves to, so "python:3.12-slim" and
// "docker.io/library/python:3.12-slim" share one, and a name that moved to
// a new image stops matching sandboxes made of the old one.
type pools struct {
	mu  sync.Mutex
	all map[string]*pool // by image reference as configured
}

type pool struct {
	image, rt string
	size      int
	ready     []pooled      // oldest first
	kick      chan struct{} // wakes the refiller
	stop      context.CancelFunc
}

// pooled is a booted sandbox waiting for a create.
type pooled struct {
	id, imageID string
}

// startPool starts the refillers of the configured pools.
func (m *Manager) startPool() {
	m.pool.all = map[string]*pool{}
	if m.cfg.WarmPool > 0 {
		m.setPool(m.cfg.DefaultImage, m.cfg.WarmPool)
	}
	for img, n := range m.cfg.WarmPools {
		m.setPool(img, n)
	}
}

// SetPool keeps size sandboxes of img (on the default runtime) booted; 0
// removes the pool and deletes its sandboxes.
func (m *Manager) SetPool(ctx context.Context, img string, size int) (api.Pool, error) {
	if img == "" {
		return api.Pool{}, errdefs.New(errdefs.InvalidArgument, "image: required")
	}
	if size < 0 || size > maxPool {
		return api.Pool{}, errdefs.New(errdefs.InvalidArgument, "size: %d is outside 0..%d", size, maxPool)
	}
	if size > 0 {
		if _, _, err := m.normalize(ctx, "", api.CreateSandboxRequest{Image: img}); err != nil {
			return api.Pool{}, err
		}
		if _, err := m.tiers[m.cfg.DefaultRuntime].updater(); err != nil {
			return api.Pool{}, err
		}
	}
	m.setPool(img, size)
	for _, p := range m.Pools() {
		if p.Image == img {
			return p, nil
		}
	}
	return api.Pool{Image: img, Runtime: m.cfg.DefaultRuntime}, nil
}

// maxPool bounds one pool.
const maxPool = 256

func (m *Manager) setPool(img string, size int) {
	m.pool.mu.Lock()
	p := m.pool.all[img]
	if p != nil && size > 0 {
		p.size = size
		m.pool.mu.Unlock()
		select {
		case p.kick <- struct{}{}:
		default:
		}
		return
	}
	if p == nil && size == 0 {
		m.pool.mu.Unlock()
		return
	}
	if p != nil { // size 0: the pool goes
		delete(m.pool.all, img)
		p.stop()
		ready := p.ready
		p.ready = nil
		m.pool.mu.Unlock()
		for _, r := range ready {
			m.discard(context.Background(), r.id)
		}
		return
	}
	// A hand-over applies the request's limits to a running sandbox.
	if _, err := m.tiers[m.cfg.DefaultRuntime].updater(); err != nil {
		m.pool.mu.Unlock()
		m.log.Warn("warm pool off", "runtime", m.cfg.DefaultRuntime, "image", img, "why", errdefs.Message(err))
		return
	}
	ctx, stop := context.WithCancel(m.ctx)
	p = &pool{image: img, rt: m.cfg.DefaultRuntime, size: size, kick: make(chan struct{}, 1), stop: stop}
	m.pool.all[img] = p
	m.pool.mu.Unlock()
	m.wg.Add(1)
	go m.refiller(ctx, p)
}

// Pools lists the warm pools.
func (m *Manager) Pools() []api.Pool {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	out := make([]api.Pool, 0, len(m.pool.all))
	for _, p := range m.pool.all {
		out = append(out, api.Pool{Image: p.image, Runtime: p.rt, Size: p.size, Ready: len(p.ready)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Image < out[j].Image })
	return out
}

// refiller boots sandboxes until its pool is full, then waits for a take.
// A failure (a registry that is down) is retried, less often each time.
func (m *Manager) refiller(ctx context.Context, p *pool) {
	defer m.wg.Done()
	backoff := time.Second
	for {
		for m.poolShort(p) {
			if err := m.fillOne(ctx, p); err != nil {
				if ctx.Err() != nil {
					return
				}
				m.log.Warn("warm pool: boot failed", "image", p.image, "err", err, "retry_in", backoff)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
	}
}

func (m *Manager) poolShort(p *pool) bool {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	return len(p.ready) < p.size
}

// fillOne boots one pooled sandbox of p's image with the daemon's defaults.
func (m *Manager) fillOne(ctx context.Context, p *pool) error {
	req, imageID, err := m.normalize(ctx, "", api.CreateSandboxRequest{Image: p.image, Runtime: p.rt})
	if err != nil {
		return err
	}
	if err := m.normalizeRequestNetwork(ctx, "", &req); err != nil {
		return err
	}
	_, id, err := m.boot(ctx, "", statePooled, req, imageID)
	if err != nil {
		return fmt.Errorf("warm pool: %w", err)
	}
	m.pool.mu.Lock()
	if m.pool.all[p.image] == p {
		p.ready = append(p.ready, pooled{id: id, imageID: imageID})
		id = ""
	}
	m.pool.mu.Unlock()
	if id != "" { // the pool went meanwhile
		m.discard(context.Background(), id)
	}
	return nil
}

// takePooled hands out a pooled sandbox for req (made of imageID), if a
// pool has one.
func (m *Manager) takePooled(req api.CreateSandboxRequest, imageID string) (string, bool) {
	// A disk limit is a file system made at create: pooled sandboxes have none.
	if req.Limits.DiskBytes != 0 {
		return "", false
	}
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	for _, p := range m.pool.all {
		if p.rt != req.Runtime {
			continue
		}
		for i, r := range p.ready {
			if r.imageID != imageID || (imageID == "" && p.image != req.Image) {
				continue
			}
			p.ready = append(p.ready[:i:i], p.ready[i+1:]...)
			select {
			case p.kick <- struct{}{}:
			default:
			}
			return r.id, true
		}
	}
	return "", false
}

// claim turns pooled sandbox id into the tenant's sandbox for req: limits,
// then the store row (spec, labels, owner, creation time) in one step.
func (m *Manager) claim(ctx context.Context, tenant, id string, req api.CreateSandboxRequest, imageID string) (api.Sandbox, error) {
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
		Spec: specJSON, Labels: req.Labels, CreatedAt: now, UpdatedAt: now, AccessToken: token, ImageID: imageID}
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
	for _, p := range m.pool.all {
		for i, r := range p.ready {
			if r.id == id {
				p.ready = append(p.ready[:i:i], p.ready[i+1:]...)
				break
			}
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
	var ids []string
	for _, p := range m.pool.all {
		for _, r := range p.ready {
			ids = append(ids, r.id)
		}
	}
	m.pool.mu.Unlock()
	for _, id := range ids {
		m.discard(ctx, id)
	}
}
