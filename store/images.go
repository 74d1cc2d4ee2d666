package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/berthsh/berth/errdefs"
)

// Image is a stored image: what the image package unpacked, by id (its
// manifest's digest), with the names that point at it.
type Image struct {
	ID string
	// Config is the image's OCI configuration as pulled, opaque to the store.
	Config json.RawMessage
	// Layers are the digests of its unpacked layers, bottom first.
	Layers []string
	// Size is the bytes of its unpacked layers.
	Size int64
	// Source is where it came from: the reference it was pulled as, or the
	// file it was imported from.
	Source    string
	CreatedAt time.Time
	// Names are the references that resolve to it, every tenant's, sorted
	// by tenant and name.
	Names []ImageName
}

// ImageName is a name of an image, which belongs to a tenant ("" the
// operator's, the catalog every tenant reads). A name equal to the image's
// id is a grant: it names nothing, but lets the tenant use the image by id
// (a template build's step image).
type ImageName struct {
	Tenant, Name string
}

// Grant says whether n is a grant of image id rather than a name.
func (n ImageName) Grant(id string) bool { return n.Name == id }

// PutImage stores img (replacing a row with its id) and points tenant's
// names at it, moving a name of tenant's that pointed at another image, in
// one transaction.
func (s *Store) PutImage(ctx context.Context, tenant string, img Image, names []string) error {
	layers, err := json.Marshal(img.Layers)
	if err != nil {
		return err
	}
	created, err := nanos("created_at", img.CreatedAt)
	if err != nil {
		return err
	}
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO images (id, config, layers, size, source, created_at) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET config = excluded.config, layers = excluded.layers, size = excluded.size`,
			img.ID, []byte(img.Config), layers, img.Size, img.Source, created)
		if err != nil {
			return fmt.Errorf("store image %s: %w", img.ID, err)
		}
		for _, n := range names {
			if _, err := tx.ExecContext(ctx, `INSERT INTO image_names (tenant, name, image_id) VALUES (?, ?, ?)
				ON CONFLICT (tenant, name) DO UPDATE SET image_id = excluded.image_id`, tenant, n, img.ID); err != nil {
				return fmt.Errorf("name image %s %s: %w", img.ID, n, err)
			}
		}
		return nil
	})
}

func imageNotFound(ref string) error {
	return errdefs.New(errdefs.NotFound, "image %q not found (berth image pull %s)", ref, ref)
}

// ImageByName returns the image name points at for tenant, and whose
// name it is: tenant's own name, else the operator's (""). not_found if
// neither has it.
func (s *Store) ImageByName(ctx context.Context, tenant, name string) (Image, string, error) {
	var id, owner string
	err := s.r.QueryRowContext(ctx, `SELECT image_id, tenant FROM image_names WHERE name = ? AND tenant IN (?, '')
		ORDER BY tenant = ? DESC LIMIT 1`, name, tenant, tenant).Scan(&id, &owner)
	if errors.Is(err, sql.ErrNoRows) {
		return Image{}, "", imageNotFound(name)
	}
	if err != nil {
		return Image{}, "", fmt.Errorf("find image %s: %w", name, err)
	}
	img, err := s.GetImage(ctx, id)
	return img, owner, err
}

// ImageVisible says whether tenant may use image id by its id: the
// operator ("") may use every image; a tenant those that it or the
// operator names (or grants itself), and those its own sandboxes and
// snapshots are made of.
func (s *Store) ImageVisible(ctx context.Context, tenant, id string) (bool, error) {
	var ok bool
	err := s.r.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM images WHERE id = ?1 AND (?2 = ''
		OR EXISTS (SELECT 1 FROM image_names WHERE image_id = ?1 AND tenant IN (?2, ''))
		OR EXISTS (SELECT 1 FROM sandboxes WHERE image_id = ?1 AND tenant = ?2)
		OR EXISTS (SELECT 1 FROM snapshots WHERE base = ?1 AND tenant = ?2)))`, id, tenant).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("find image %s: %w", id, err)
	}
	return ok, nil
}

