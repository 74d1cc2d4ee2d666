package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/runtime"
)

// specOf reads a live sandbox's spec (limits can change while it runs).
func (m *Manager) specOf(ls *liveSandbox) api.CreateSandboxRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return ls.spec
}

// Stats returns what a running sandbox uses now.
func (m *Manager) Stats(ctx context.Context, tenant, id string) (api.Usage, error) {
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return api.Usage{}, err
	}
	if rec.State != api.StateRunning {
		return api.Usage{}, notRunning(rec.Status())
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return api.Usage{}, err
	}
	sp, ok := t.stats()
	if !ok {
		return api.Usage{}, errdefs.New(errdefs.NotImplemented, "runtime %q does not report usage", rec.Runtime)
	}
	u, err := sp.Stats(ctx, id)
	if err != nil {
		return api.Usage{}, err
	}
	out := usageToAPI(u)
	m.mu.Lock()
	if ls := m.live[id]; ls != nil && ls.net != nil {
		sum := ls.net.Summary()
		out.Egress = &sum
	}
	m.mu.Unlock()
	return out, nil
}

// oomCounter explains SIGKILLed processes: the kernel's OOM killer sends
// SIGKILL, and the sandbox's cgroup counts its kills, so a process that died
// of SIGKILL while that count went up was OOM-killed. (Two processes killed
// in the same window are both reported; the kernel does not say which pid.)
type oomCounter struct {
	mu     sync.Mutex
	before map[int]int64 // background pid -> count when it started
	seen   map[int]bool  // background pids whose exit was published
}

// oomKills reads a live sandbox's OOM-kill count from its runtime (no store
// access: it runs twice around every exec that ends by SIGKILL and once
// before every exec).
func (m *Manager) oomKills(ctx context.Context, ls *liveSandbox, id string) (int64, bool) {
	sp, ok := ls.tier.stats()
	if !ok {
		return 0, false
	}
	n, err := sp.OOMKills(ctx, id)
	return n, err == nil
}

// explain sets r.OOMKilled when r ended by SIGKILL, or exited 137 as a
// shell does whose command was SIGKILLed (sh -c 'python3 …'), and the OOM
// count rose above before. An exit 137 without an OOM kill stays as it is.
func (m *Manager) explain(ctx context.Context, ls *liveSandbox, id string, before int64, known bool, r *api.ExecResult) {
	if !known || r == nil || (r.Signal != 9 && (r.Signal != 0 || r.ExitCode != 137)) {
		return
	}
	if after, ok := m.oomKills(ctx, ls, id); ok && after > before {
		r.OOMKilled = true
	}
}

// rememberStart records the OOM count when a background process starts
// (known: the count could be read), and that its exit is unseen.
func (ls *liveSandbox) rememberStart(pid int, count int64, known bool) {
	ls.oom.mu.Lock()
	defer ls.oom.mu.Unlock()
	if !known {
		delete(ls.oom.before, pid)
		delete(ls.oom.seen, pid) // a reused pid is a new process
		return
	}
	if ls.oom.before == nil {
		ls.oom.before = map[int]int64{}
	}
	if len(ls.oom.before) > 4096 { // bounded: the guest keeps at most 1024 finished
		ls.oom.before = map[int]int64{}
	}
	ls.oom.before[pid] = count
	delete(ls.oom.seen, pid) // a reused pid is a new process
}

// firstSight reports whether this is the first time the daemon sees pid's
// exit (so its event is published once).
func (ls *liveSandbox) firstSight(pid int) bool {
	ls.oom.mu.Lock()
	defer ls.oom.mu.Unlock()
	if ls.oom.seen == nil || len(ls.oom.seen) > 4096 {
		ls.oom.seen = map[int]bool{}
	}
	if ls.oom.seen[pid] {
		return false
	}
	ls.oom.seen[pid] = true
	return true
}

func (ls *liveSandbox) startCount(pid int) (int64, bool) {
	ls.oom.mu.Lock()
	defer ls.oom.mu.Unlock()
	n, ok := ls.oom.before[pid]
	return n, ok
}

// Collector returns the manager's Prometheus collector: sandboxes by state,
// and each running sandbox's CPU, memory, pids and OOM kills, read when
// scraped (disk is left to the stats call: it walks the writable layer).
func (m *Manager) Collector() prometheus.Collector { return collector{m} }

// usageMetric is one per-sandbox usage metric.
type usageMetric struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	val  func(runtime.Usage) float64
}

