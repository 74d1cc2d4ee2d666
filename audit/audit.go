// Package audit keeps the log of every mutating API call: one structured
// log line each, and a bounded table in the store that GET /v1/audit
// reads. Calls are written off the request path, in batches, by one
// goroutine the Log owns; a reader first waits for what was queued before
// it, so a caller reads its own calls. A daemon killed with SIGKILL loses
// at most the batch in flight.
package audit

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/store"
)

// Store is where the records are kept (store.Store implements it).
type Store interface {
	AppendAudit(ctx context.Context, recs []store.AuditRecord, keep int64) error
	ListAudit(ctx context.Context, q store.AuditQuery) ([]store.AuditRecord, error)
	AuditCounts(ctx context.Context) (map[string]int64, error)
	TrimAudit(ctx context.Context, tenant string, keep int64) error
}

// DefaultKeep is how many records of each tenant (the operator's calls
// being one more) the table keeps by default. The bound is per tenant, so
// that one tenant's calls cannot push another's out of the table.
const DefaultKeep = 100_000

// queueLen bounds the calls waiting to be written; beyond it, calls are
// counted as dropped and said in the log.
const queueLen = 4096

// batchMax is the most records written in one transaction.
const batchMax = 512

type item struct {
	rec     api.AuditRecord
	flushed chan struct{} // a reader's marker, closed once written up to it
}

// Log is the audit log.
type Log struct {
	st   Store
	log  *slog.Logger
	keep int64
	q    chan item
	done chan struct{}
	// counts are the table's records by tenant (the writer's alone),
	// read from the store before the first write.
	counts map[string]int64

	mu      sync.Mutex
	closed  bool
	dropped int64
}

// New starts the log's writer; keep bounds the table (DefaultKeep when 0).
func New(st Store, log *slog.Logger, keep int64) *Log {
	if keep <= 0 {
		keep = DefaultKeep
	}
	l := &Log{st: st, log: log, keep: keep, q: make(chan item, queueLen), done: make(chan struct{})}
	go l.write()
	return l
}

// Audit logs one call and queues it for the table; it never blocks.
func (l *Log) Audit(rec api.AuditRecord) {
	l.line(rec)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	select {
	case l.q <- item{rec: rec}:
	default:
		l.dropped++
		if l.dropped&(l.dropped-1) == 0 { // 1, 2, 4, 8, …: said, not flooded
			l.log.Warn("audit: the table's queue is full; calls are in the log only", "dropped", l.dropped)
		}
	}
}

// AuditRefused logs a call the edge refused for want of a valid key: a
// line in the log, not a row in the table, which anyone who can reach the
// daemon could otherwise fill with refusals.
func (l *Log) AuditRefused(rec api.AuditRecord) { l.line(rec) }

// line is a call's line in the log.
func (l *Log) line(rec api.AuditRecord) {
	args := []any{"method", rec.Method, "route", rec.Route, "status", rec.Status, "request_id", rec.RequestID}
	if rec.Tenant != "" {
		args = append(args, "tenant", rec.Tenant)
	}
	if rec.KeyID != "" {
		args = append(args, "key", rec.KeyID)
	}
	if rec.SandboxID != "" {
		args = append(args, "sandbox", rec.SandboxID)
	}
	if rec.Error != "" {
		args = append(args, "error", rec.Error)
	}
	l.log.Info("audit", args...)
}

// Close writes what is queued and stops the writer.
func (l *Log) Close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.q)
	}
	l.mu.Unlock()
	<-l.done
}

// write is the writer: it takes what is queued, up to batchMax records,
// and writes it in one transaction.
func (l *Log) write() {
	defer close(l.done)
	var batch []store.AuditRecord
	var markers []chan struct{}
	for it := range l.q {
		batch, markers = l.add(batch[:0], markers[:0], it)
	more:
		for len(batch) < batchMax {
			select {
			case it, ok := <-l.q:
				if !ok {
					break more
				}
				batch, markers = l.add(batch, markers, it)
			default:
				break more
			}
		}
		if len(batch) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := l.st.AppendAudit(ctx, batch, 0); err != nil {
				l.log.Error("audit: write the table", "records", len(batch), "err", err)
			} else {
				l.trim(ctx, batch)
			}
			cancel()
		}
		for _, m := range markers {
			close(m)
		}
	}
}

// trim keeps each tenant of batch to its newest keep records, once it has
// some more than that (so that trims are few): its own, no other's.
func (l *Log) trim(ctx context.Context, batch []store.AuditRecord) {
	if l.counts == nil {
		c, err := l.st.AuditCounts(ctx)
		if err != nil {
			l.log.Error("audit: count the table", "err", err)
			return
		}
		l.counts = c
	} else {
		for _, r := range batch {
			l.counts[r.Tenant]++
		}
	}
	slack := min(l.keep, 1024)
	for _, r := range batch {
		if l.counts[r.Tenant] <= l.keep+slack {
			continue
		}
		if err := l.st.TrimAudit(ctx, r.Tenant, l.keep); err != nil {
			l.log.Error("audit: trim the table", "tenant", r.Tenant, "err", err)
			continue
		}
		l.counts[r.Tenant] = l.keep
	}
}

func (l *Log) add(batch []store.AuditRecord, markers []chan struct{}, it item) ([]store.AuditRecord, []chan struct{}) {
	if it.flushed != nil {
		return batch, append(markers, it.flushed)
	}
	r := it.rec
	return append(batch, store.AuditRecord{At: r.At, Tenant: r.Tenant, KeyID: r.KeyID, Method: r.Method, Route: r.Route,
		Path: r.Path, SandboxID: r.SandboxID, Status: r.Status, ErrorClass: r.Error, RequestID: r.RequestID}), markers
}

// flush waits until what was queued before it is written (or ctx ends).
func (l *Log) flush(ctx context.Context) {
	m := make(chan struct{})
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	select {
	case l.q <- item{flushed: m}:
	default:
		m = nil // full: read what is there
	}
	l.mu.Unlock()
	if m == nil {
		return
	}
	select {
	case <-m:
	case <-ctx.Done():
	}
}

// List returns the records of tenant (every tenant's when all), of one
// sandbox when sandbox is set, with seq above after, the newest limit of
// them (1000 when 0), oldest first.
func (l *Log) List(ctx context.Context, tenant string, all bool, sandbox string, after int64, limit int) ([]api.AuditRecord, error) {
	l.flush(ctx)
	recs, err := l.st.ListAudit(ctx, store.AuditQuery{Tenant: tenant, All: all, SandboxID: sandbox, After: after, Limit: limit})
	if err != nil {
		return nil, err
	}
	out := make([]api.AuditRecord, len(recs))
	for i, r := range recs {
		out[i] = api.AuditRecord{Seq: r.Seq, At: r.At, Tenant: r.Tenant, KeyID: r.KeyID, Method: r.Method, Route: r.Route,
			Path: r.Path, SandboxID: r.SandboxID, Status: r.Status, Error: r.ErrorClass, RequestID: r.RequestID}
	}
	return out, nil
}
