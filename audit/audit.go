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
}

// DefaultKeep is how many records the table keeps by default.
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
			if err := l.st.AppendAudit(ctx, batch, l.keep); err != nil {
				l.log.Error("audit: write the table", "records", len(batch), "err", err)
			}
			cancel()
		}
		for _, m := range markers {
			close(m)
		}
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
