// Package sandbox is berth's sandbox manager: it validates requests, resolves
// each sandbox into one runtime.Spec (spec.go), keeps sandboxes in the store,
// drives the runtimes within their declared capabilities, and relays exec,
// process and file calls to each sandbox's guest. Its files follow the
// lifecycle: manager.go (create, get, delete, attach), lifecycle.go (stop,
// start, update, get-or-create, timeouts), pool.go (warm pool), exec.go,
// files.go, usage.go, events.go.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guestclient"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/network"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

// Config tunes the manager.
type Config struct {
	// DefaultRuntime is used when a create request names none.
	DefaultRuntime string
	// DefaultImage is used when a create request names none ("host").
	DefaultImage string
	// Unavailable names the runtimes that cannot run on this host, with why.
	Unavailable map[string]string
	// IDMap is the base of sandboxes' mappings of user and group ids to
	// the host's (runtime.DefaultIDMap when zero): each sandbox gets a
	// range of its size above it.
	IDMap runtime.IDMap
	// DefaultLimits fill the zero fields of a create request's limits.
	DefaultLimits api.Limits
	// DefaultTimeouts fill the absent fields of a create request's timeouts.
	DefaultTimeouts TimeoutDefaults
	// CreateTimeout bounds one runtime Create or Start.
	CreateTimeout time.Duration
	// WarmPool is how many sandboxes of the default image and runtime are
	// kept booted ahead of time, so that a create is a hand-over (0: none).
	WarmPool int
	// WarmPools are pools of other images (on the default runtime), by
	// image reference.
	WarmPools map[string]int
	// SpareGuests is how many guests each runtime that can (runtime.Spares)
	// keeps started ahead of their sandboxes, for any image and spec: a
	// create that finds one skips the spawn (0: none).
	SpareGuests int
	// SweepInterval is how often timeouts are checked (default 1s).
	SweepInterval time.Duration
	// UsageInterval is how often running sandboxes are sampled for the
	// tenants' usage counters (default 5s).
	UsageInterval time.Duration
	// Now is the manager's clock (default time.Now); tests inject one.
	Now func() time.Time
	// ExecOutputBudget bounds the output that running plain (not streamed)
	// execs hold in the daemon together, in bytes (default 512 MiB).
	ExecOutputBudget int64
	// DefaultNetwork is the network mode of sandboxes whose create names
	// none (default none).
	DefaultNetwork string
	// Network runs sandboxes' networks; nil when the daemon gives none,
	// and NetworkUnavailable says why.
	Network            *network.Service
	NetworkUnavailable string
}

// DefaultExecOutputBudget is ExecOutputBudget's default.
const DefaultExecOutputBudget = 512 << 20

// Images resolves image references into root file systems (image.Store).
type Images interface {
	// Ensure finds a stored image by reference as tenant may use it (its
	// own names, then the operator's), pulling it as tenant's if need be.
	Ensure(ctx context.Context, tenant, ref string) (api.Image, error)
	// Resolve prepares the host image or a stored image by the id a
	// sandbox's record pins (resolved for its tenant at create).
	Resolve(ctx context.Context, ref string, ids runtime.IDMap) (image.Resolved, error)
}

// TimeoutDefaults are the daemon's default timeouts; zero turns one off.
type TimeoutDefaults struct {
	Idle, DeleteAfter, ArchiveAfter, MaxLifetime time.Duration
}

// Manager owns the live sandboxes of one daemon.
type Manager struct {
	cfg    Config
	store  *store.Store
	tiers  map[string]*tier // available runtimes by name
	images Images
	log    *slog.Logger

	mu sync.Mutex
	// ten is the tenants' quotas and usage; admitMu makes each quota
	// admission one step.
	ten     tenancy
	admitMu sync.Mutex
	live    map[string]*liveSandbox // running sandboxes with a guest connection

	outputs budget    // output that plain execs hold until their end
	ranges  *idRanges // sandboxes' ranges of host ids
	net     *network.Service
	egress  *egressLog

	ops    keyedMutex // one lifecycle operation at a time per sandbox
	goc    keyedMutex // one get-or-create at a time per tenant and label set
	pool   pools      // warm sandboxes for hand-over
	events eventBus   // per-sandbox event subscribers

	ctx    context.Context // ends watchers at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// wake tells the sweeper that nextSweep changed (sweepAt).
	wake      chan struct{}
	sweepMu   sync.Mutex
	nextSweep time.Time
}

