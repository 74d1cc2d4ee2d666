package sandbox

import (
	"maps"
	"slices"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
)

// tier is an available runtime with the capabilities it declared when the
// manager started: what the manager asks of it is checked against them.
type tier struct {
	name string
	rt   runtime.Runtime
	caps runtime.Capabilities
}

// lacks is the not_implemented error for a capability the runtime does not
// have: what cannot be done, and the runtime's reason when it gave one.
func (t *tier) lacks(capability, what string) error {
	if why := t.caps.Missing[capability]; why != "" {
		return errdefs.New(errdefs.NotImplemented, "runtime %q cannot %s: %s", t.name, what, why)
	}
	return errdefs.New(errdefs.NotImplemented, "runtime %q cannot %s", t.name, what)
}

// stopper returns the runtime's Stopper, or why it has none.
func (t *tier) stopper() (runtime.Stopper, error) {
	st, ok := t.rt.(runtime.Stopper)
	if !ok || !t.caps.StopStart {
		return nil, t.lacks("stop_start", "stop and start sandboxes")
	}
	return st, nil
}

// updater returns the runtime's Updater, or why it has none.
func (t *tier) updater() (runtime.Updater, error) {
	u, ok := t.rt.(runtime.Updater)
	if !ok || !t.caps.UpdateLimits {
		return nil, t.lacks("update_limits", "change limits of a running sandbox")
	}
	return u, nil
}

// stats returns the runtime's StatsProvider, if it reports usage.
func (t *tier) stats() (runtime.StatsProvider, bool) {
	sp, ok := t.rt.(runtime.StatsProvider)
	return sp, ok && t.caps.Stats
}

// limitNames are the API's names of the limits, in the order of api.Limits.
func limitNames(s runtime.LimitSupport) []string {
	var out []string
	for _, l := range []struct {
		name string
		ok   bool
	}{{"cpus", s.CPUs}, {"memory_bytes", s.Memory}, {"pids", s.Pids}, {"disk_bytes", s.Disk}, {"open_files", s.OpenFiles}} {
		if l.ok {
			out = append(out, l.name)
		}
	}
	return out
}

// tier returns the available runtime name (not_found-free: the name was
// validated when the sandbox was made; a daemon that lost the runtime since
// answers unavailable).
func (m *Manager) tier(name string) (*tier, error) {
	t, ok := m.tiers[name]
	if !ok {
		return nil, errdefs.New(errdefs.Unavailable, "runtime %q is not available in this daemon", name)
	}
	return t, nil
}

// Runtimes lists the names of the available runtimes, sorted.
func (m *Manager) Runtimes() []string {
	return slices.Sorted(maps.Keys(m.tiers))
}

// RuntimeInfo describes every runtime the daemon knows: the available ones
// with their capabilities, the others with why they cannot run here.
func (m *Manager) RuntimeInfo() []api.Runtime {
	var out []api.Runtime
	for _, name := range m.Runtimes() {
		c := m.tiers[name].caps
		modes, missing := []string{api.NetworkNone}, maps.Clone(c.Missing)
		switch {
		case !slices.Contains(c.NetworkModes, runtime.NetworkLink):
		case m.net == nil:
			if missing == nil {
				missing = map[string]string{}
			}
			missing["network"] = m.cfg.NetworkUnavailable
		default:
			modes = append(modes, api.NetworkAllowlist, api.NetworkOpen)
		}
		out = append(out, api.Runtime{Name: name, Default: name == m.cfg.DefaultRuntime, Available: true,
			Capabilities: &api.RuntimeCapabilities{
				Limits: limitNames(c.Limits),
				Max: api.Limits{CPUs: c.Host.CPUs, MemoryBytes: c.Host.MemoryBytes, Pids: maxPids,
					DiskBytes: c.Host.DiskBytes, OpenFiles: c.Host.OpenFiles},
				NetworkModes: modes,
				StopStart:    c.StopStart, UpdateLimits: c.UpdateLimits, GrowDisk: c.GrowDisk, Stats: c.Stats,
				IDMappedLayers: c.IDMappedLayers, Pause: c.Pause, Snapshot: c.Snapshot,
				MemoryCheckpoint: c.MemoryCheckpoint, Missing: missing,
			}})
	}
	for _, name := range slices.Sorted(maps.Keys(m.cfg.Unavailable)) {
		if _, ok := m.tiers[name]; !ok {
			out = append(out, api.Runtime{Name: name, Reason: m.cfg.Unavailable[name]})
		}
	}
	return out
}
