// Package store keeps the daemon's state in one SQLite file: sandboxes,
// their labels, and each runtime's private state, safe for concurrent use.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
)

// migrations are applied in order; PRAGMA user_version counts those done.
var migrations = []string{
	`CREATE TABLE sandboxes (
		id TEXT PRIMARY KEY,
		tenant TEXT NOT NULL DEFAULT '',
		state TEXT NOT NULL,
		image TEXT NOT NULL,
		runtime TEXT NOT NULL,
		spec BLOB NOT NULL,
		runtime_state BLOB,
		error TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL
	);
	CREATE INDEX sandboxes_tenant ON sandboxes(tenant, created_at);
	CREATE TABLE sandbox_labels (
		sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
		key TEXT NOT NULL,
		value TEXT NOT NULL,
		PRIMARY KEY (sandbox_id, key)
	);
	CREATE INDEX sandbox_labels_kv ON sandbox_labels(key, value);`,
	`ALTER TABLE sandboxes ADD COLUMN stopped_at INTEGER NOT NULL DEFAULT 0;`,
}

// Store is the daemon's state.
type Store struct{ db *sql.DB }

// Sandbox is a stored sandbox.
type Sandbox struct {
	ID, Tenant, State, Image, Runtime string
	// Spec is the normalized create request, opaque to the store.
	Spec   json.RawMessage
	Labels map[string]string
	// RuntimeState is the runtime's private state, opaque to the store.
	RuntimeState json.RawMessage
	Error        string
	CreatedAt    time.Time
	UpdatedAt    time.Time
	// StoppedAt is when the sandbox last stopped; zero unless it is stopped.
	StoppedAt time.Time
}

// Open opens (creating if needed) the store at path and migrates it.
func Open(ctx context.Context, path string) (*Store, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	f.Close()
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	s := &Store{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) migrate(ctx context.Context) error {
	var version int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("store schema version %d is newer than this berth (%d)", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		err := s.tx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", i+1))
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// CreateSandbox inserts a sandbox and its labels.
func (s *Store) CreateSandbox(ctx context.Context, sb Sandbox) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (id, tenant, state, image, runtime, spec, runtime_state, error, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sb.ID, sb.Tenant, sb.State, sb.Image, sb.Runtime, []byte(sb.Spec), nullable(sb.RuntimeState), sb.Error,
			sb.CreatedAt.UTC().UnixNano(), sb.UpdatedAt.UTC().UnixNano())
		if err != nil {
			if strings.Contains(err.Error(), "UNIQUE constraint failed") {
				return errdefs.New(errdefs.AlreadyExists, "sandbox %q already exists", sb.ID)
			}
			return fmt.Errorf("insert sandbox %s: %w", sb.ID, err)
		}
		return insertLabels(ctx, tx, sb.ID, sb.Labels)
	})
}

func nullable(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return []byte(b)
}

