package sandbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/store"
)

// egressLog keeps sandboxes' egress records. Each record gets the next
// sequence number of its sandbox and goes at once to the sandbox's
// followers, and to the store in batches: a writer goroutine flushes every
// flushEvery or flushAt records, so that a busy sandbox costs one
// transaction per batch, not one per connection. The store keeps each
// sandbox's last store.EgressKept records, across restarts.
type egressLog struct {
	store    *store.Store
	log      *slog.Logger
	onDenied func(id string, rec api.EgressRecord)

	mu      sync.Mutex
	seq     map[string]int64
	subs    map[string]map[chan api.EgressRecord]struct{}
	pending []store.EgressEntry
	dropped int64

	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

const (
	flushEvery  = 100 * time.Millisecond
	flushAt     = 256
	maxPending  = 65536 // the store is that far behind: new records are counted, not kept
	followerBuf = 1024
)

func newEgressLog(st *store.Store, log *slog.Logger, onDenied func(string, api.EgressRecord)) *egressLog {
	l := &egressLog{store: st, log: log, onDenied: onDenied, seq: map[string]int64{},
		subs: map[string]map[chan api.EgressRecord]struct{}{}, kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go l.run() // owned: ends at close
	return l
}

// open prepares sandbox id's numbering (after the store's last record).
func (l *egressLog) open(ctx context.Context, id string) {
	l.mu.Lock()
	_, known := l.seq[id]
	l.mu.Unlock()
	if known {
		return
	}
	last, err := l.store.LastEgressSeq(ctx, id)
	if err != nil {
		l.log.Warn("egress: read the last record", "sandbox", id, "err", err)
	}
	l.mu.Lock()
	if cur, ok := l.seq[id]; !ok || cur < last {
		l.seq[id] = last
	}
	l.mu.Unlock()
}

// forget drops sandbox id's numbering and ends its followers (it was
// deleted).
func (l *egressLog) forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.seq, id)
	for ch := range l.subs[id] {
		close(ch)
	}
	delete(l.subs, id)
}

// add numbers rec, hands it to id's followers and queues it for the store.
func (l *egressLog) add(id string, rec api.EgressRecord) {
	l.mu.Lock()
	l.seq[id]++
	rec.Seq = l.seq[id]
	for ch := range l.subs[id] {
		select {
		case ch <- rec:
		default: // a follower this far behind loses records
		}
	}
	b, err := json.Marshal(rec)
	switch {
	case err != nil:
		l.log.Error("egress: encode a record", "sandbox", id, "err", err)
	case len(l.pending) >= maxPending:
		l.dropped++
	default:
		l.pending = append(l.pending, store.EgressEntry{Sandbox: id, Seq: rec.Seq, Allowed: rec.Allowed, Record: b})
	}
	n := len(l.pending)
	l.mu.Unlock()
	if n >= flushAt {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
	if !rec.Allowed && l.onDenied != nil {
		l.onDenied(id, rec)
	}
}

// subscribe returns id's records from now on, and its cancel.
func (l *egressLog) subscribe(id string) (<-chan api.EgressRecord, func()) {
	ch := make(chan api.EgressRecord, followerBuf)
	l.mu.Lock()
	if l.subs[id] == nil {
		l.subs[id] = map[chan api.EgressRecord]struct{}{}
	}
	l.subs[id][ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, ok := l.subs[id][ch]; ok { // not yet closed by forget
			delete(l.subs[id], ch)
			if len(l.subs[id]) == 0 {
				delete(l.subs, id)
			}
			close(ch)
		}
	}
}

func (l *egressLog) run() {
	defer close(l.done)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			l.flush(context.Background())
			return
		case <-tick.C:
		case <-l.kick:
		}
		l.flush(context.Background())
	}
}

// flush writes what is queued.
func (l *egressLog) flush(ctx context.Context) {
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	dropped := l.dropped
	l.dropped = 0
	l.mu.Unlock()
	if dropped > 0 {
		l.log.Warn("egress: the store fell behind; records dropped", "count", dropped)
	}
	if err := l.store.AppendEgress(ctx, batch); err != nil {
		l.log.Error("egress: store records", "count", len(batch), "err", err)
	}
}

// close writes what is queued and stops the writer.
func (l *egressLog) close() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
}

// Egress returns a sandbox's records after q.After, oldest first (at most
// q.Limit).
func (m *Manager) Egress(ctx context.Context, tenant, id string, q store.EgressQuery) ([]api.EgressRecord, error) {
	if _, err := m.record(ctx, tenant, id); err != nil {
		return nil, err
	}
	m.egress.flush(ctx)
	raw, err := m.store.ListEgress(ctx, id, q)
	if err != nil {
		return nil, err
	}
	out := make([]api.EgressRecord, 0, len(raw))
	for _, b := range raw {
		var rec api.EgressRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// FollowEgress sends a sandbox's records after q.After to send, the
// stored ones first, then new ones as they come, until ctx ends, send
// fails or the sandbox is deleted. ready is called once the sandbox is
// known to be the caller's.
func (m *Manager) FollowEgress(ctx context.Context, tenant, id string, q store.EgressQuery, ready func(), send func(api.EgressRecord) error) error {
	if _, err := m.record(ctx, tenant, id); err != nil {
		return err
	}
	live, cancel := m.egress.subscribe(id)
	defer cancel()
	ready()
	last := q.After
	for {
		page, err := m.Egress(ctx, tenant, id, store.EgressQuery{After: last, DeniedOnly: q.DeniedOnly})
		if err != nil {
			return err
		}
		for _, rec := range page {
			if err := send(rec); err != nil {
				return err
			}
			last = rec.Seq
		}
		if len(page) < 1000 {
			break
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case rec, ok := <-live:
			if !ok {
				return nil
			}
			if rec.Seq <= last || (q.DeniedOnly && rec.Allowed) {
				continue
			}
			if err := send(rec); err != nil {
				return err
			}
			last = rec.Seq
		}
	}
}

// RecordEgress takes an egress record of sandbox id from its network.
func (m *Manager) RecordEgress(id string, rec api.EgressRecord) {
	m.egress.add(id, rec)
	m.meterEgress(id, rec)
}