// liveSandbox is a running sandbox's connection and activity.
type liveSandbox struct {
	inst  *runtime.Instance
	tier  *tier
	guest *guestclient.Client
	spec  api.CreateSandboxRequest
	// features are what its guest said it can do (guestapi.Feature*).
	features []string
	// lastActive is the manager clock's UnixNano of the last activity.
	lastActive atomic.Int64
	// streams counts open exec and output streams.
	streams atomic.Int64
	// oom remembers OOM counts at background process starts.
	oom oomCounter
	// hits is the limit counts last seen by the sweeper (its goroutine only).
	hits runtime.LimitHits
	// net is the sandbox's network, when its policy gives it one (under mu).
	net *network.Sandbox
	// layers are the image's, as resolved when the sandbox booted.
	layers []string
	// token caches the sandbox's port access token once read.
	token atomic.Pointer[string]
	// stopExits stops the goroutine that follows its guest's exits stream
	// (a no-op when there is none); set by followExits before it is live.
	stopExits context.CancelFunc
	// starts is read-held by each StartProcess from its request to the
	// guest until it published the start, and held by the exits follower
	// while it publishes an exit.
	starts sync.RWMutex
}

// close stops what the daemon runs for a sandbox that is no longer live
// and drops its guest connections.
func (ls *liveSandbox) close() {
	ls.endExits()
	ls.guest.Close()
}

// endExits stops the exits follower, if there is one.
func (ls *liveSandbox) endExits() {
	if ls.stopExits != nil {
		ls.stopExits()
	}
}

