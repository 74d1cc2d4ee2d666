package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/store"
)

// StoreLayer stores layer tar stream r (a sandbox's changes, or a build
// step's files) as it stores a pulled layer: unpacked by the same code,
// under the same limits, named by the tar's digest. A tar of no entries
// stores nothing and gives diff "". The layer is kept until no image and
// no cached build step has it.
func (s *Store) StoreLayer(ctx context.Context, r io.Reader) (diff string, size int64, err error) {
	if s.db == nil {
		return "", 0, errdefs.New(errdefs.NotImplemented, "image store: this store has only the host image")
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	tmp, err := s.newLayerDir()
	if err != nil {
		return "", 0, err
	}
	defer func() {
		if tmp != "" {
			removeAll(tmp)
		}
	}()
	h := sha256.New()
	b := &budget{lim: s.limits.withDefaults(), dir: s.layersDir()}
	if _, err := unpackLayer(tmp, io.TeeReader(r, h), b); err != nil {
		return "", 0, err
	}
	if _, err := io.Copy(h, r); err != nil { // the tar's end, in the digest too
		return "", 0, err
	}
	if b.entries == 0 {
		return "", 0, nil
	}
	diff = digestOf(h)
	if size, err := s.db.LayerSize(ctx, diff); err == nil { // the same changes again
		return diff, size, nil
	}
	err = s.placeLayer(ctx, tmp, diff, b.bytes)
	tmp = "" // placed, or removed by placeLayer
	if err != nil {
		return "", 0, err
	}
	return diff, b.bytes, nil
}

// BuiltPrefix begins the source of an image built here: "build:" and the
// Dockerfile's path.
const BuiltPrefix = "build:"

// StoreBuilt stores an image made here (a template) from its config,
// whose rootfs lists stored layers, named names of tenant's. Its id is the
// digest of the config, which names every layer: the same files and
// settings are the same image. An image stored without names (a build
// step's) is granted to tenant, so that tenant may make a sandbox of it by
// its id, until Forget.
func (s *Store) StoreBuilt(ctx context.Context, tenant string, cf v1.ConfigFile, names []string, source string) (api.Image, error) {
	if s.db == nil {
		return api.Image{}, errdefs.New(errdefs.NotImplemented, "image store: this store has only the host image")
	}
	if len(cf.RootFS.DiffIDs) > maxLayers {
		return api.Image{}, errdefs.New(errdefs.InvalidArgument, "image %s would have %d layers, over the %d a sandbox's root can stack", source, len(cf.RootFS.DiffIDs), maxLayers)
	}
	cf.RootFS.Type = "layers"
	raw, err := json.Marshal(cf)
	if err != nil {
		return api.Image{}, err
	}
	sum := sha256.Sum256(raw)
	rec := store.Image{ID: fmt.Sprintf("sha256:%x", sum), Config: raw, Source: source, CreatedAt: time.Now().UTC()}
	s.gc.RLock()
	defer s.gc.RUnlock()
	for _, d := range cf.RootFS.DiffIDs {
		size, err := s.db.LayerSize(ctx, d.String())
		if err != nil {
			return api.Image{}, fmt.Errorf("image %s: %w", source, err)
		}
		rec.Layers = append(rec.Layers, d.String())
		rec.Size += size
	}
	var named []string
	for _, n := range names {
		r, err := s.parseRef(n)
		if err != nil {
			return api.Image{}, err
		}
		named = append(named, r.Name())
	}
	if len(named) == 0 && tenant != "" {
		named = []string{rec.ID} // a grant: see store.ImageName
	}
	if err := s.db.PutImage(ctx, tenant, rec, named); err != nil {
		return api.Image{}, err
	}
	out, err := s.db.GetImage(ctx, rec.ID)
	if err != nil {
		return api.Image{}, err
	}
	return toAPI(out, tenant)
}

// ConfigOf returns a stored image's OCI configuration.
func (s *Store) ConfigOf(ctx context.Context, id string) (*v1.ConfigFile, error) {
	if s.db == nil {
		return nil, errdefs.New(errdefs.NotFound, "image %q not found: this store has only the host image", id)
	}
	rec, err := s.db.GetImage(ctx, id)
	if err != nil {
		return nil, err
	}
	return v1.ParseConfigFile(bytes.NewReader(rec.Config))
}

// Forget removes the row of build step image id, which StoreBuilt granted
// tenant, if it is then unnamed and unused, keeping its layers (the build
// cache has them).
func (s *Store) Forget(ctx context.Context, tenant, id string) error {
	if s.db == nil {
		return nil
	}
	if tenant != "" {
		if err := s.db.Untag(ctx, tenant, id); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	_, err := s.db.DeleteIntermediate(ctx, id)
	return err
}
