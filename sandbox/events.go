package sandbox

import (
	"context"
	"sync"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/store"
)

// eventBus fans a sandbox's events out to its subscribers. Delivery is best
// effort: a subscriber that falls 256 events behind loses the oldest ones
// rather than slowing the sandbox down.
type eventBus struct {
	mu   sync.Mutex
	subs map[string]map[chan api.SandboxEvent]struct{}
}

// subscribe returns a channel of id's events from now on and its cancel.
func (b *eventBus) subscribe(id string) (<-chan api.SandboxEvent, func()) {
	ch := make(chan api.SandboxEvent, 256)
	b.mu.Lock()
	if b.subs == nil {
		b.subs = map[string]map[chan api.SandboxEvent]struct{}{}
	}
	if b.subs[id] == nil {
		b.subs[id] = map[chan api.SandboxEvent]struct{}{}
	}
	b.subs[id][ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, ok := b.subs[id][ch]; ok {
			delete(b.subs[id], ch)
			if len(b.subs[id]) == 0 {
				delete(b.subs, id)
			}
			close(ch)
		}
	}
}

func (b *eventBus) publish(ev api.SandboxEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs[ev.Sandbox] {
		select {
		case ch <- ev:
		default: // full: drop the oldest, keep the newest
			select {
			case <-ch:
			default:
			}
			select {
			case ch <- ev:
			default:
			}
		}
	}
}

// emit publishes an event of sandbox id at the manager's clock.
func (m *Manager) emit(id, typ string, mod ...func(*api.SandboxEvent)) {
	ev := api.SandboxEvent{Type: typ, Sandbox: id, Time: m.cfg.Now().UTC()}
	for _, f := range mod {
		f(&ev)
	}
	m.events.publish(ev)
}

// emitExit publishes how a process ended: process_exited, plus oom or timed_out.
func (m *Manager) emitExit(id string, r *api.ExecResult) {
	if r == nil {
		return
	}
	res := *r
	res.Stdout, res.Stderr = []byte{}, []byte{} // events carry no output; never null on the wire
	with := func(ev *api.SandboxEvent) { ev.Pid, ev.Result = res.Pid, &res }
	m.emit(id, api.ProcessExited, with)
	if res.OOMKilled {
		m.emit(id, api.ProcessOOM, with)
	}
	if res.TimedOut {
		m.emit(id, api.ProcessTimedOut, with)
	}
}

// Events streams a sandbox's events to emit until ctx ends or the sandbox
// is deleted (the deleted event is the last).
func (m *Manager) Events(ctx context.Context, tenant, id string, ready func(), emit func(api.SandboxEvent) error) error {
	if _, err := m.record(ctx, tenant, id); err != nil {
		return err
	}
	ch, cancel := m.events.subscribe(id)
	defer cancel()
	ready()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-ch:
			if !ok {
				return nil
			}
			if err := emit(ev); err != nil {
				return err
			}
			if ev.Type == api.SandboxDeleted {
				return nil
			}
		}
	}
}

// watchLimits publishes limit_hit events for the limits a running sandbox
// met since the sweeper last looked: forks refused at the pids limit, CPU
// periods throttled, a disk that became full.
func (m *Manager) watchLimits(ctx context.Context, rec store.Sandbox, ls *liveSandbox) {
	sp, ok := ls.tier.stats()
	if !ok {
		return
	}
	h, err := sp.LimitHits(ctx, rec.ID)
	if err != nil {
		return
	}
	last := ls.hits
	ls.hits = h
	hit := func(limit string, n int64) {
		if n > 0 {
			m.emit(rec.ID, api.LimitHit, func(e *api.SandboxEvent) { e.Limit, e.Count = limit, n })
		}
	}
	hit("pids", h.Pids-last.Pids)
	hit("cpu", h.CPUThrottled-last.CPUThrottled)
	if h.DiskFull && !last.DiskFull {
		hit("disk", 1)
	}
}
