// Package store keeps the daemon's state (sandboxes, their labels and each
// runtime's private state) in one SQLite file, safe for concurrent use.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
)

// migrations returns the schema changes in order; PRAGMA user_version
// counts those applied. Append only: a released migration never changes.
func migrations() []string {
	return []string{
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
		`ALTER TABLE sandboxes ADD COLUMN id_range INTEGER NOT NULL DEFAULT 0;
		CREATE UNIQUE INDEX sandboxes_id_range ON sandboxes(id_range) WHERE id_range > 0;`,
		`CREATE TABLE secrets (
			tenant TEXT NOT NULL,
			name TEXT NOT NULL,
			value BLOB NOT NULL,
			created_at INTEGER NOT NULL,
			updated_at INTEGER NOT NULL,
			PRIMARY KEY (tenant, name)
		);
		CREATE TABLE sandbox_ca (
			sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes(id) ON DELETE CASCADE,
			cert BLOB NOT NULL,
			key BLOB NOT NULL
		);
		CREATE TABLE egress (
			sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
			seq INTEGER NOT NULL,
			allowed INTEGER NOT NULL,
			record BLOB NOT NULL,
			PRIMARY KEY (sandbox_id, seq)
		) WITHOUT ROWID;`,
		`ALTER TABLE sandboxes ADD COLUMN access_token TEXT NOT NULL DEFAULT '';`,
		`ALTER TABLE sandboxes ADD COLUMN image_id TEXT NOT NULL DEFAULT '';
		CREATE INDEX sandboxes_image ON sandboxes(image_id) WHERE image_id != '';
		CREATE TABLE images (
			id TEXT PRIMARY KEY,
			config BLOB NOT NULL,
			layers BLOB NOT NULL,
			size INTEGER NOT NULL,
			source TEXT NOT NULL,
			created_at INTEGER NOT NULL
		);
		CREATE TABLE image_names (
			name TEXT PRIMARY KEY,
			image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE
		);
		CREATE INDEX image_names_image ON image_names(image_id);
		CREATE TABLE layers (
			digest TEXT PRIMARY KEY,
			size INTEGER NOT NULL
		);`,
		`CREATE TABLE build_cache (
			key TEXT PRIMARY KEY,
			layer TEXT NOT NULL,
			created_at INTEGER NOT NULL
		);`,
		`CREATE TABLE snapshots (
			id TEXT PRIMARY KEY,
			tenant TEXT NOT NULL,
			name TEXT NOT NULL,
			sandbox_id TEXT NOT NULL,
			base TEXT NOT NULL,
			image TEXT NOT NULL,
			parent TEXT NOT NULL,
			layers BLOB NOT NULL,
			size INTEGER NOT NULL,
			config BLOB NOT NULL,
			labels BLOB NOT NULL,
			frozen_ns INTEGER NOT NULL,
			created_at INTEGER NOT NULL
		);
		CREATE UNIQUE INDEX snapshots_name ON snapshots(tenant, name) WHERE name != '';
		CREATE INDEX snapshots_base ON snapshots(base);`,
		`ALTER TABLE sandboxes ADD COLUMN archive_bytes INTEGER NOT NULL DEFAULT 0;`,
		`CREATE TABLE api_keys (
			id TEXT PRIMARY KEY,
			tenant TEXT NOT NULL,
			scope TEXT NOT NULL,
			name TEXT NOT NULL,
			hash BLOB NOT NULL,
			created_at INTEGER NOT NULL,
			expires_at INTEGER NOT NULL,
			revoked_at INTEGER NOT NULL
		);
		CREATE TABLE audit (
			seq INTEGER PRIMARY KEY AUTOINCREMENT,
			at INTEGER NOT NULL,
			tenant TEXT NOT NULL,
			key_id TEXT NOT NULL,
			method TEXT NOT NULL,
			route TEXT NOT NULL,
			path TEXT NOT NULL,
			sandbox_id TEXT NOT NULL,
			status INTEGER NOT NULL,
			error_class TEXT NOT NULL,
			request_id TEXT NOT NULL
		);
		CREATE INDEX audit_tenant ON audit(tenant, seq);`,
		`CREATE TABLE quotas (
			tenant TEXT PRIMARY KEY,
			quota BLOB NOT NULL,
			updated_at INTEGER NOT NULL
		);
		CREATE TABLE tenant_usage (
			tenant TEXT PRIMARY KEY,
			sandbox_seconds REAL NOT NULL,
			cpu_seconds REAL NOT NULL,
			memory_gb_seconds REAL NOT NULL,
			egress_bytes_out INTEGER NOT NULL,
			egress_bytes_in INTEGER NOT NULL
		);`,
		// Image names belong to a tenant ('' the operator's, as every
		// name before was); an image's content stays shared.
		`CREATE TABLE image_names_by_tenant (
			tenant TEXT NOT NULL DEFAULT '',
			name TEXT NOT NULL,
			image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE,
			PRIMARY KEY (tenant, name)
		);
		INSERT INTO image_names_by_tenant (tenant, name, image_id) SELECT '', name, image_id FROM image_names;
		DROP TABLE image_names;
		ALTER TABLE image_names_by_tenant RENAME TO image_names;
		CREATE INDEX image_names_image ON image_names(image_id);`,
	}
}