// GetImage returns image id: not_found if absent.
func (s *Store) GetImage(ctx context.Context, id string) (Image, error) {
	imgs, err := s.images(ctx, `WHERE i.id = ?`, id)
	if err != nil {
		return Image{}, err
	}
	if len(imgs) == 0 {
		return Image{}, imageNotFound(id)
	}
	return imgs[0], nil
}

// ListImages returns the images tenant sees, newest first: for the
// operator (""), every stored image; for a tenant, those it or the
// operator names.
func (s *Store) ListImages(ctx context.Context, tenant string) ([]Image, error) {
	if tenant == "" {
		return s.images(ctx, ``)
	}
	return s.images(ctx, `WHERE EXISTS (SELECT 1 FROM image_names v WHERE v.image_id = i.id AND v.tenant IN (?, '') AND v.name != i.id)`, tenant)
}

func (s *Store) images(ctx context.Context, where string, args ...any) ([]Image, error) {
	out := []Image{}
	err := s.read(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT i.id, i.config, i.layers, i.size, i.source, i.created_at,
			COALESCE((SELECT group_concat(n.tenant || char(9) || n.name, char(10)) FROM image_names n WHERE n.image_id = i.id), '')
			FROM images i `+where+` ORDER BY i.created_at DESC, i.id`, args...)
		if err != nil {
			return fmt.Errorf("list images: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var (
				img            Image
				config, layers []byte
				created        int64
				names          string
			)
			if err := rows.Scan(&img.ID, &config, &layers, &img.Size, &img.Source, &created, &names); err != nil {
				return fmt.Errorf("list images: %w", err)
			}
			img.Config = config
			if err := json.Unmarshal(layers, &img.Layers); err != nil {
				return fmt.Errorf("image %s: layers: %w", img.ID, err)
			}
			img.CreatedAt = fromNanos(created)
			if names != "" {
				for _, tn := range strings.Split(names, "\n") {
					t, n, _ := strings.Cut(tn, "\t")
					img.Names = append(img.Names, ImageName{Tenant: t, Name: n})
				}
				sort.Slice(img.Names, func(a, b int) bool {
					x, y := img.Names[a], img.Names[b]
					return x.Tenant < y.Tenant || x.Tenant == y.Tenant && x.Name < y.Name
				})
			}
			out = append(out, img)
		}
		return rows.Err()
	})
	return out, err
}

// ImageUsers lists the sandboxes made of image id.
func (s *Store) ImageUsers(ctx context.Context, id string) ([]string, error) {
	return s.TenantImageUsers(ctx, "", id)
}

// TenantImageUsers lists the sandboxes of tenant ("" every tenant's) made
// of image id.
func (s *Store) TenantImageUsers(ctx context.Context, tenant, id string) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id FROM sandboxes WHERE image_id = ? AND (? = '' OR tenant = ?) ORDER BY id`, id, tenant, tenant)
	if err != nil {
		return nil, fmt.Errorf("image users: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var sid string
		if err := rows.Scan(&sid); err != nil {
			return nil, fmt.Errorf("image users: %w", err)
		}
		ids = append(ids, sid)
	}
	return ids, rows.Err()
}

// ImageUsedBy lists what of tenant's ("" every tenant's) is made of
// image id: its sandboxes, and its snapshots as "snapshot NAME" (at most
// eleven).
func (s *Store) ImageUsedBy(ctx context.Context, tenant, id string) ([]string, error) {
	return usersOf(ctx, s.r, tenant, id)
}

// Untag removes tenant's names from the image they point at; the image
// stays. not_found if tenant has none of them.
func (s *Store) Untag(ctx context.Context, tenant string, names ...string) error {
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		var gone int64
		for _, name := range names {
			res, err := tx.ExecContext(ctx, `DELETE FROM image_names WHERE tenant = ? AND name = ?`, tenant, name)
			if err != nil {
				return fmt.Errorf("untag %s: %w", name, err)
			}
			n, _ := res.RowsAffected()
			gone += n
		}
		if gone == 0 && len(names) > 0 {
			return imageNotFound(names[0])
		}
		return nil
	})
}