// New returns a manager over the available runtimes, reading their
// capabilities once. Call Start to re-attach to sandboxes from the store.
func New(cfg Config, st *store.Store, runtimes map[string]runtime.Runtime, images Images, log *slog.Logger) (*Manager, error) {
	if _, ok := runtimes[cfg.DefaultRuntime]; !ok {
		return nil, fmt.Errorf("default runtime %q is not available", cfg.DefaultRuntime)
	}
	if cfg.DefaultImage == "" {
		cfg.DefaultImage = image.Host
	}
	if cfg.IDMap.Size == 0 {
		cfg.IDMap = runtime.DefaultIDMap
	}
	if cfg.IDMap.HostID == 0 || cfg.IDMap.Ranges() < 2 {
		return nil, fmt.Errorf("id map %d+%d: the base must be above 0 (sandboxes' root would be the host's) and leave room for ranges", cfg.IDMap.HostID, cfg.IDMap.Size)
	}
	if cfg.CreateTimeout == 0 {
		cfg.CreateTimeout = 30 * time.Second
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = time.Second
	}
	if cfg.UsageInterval == 0 {
		cfg.UsageInterval = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ExecOutputBudget == 0 {
		cfg.ExecOutputBudget = DefaultExecOutputBudget
	}
	if cfg.DefaultNetwork == "" {
		cfg.DefaultNetwork = api.NetworkNone
	}
	if _, err := network.Compile(api.Network{Mode: cfg.DefaultNetwork}); err != nil {
		return nil, fmt.Errorf("default network: %w", err)
	}
	if cfg.Network == nil && cfg.NetworkUnavailable == "" {
		cfg.NetworkUnavailable = "no network service"
	}
	tiers := map[string]*tier{}
	for name, rt := range runtimes {
		tiers[name] = &tier{name: name, rt: rt, caps: rt.Capabilities()}
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{cfg: cfg, store: st, tiers: tiers, images: images, log: log, live: map[string]*liveSandbox{}, wake: make(chan struct{}, 1),
		ctx: ctx, cancel: cancel, outputs: budget{size: cfg.ExecOutputBudget},
		ranges: newIDRanges(cfg.IDMap.Ranges()), net: cfg.Network,
		ten: tenancy{quotas: map[string]api.Quota{}, pending: map[string]holding{}, usage: map[string]api.TenantUsage{},
			seen: map[string]sample{}, snapshots: map[string]*sync.Mutex{}, since: cfg.Now()}}
	m.egress = newEgressLog(st, log, func(id string, rec api.EgressRecord) {
		m.emit(id, api.EgressDenied, func(ev *api.SandboxEvent) { ev.Egress = &rec })
	})
	return m, nil
}

// Start re-attaches to every sandbox the store says is running, settles
// operations a crash cut off, and starts the timeout sweeper. A running
// sandbox whose init is gone (the host restarted, or it died) comes back
// stopped, with its files, and the reason in its error field.
func (m *Manager) Start(ctx context.Context) error {
	all, err := m.store.ListSandboxes(ctx, "", labels.Selector{})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	for _, rec := range all {
		m.ranges.hold(rec.ID, rec.IDRange)
		if rec.AccessToken == "" && rec.State != statePooled {
			// A sandbox made before ports gets its token now, so that every
			// sandbox the API shows has one.
			token, err := newAccessToken()
			if err == nil {
				err = m.store.SetAccessToken(ctx, rec.ID, token)
			}
			if err != nil {
				m.log.Error("give a sandbox its access token", "sandbox", rec.ID, "err", err)
			}
		}
	}
	for _, rec := range all {
		switch rec.State {
		case api.StateRunning:
			if err := m.attach(ctx, rec); err != nil {
				m.log.Warn("sandbox's init is gone; marking it stopped", "sandbox", rec.ID, "err", err)
				m.settleStopped(ctx, rec, "its init was gone when the daemon started (host restart or crash): start it again")
			} else {
				m.log.Info("re-attached", "sandbox", rec.ID)
			}
		case api.StatePaused:
			// Its guest is frozen: the connection waits for resume. Only
			// whether its init lives is checked now. One paused with its
			// memory has nothing running: its checkpoint waits for resume.
			if m.checkpointed(rec) {
				m.log.Info("checkpointed sandbox waits for resume", "sandbox", rec.ID)
			} else if t, err := m.tier(rec.Runtime); err != nil {
				m.log.Warn("paused sandbox's runtime is unavailable", "sandbox", rec.ID, "err", err)
			} else if _, err := t.rt.Attach(ctx, rec.ID, rec.RuntimeState); err != nil {
				m.log.Warn("paused sandbox's init is gone; marking it stopped", "sandbox", rec.ID, "err", err)
				m.settleStopped(ctx, rec, "its init was gone when the daemon started (host restart or crash): start it again")
			}
		case api.StateStopping, api.StateStarting:
			m.settleStopped(ctx, rec, "a "+rec.State+" was cut off by a daemon restart")
		case api.StateCreating, api.StateDeleting, statePooled:
			// A create or delete was cut off by a daemon crash: finish it as a delete.
			m.log.Warn("cleaning up a sandbox left half-made", "sandbox", rec.ID, "state", rec.State)
			if t, err := m.tier(rec.Runtime); err == nil {
				if err := t.rt.Delete(ctx, rec.ID, rec.RuntimeState); err != nil {
					m.log.Error("clean-up failed", "sandbox", rec.ID, "err", err)
					continue
				}
			}
			m.forget(rec.ID)
		}
	}
	if err := m.loadTenancy(ctx); err != nil {
		return err
	}
	m.wg.Add(2)
	go m.sweeper()
	go m.meterLoop()
	m.prepareHostImage()
	m.startPool()
	m.startSpares()
	return nil
}

// prepareHostImage builds the host image in the background when it is the
// default image and a runtime takes it as one copy for every sandbox
// (idmapped layers), so that the first create of a new state directory does
// not wait for it: the copy of the host's /etc allowlist takes 26-75 ms on
// this project's VM's ext4, and up to 0.6 s there after a churn of creates
// and deletes (ext4 without a journal walks the inodes freed in the last
// 30 s for every new one). A create that comes meanwhile waits for the
// build (the image store makes one at a time) and finds the image made; a
// build that fails is logged, and the next create tries again and reports
// why. Where every range gets its own copy, which range comes first is not
// known yet.
func (m *Manager) prepareHostImage() {
	if m.cfg.DefaultImage != image.Host {
		return
	}
	for _, t := range m.tiers {
		if !t.caps.IDMappedLayers {
			continue
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if _, err := m.images.Resolve(m.ctx, image.Host, image.Unmapped); err != nil {
				m.log.Warn("prepare the host image", "err", err)
			}
		}()
		return // one copy serves every runtime that idmaps
	}
}

// startSpares has each runtime that can keep cfg.SpareGuests spares, each
// for a new sandbox id holding its id range from now on.
func (m *Manager) startSpares() {
	if m.cfg.SpareGuests <= 0 {
		return
	}
	reserve := func() (string, runtime.IDMap, error) {
		id, n, err := m.newIDRange()
		return id, m.cfg.IDMap.Range(n), err
	}
	for _, t := range m.tiers {
		if sp, ok := t.rt.(runtime.Spares); ok {
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				sp.KeepSpares(m.ctx, m.cfg.SpareGuests, reserve, m.ranges.release)
			}()
		}
	}
}

// settleStopped makes sure nothing of a sandbox runs and records it stopped.
func (m *Manager) settleStopped(ctx context.Context, rec store.Sandbox, reason string) {
	if t, err := m.tier(rec.Runtime); err == nil {
		if st, err := t.stopper(); err == nil {
			if err := st.Stop(ctx, rec.ID, rec.RuntimeState); err != nil {
				m.log.Error("stop failed", "sandbox", rec.ID, "err", err)
				m.setState(rec.ID, api.StateError, "stop failed: "+err.Error())
				return
			}
		}
	}
	m.setState(rec.ID, api.StateStopped, reason)
	m.emit(rec.ID, api.SandboxStopped, func(ev *api.SandboxEvent) { ev.Reason = reason })
}

// setState records a state on a path that has nothing better to do with a
// store error than to log it (a rollback, a settling after a crash).
func (m *Manager) setState(id, state, why string) {
	if err := m.store.UpdateState(context.Background(), id, state, why, m.cfg.Now()); err != nil {
		m.log.Error("record state", "sandbox", id, "state", state, "err", err)
	}
}

// forget deletes a sandbox's row, and frees its id range, on a path that
// can only log a failure.
func (m *Manager) forget(id string) {
	if err := m.store.DeleteSandbox(context.Background(), id); err != nil && !errdefs.IsNotFound(err) {
		m.log.Error("delete row", "sandbox", id, "err", err)
		return
	}
	m.ranges.release(id)
}

// undoCreate deletes what a runtime made for a create that failed later.
func (m *Manager) undoCreate(t *tier, id string, state json.RawMessage) {
	if err := t.rt.Delete(context.Background(), id, state); err != nil {
		m.log.Error("failed create: delete from runtime", "sandbox", id, "err", err)
	}
}

func (m *Manager) attach(ctx context.Context, rec store.Sandbox) error {
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return err
	}
	spec, err := recordSpec(rec)
	if err != nil {
		return err
	}
	inst, err := t.rt.Attach(ctx, rec.ID, rec.RuntimeState)
	if err != nil {
		return err
	}
	// Limits met before this daemon started were reported by the last one.
	var hits runtime.LimitHits
	if sp, ok := t.stats(); ok {
		if hits, err = sp.LimitHits(ctx, rec.ID); err != nil {
			m.log.Warn("read limit counts at attach", "sandbox", rec.ID, "err", err)
		}
	}
	return m.connect(ctx, rec.ID, rec.Tenant, inst, spec, nil, hits)
}