// sqlSelectorMax is the most requirements a selector may have to be applied
// in SQL; a longer one (too deep an expression for SQLite) is applied in Go.
const sqlSelectorMax = 32

// Store is the daemon's state. Writes go through one connection, so they
// queue in Go instead of contending for SQLite's lock; reads use a pool of
// read-only connections and, thanks to WAL, never wait for writes.
type Store struct {
	w *sql.DB // one connection: every write
	r *sql.DB // read-only connections: every read
	q stmts
}

// stmts are the statements of every create, exec, file call and delete,
// prepared once at Open: SQLite's parse and plan of a statement cost about
// as much as running it (an UPDATE of sandboxes, with the foreign keys
// that point at it, the most), and a 32-client create/exec/delete loop
// spent 2.4% of all the host's CPU parsing them again on every call.
// database/sql prepares each again on a connection that has not seen it
// (a reader), once. In a transaction, tx.StmtContext takes them.
type stmts struct {
	// On w.
	insertSandbox, replaceSandbox, deleteSandbox, touch, insertLabel, deleteLabels *sql.Stmt
	setState, setRuntimeState, setSpec, setAccessToken, setArchived                *sql.Stmt
	insertAudit, trimAudit                                                         *sql.Stmt
	// On r.
	status, getSandbox, labelsOf *sql.Stmt
}

// prepare prepares s's statements; on error it closes those it made.
func (s *stmts) prepare(ctx context.Context, w, r *sql.DB) error {
	for _, st := range []struct {
		dst **sql.Stmt
		db  *sql.DB
		q   string
	}{
		{&s.insertSandbox, w, `INSERT INTO sandboxes
			(id, tenant, state, image, runtime, spec, runtime_state, error, created_at, updated_at, stopped_at, id_range, access_token, image_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`},
		{&s.replaceSandbox, w, `UPDATE sandboxes SET tenant = ?, state = ?, image = ?, runtime = ?, spec = ?,
			error = ?, created_at = ?, updated_at = ?, stopped_at = 0, access_token = ?, image_id = ? WHERE id = ? AND state = ?`},
		{&s.deleteSandbox, w, `DELETE FROM sandboxes WHERE id = ?`},
		{&s.touch, w, `UPDATE sandboxes SET updated_at = ? WHERE id = ?`},
		{&s.insertLabel, w, `INSERT INTO sandbox_labels (sandbox_id, key, value) VALUES (?, ?, ?)`},
		{&s.deleteLabels, w, `DELETE FROM sandbox_labels WHERE sandbox_id = ?`},
		{&s.setState, w, `UPDATE sandboxes SET state = ?, error = ?, updated_at = ?, stopped_at = ? WHERE id = ?`},
		{&s.setRuntimeState, w, `UPDATE sandboxes SET runtime_state = ?, updated_at = ? WHERE id = ?`},
		{&s.setSpec, w, `UPDATE sandboxes SET spec = ?, updated_at = ? WHERE id = ?`},
		{&s.setAccessToken, w, `UPDATE sandboxes SET access_token = ?, updated_at = ? WHERE id = ?`},
		{&s.setArchived, w, `UPDATE sandboxes SET archive_bytes = ? WHERE id = ?`},
		{&s.insertAudit, w, `INSERT INTO audit (at, tenant, key_id, method, route, path, sandbox_id, status, error_class, request_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`},
		{&s.trimAudit, w, `DELETE FROM audit WHERE seq <= ?`},
		{&s.status, r, `SELECT tenant, state, error FROM sandboxes WHERE id = ?`},
		{&s.getSandbox, r, `SELECT ` + sandboxColumns + ` FROM sandboxes s WHERE s.id = ?`},
		{&s.labelsOf, r, `SELECT sandbox_id, key, value FROM sandbox_labels WHERE sandbox_id = ?`},
	} {
		var err error
		if *st.dst, err = st.db.PrepareContext(ctx, st.q); err != nil {
			return errors.Join(fmt.Errorf("prepare %q: %w", strings.Fields(st.q)[:3], err), s.close())
		}
	}
	return nil
}

