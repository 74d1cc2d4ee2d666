package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// AuditRecord is one mutating API call as the audit log keeps it.
type AuditRecord struct {
	Seq       int64
	At        time.Time
	Tenant    string
	KeyID     string
	Method    string
	Route     string // the route's pattern: /v1/sandboxes/{id}/exec
	Path      string
	SandboxID string
	Status    int
	// ErrorClass is the error's class ("" when the call succeeded).
	ErrorClass string
	RequestID  string
}

// AppendAudit adds records in one transaction, then drops the oldest
// rows beyond keep, so the table stays bounded.
func (s *Store) AppendAudit(ctx context.Context, recs []AuditRecord, keep int64) error {
	if len(recs) == 0 {
		return nil
	}
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		ins := tx.StmtContext(ctx, s.q.insertAudit)
		var last int64
		for _, r := range recs {
			res, err := ins.ExecContext(ctx, r.At.UnixNano(), r.Tenant, r.KeyID, r.Method, r.Route, r.Path, r.SandboxID, r.Status, r.ErrorClass, r.RequestID)
			if err != nil {
				return fmt.Errorf("audit: %w", err)
			}
			last, _ = res.LastInsertId()
		}
		if keep > 0 && last > keep {
			if _, err := tx.StmtContext(ctx, s.q.trimAudit).ExecContext(ctx, last-keep); err != nil {
				return fmt.Errorf("audit: trim: %w", err)
			}
		}
		return nil
	})
}

// AuditQuery selects audit records.
type AuditQuery struct {
	// Tenant limits the records to one tenant's; All ignores it.
	Tenant string
	All    bool
	// SandboxID limits them to one sandbox's calls when set.
	SandboxID string
	// After returns records with a larger seq only.
	After int64
	// Limit is the most records returned, newest last (default 1000).
	Limit int
}

// ListAudit returns the records q selects in seq order, the newest Limit
// of them.
func (s *Store) ListAudit(ctx context.Context, q AuditQuery) ([]AuditRecord, error) {
	if q.Limit <= 0 {
		q.Limit = 1000
	}
	where, args := `seq > ?`, []any{q.After}
	if !q.All {
		where, args = where+` AND tenant = ?`, append(args, q.Tenant)
	}
	if q.SandboxID != "" {
		where, args = where+` AND sandbox_id = ?`, append(args, q.SandboxID)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT seq, at, tenant, key_id, method, route, path, sandbox_id, status, error_class, request_id
		FROM (SELECT * FROM audit WHERE `+where+` ORDER BY seq DESC LIMIT ?) ORDER BY seq`, append(args, q.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var r AuditRecord
		var at int64
		if err := rows.Scan(&r.Seq, &at, &r.Tenant, &r.KeyID, &r.Method, &r.Route, &r.Path, &r.SandboxID, &r.Status, &r.ErrorClass, &r.RequestID); err != nil {
			return nil, fmt.Errorf("list audit: %w", err)
		}
		r.At = fromNanos(at)
		out = append(out, r)
	}
	return out, rows.Err()
}

// AuditCounts returns how many records the table holds of each tenant.
func (s *Store) AuditCounts(ctx context.Context) (map[string]int64, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT tenant, COUNT(*) FROM audit GROUP BY tenant`)
	if err != nil {
		return nil, fmt.Errorf("count audit: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var tenant string
		var n int64
		if err := rows.Scan(&tenant, &n); err != nil {
			return nil, fmt.Errorf("count audit: %w", err)
		}
		out[tenant] = n
	}
	return out, rows.Err()
}

// TrimAudit drops a tenant's oldest records beyond its newest keep, and
// no other tenant's: one tenant's calls cannot push another's out.
func (s *Store) TrimAudit(ctx context.Context, tenant string, keep int64) error {
	_, err := s.w.ExecContext(ctx, `DELETE FROM audit WHERE tenant = ? AND seq <= (
		SELECT seq FROM audit WHERE tenant = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`, tenant, tenant, keep)
	if err != nil {
		return fmt.Errorf("trim audit of %q: %w", tenant, err)
	}
	return nil
}