func insertLabels(ctx context.Context, tx *sql.Tx, id string, m map[string]string) error {
	for k, v := range m {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_labels (sandbox_id, key, value) VALUES (?, ?, ?)`, id, k, v); err != nil {
			return fmt.Errorf("insert label %s of %s: %w", k, id, err)
		}
	}
	return nil
}

const selectSandbox = `SELECT id, tenant, state, image, runtime, spec, runtime_state, error, created_at, updated_at, stopped_at FROM sandboxes`

func scanSandbox(row interface{ Scan(...any) error }) (Sandbox, error) {
	var sb Sandbox
	var spec, rs []byte
	var created, updated, stopped int64
	if err := row.Scan(&sb.ID, &sb.Tenant, &sb.State, &sb.Image, &sb.Runtime, &spec, &rs, &sb.Error, &created, &updated, &stopped); err != nil {
		return sb, err
	}
	sb.Spec, sb.RuntimeState = spec, rs
	sb.CreatedAt, sb.UpdatedAt = time.Unix(0, created).UTC(), time.Unix(0, updated).UTC()
	if stopped != 0 {
		sb.StoppedAt = time.Unix(0, stopped).UTC()
	}
	return sb, nil
}

// GetSandbox returns one sandbox with its labels.
func (s *Store) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	sb, err := scanSandbox(s.db.QueryRowContext(ctx, selectSandbox+` WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return sb, errdefs.New(errdefs.NotFound, "sandbox %q not found", id)
	}
	if err != nil {
		return sb, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	all, err := s.labels(ctx, id)
	if err != nil {
		return sb, err
	}
	sb.Labels = all[id]
	return sb, nil
}

// labels reads the labels of one sandbox, or of all when id is "".
func (s *Store) labels(ctx context.Context, id string) (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	q := `SELECT sandbox_id, key, value FROM sandbox_labels`
	var args []any
	if id != "" {
		q += ` WHERE sandbox_id = ?`
		args = append(args, id)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read labels: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var sid, k, v string
		if err := rows.Scan(&sid, &k, &v); err != nil {
			return nil, err
		}
		if out[sid] == nil {
			out[sid] = map[string]string{}
		}
		out[sid][k] = v
	}
	return out, rows.Err()
}

// ListSandboxes returns a tenant's sandboxes ("" = every tenant) that match
// sel, oldest first.
func (s *Store) ListSandboxes(ctx context.Context, tenant string, sel labels.Selector) ([]Sandbox, error) {
	q := selectSandbox
	var args []any
	if tenant != "" {
		q += ` WHERE tenant = ?`
		args = append(args, tenant)
	}
	q += ` ORDER BY created_at, id`
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var all []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		all = append(all, sb)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	lbls, err := s.labels(ctx, "")
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, sb := range all {
		sb.Labels = lbls[sb.ID]
		if sel.Matches(sb.Labels) {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (s *Store) update(ctx context.Context, id, q string, args ...any) error {
	res, err := s.db.ExecContext(ctx, q, append(args, id)...)
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.New(errdefs.NotFound, "sandbox %q not found", id)
	}
	return nil
}

// UpdateState sets a sandbox's state and error message at time at (the
// caller's clock). Entering "stopped" records at as the stop time; any other
// state clears it.
func (s *Store) UpdateState(ctx context.Context, id, state, errMsg string, at time.Time) error {
	var stopped int64
	if state == "stopped" {
		stopped = at.UTC().UnixNano()
	}
	return s.update(ctx, id, `UPDATE sandboxes SET state = ?, error = ?, updated_at = ?, stopped_at = ? WHERE id = ?`,
		state, errMsg, at.UTC().UnixNano(), stopped)
}

// SetRuntimeState stores a runtime's private state for a sandbox.
func (s *Store) SetRuntimeState(ctx context.Context, id string, st json.RawMessage) error {
	return s.update(ctx, id, `UPDATE sandboxes SET runtime_state = ?, updated_at = ? WHERE id = ?`,
		nullable(st), time.Now().UTC().UnixNano())
}

// SetSpec replaces a sandbox's stored spec.
func (s *Store) SetSpec(ctx context.Context, id string, spec json.RawMessage) error {
	return s.update(ctx, id, `UPDATE sandboxes SET spec = ?, updated_at = ? WHERE id = ?`,
		[]byte(spec), time.Now().UTC().UnixNano())
}

// SetLabels replaces a sandbox's labels.
func (s *Store) SetLabels(ctx context.Context, id string, m map[string]string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET updated_at = ? WHERE id = ?`, time.Now().UTC().UnixNano(), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.New(errdefs.NotFound, "sandbox %q not found", id)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_labels WHERE sandbox_id = ?`, id); err != nil {
			return err
		}
		return insertLabels(ctx, tx, id, m)
	})
}

// ReplaceSandbox overwrites every field of sandbox sb.ID whose state is
// from, labels included, atomically. It is how a pooled sandbox is handed
// over: not_found if no such row is in state from.
func (s *Store) ReplaceSandbox(ctx context.Context, from string, sb Sandbox) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET tenant = ?, state = ?, image = ?, runtime = ?, spec = ?,
			error = ?, created_at = ?, updated_at = ?, stopped_at = 0 WHERE id = ? AND state = ?`,
			sb.Tenant, sb.State, sb.Image, sb.Runtime, []byte(sb.Spec), sb.Error,
			sb.CreatedAt.UTC().UnixNano(), sb.UpdatedAt.UTC().UnixNano(), sb.ID, from)
		if err != nil {
			return fmt.Errorf("replace sandbox %s: %w", sb.ID, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.New(errdefs.NotFound, "sandbox %q in state %s not found", sb.ID, from)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_labels WHERE sandbox_id = ?`, sb.ID); err != nil {
			return err
		}
		return insertLabels(ctx, tx, sb.ID, sb.Labels)
	})
}

// DeleteSandbox removes a sandbox and its labels.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	return s.update(ctx, id, `DELETE FROM sandboxes WHERE id = ?`)
}
