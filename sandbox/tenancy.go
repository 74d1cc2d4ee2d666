package sandbox

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/store"
)

// tenancy is what the manager keeps per tenant: quotas, the holds of
// creates under way (so that two creates at once cannot both pass a
// bound), and the usage counters the meter adds to.
type tenancy struct {
	mu      sync.Mutex
	quotas  map[string]api.Quota
	pending map[string]holding
	usage   map[string]api.TenantUsage
	dirty   bool
	// seen is each running sandbox's last sample.
	seen map[string]sample
	// snapshots serializes the snapshots of each tenant with a snapshot
	// quota (admitSnapshot).
	snapshots map[string]*sync.Mutex
	since     time.Time // when the meter began: sandboxes started after it count from their start
}

// holding is what sandboxes hold of a quota.
type holding struct {
	sandboxes   int
	cpus        float64
	memory      int64
	disk        int64
	snapshotsSz int64
}

type sample struct {
	tenant string
	at     time.Time
	cpu    float64
}

// loadTenancy reads the quotas and usage counters from the store.
func (m *Manager) loadTenancy(ctx context.Context) error {
	q, err := m.store.Quotas(ctx)
	if err != nil {
		return err
	}
	u, err := m.store.LoadUsage(ctx)
	if err != nil {
		return err
	}
	m.ten.mu.Lock()
	defer m.ten.mu.Unlock()
	m.ten.quotas, m.ten.usage = q, u
	m.ten.pending, m.ten.seen, m.ten.snapshots = map[string]holding{}, map[string]sample{}, map[string]*sync.Mutex{}
	m.ten.since = m.cfg.Now()
	return nil
}

// SetQuota sets a tenant's quota (an all-zero one removes it) and returns
// the tenant's usage. Sandboxes that run stay: a quota below the current
// use refuses only what would add to it.
func (m *Manager) SetQuota(ctx context.Context, tenant string, q api.Quota) (api.TenantUsage, error) {
	if err := auth.CheckTenant("tenant", tenant); err != nil {
		return api.TenantUsage{}, err
	}
	switch {
	case q.Sandboxes < 0:
		return api.TenantUsage{}, errdefs.New(errdefs.InvalidArgument, "sandboxes: %d is negative", q.Sandboxes)
	case q.CPUs < 0:
		return api.TenantUsage{}, errdefs.New(errdefs.InvalidArgument, "cpus: %g is negative", q.CPUs)
	case q.MemoryBytes < 0:
		return api.TenantUsage{}, errdefs.New(errdefs.InvalidArgument, "memory_bytes: %d is negative", q.MemoryBytes)
	case q.DiskBytes < 0:
		return api.TenantUsage{}, errdefs.New(errdefs.InvalidArgument, "disk_bytes: %d is negative", q.DiskBytes)
	case q.SnapshotBytes < 0:
		return api.TenantUsage{}, errdefs.New(errdefs.InvalidArgument, "snapshot_bytes: %d is negative", q.SnapshotBytes)
	}
	if err := m.store.SetQuota(ctx, tenant, q); err != nil {
		return api.TenantUsage{}, err
	}
	m.ten.mu.Lock()
	if q == (api.Quota{}) {
		delete(m.ten.quotas, tenant)
	} else {
		m.ten.quotas[tenant] = q
	}
	m.ten.mu.Unlock()
	list, err := m.Usage(ctx, tenant, false)
	if err != nil {
		return api.TenantUsage{}, err
	}
	return list[0], nil
}

// held is what a tenant's sandboxes hold now, as the quota counts it:
// running and paused ones count toward sandboxes, CPUs and memory; every
// sandbox counts its disk. Creates and starts under way are not counted
// here: their admission holds their share (pending) until they end.
func (m *Manager) held(ctx context.Context, tenant string) (holding, error) {
	recs, err := m.store.ListSandboxes(ctx, tenant, labels.Selector{})
	if err != nil {
		return holding{}, err
	}
	var h holding
	for _, rec := range recs {
		if rec.Tenant != tenant || rec.State == statePooled || rec.State == api.StateDeleting {
			continue
		}
		spec, err := recordSpec(rec)
		if err != nil {
			continue
		}
		if rec.State != api.StateCreating {
			h.disk += spec.Limits.DiskBytes
		}
		switch rec.State {
		case api.StateRunning, api.StatePaused:
			h.sandboxes++
			h.cpus += spec.Limits.CPUs
			h.memory += spec.Limits.MemoryBytes
		}
	}
	if h.snapshotsSz, err = m.store.SnapshotBytes(ctx, tenant); err != nil {
		return holding{}, err
	}
	return h, nil
}

