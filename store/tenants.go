package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/berthsh/berth/api"
)

// SetQuota stores a tenant's quota; an all-zero quota removes it.
func (s *Store) SetQuota(ctx context.Context, tenant string, q api.Quota) error {
	if q == (api.Quota{}) {
		if _, err := s.w.ExecContext(ctx, `DELETE FROM quotas WHERE tenant = ?`, tenant); err != nil {
			return fmt.Errorf("quota of %s: %w", tenant, err)
		}
		return nil
	}
	b, err := json.Marshal(q)
	if err != nil {
		return fmt.Errorf("quota of %s: %w", tenant, err)
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO quotas (tenant, quota, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (tenant) DO UPDATE SET quota = excluded.quota, updated_at = excluded.updated_at`, tenant, b, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("quota of %s: %w", tenant, err)
	}
	return nil
}

// Quotas returns every tenant's quota.
func (s *Store) Quotas(ctx context.Context) (map[string]api.Quota, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT tenant, quota FROM quotas`)
	if err != nil {
		return nil, fmt.Errorf("quotas: %w", err)
	}
	defer rows.Close()
	out := map[string]api.Quota{}
	for rows.Next() {
		var tenant string
		var b []byte
		var q api.Quota
		if err := rows.Scan(&tenant, &b); err != nil {
			return nil, fmt.Errorf("quotas: %w", err)
		}
		if err := json.Unmarshal(b, &q); err != nil {
			return nil, fmt.Errorf("quota of %s: %w", tenant, err)
		}
		out[tenant] = q
	}
	return out, rows.Err()
}

// SnapshotBytes is the size of a tenant's stored snapshots.
func (s *Store) SnapshotBytes(ctx context.Context, tenant string) (int64, error) {
	var n int64
	if err := s.r.QueryRowContext(ctx, `SELECT COALESCE(SUM(size), 0) FROM snapshots WHERE tenant = ?`, tenant).Scan(&n); err != nil {
		return 0, fmt.Errorf("snapshot bytes of %s: %w", tenant, err)
	}
	return n, nil
}

// SaveUsage replaces the stored usage counters of the tenants in u.
func (s *Store) SaveUsage(ctx context.Context, u map[string]api.TenantUsage) error {
	if len(u) == 0 {
		return nil
	}
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		for tenant, c := range u {
			_, err := tx.ExecContext(ctx, `INSERT INTO tenant_usage (tenant, sandbox_seconds, cpu_seconds, memory_gb_seconds, egress_bytes_out, egress_bytes_in)
				VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET sandbox_seconds = excluded.sandbox_seconds,
				cpu_seconds = excluded.cpu_seconds, memory_gb_seconds = excluded.memory_gb_seconds,
				egress_bytes_out = excluded.egress_bytes_out, egress_bytes_in = excluded.egress_bytes_in`,
				tenant, c.SandboxSeconds, c.CPUSeconds, c.MemoryGBSeconds, c.EgressBytesOut, c.EgressBytesIn)
			if err != nil {
				return fmt.Errorf("usage of %s: %w", tenant, err)
			}
		}
		return nil
	})
}

// LoadUsage returns the stored usage counters by tenant.
func (s *Store) LoadUsage(ctx context.Context) (map[string]api.TenantUsage, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT tenant, sandbox_seconds, cpu_seconds, memory_gb_seconds, egress_bytes_out, egress_bytes_in FROM tenant_usage`)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	defer rows.Close()
	out := map[string]api.TenantUsage{}
	for rows.Next() {
		var c api.TenantUsage
		if err := rows.Scan(&c.Tenant, &c.SandboxSeconds, &c.CPUSeconds, &c.MemoryGBSeconds, &c.EgressBytesOut, &c.EgressBytesIn); err != nil {
			return nil, fmt.Errorf("usage: %w", err)
		}
		out[c.Tenant] = c
	}
	return out, rows.Err()
}