// connect authenticates the guest, starts the sandbox's network (on the
// link the runtime made, or on a new one for a sandbox re-attached after a
// restart) and registers the sandbox as live. hits is the baseline of
// limit counts (zero for a new cgroup); layers are the image's.
func (m *Manager) connect(ctx context.Context, id, tenant string, inst *runtime.Instance, spec api.CreateSandboxRequest, layers []string, hits runtime.LimitHits) error {
	gc := guestclient.New(id, inst.Token, inst.Dial)
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var (
		hello guestapi.HelloResponse
		err   error
	)
	if inst.Hello != nil { // the runtime had it at boot: no round trip
		hello, err = *inst.Hello, guestclient.CheckProtocol(id, *inst.Hello)
	} else {
		hello, err = gc.Hello(hctx)
	}
	if err != nil {
		gc.Close()
		if inst.Link != nil {
			inst.Link.File.Close()
		}
		return err
	}
	t := m.tiers[spec.Runtime]
	var nsb *network.Sandbox
	switch n := networkOf(spec); {
	case inst.Link != nil:
		var err error
		if nsb, err = m.attachNetwork(ctx, id, tenant, inst.Link, n); err != nil {
			gc.Close()
			return err
		}
	case n.Mode != api.NetworkNone:
		var err error
		if nsb, err = m.relink(ctx, t, id, tenant, n); err != nil {
			gc.Close()
			return err
		}
	}
	ls := &liveSandbox{inst: inst, tier: t, guest: gc, spec: spec, hits: hits, net: nsb, layers: layers, features: hello.Features}
	ls.lastActive.Store(m.cfg.Now().UnixNano())
	m.followExits(id, ls)
	m.mu.Lock()
	m.live[id] = ls
	m.mu.Unlock()
	m.wg.Add(1)
	go m.watch(id, inst)
	return nil
}