// close closes the statements prepared.
func (s *stmts) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.insertSandbox, s.replaceSandbox, s.deleteSandbox, s.touch, s.insertLabel, s.deleteLabels,
		s.setState, s.setRuntimeState, s.setSpec, s.setAccessToken, s.setArchived, s.insertAudit, s.trimAudit,
		s.status, s.getSandbox, s.labelsOf} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// Sandbox is a stored sandbox.
type Sandbox struct {
	ID, Tenant, State, Image, Runtime string
	// Spec is the normalized create request, opaque to the store.
	Spec json.RawMessage
	// Labels is nil when the sandbox has none.
	Labels map[string]string
	// RuntimeState is the runtime's private state, opaque to the store; nil
	// when unset.
	RuntimeState json.RawMessage
	Error        string
	// Times are stored in UTC with nanosecond precision and returned in UTC.
	CreatedAt time.Time
	UpdatedAt time.Time
	// StoppedAt is when the sandbox last stopped; zero unless it is stopped.
	StoppedAt time.Time
	// IDRange is the sandbox's range of host uids and gids (see
	// runtime.IDMap.Range): no two sandboxes hold the same range above 0,
	// the range sandboxes made before ranges were per sandbox share.
	IDRange uint32
	// AccessToken opens the sandbox's private ports (empty for sandboxes
	// made before ports: the manager gives them one when first asked).
	AccessToken string
	// ImageID pins the stored image the sandbox is made of (empty for the
	// host image): an image in use cannot be removed.
	ImageID string
	// ArchiveBytes is the size of the compressed archive that holds the
	// stopped sandbox's writable layer while its directory is freed; 0 when
	// it is not archived.
	ArchiveBytes int64
}

// Open opens the store at path, creating the file (mode 0600) if needed, in
// WAL mode with a 5 s busy timeout, foreign keys on and synchronous=NORMAL,
// and applies the migrations it lacks.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "store: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}

	w, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_pragma": {"busy_timeout(5000)", "journal_mode(WAL)", "foreign_keys(1)", "synchronous(NORMAL)"},
		"_txlock": {"immediate"},
	}))
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	if err := setUp(ctx, w); err != nil {
		w.Close()
		return nil, fmt.Errorf("store %s: %w", abs, err)
	}

	r, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_pragma": {"busy_timeout(5000)", "foreign_keys(1)", "query_only(1)"},
	}))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store %s: %w", abs, err)
	}
	r.SetMaxOpenConns(8)
	r.SetMaxIdleConns(8)
	if err := r.PingContext(ctx); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("store %s: %w", abs, err)
	}
	s := &Store{w: w, r: r}
	if err := s.q.prepare(ctx, w, r); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("store %s: %w", abs, err)
	}
	return s, nil
}

// dsn is the driver's name for the file at abs with query parameters q. The
// path is escaped, so "?", "#" and "%" in it are taken literally.
func dsn(abs string, q url.Values) string {
	u := url.URL{Scheme: "file", Path: abs, RawQuery: q.Encode()}
	return u.String()
}

