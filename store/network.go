package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berthsh/berth/errdefs"
)

// Secret is a stored secret.
type Secret struct {
	Tenant, Name string
	Value        []byte
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// CreateSecret stores a new secret: already_exists if the tenant has one
// of that name.
func (s *Store) CreateSecret(ctx context.Context, sec Secret) error {
	now := time.Now().UnixNano()
	_, err := s.w.ExecContext(ctx, `INSERT INTO secrets (tenant, name, value, created_at, updated_at) VALUES (?, ?, ?, ?, ?)`,
		sec.Tenant, sec.Name, sec.Value, now, now)
	if isConstraint(err, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY) {
		return errdefs.New(errdefs.AlreadyExists, "secret %q already exists (PUT /v1/secrets/%s replaces its value)", sec.Name, sec.Name)
	}
	if err != nil {
		return fmt.Errorf("insert secret %s: %w", sec.Name, err)
	}
	return nil
}

// UpdateSecret replaces a secret's value: not_found if absent.
func (s *Store) UpdateSecret(ctx context.Context, tenant, name string, value []byte) error {
	res, err := s.w.ExecContext(ctx, `UPDATE secrets SET value = ?, updated_at = ? WHERE tenant = ? AND name = ?`,
		value, time.Now().UnixNano(), tenant, name)
	if err != nil {
		return fmt.Errorf("update secret %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return secretNotFound(name)
	}
	return nil
}

func secretNotFound(name string) error {
	return errdefs.New(errdefs.NotFound, "secret %q not found", name)
}

// GetSecret returns a secret with its value: not_found if absent.
func (s *Store) GetSecret(ctx context.Context, tenant, name string) (Secret, error) {
	sec := Secret{Tenant: tenant, Name: name}
	var created, updated int64
	err := s.r.QueryRowContext(ctx, `SELECT value, created_at, updated_at FROM secrets WHERE tenant = ? AND name = ?`, tenant, name).
		Scan(&sec.Value, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return Secret{}, secretNotFound(name)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("get secret %s: %w", name, err)
	}
	sec.CreatedAt, sec.UpdatedAt = fromNanos(created), fromNanos(updated)
	return sec, nil
}

// ListSecrets returns a tenant's secrets without their values, by name.
func (s *Store) ListSecrets(ctx context.Context, tenant string) ([]Secret, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT name, created_at, updated_at FROM secrets WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	defer rows.Close()
	out := []Secret{}
	for rows.Next() {
		sec := Secret{Tenant: tenant}
		var created, updated int64
		if err := rows.Scan(&sec.Name, &created, &updated); err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		sec.CreatedAt, sec.UpdatedAt = fromNanos(created), fromNanos(updated)
		out = append(out, sec)
	}
	return out, rows.Err()
}

// DeleteSecret removes a secret: not_found if absent.
func (s *Store) DeleteSecret(ctx context.Context, tenant, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ? AND name = ?`, tenant, name)
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return secretNotFound(name)
	}
	return nil
}

// PutCA stores a sandbox's CA (replacing one it had).
func (s *Store) PutCA(ctx context.Context, id string, cert, key []byte) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO sandbox_ca (sandbox_id, cert, key) VALUES (?, ?, ?)
		ON CONFLICT (sandbox_id) DO UPDATE SET cert = excluded.cert, key = excluded.key`, id, cert, key)
	if isConstraint(err, sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY) {
		return notFound(id)
	}
	if err != nil {
		return fmt.Errorf("store the CA of %s: %w", id, err)
	}
	return nil
}

// GetCA returns a sandbox's CA: not_found if it has none.
func (s *Store) GetCA(ctx context.Context, id string) (cert, key []byte, err error) {
	err = s.r.QueryRowContext(ctx, `SELECT cert, key FROM sandbox_ca WHERE sandbox_id = ?`, id).Scan(&cert, &key)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, errdefs.New(errdefs.NotFound, "sandbox %q has no CA", id)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("get the CA of %s: %w", id, err)
	}
	return cert, key, nil
}

// EgressKept is how many egress records a sandbox keeps; older ones go.
const EgressKept = 10000

// EgressEntry is one egress record of a sandbox, opaque to the store but
// for its order and whether it was allowed.
type EgressEntry struct {
	Sandbox string
	Seq     int64
	Allowed bool
	Record  json.RawMessage
}

// AppendEgress stores entries in one transaction and trims every sandbox
// it touched to its last EgressKept. Entries of a sandbox that is gone
// are dropped.
func (s *Store) AppendEgress(ctx context.Context, entries []EgressEntry) error {
	if len(entries) == 0 {
		return nil
	}
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		ins, err := tx.PrepareContext(ctx, `INSERT INTO egress (sandbox_id, seq, allowed, record)
			SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)`)
		if err != nil {
			return fmt.Errorf("append egress: %w", err)
		}
		defer ins.Close()
		last := map[string]int64{}
		for _, e := range entries {
			if _, err := ins.ExecContext(ctx, e.Sandbox, e.Seq, e.Allowed, []byte(e.Record), e.Sandbox); err != nil {
				return fmt.Errorf("append egress of %s: %w", e.Sandbox, err)
			}
			last[e.Sandbox] = max(last[e.Sandbox], e.Seq)
		}
		for id, seq := range last {
			if seq > EgressKept {
				if _, err := tx.ExecContext(ctx, `DELETE FROM egress WHERE sandbox_id = ? AND seq <= ?`, id, seq-EgressKept); err != nil {
					return fmt.Errorf("trim egress of %s: %w", id, err)
				}
			}
		}
		return nil
	})
}

// EgressQuery selects a sandbox's records.
type EgressQuery struct {
	After      int64 // records with Seq > After
	Limit      int   // at most (default and most: 1000)
	DeniedOnly bool
}

// ListEgress returns a sandbox's records in order.
func (s *Store) ListEgress(ctx context.Context, id string, q EgressQuery) ([]json.RawMessage, error) {
	if q.Limit <= 0 || q.Limit > 1000 {
		q.Limit = 1000
	}
	query := `SELECT record FROM egress WHERE sandbox_id = ? AND seq > ?`
	if q.DeniedOnly {
		query += ` AND allowed = 0`
	}
	rows, err := s.r.QueryContext(ctx, query+` ORDER BY seq LIMIT ?`, id, q.After, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("list egress of %s: %w", id, err)
	}
	defer rows.Close()
	out := []json.RawMessage{}
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, fmt.Errorf("list egress of %s: %w", id, err)
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// LastEgressSeq is the Seq of a sandbox's newest record (0: none).
func (s *Store) LastEgressSeq(ctx context.Context, id string) (int64, error) {
	var seq sql.NullInt64
	if err := s.r.QueryRowContext(ctx, `SELECT max(seq) FROM egress WHERE sandbox_id = ?`, id).Scan(&seq); err != nil {
		return 0, fmt.Errorf("last egress of %s: %w", id, err)
	}
	return seq.Int64, nil
}