// watch records a sandbox as stopped when its init exits without a stop or
// delete asking for it (an OOM kill of init, a bug), and clears its cgroup.
func (m *Manager) watch(id string, inst *runtime.Instance) {
	defer m.wg.Done()
	select {
	case <-m.ctx.Done():
		return
	case <-inst.Exited:
	}
	unlock := m.ops.lock(id)
	defer unlock()
	m.mu.Lock()
	ls, ok := m.live[id]
	mine := ok && ls.inst == inst
	if mine {
		delete(m.live, id)
	}
	m.mu.Unlock()
	if !mine {
		return // stopped or deleted on purpose
	}
	ls.close()
	reason := "its init exited unexpectedly: start it again"
	if sp, ok := ls.tier.stats(); ok {
		if n, err := sp.OOMKills(context.Background(), id); err == nil && n > 0 && ls.spec.Limits.MemoryBytes > 0 {
			reason = fmt.Sprintf("it ran out of memory (its limit is %d bytes): start it again, with a higher limit", ls.spec.Limits.MemoryBytes)
		}
	}
	m.log.Warn("sandbox init exited", "sandbox", id, "why", reason)
	if rec, err := m.store.GetSandbox(context.Background(), id); err == nil {
		if rec.State == statePooled {
			m.discard(context.Background(), id)
			return
		}
		m.settleStopped(context.Background(), rec, reason)
	}
}

// Close stops the manager's watchers, deletes the warm pool, drops guest
// connections and ends the sandboxes' networks (a restarted daemon links
// them again). Sandboxes keep running.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
	m.drainPool(context.Background())
	m.mu.Lock()
	for _, ls := range m.live {
		ls.guest.Close()
		if ls.net != nil {
			ls.net.Close()
		}
	}
	m.mu.Unlock()
	m.egress.close()
}

// Create makes a sandbox and waits until its guest answers.
func (m *Manager) Create(ctx context.Context, tenant string, req api.CreateSandboxRequest) (api.Sandbox, error) {
	req, imageID, err := m.normalize(ctx, tenant, req)
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := m.normalizeRequestNetwork(ctx, tenant, &req); err != nil {
		return api.Sandbox{}, err
	}
	return m.create(ctx, tenant, req, imageID)
}

// create makes a sandbox of normalized request req, pinned to imageID:
// from the warm pool when it has one, else booted.
func (m *Manager) create(ctx context.Context, tenant string, req api.CreateSandboxRequest, imageID string) (api.Sandbox, error) {
	var (
		sb  api.Sandbox
		err error
	)
	release, err := m.admit(ctx, tenant, req, true)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer release()
	if id, ok := m.takePooled(req, imageID); ok {
		if sb, err = m.claim(ctx, tenant, id, req, imageID); err != nil {
			m.log.Warn("warm pool hand-over failed; booting a new sandbox", "sandbox", id, "err", err)
			m.discard(context.Background(), id)
		}
	}
	if sb.ID == "" {
		if sb, _, err = m.boot(ctx, tenant, api.StateRunning, req, imageID); err != nil {
			return api.Sandbox{}, err
		}
	}
	if err := m.runStartCmd(ctx, sb.ID, req); err != nil {
		// Nothing half-made: a sandbox whose start command cannot start goes.
		if derr := m.Delete(context.WithoutCancel(ctx), tenant, sb.ID); derr != nil {
			m.log.Error("delete after a failed start_cmd", "sandbox", sb.ID, "err", derr)
		}
		return api.Sandbox{}, err
	}
	return sb, nil
}