// setUp checks that the connection's settings took (WAL, foreign keys) and
// migrates the file.
func setUp(ctx context.Context, db *sql.DB) error {
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("read journal mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal mode is %q, not WAL (does the file system support it?)", mode)
	}
	var fk int
	if err := db.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk); err != nil {
		return fmt.Errorf("read foreign_keys: %w", err)
	}
	if fk != 1 {
		return errors.New("foreign keys are off")
	}
	return migrate(ctx, db)
}

// migrate applies the migrations the file lacks, each in its own
// transaction that reads user_version again, so two processes opening the
// file at once do not apply one twice.
func migrate(ctx context.Context, db *sql.DB) error {
	all := migrations()
	for {
		done := false
		err := inTx(ctx, db, func(tx *sql.Tx) error {
			var version int
			if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
				return fmt.Errorf("read schema version: %w", err)
			}
			switch {
			case version > len(all):
				return fmt.Errorf("schema version %d is newer than this berth knows (%d)", version, len(all))
			case version == len(all):
				done = true
				return nil
			}
			if _, err := tx.ExecContext(ctx, all[version]); err != nil {
				return fmt.Errorf("migration %d: %w", version+1, err)
			}
			// PRAGMA takes no parameters; version is an int, so this is safe.
			if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", version+1)); err != nil {
				return fmt.Errorf("migration %d: set version: %w", version+1, err)
			}
			return nil
		})
		if err != nil || done {
			return err
		}
	}
}

// Close closes the store.
func (s *Store) Close() error {
	return errors.Join(s.q.close(), s.r.Close(), s.w.Close())
}

// inTx runs fn in a transaction of db, committing when it returns nil.
func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	return beginTx(ctx, db, nil, fn)
}

// read runs fn in a read-only transaction, so that its queries see one
// snapshot of the file.
func (s *Store) read(ctx context.Context, fn func(*sql.Tx) error) error {
	return beginTx(ctx, s.r, &sql.TxOptions{ReadOnly: true}, fn)
}

func beginTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// nanos converts t to the stored form, nanoseconds since the Unix epoch.
func nanos(field string, t time.Time) (int64, error) {
	if t.Before(time.Unix(0, math.MinInt64)) || t.After(time.Unix(0, math.MaxInt64)) {
		return 0, errdefs.New(errdefs.InvalidArgument, "store: %s %s is out of range", field, t.UTC().Format(time.RFC3339))
	}
	return t.UnixNano(), nil
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// blob is b as a nullable column value.
func blob(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return []byte(b)
}

// isConstraint reports whether err is the SQLite extended result code code.
func isConstraint(err error, code int) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == code
}

func notFound(id string) error {
	return errdefs.WithReason(errdefs.New(errdefs.NotFound, "sandbox %q not found", id), errdefs.SandboxGone)
}

// CreateSandbox inserts sb and its labels in one transaction: already_exists
// if a sandbox with its ID exists. A zero CreatedAt means now, a zero
// UpdatedAt means CreatedAt.
func (s *Store) CreateSandbox(ctx context.Context, sb Sandbox) error {
	if sb.ID == "" {
		return errdefs.New(errdefs.InvalidArgument, "store: sandbox without an id")
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = time.Now()
	}
	if sb.UpdatedAt.IsZero() {
		sb.UpdatedAt = sb.CreatedAt
	}
	created, err := nanos("created_at", sb.CreatedAt)
	if err != nil {
		return err
	}
	updated, err := nanos("updated_at", sb.UpdatedAt)
	if err != nil {
		return err
	}
	var stopped int64
	if !sb.StoppedAt.IsZero() {
		if stopped, err = nanos("stopped_at", sb.StoppedAt); err != nil {
			return err
		}
	}
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		_, err := tx.StmtContext(ctx, s.q.insertSandbox).ExecContext(ctx, sb.ID, sb.Tenant, sb.State, sb.Image, sb.Runtime, []byte(append(json.RawMessage{}, sb.Spec...)),
			blob(sb.RuntimeState), sb.Error, created, updated, stopped, sb.IDRange, sb.AccessToken, sb.ImageID)
		if isConstraint(err, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY) {
			return errdefs.New(errdefs.AlreadyExists, "sandbox %q already exists", sb.ID)
		}
		if isConstraint(err, sqlite3.SQLITE_CONSTRAINT_UNIQUE) {
			return errdefs.New(errdefs.AlreadyExists, "sandbox %q: id range %d is another sandbox's", sb.ID, sb.IDRange)
		}
		if err != nil {
			return fmt.Errorf("insert sandbox %s: %w", sb.ID, err)
		}
		return s.insertLabels(ctx, tx, sb.ID, sb.Labels)
	})
}

