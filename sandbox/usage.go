package sandbox

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"

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
	return api.Usage(u), nil
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

// explain sets r.OOMKilled when r ended by SIGKILL and the OOM count rose
// above before.
func (m *Manager) explain(ctx context.Context, ls *liveSandbox, id string, before int64, known bool, r *api.ExecResult) {
	if !known || r == nil || r.Signal != 9 {
		return
	}
	if after, ok := m.oomKills(ctx, ls, id); ok && after > before {
		r.OOMKilled = true
	}
}

// rememberStart records the OOM count when a background process starts.
func (ls *liveSandbox) rememberStart(pid int, count int64) {
	ls.oom.mu.Lock()
	defer ls.oom.mu.Unlock()
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

// WriteMetrics writes the daemon's metrics in the Prometheus text format:
// sandboxes by state, and each running sandbox's CPU, memory, pids and OOM
// kills (disk is left to the stats call: it walks the writable layer).
func (m *Manager) WriteMetrics(ctx context.Context, w io.Writer) error {
	all, err := m.store.ListSandboxes(ctx, "", labels.Selector{})
	if err != nil {
		return err
	}
	states := map[string]int{}
	for _, st := range []string{api.StateCreating, api.StateRunning, api.StateStopping, api.StateStopped,
		api.StateStarting, api.StateDeleting, api.StateError, statePooled} {
		states[st] = 0
	}
	type row struct {
		id string
		u  runtime.Usage
	}
	var rows []row
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
		if u, err := sp.Stats(ctx, rec.ID); err == nil {
			rows = append(rows, row{rec.ID, u})
		}
	}
	var names []string
	for st := range states {
		names = append(names, st)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "# HELP berth_sandboxes Sandboxes by state (pooled: the warm pool).")
	fmt.Fprintln(w, "# TYPE berth_sandboxes gauge")
	for _, st := range names {
		fmt.Fprintf(w, "berth_sandboxes{state=%q} %d\n", st, states[st])
	}
	for _, g := range []struct {
		name, typ, help string
		val             func(runtime.Usage) string
	}{
		{"berth_sandbox_cpu_seconds_total", "counter", "CPU time used by the sandbox's processes.", func(u runtime.Usage) string { return fmt.Sprintf("%g", u.CPUSeconds) }},
		{"berth_sandbox_memory_bytes", "gauge", "Memory in use.", func(u runtime.Usage) string { return fmt.Sprint(u.MemoryBytes) }},
		{"berth_sandbox_memory_peak_bytes", "gauge", "Most memory in use so far.", func(u runtime.Usage) string { return fmt.Sprint(u.MemoryPeakBytes) }},
		{"berth_sandbox_pids", "gauge", "Tasks (processes and threads).", func(u runtime.Usage) string { return fmt.Sprint(u.Pids) }},
		{"berth_sandbox_oom_kills_total", "counter", "Processes killed at the memory limit.", func(u runtime.Usage) string { return fmt.Sprint(u.OOMKills) }},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", g.name, g.help, g.name, g.typ)
		for _, r := range rows {
			fmt.Fprintf(w, "%s{sandbox=%q} %s\n", g.name, r.id, g.val(r.u))
		}
	}
	return nil
}