// runStartCmd starts a sandbox's start_cmd, if it has one, as a background
// process. A command that cannot run is a process that ended (127, 126),
// not an error: ps shows it; an error is a guest that did not take it.
func (m *Manager) runStartCmd(ctx context.Context, id string, spec api.CreateSandboxRequest) error {
	if spec.StartCmd == "" {
		return nil
	}
	m.mu.Lock()
	ls := m.live[id]
	m.mu.Unlock()
	if ls == nil {
		return errdefs.New(errdefs.Unavailable, "sandbox %s stopped before its start_cmd could run", id)
	}
	info, err := ls.guest.Start(ctx, processSpec(spec, api.ExecRequest{Shell: spec.StartCmd}))
	if err != nil {
		return fmt.Errorf("sandbox %s: start_cmd: %w", id, m.gone(id, err))
	}
	m.emit(id, api.ProcessStarted, func(e *api.SandboxEvent) { e.Pid = info.Pid })
	return nil
}

// boot makes a new sandbox from a normalized request: the resolved spec, its
// row (creating, or pooled for the warm pool), the runtime's sandbox and the
// guest connection, then the row in state running (a pooled row stays
// pooled). A failure at any step undoes the earlier ones. imageID pins the
// stored image req names ("" for the host image).
func (m *Manager) boot(ctx context.Context, tenant, state string, req api.CreateSandboxRequest, imageID string) (api.Sandbox, string, error) {
	t, err := m.tier(req.Runtime)
	if err != nil {
		return api.Sandbox{}, "", err
	}
	id, idRange, spare, err := m.newSandboxID(t, state)
	if err != nil {
		return api.Sandbox{}, "", err
	}
	// Until the runtime's Create has the spare, a failure ends it.
	unclaimed := spare
	defer func() {
		if unclaimed != nil {
			unclaimed.DiscardSpare(id)
		}
	}()
	specJSON, err := json.Marshal(req)
	if err != nil {
		m.ranges.release(id)
		return api.Sandbox{}, "", err
	}
	token, err := newAccessToken()
	if err != nil {
		m.ranges.release(id)
		return api.Sandbox{}, "", err
	}
	now := m.cfg.Now().UTC()
	rec := store.Sandbox{ID: id, Tenant: tenant, State: api.StateCreating, Image: req.Image, Runtime: req.Runtime,
		Spec: specJSON, Labels: req.Labels, CreatedAt: now, UpdatedAt: now, IDRange: idRange, AccessToken: token, ImageID: imageID}
	if state == statePooled {
		rec.State = statePooled // a crash before the end is cleaned up like a creating one
	}
	if err := m.store.CreateSandbox(ctx, rec); err != nil {
		m.ranges.release(id)
		return api.Sandbox{}, "", err
	}
	// From here a failure must remove the row (and the runtime rolls back its own half).
	fail := func(err error) (api.Sandbox, string, error) {
		m.forget(id)
		return api.Sandbox{}, "", err
	}
	// After the row: a networked sandbox's CA is stored with it.
	spec, err := m.resolve(ctx, id, idRange, req, imageRef(rec))
	if err != nil {
		return fail(err)
	}
	cctx, cancel := context.WithTimeout(ctx, m.cfg.CreateTimeout)
	defer cancel()
	unclaimed = nil // Create boots on it or ends it
	inst, err := t.rt.Create(cctx, spec)
	if err != nil {
		return fail(err)
	}
	if err := m.store.SetRuntimeState(ctx, id, inst.State); err != nil {
		m.undoCreate(t, id, inst.State)
		return fail(err)
	}
	if err := m.connect(cctx, id, tenant, inst, req, spec.Root.Layers, runtime.LimitHits{}); err != nil {
		m.undoCreate(t, id, inst.State)
		return fail(err)
	}
	if state == statePooled {
		return api.Sandbox{}, id, nil
	}
	if err := m.store.UpdateState(ctx, id, state, "", m.cfg.Now()); err != nil {
		m.drop(id)
		m.undoCreate(t, id, inst.State)
		return fail(err)
	}
	rec.State = state
	m.emit(id, api.SandboxCreated)
	return toAPI(rec, req), id, nil
}