func (s *Store) insertLabels(ctx context.Context, tx *sql.Tx, id string, m map[string]string) error {
	if len(m) == 0 {
		return nil
	}
	stmt := tx.StmtContext(ctx, s.q.insertLabel)
	for k, v := range m {
		if _, err := stmt.ExecContext(ctx, id, k, v); err != nil {
			return fmt.Errorf("insert label %q of %s: %w", k, id, err)
		}
	}
	return nil
}

const sandboxColumns = `s.id, s.tenant, s.state, s.image, s.runtime, s.spec, s.runtime_state, s.error,
	s.created_at, s.updated_at, s.stopped_at, s.id_range, s.access_token, s.image_id, s.archive_bytes`

func scanSandbox(row interface{ Scan(...any) error }) (Sandbox, error) {
	var (
		sb                        Sandbox
		spec, rs                  []byte
		created, updated, stopped int64
	)
	err := row.Scan(&sb.ID, &sb.Tenant, &sb.State, &sb.Image, &sb.Runtime, &spec, &rs, &sb.Error,
		&created, &updated, &stopped, &sb.IDRange, &sb.AccessToken, &sb.ImageID, &sb.ArchiveBytes)
	if err != nil {
		return Sandbox{}, err
	}
	if len(spec) > 0 {
		sb.Spec = spec
	}
	sb.RuntimeState = rs
	sb.CreatedAt, sb.UpdatedAt = fromNanos(created), fromNanos(updated)
	if stopped != 0 {
		sb.StoppedAt = fromNanos(stopped)
	}
	return sb, nil
}

// GetSandbox returns the sandbox id with its labels: not_found if absent.
func (s *Store) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := s.read(ctx, func(tx *sql.Tx) error {
		var err error
		sb, err = scanSandbox(tx.StmtContext(ctx, s.q.getSandbox).QueryRowContext(ctx, id))
		if errors.Is(err, sql.ErrNoRows) {
			return notFound(id)
		}
		if err != nil {
			return fmt.Errorf("get sandbox %s: %w", id, err)
		}
		rows, err := tx.StmtContext(ctx, s.q.labelsOf).QueryContext(ctx, id)
		if err != nil {
			return fmt.Errorf("read labels: %w", err)
		}
		all, err := scanLabels(rows)
		sb.Labels = all[id]
		return err
	})
	if err != nil {
		return Sandbox{}, err
	}
	return sb, nil
}

// Status is the part of a stored sandbox that says whether a call may
// reach it: whose it is and what state it is in.
type Status struct {
	ID, Tenant, State, Error string
}

// Status is the sandbox's Status.
func (sb Sandbox) Status() Status {
	return Status{ID: sb.ID, Tenant: sb.Tenant, State: sb.State, Error: sb.Error}
}