// quotaOf is tenant's quota; ok is false for the operator (tenant "") and
// for a tenant without one.
func (m *Manager) quotaOf(tenant string) (q api.Quota, ok bool) {
	if tenant == "" {
		return api.Quota{}, false
	}
	m.ten.mu.Lock()
	defer m.ten.mu.Unlock()
	q, ok = m.ten.quotas[tenant]
	return q, ok
}

// inUse is what tenant's sandboxes hold with the admissions under way
// added; the caller holds admitMu.
func (m *Manager) inUse(ctx context.Context, tenant string) (holding, error) {
	h, err := m.held(ctx, tenant)
	if err != nil {
		return holding{}, err
	}
	m.ten.mu.Lock()
	p := m.ten.pending[tenant]
	m.ten.mu.Unlock()
	sum := plus(h, p, 1)
	sum.snapshotsSz = h.snapshotsSz
	return sum, nil
}

// admit checks that a sandbox of spec can start running for tenant
// (withDisk: it is new, so its disk counts too) and holds its share until
// release, which the caller runs once the sandbox is in the store or
// failed. The operator's sandboxes (tenant "") have no quota.
func (m *Manager) admit(ctx context.Context, tenant string, spec api.CreateSandboxRequest, withDisk bool) (release func(), err error) {
	q, ok := m.quotaOf(tenant)
	if !ok {
		return func() {}, nil
	}
	add := holding{sandboxes: 1, cpus: spec.Limits.CPUs, memory: spec.Limits.MemoryBytes}
	if withDisk {
		add.disk = spec.Limits.DiskBytes
	}
	switch {
	case q.CPUs > 0 && spec.Limits.CPUs <= 0:
		return nil, errdefs.New(errdefs.InvalidArgument, "limits.cpus: tenant %q has a quota of %g CPUs: give the sandbox a CPU limit", tenant, q.CPUs)
	case q.MemoryBytes > 0 && spec.Limits.MemoryBytes <= 0:
		return nil, errdefs.New(errdefs.InvalidArgument, "limits.memory_bytes: tenant %q has a memory quota of %s: give the sandbox a memory limit", tenant, bytesText(q.MemoryBytes))
	case withDisk && q.DiskBytes > 0 && spec.Limits.DiskBytes <= 0:
		return nil, errdefs.New(errdefs.InvalidArgument, "limits.disk_bytes: tenant %q has a disk quota of %s: give the sandbox a disk limit", tenant, bytesText(q.DiskBytes))
	}
	// One admission at a time per manager: the store read and the hold
	// are one step, so two creates cannot both take the last share.
	m.admitMu.Lock()
	defer m.admitMu.Unlock()
	h, err := m.inUse(ctx, tenant)
	if err != nil {
		return nil, err
	}
	exhausted := func(what, quota, use string) error {
		return errdefs.New(errdefs.ResourceExhausted, "quota of tenant %q: %s is %s, and %s are in use", tenant, what, quota, use)
	}
	switch {
	case q.Sandboxes > 0 && h.sandboxes+add.sandboxes > q.Sandboxes:
		return nil, exhausted("sandboxes", fmt.Sprint(q.Sandboxes), fmt.Sprintf("%d running", h.sandboxes))
	case q.CPUs > 0 && h.cpus+add.cpus > q.CPUs+1e-9:
		return nil, exhausted("cpus", fmt.Sprintf("%g", q.CPUs), fmt.Sprintf("%g (this sandbox asks %g)", h.cpus, add.cpus))
	case q.MemoryBytes > 0 && h.memory+add.memory > q.MemoryBytes:
		return nil, exhausted("memory_bytes", bytesText(q.MemoryBytes), fmt.Sprintf("%s (this sandbox asks %s)", bytesText(h.memory), bytesText(add.memory)))
	case q.DiskBytes > 0 && h.disk+add.disk > q.DiskBytes:
		return nil, exhausted("disk_bytes", bytesText(q.DiskBytes), fmt.Sprintf("%s (this sandbox asks %s)", bytesText(h.disk), bytesText(add.disk)))
	}
	m.ten.mu.Lock()
	m.ten.pending[tenant] = plus(m.ten.pending[tenant], add, 1)
	m.ten.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.ten.mu.Lock()
			m.ten.pending[tenant] = plus(m.ten.pending[tenant], add, -1)
			m.ten.mu.Unlock()
		})
	}, nil
}