// newSandboxID gives a new sandbox its id and id range: a spare's when
// tier t keeps spares and one is ready (spare is then t's runtime), else
// new ones. The warm pool, which boots ahead of time anyway, takes none.
func (m *Manager) newSandboxID(t *tier, state string) (id string, idRange uint32, spare runtime.Spares, err error) {
	if sp, ok := t.rt.(runtime.Spares); ok && state != statePooled {
		if id, ok := sp.TakeSpare(); ok {
			if n, ok := m.ranges.held(id); ok {
				return id, n, sp, nil
			}
			sp.DiscardSpare(id) // not expected: a spare's id holds its range until it ends
		}
	}
	id, idRange, err = m.newIDRange()
	return id, idRange, nil, err
}

// newIDRange makes a new sandbox id and takes an id range for it.
func (m *Manager) newIDRange() (string, uint32, error) {
	id, err := newID()
	if err != nil {
		return "", 0, err
	}
	n, err := m.ranges.take(id)
	if err != nil {
		return "", 0, err
	}
	return id, n, nil
}

// drop forgets a live sandbox's connection and ends its network.
func (m *Manager) drop(id string) {
	m.mu.Lock()
	ls, ok := m.live[id]
	delete(m.live, id)
	m.mu.Unlock()
	if ok {
		ls.close()
		if ls.net != nil {
			ls.net.Close()
		}
	}
}

// Get returns a sandbox of tenant ("" for any).
func (m *Manager) Get(ctx context.Context, tenant, id string) (api.Sandbox, error) {
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := recordToAPI(rec)
	sb.Checkpointed = rec.State == api.StatePaused && m.checkpointed(rec)
	return sb, err
}

func (m *Manager) record(ctx context.Context, tenant, id string) (store.Sandbox, error) {
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return rec, err
	}
	if err := visible(tenant, rec.Status()); err != nil {
		return store.Sandbox{}, err
	}
	return rec, nil
}

// visible is not_found for a sandbox that is another tenant's or still in
// the warm pool: to the caller, neither exists.
func visible(tenant string, st store.Status) error {
	if (tenant != "" && st.Tenant != tenant) || st.State == statePooled {
		return errdefs.New(errdefs.NotFound, "sandbox %q not found", st.ID)
	}
	return nil
}