// GetStatus reads a sandbox's Status: one prepared query, without labels
// or spec, for the calls that only need to know that the sandbox is the
// caller's and running. not_found when there is none.
func (s *Store) GetStatus(ctx context.Context, id string) (Status, error) {
	st := Status{ID: id}
	err := s.q.status.QueryRowContext(ctx, id).Scan(&st.Tenant, &st.State, &st.Error)
	if errors.Is(err, sql.ErrNoRows) {
		return Status{}, notFound(id)
	}
	if err != nil {
		return Status{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return st, nil
}

// readLabels returns the labels of the sandboxes s for which where holds,
// by sandbox id.
func readLabels(ctx context.Context, tx *sql.Tx, where string, args []any) (map[string]map[string]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT l.sandbox_id, l.key, l.value
		FROM sandbox_labels l JOIN sandboxes s ON s.id = l.sandbox_id WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("read labels: %w", err)
	}
	return scanLabels(rows)
}

// scanLabels reads rows of (sandbox id, key, value) by sandbox id, and
// closes them.
func scanLabels(rows *sql.Rows) (map[string]map[string]string, error) {
	defer rows.Close()
	out := map[string]map[string]string{}
	for rows.Next() {
		var id, k, v string
		if err := rows.Scan(&id, &k, &v); err != nil {
			return nil, fmt.Errorf("read labels: %w", err)
		}
		if out[id] == nil {
			out[id] = map[string]string{}
		}
		out[id][k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read labels: %w", err)
	}
	return out, nil
}

// selectorSQL renders sel as a condition on sandboxes s with its arguments.
func selectorSQL(sel labels.Selector) (string, []any) {
	var (
		conds []string
		args  []any
	)
	const has = `EXISTS (SELECT 1 FROM sandbox_labels l WHERE l.sandbox_id = s.id AND l.key = ?`
	for _, r := range sel.Requirements() {
		switch r.Op {
		case labels.Equals:
			conds, args = append(conds, has+` AND l.value = ?)`), append(args, r.Key, r.Value)
		case labels.NotEquals:
			conds, args = append(conds, `NOT `+has+` AND l.value = ?)`), append(args, r.Key, r.Value)
		case labels.Exists:
			conds, args = append(conds, has+`)`), append(args, r.Key)
		case labels.NotExists:
			conds, args = append(conds, `NOT `+has+`)`), append(args, r.Key)
		default:
			conds = append(conds, `0`) // matches nothing, as Requirement.Matches does
		}
	}
	return strings.Join(conds, " AND "), args
}

// ListSandboxes returns the sandboxes of tenant ("" = every tenant) whose
// labels match sel, ordered by creation time, then id. It never returns a
// nil slice.
func (s *Store) ListSandboxes(ctx context.Context, tenant string, sel labels.Selector) ([]Sandbox, error) {
	conds, args := []string{"1"}, []any{}
	if tenant != "" {
		conds, args = append(conds, `s.tenant = ?`), append(args, tenant)
	}
	inSQL := len(sel.Requirements()) <= sqlSelectorMax
	if inSQL && !sel.Empty() {
		c, a := selectorSQL(sel)
		conds, args = append(conds, c), append(args, a...)
	}
	where := strings.Join(conds, " AND ")
	out := []Sandbox{}
	err := s.read(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes s WHERE `+where+
			` ORDER BY s.created_at, s.id`, args...)
		if err != nil {
			return fmt.Errorf("list sandboxes: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			sb, err := scanSandbox(rows)
			if err != nil {
				return fmt.Errorf("list sandboxes: %w", err)
			}
			out = append(out, sb)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("list sandboxes: %w", err)
		}
		rows.Close()
		all, err := readLabels(ctx, tx, where, args)
		if err != nil {
			return err
		}
		for i := range out {
			out[i].Labels = all[out[i].ID]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !inSQL {
		kept := out[:0]
		for _, sb := range out {
			if sel.Matches(sb.Labels) {
				kept = append(kept, sb)
			}
		}
		out = kept
	}
	return out, nil
}

// update runs one UPDATE or DELETE of sandbox id (its last argument):
// not_found if no row was touched.
func (s *Store) update(ctx context.Context, id string, stmt *sql.Stmt, args ...any) error {
	res, err := stmt.ExecContext(ctx, append(args, id)...)
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", id, err)
	}
	if n == 0 {
		return notFound(id)
	}
	return nil
}

// UpdateState sets sandbox id's state and error message (errMsg, "" for
// none) as of at, the caller's clock: not_found if absent. Entering
// "stopped" records at as the stop time; any other state clears it.
func (s *Store) UpdateState(ctx context.Context, id, state, errMsg string, at time.Time) error {
	if at.IsZero() {
		at = time.Now()
	}
	now, err := nanos("update time", at)
	if err != nil {
		return err
	}
	var stopped int64
	if state == "stopped" {
		stopped = now
	}
	return s.update(ctx, id, s.q.setState, state, errMsg, now, stopped)
}

// SetRuntimeState replaces sandbox id's runtime state (nil clears it):
// not_found if absent.
func (s *Store) SetRuntimeState(ctx context.Context, id string, st json.RawMessage) error {
	return s.update(ctx, id, s.q.setRuntimeState, blob(st), time.Now().UnixNano())
}

// SetSpec replaces sandbox id's spec: not_found if absent.
func (s *Store) SetSpec(ctx context.Context, id string, spec json.RawMessage) error {
	return s.update(ctx, id, s.q.setSpec, []byte(append(json.RawMessage{}, spec...)), time.Now().UnixNano())
}

// SetAccessToken replaces sandbox id's port access token: not_found if absent.
func (s *Store) SetAccessToken(ctx context.Context, id, token string) error {
	return s.update(ctx, id, s.q.setAccessToken, token, time.Now().UnixNano())
}

// SetLabels replaces all of sandbox id's labels with m, atomically:
// not_found if absent.
func (s *Store) SetLabels(ctx context.Context, id string, m map[string]string) error {
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		res, err := tx.StmtContext(ctx, s.q.touch).ExecContext(ctx, time.Now().UnixNano(), id)
		if err != nil {
			return fmt.Errorf("set labels of %s: %w", id, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("set labels of %s: %w", id, err)
		} else if n == 0 {
			return notFound(id)
		}
		if _, err := tx.StmtContext(ctx, s.q.deleteLabels).ExecContext(ctx, id); err != nil {
			return fmt.Errorf("set labels of %s: %w", id, err)
		}
		return s.insertLabels(ctx, tx, id, m)
	})
}

// ReplaceSandbox atomically overwrites sandbox sb.ID, if it is in state
// from, with sb: every field and the labels, except the runtime state and
// the id range, which the running sandbox keeps, and the stop time, which
// it clears. It is
// how a pooled sandbox is handed over: not_found if no sandbox sb.ID is in
// state from. Zero times are defaulted as by CreateSandbox.
func (s *Store) ReplaceSandbox(ctx context.Context, from string, sb Sandbox) error {
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = time.Now()
	}
	if sb.UpdatedAt.IsZero() {
		sb.UpdatedAt = sb.CreatedAt
	}
	created, err := nanos("created_at", sb.CreatedAt)
	if err != nil {
		return err
	}
	updated, err := nanos("updated_at", sb.UpdatedAt)
	if err != nil {
		return err
	}
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		res, err := tx.StmtContext(ctx, s.q.replaceSandbox).ExecContext(ctx, sb.Tenant, sb.State, sb.Image, sb.Runtime, []byte(append(json.RawMessage{}, sb.Spec...)), sb.Error,
			created, updated, sb.AccessToken, sb.ImageID, sb.ID, from)
		if err != nil {
			return fmt.Errorf("replace sandbox %s: %w", sb.ID, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("replace sandbox %s: %w", sb.ID, err)
		} else if n == 0 {
			return errdefs.New(errdefs.NotFound, "sandbox %q in state %q not found", sb.ID, from)
		}
		if _, err := tx.StmtContext(ctx, s.q.deleteLabels).ExecContext(ctx, sb.ID); err != nil {
			return fmt.Errorf("replace sandbox %s: %w", sb.ID, err)
		}
		return s.insertLabels(ctx, tx, sb.ID, sb.Labels)
	})
}

// DeleteSandbox removes sandbox id and, by cascade, its labels: not_found
// if absent.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	return s.update(ctx, id, s.q.deleteSandbox)
}

// SetArchived records that sandbox id's writable layer is kept in an
// archive of size bytes (0: it is not, any more).
func (s *Store) SetArchived(ctx context.Context, id string, size int64) error {
	return s.update(ctx, id, s.q.setArchived, size)
}