// admitLimits checks that a running sandbox's new limits keep its tenant
// within its quota (its old ones count as held) and returns with the
// admission lock held, for the caller to release once they are stored.
func (m *Manager) admitLimits(ctx context.Context, rec store.Sandbox, to api.Limits) (release func(), err error) {
	q, ok := m.quotaOf(rec.Tenant)
	if !ok {
		return func() {}, nil
	}
	from, err := recordSpec(rec)
	if err != nil {
		return nil, err
	}
	m.admitMu.Lock()
	unlock := sync.OnceFunc(m.admitMu.Unlock)
	h, err := m.inUse(ctx, rec.Tenant)
	if err != nil {
		unlock()
		return nil, err
	}
	cpus := h.cpus - from.Limits.CPUs + to.CPUs
	memory := h.memory - from.Limits.MemoryBytes + to.MemoryBytes
	disk := h.disk - from.Limits.DiskBytes + to.DiskBytes
	var why error
	switch {
	case q.CPUs > 0 && to.CPUs > from.Limits.CPUs && cpus > q.CPUs+1e-9:
		why = errdefs.New(errdefs.ResourceExhausted, "quota of tenant %q: cpus is %g, and %g would be in use with these limits", rec.Tenant, q.CPUs, cpus)
	case q.MemoryBytes > 0 && to.MemoryBytes > from.Limits.MemoryBytes && memory > q.MemoryBytes:
		why = errdefs.New(errdefs.ResourceExhausted, "quota of tenant %q: memory_bytes is %s, and %s would be in use with these limits", rec.Tenant, bytesText(q.MemoryBytes), bytesText(memory))
	case q.DiskBytes > 0 && to.DiskBytes > from.Limits.DiskBytes && disk > q.DiskBytes:
		why = errdefs.New(errdefs.ResourceExhausted, "quota of tenant %q: disk_bytes is %s, and %s would be in use with these limits", rec.Tenant, bytesText(q.DiskBytes), bytesText(disk))
	}
	if why != nil {
		unlock()
		return nil, why
	}
	return unlock, nil
}

func plus(a, b holding, sign int) holding {
	return holding{sandboxes: a.sandboxes + sign*b.sandboxes, cpus: a.cpus + float64(sign)*b.cpus,
		memory: a.memory + int64(sign)*b.memory, disk: a.disk + int64(sign)*b.disk}
}

// admitSnapshot refuses a snapshot once the tenant's snapshots reach its
// quota (the new one may pass it by its own size: its size is known only
// once it is made). While a tenant has a snapshot quota its snapshots are
// made one at a time: release, once the snapshot is stored, lets the next
// one count it.
func (m *Manager) admitSnapshot(ctx context.Context, tenant string) (release func(), err error) {
	q, ok := m.quotaOf(tenant)
	if !ok || q.SnapshotBytes == 0 {
		return func() {}, nil
	}
	m.ten.mu.Lock()
	mu := m.ten.snapshots[tenant]
	if mu == nil {
		mu = &sync.Mutex{}
		m.ten.snapshots[tenant] = mu
	}
	m.ten.mu.Unlock()
	mu.Lock()
	n, err := m.store.SnapshotBytes(ctx, tenant)
	if err != nil {
		mu.Unlock()
		return nil, err
	}
	if n >= q.SnapshotBytes {
		mu.Unlock()
		return nil, errdefs.New(errdefs.ResourceExhausted, "quota of tenant %q: snapshot_bytes is %s, and %s are stored: delete snapshots first",
			tenant, bytesText(q.SnapshotBytes), bytesText(n))
	}
	return sync.OnceFunc(mu.Unlock), nil
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Usage returns each tenant's usage (only tenant's unless all; all is
// every tenant with a quota, counters or a sandbox).
func (m *Manager) Usage(ctx context.Context, tenant string, all bool) ([]api.TenantUsage, error) {
	names := []string{tenant}
	if all {
		set := map[string]bool{}
		recs, err := m.store.ListSandboxes(ctx, "", labels.Selector{})
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			if rec.State != statePooled {
				set[rec.Tenant] = true
			}
		}
		m.ten.mu.Lock()
		for t := range m.ten.quotas {
			set[t] = true
		}
		for t := range m.ten.usage {
			set[t] = true
		}
		m.ten.mu.Unlock()
		names = slices.Sorted(maps.Keys(set))
	}
	out := make([]api.TenantUsage, 0, len(names))
	for _, t := range names {
		h, err := m.held(ctx, t)
		if err != nil {
			return nil, err
		}
		m.ten.mu.Lock()
		u := m.ten.usage[t]
		u.Quota = m.ten.quotas[t]
		m.ten.mu.Unlock()
		u.Tenant, u.Sandboxes, u.CPUs, u.MemoryBytes, u.DiskBytes, u.SnapshotBytes = t, h.sandboxes, h.cpus, h.memory, h.disk, h.snapshotsSz
		out = append(out, u)
	}
	return out, nil
}