// List returns the tenant's sandboxes that match sel.
func (m *Manager) List(ctx context.Context, tenant string, sel labels.Selector) ([]api.Sandbox, error) {
	recs, err := m.store.ListSandboxes(ctx, tenant, sel)
	if err != nil {
		return nil, err
	}
	out := make([]api.Sandbox, 0, len(recs))
	for _, rec := range recs {
		if rec.State == statePooled {
			continue
		}
		sb, err := recordToAPI(rec)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, nil
}

// Delete stops a sandbox and removes every trace of it.
func (m *Manager) Delete(ctx context.Context, tenant, id string) error {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return err
	}
	switch rec.State {
	case api.StateRunning, api.StatePaused, api.StateStopped, api.StateError:
	default:
		return errdefs.New(errdefs.Conflict, "sandbox %s is %s; delete it once that has finished", id, rec.State)
	}
	t, ok := m.tiers[rec.Runtime]
	if !ok {
		return errdefs.New(errdefs.Unavailable, "sandbox %s: runtime %q is not available in this daemon", id, rec.Runtime)
	}
	if rec.State == api.StateRunning {
		m.meterOne(ctx, rec) // its last sample, before its processes go
	}
	if err := m.store.UpdateState(ctx, id, api.StateDeleting, "", m.cfg.Now()); err != nil {
		return err
	}
	m.drop(id)
	if err := t.rt.Delete(ctx, id, rec.RuntimeState); err != nil {
		m.setState(id, api.StateError, "delete failed: "+err.Error())
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if err := m.store.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	m.ranges.release(id)
	m.egress.forget(id)
	if ai, ok := m.images.(ArchiveImages); ok {
		if err := ai.RemoveArchive(id); err != nil {
			m.log.Error("remove a deleted sandbox's archive", "sandbox", id, "err", err)
		}
	}
	m.releaseSnapshot(ctx, rec.ImageID)
	m.emit(id, api.SandboxDeleted)
	return nil
}

// guest returns the live connection of a running sandbox of tenant.
func (m *Manager) guest(ctx context.Context, tenant, id string) (*liveSandbox, error) {
	// The status alone (one prepared query) on this path of every exec and
	// file call; the whole record costs a transaction and a labels join.
	st, err := m.store.GetStatus(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := visible(tenant, st); err != nil {
		return nil, err
	}
	m.mu.Lock()
	ls, ok := m.live[id]
	m.mu.Unlock()
	if !ok || st.State != api.StateRunning {
		return nil, notRunning(st)
	}
	ls.lastActive.Store(m.cfg.Now().UnixNano())
	return ls, nil
}

// gone explains a guest call that failed because the guest went away: the
// sandbox was deleted (not_found) or stopped (conflict) while it ran, which
// a caller must not retry as it would an unavailable guest. Other errors
// pass as they are.
func (m *Manager) gone(id string, err error) error {
	if err == nil || !errdefs.IsUnavailable(err) {
		return err
	}
	st, serr := m.store.GetStatus(context.Background(), id)
	switch {
	case errdefs.IsNotFound(serr) || (serr == nil && st.State == api.StateDeleting):
		return errdefs.WithReason(errdefs.New(errdefs.NotFound, "sandbox %s was deleted while the call ran", id), errdefs.SandboxGone)
	case serr == nil && st.State != api.StateRunning:
		return errdefs.New(errdefs.Conflict, "sandbox %s was %s while the call ran", id, st.State)
	}
	return err
}

// notRunning is the conflict error for a call that needs a running sandbox:
// it says the state and what to do.
func notRunning(rec store.Status) error {
	why := ""
	if rec.Error != "" {
		why = " (" + rec.Error + ")"
	}
	switch rec.State {
	case api.StateStopped:
		return errdefs.WithReason(errdefs.New(errdefs.Conflict, "sandbox %s is stopped%s: start it first (POST /v1/sandboxes/%s/start, berth start %s)", rec.ID, why, rec.ID, rec.ID), errdefs.SandboxStopped)
	case api.StatePaused:
		return errdefs.WithReason(errdefs.New(errdefs.Conflict, "sandbox %s is paused: resume it first (POST /v1/sandboxes/%s/resume, berth resume %s)", rec.ID, rec.ID, rec.ID), errdefs.SandboxPaused)
	default:
		return errdefs.New(errdefs.Conflict, "sandbox %s is %s%s, not running", rec.ID, rec.State, why)
	}
}

func toAPI(rec store.Sandbox, spec api.CreateSandboxRequest) api.Sandbox {
	sb := api.Sandbox{
		ID: rec.ID, State: rec.State, Image: rec.Image, ImageID: rec.ImageID, Runtime: rec.Runtime, Env: spec.Env,
		Workdir: spec.Workdir, User: spec.User, Labels: rec.Labels, Limits: spec.Limits,
		Timeouts: spec.Timeouts, Network: networkOf(spec), CreatedAt: rec.CreatedAt, Error: rec.Error,
		PublicPorts: spec.PublicPorts, Public: spec.Public, AccessToken: rec.AccessToken, StartCmd: spec.StartCmd,
		Archived: rec.ArchiveBytes > 0,
	}
	if !rec.StoppedAt.IsZero() {
		t := rec.StoppedAt
		sb.StoppedAt = &t
	}
	return sb
}

func recordToAPI(rec store.Sandbox) (api.Sandbox, error) {
	spec, err := recordSpec(rec)
	if err != nil {
		return api.Sandbox{}, err
	}
	return toAPI(rec, spec), nil
}

// newID returns "sb-" and 12 random lowercase base32 characters: a valid
// hostname, short enough to type, 60 bits of randomness.
func newID() (string, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	for i := range b {
		b[i] = alphabet[b[i]&31]
	}
	return "sb-" + string(b), nil
}
