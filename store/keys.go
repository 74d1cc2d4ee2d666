package store

import (
	"context"
	"fmt"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berthsh/berth/errdefs"
)

// APIKey is a stored API key: never the key itself, only its hash.
type APIKey struct {
	ID, Tenant, Scope, Name string
	// Hash is SHA-256 of the key's secret part.
	Hash      []byte
	CreatedAt time.Time
	// ExpiresAt and RevokedAt are zero when unset.
	ExpiresAt time.Time
	RevokedAt time.Time
}

// CreateAPIKey stores a new key: already_exists if its id is taken.
func (s *Store) CreateAPIKey(ctx context.Context, k APIKey) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO api_keys (id, tenant, scope, name, hash, created_at, expires_at, revoked_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, k.ID, k.Tenant, k.Scope, k.Name, k.Hash, optNanos(k.CreatedAt), optNanos(k.ExpiresAt), optNanos(k.RevokedAt))
	if isConstraint(err, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY) {
		return errdefs.New(errdefs.AlreadyExists, "API key %q already exists", k.ID)
	}
	if err != nil {
		return fmt.Errorf("insert API key %s: %w", k.ID, err)
	}
	return nil
}

// ListAPIKeys returns every key, revoked and expired ones too, oldest first.
func (s *Store) ListAPIKeys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, tenant, scope, name, hash, created_at, expires_at, revoked_at
		FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		var k APIKey
		var created, expires, revoked int64
		if err := rows.Scan(&k.ID, &k.Tenant, &k.Scope, &k.Name, &k.Hash, &created, &expires, &revoked); err != nil {
			return nil, fmt.Errorf("list API keys: %w", err)
		}
		k.CreatedAt, k.ExpiresAt, k.RevokedAt = fromOptNanos(created), fromOptNanos(expires), fromOptNanos(revoked)
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	return out, nil
}

// RevokeAPIKey marks a key revoked at at: not_found if there is no such
// key; revoking a revoked key keeps its first revocation time.
func (s *Store) RevokeAPIKey(ctx context.Context, id string, at time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE api_keys SET revoked_at = CASE revoked_at WHEN 0 THEN ? ELSE revoked_at END WHERE id = ?`,
		optNanos(at), id)
	if err != nil {
		return fmt.Errorf("revoke API key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.New(errdefs.NotFound, "API key %q not found", id)
	}
	return nil
}

// optNanos is t in Unix nanoseconds, 0 for the zero time (unset).
func optNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromOptNanos is the inverse of optNanos, in UTC.
func fromOptNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return fromNanos(n)
}