// meter samples every running sandbox: sandbox-seconds, CPU-seconds and
// memory GB-seconds since its last sample go to its tenant's counters,
// which are then saved. A sandbox first seen counts from its start when it
// started after the meter began; from its first sample otherwise (what ran
// before a daemon restart is not known).
func (m *Manager) meter(ctx context.Context) {
	recs, err := m.store.ListSandboxes(ctx, "", labels.Selector{})
	if err != nil {
		m.log.Warn("meter: list sandboxes", "err", err)
		return
	}
	running := map[string]bool{}
	for _, rec := range recs {
		if rec.State == api.StateRunning {
			running[rec.ID] = true
			m.meterOne(ctx, rec)
		}
	}
	m.ten.mu.Lock()
	for id := range m.ten.seen {
		if !running[id] {
			delete(m.ten.seen, id)
		}
	}
	var save map[string]api.TenantUsage
	if m.ten.dirty {
		save = maps.Clone(m.ten.usage)
		m.ten.dirty = false
	}
	m.ten.mu.Unlock()
	if err := m.store.SaveUsage(ctx, save); err != nil {
		m.log.Warn("meter: save usage", "err", err)
	}
}

// meterOne samples one running sandbox (the meter's pass, and a stop's
// last look before its processes go).
func (m *Manager) meterOne(ctx context.Context, rec store.Sandbox) {
	t, ok := m.tiers[rec.Runtime]
	if !ok {
		return
	}
	sp, ok := t.stats()
	if !ok {
		return
	}
	u, err := sp.Stats(ctx, rec.ID)
	if err != nil {
		return
	}
	now := m.cfg.Now()
	m.ten.mu.Lock()
	defer m.ten.mu.Unlock()
	prev, ok := m.ten.seen[rec.ID]
	if !ok {
		if rec.UpdatedAt.After(m.ten.since) && !rec.UpdatedAt.After(now) {
			prev = sample{tenant: rec.Tenant, at: rec.UpdatedAt}
		} else {
			m.ten.seen[rec.ID] = sample{tenant: rec.Tenant, at: now, cpu: u.CPUSeconds}
			return
		}
	}
	dt := now.Sub(prev.at).Seconds()
	if dt <= 0 {
		return
	}
	c := m.ten.usage[rec.Tenant]
	c.Tenant = rec.Tenant
	c.SandboxSeconds += dt
	c.CPUSeconds += max(0, u.CPUSeconds-prev.cpu)
	c.MemoryGBSeconds += float64(u.MemoryBytes) / 1e9 * dt
	m.ten.usage[rec.Tenant] = c
	m.ten.seen[rec.ID] = sample{tenant: rec.Tenant, at: now, cpu: u.CPUSeconds}
	m.ten.dirty = true
}

// meterEgress adds one egress record's bytes to its sandbox's tenant.
func (m *Manager) meterEgress(id string, rec api.EgressRecord) {
	if rec.BytesIn == 0 && rec.BytesOut == 0 {
		return
	}
	st, err := m.store.GetStatus(m.ctx, id)
	if err != nil {
		return
	}
	m.ten.mu.Lock()
	c := m.ten.usage[st.Tenant]
	c.Tenant = st.Tenant
	c.EgressBytesOut += rec.BytesOut
	c.EgressBytesIn += rec.BytesIn
	m.ten.usage[st.Tenant] = c
	m.ten.dirty = true
	m.ten.mu.Unlock()
}

// meterLoop runs the meter every UsageInterval until the manager closes,
// and once more then, so that a graceful stop loses nothing.
func (m *Manager) meterLoop() {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.UsageInterval)
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			m.meter(ctx)
			cancel()
			return
		case <-tick.C:
			m.meter(m.ctx)
		}
	}
}