// metricDescs are made on first use, not at start-up (every berth process,
// sandboxes' guests included, links this package).
var metricDescs = sync.OnceValues(func() (*prometheus.Desc, []usageMetric) {
	desc := func(name, help string, label string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{label}, nil)
	}
	return desc("berth_sandboxes", "Sandboxes by state (pooled: the warm pool).", "state"), []usageMetric{
		{desc("berth_sandbox_cpu_seconds_total", "CPU time used by the sandbox's processes.", "sandbox"),
			prometheus.CounterValue, func(u runtime.Usage) float64 { return u.CPUSeconds }},
		{desc("berth_sandbox_memory_bytes", "Memory in use.", "sandbox"),
			prometheus.GaugeValue, func(u runtime.Usage) float64 { return float64(u.MemoryBytes) }},
		{desc("berth_sandbox_memory_peak_bytes", "Most memory in use so far.", "sandbox"),
			prometheus.GaugeValue, func(u runtime.Usage) float64 { return float64(u.MemoryPeakBytes) }},
		{desc("berth_sandbox_pids", "Tasks (processes and threads).", "sandbox"),
			prometheus.GaugeValue, func(u runtime.Usage) float64 { return float64(u.Pids) }},
		{desc("berth_sandbox_oom_kills_total", "Processes killed at the memory limit.", "sandbox"),
			prometheus.CounterValue, func(u runtime.Usage) float64 { return float64(u.OOMKills) }},
	}
})

// sparesDesc is the spare guests ready, by runtime.
var sparesDesc = sync.OnceValue(func() *prometheus.Desc {
	return prometheus.NewDesc("berth_spare_guests", "Guests started ahead of their sandboxes, ready for a create (serve --spare-guests).", []string{"runtime"}, nil)
})

// tenantDescs are the tenants' usage counters, what a team bills on.
var tenantDescs = sync.OnceValue(func() []tenantMetric {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append([]string{"tenant"}, labels...), nil)
	}
	return []tenantMetric{
		{desc("berth_tenant_sandbox_seconds_total", "Seconds the tenant's sandboxes ran, summed."), nil,
			func(u api.TenantUsage) float64 { return u.SandboxSeconds }},
		{desc("berth_tenant_cpu_seconds_total", "CPU time of the tenant's sandboxes."), nil,
			func(u api.TenantUsage) float64 { return u.CPUSeconds }},
		{desc("berth_tenant_memory_gb_seconds_total", "Memory in use by the tenant's sandboxes, in GB (10^9 bytes) times seconds."), nil,
			func(u api.TenantUsage) float64 { return u.MemoryGBSeconds }},
		{desc("berth_tenant_egress_bytes_total", "Bytes of the tenant's sandboxes' egress, by direction.", "direction"), []string{"out"},
			func(u api.TenantUsage) float64 { return float64(u.EgressBytesOut) }},
		{desc("berth_tenant_egress_bytes_total", "Bytes of the tenant's sandboxes' egress, by direction.", "direction"), []string{"in"},
			func(u api.TenantUsage) float64 { return float64(u.EgressBytesIn) }},
	}
})

type tenantMetric struct {
	desc   *prometheus.Desc
	labels []string
	val    func(api.TenantUsage) float64
}

type collector struct{ m *Manager }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	sandboxes, usage := metricDescs()
	ch <- sandboxes
	ch <- sparesDesc()
	for _, u := range usage {
		ch <- u.desc
	}
	for i, t := range tenantDescs() {
		if i < 4 { // the egress pair shares one desc
			ch <- t.desc
		}
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	descSandboxes, usageMetrics := metricDescs()
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	all, err := m.store.ListSandboxes(ctx, "", labels.Selector{})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descSandboxes, err)
		return
	}
	states := map[string]int{}
	for _, st := range []string{api.StateCreating, api.StateRunning, api.StateStopping, api.StateStopped,
		api.StateStarting, api.StateDeleting, api.StateError, statePooled} {
		states[st] = 0
	}
	for _, rec := range all {
		states[rec.State]++
		if rec.State != api.StateRunning {
			continue
		}
		t, ok := m.tiers[rec.Runtime]
		if !ok {
			continue
		}
		sp, ok := t.stats()
		if !ok {
			continue
		}
		u, err := sp.Stats(ctx, rec.ID)
		if err != nil {
			continue // stopped or deleted since the listing
		}
		for _, um := range usageMetrics {
			ch <- prometheus.MustNewConstMetric(um.desc, um.typ, um.val(u), rec.ID)
		}
	}
	for st, n := range states {
		ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(n), st)
	}
	for name, t := range m.tiers {
		if sp, ok := t.rt.(runtime.Spares); ok {
			ch <- prometheus.MustNewConstMetric(sparesDesc(), prometheus.GaugeValue, float64(sp.ReadySpares()), name)
		}
	}
	m.ten.mu.Lock()
	usage := make([]api.TenantUsage, 0, len(m.ten.usage))
	for _, u := range m.ten.usage {
		usage = append(usage, u)
	}
	m.ten.mu.Unlock()
	for _, u := range usage {
		tenant := u.Tenant
		if tenant == "" {
			tenant = "-" // the operator's own
		}
		for _, t := range tenantDescs() {
			ch <- prometheus.MustNewConstMetric(t.desc, prometheus.CounterValue, t.val(u), append([]string{tenant}, t.labels...)...)
		}
	}
}
