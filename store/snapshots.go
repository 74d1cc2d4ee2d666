package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berthsh/berth/errdefs"
)

// Snapshot is a sandbox's files at one instant: layers stored in the image
// store, stacked on a base image.
type Snapshot struct {
	// ID is "snap-…"; sandboxes made from the snapshot carry it as ImageID.
	ID     string
	Tenant string
	// Name is unique per tenant; "" for a fork's snapshot, which goes with
	// its last sandbox.
	Name string
	// Sandbox is the sandbox it was taken of (which may be gone).
	Sandbox string
	// Base is the image under the layers: "host" or a stored image's id.
	Base string
	// Image is the reference the source sandbox was made from.
	Image string
	// Parent is the snapshot the source was made from, if any.
	Parent string
	// Layers are the digests of the layers above Base, bottom first
	// (the parent's, then this snapshot's own).
	Layers []string
	// Size is the bytes of the snapshot's own layer.
	Size int64
	// Config is the source's defaults (env, user, workdir), opaque here.
	Config json.RawMessage
	Labels map[string]string
	// Frozen is how long the source's processes were frozen for the capture.
	Frozen    time.Duration
	CreatedAt time.Time
}

func snapshotNotFound(ref string) error {
	return errdefs.New(errdefs.NotFound, "snapshot %q not found", ref)
}

// PutSnapshot stores a new snapshot: already_exists if the tenant has one
// of its name.
func (s *Store) PutSnapshot(ctx context.Context, sn Snapshot) error {
	layers, err := json.Marshal(sn.Layers)
	if err != nil {
		return err
	}
	lbls, err := json.Marshal(sn.Labels)
	if err != nil {
		return err
	}
	created, err := nanos("created_at", sn.CreatedAt)
	if err != nil {
		return err
	}
	if sn.Config == nil {
		sn.Config = json.RawMessage("{}")
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO snapshots (id, tenant, name, sandbox_id, base, image, parent, layers, size, config, labels, frozen_ns, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.Tenant, sn.Name, sn.Sandbox, sn.Base, sn.Image, sn.Parent, layers, sn.Size, []byte(sn.Config), lbls, int64(sn.Frozen), created)
	if isConstraint(err, sqlite3.SQLITE_CONSTRAINT_UNIQUE) || isConstraint(err, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY) {
		return errdefs.New(errdefs.AlreadyExists, "snapshot %q already exists", sn.Name)
	}
	if err != nil {
		return fmt.Errorf("store snapshot %s: %w", sn.ID, err)
	}
	return nil
}

const snapshotColumns = `id, tenant, name, sandbox_id, base, image, parent, layers, size, config, labels, frozen_ns, created_at`

func scanSnapshot(row interface{ Scan(...any) error }) (Snapshot, error) {
	var (
		sn                     Snapshot
		layers, config, labels []byte
		frozen, created        int64
	)
	if err := row.Scan(&sn.ID, &sn.Tenant, &sn.Name, &sn.Sandbox, &sn.Base, &sn.Image, &sn.Parent, &layers, &sn.Size, &config, &labels, &frozen, &created); err != nil {
		return sn, err
	}
	if err := json.Unmarshal(layers, &sn.Layers); err != nil {
		return sn, fmt.Errorf("snapshot %s: layers: %w", sn.ID, err)
	}
	if err := json.Unmarshal(labels, &sn.Labels); err != nil {
		return sn, fmt.Errorf("snapshot %s: labels: %w", sn.ID, err)
	}
	sn.Config = config
	sn.Frozen = time.Duration(frozen)
	sn.CreatedAt = fromNanos(created)
	return sn, nil
}

// GetSnapshot returns snapshot id (any tenant's): not_found if absent.
func (s *Store) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	sn, err := scanSnapshot(s.r.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return sn, snapshotNotFound(id)
	}
	if err != nil {
		return sn, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return sn, nil
}

// SnapshotByName returns the tenant's snapshot called name: not_found if
// it has none.
func (s *Store) SnapshotByName(ctx context.Context, tenant, name string) (Snapshot, error) {
	sn, err := scanSnapshot(s.r.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE tenant = ? AND name = ? AND name != ''`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return sn, snapshotNotFound(name)
	}
	if err != nil {
		return sn, fmt.Errorf("snapshot %s: %w", name, err)
	}
	return sn, nil
}

// ListSnapshots returns the tenant's named snapshots ("" for every
// tenant's), newest first.
func (s *Store) ListSnapshots(ctx context.Context, tenant string) ([]Snapshot, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots
		WHERE name != '' AND (? = '' OR tenant = ?) ORDER BY created_at DESC, id`, tenant, tenant)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	out := []Snapshot{}
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes snapshot id unless a sandbox is made of it:
// conflict naming them. The check and the delete are one transaction.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		users, err := usersOf(ctx, tx, "", id)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return errdefs.New(errdefs.Conflict, "snapshot %s is in use by sandboxes %s: delete them first", id, listOf(users))
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
		if err != nil {
			return fmt.Errorf("delete snapshot %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return snapshotNotFound(id)
		}
		return nil
	})
}

// DeleteUnusedSnapshot removes snapshot id if it has no name and no
// sandbox or snapshot is made of it (a fork's, after its last copy), and
// says whether it did.
func (s *Store) DeleteUnusedSnapshot(ctx context.Context, id string) (bool, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ? AND name = ''
		AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE image_id = ?)
		AND NOT EXISTS (SELECT 1 FROM snapshots WHERE parent = ?)`, id, id, id)
	if err != nil {
		return false, fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// SnapshotLayers returns the layers snapshots hold.
func (s *Store) SnapshotLayers(ctx context.Context) (map[string]bool, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT layers FROM snapshots`)
	if err != nil {
		return nil, fmt.Errorf("snapshot layers: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var (
			b      []byte
			layers []string
		)
		if err := rows.Scan(&b); err != nil {
			return nil, fmt.Errorf("snapshot layers: %w", err)
		}
		if err := json.Unmarshal(b, &layers); err != nil {
			return nil, fmt.Errorf("snapshot layers: %w", err)
		}
		for _, l := range layers {
			out[l] = true
		}
	}
	return out, rows.Err()
}

// queryer is a connection pool or a transaction.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// usersOf lists (up to 11 of) tenant's ("" every tenant's) sandboxes and
// snapshots made of image or snapshot id: sandboxes by id, snapshots as
// "snapshot NAME".
func usersOf(ctx context.Context, q queryer, tenant, id string) ([]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT id FROM sandboxes WHERE image_id = ?1 AND (?2 = '' OR tenant = ?2)
		UNION ALL SELECT 'snapshot ' || CASE name WHEN '' THEN id ELSE name END FROM snapshots WHERE base = ?1 AND (?2 = '' OR tenant = ?2)
		LIMIT 11`, id, tenant)
	if err != nil {
		return nil, fmt.Errorf("users of %s: %w", id, err)
	}
	defer rows.Close()
	var users []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			return nil, fmt.Errorf("users of %s: %w", id, err)
		}
		users = append(users, u)
	}
	return users, rows.Err()
}

// listOf joins up to ten names, with an ellipsis for more.
func listOf(names []string) string {
	if len(names) > 10 {
		return strings.Join(names[:10], ", ") + ", …"
	}
	return strings.Join(names, ", ")
}