// DeleteImage removes image id and its names, unless a sandbox or a
// snapshot is made of it: conflict naming them. The check and the delete
// are one transaction, so nothing can come to use the image in between.
func (s *Store) DeleteImage(ctx context.Context, id string) error {
	return inTx(ctx, s.w, func(tx *sql.Tx) error {
		users, err := usersOf(ctx, tx, "", id)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return errdefs.New(errdefs.Conflict, "image %s is in use by %s: delete them first", id, listOf(users))
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM images WHERE id = ?`, id)
		if err != nil {
			return fmt.Errorf("delete image %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return imageNotFound(id)
		}
		return nil
	})
}

// Layers returns the stored layers' sizes by digest.
func (s *Store) Layers(ctx context.Context) (map[string]int64, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT digest, size FROM layers`)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var (
			d string
			n int64
		)
		if err := rows.Scan(&d, &n); err != nil {
			return nil, fmt.Errorf("list layers: %w", err)
		}
		out[d] = n
	}
	return out, rows.Err()
}

// LayerSize returns a stored layer's size: not_found if it is not stored.
func (s *Store) LayerSize(ctx context.Context, digest string) (int64, error) {
	var n int64
	err := s.r.QueryRowContext(ctx, `SELECT size FROM layers WHERE digest = ?`, digest).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, errdefs.New(errdefs.NotFound, "layer %s not found", digest)
	}
	if err != nil {
		return 0, fmt.Errorf("layer %s: %w", digest, err)
	}
	return n, nil
}

// PutLayer records a layer unpacked into the store.
func (s *Store) PutLayer(ctx context.Context, digest string, size int64) error {
	if _, err := s.w.ExecContext(ctx, `INSERT INTO layers (digest, size) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING`, digest, size); err != nil {
		return fmt.Errorf("record layer %s: %w", digest, err)
	}
	return nil
}

// DeleteLayer forgets a layer.
func (s *Store) DeleteLayer(ctx context.Context, digest string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM layers WHERE digest = ?`, digest); err != nil {
		return fmt.Errorf("forget layer %s: %w", digest, err)
	}
	return nil
}

// CachedStep returns the layer a template build's step with inputs key
// made ("" for a step that changed no file): not_found when no build made
// it, or when its layer is gone from the store.
func (s *Store) CachedStep(ctx context.Context, key string) (string, error) {
	var layer string
	err := s.r.QueryRowContext(ctx, `SELECT c.layer FROM build_cache c
		WHERE c.key = ? AND (c.layer = '' OR EXISTS (SELECT 1 FROM layers l WHERE l.digest = c.layer))`, key).Scan(&layer)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errdefs.New(errdefs.NotFound, "build step %s not cached", key)
	}
	if err != nil {
		return "", fmt.Errorf("build cache %s: %w", key, err)
	}
	return layer, nil
}

// CacheStep records that the step with inputs key made layer.
func (s *Store) CacheStep(ctx context.Context, key, layer string) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO build_cache (key, layer, created_at) VALUES (?, ?, ?)
		ON CONFLICT (key) DO UPDATE SET layer = excluded.layer, created_at = excluded.created_at`, key, layer, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("build cache %s: %w", key, err)
	}
	return nil
}

// CachedLayers returns the layers the build cache holds.
func (s *Store) CachedLayers(ctx context.Context) (map[string]bool, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT DISTINCT layer FROM build_cache WHERE layer != ''`)
	if err != nil {
		return nil, fmt.Errorf("build cache: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return nil, fmt.Errorf("build cache: %w", err)
		}
		out[d] = true
	}
	return out, rows.Err()
}

// ClearBuildCache forgets every cached build step and says how many.
func (s *Store) ClearBuildCache(ctx context.Context) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM build_cache`)
	if err != nil {
		return 0, fmt.Errorf("clear the build cache: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// DeleteIntermediate deletes image id if it has no name and no sandbox is
// made of it (a template build's step image), and says whether it did.
func (s *Store) DeleteIntermediate(ctx context.Context, id string) (bool, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM images WHERE id = ?
		AND NOT EXISTS (SELECT 1 FROM image_names WHERE image_id = ?)
		AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE image_id = ?)
		AND NOT EXISTS (SELECT 1 FROM snapshots WHERE base = ?)`, id, id, id, id)
	if err != nil {
		return false, fmt.Errorf("delete image %s: %w", id, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}
