package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
)

// SnapshotLayerPrefix begins the name of a layer copied from a sandbox's
// writable layer. Such a layer is named at random, not by a digest of its
// content: reading the content to name it would cost as much as the copy.
const SnapshotLayerPrefix = "snapshot:"

// CopyLayer stores a layer that fill writes into dir (an empty directory
// in the store, on the file system of the store's layers, so a copy can
// reflink): a snapshot's copy of a sandbox's writable layer. fill returns
// the bytes it wrote, and whether the layer is empty: then nothing is
// stored and name is "". On error nothing of it is left. The layer is
// kept while a snapshot or image lists it (see Collect).
func (s *Store) CopyLayer(ctx context.Context, fill func(dir string) (size int64, empty bool, err error)) (name string, size int64, err error) {
	if s.db == nil {
		return "", 0, errdefs.New(errdefs.NotImplemented, "image store: this store has only the host image")
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	tmp, err := s.newLayerDir()
	if err != nil {
		return "", 0, err
	}
	size, empty, err := fill(tmp)
	if err != nil || empty {
		removeAll(tmp)
		return "", 0, err
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		removeAll(tmp)
		return "", 0, err
	}
	name = SnapshotLayerPrefix + hex.EncodeToString(b)
	if err := s.placeLayer(ctx, tmp, name, size); err != nil {
		return "", 0, err
	}
	return name, size, nil
}

// ResolveOver prepares base (the host image or a stored image's id) with
// the stored layers above it (bottom first) on top, for sandboxes whose
// ids map as ids: a snapshot's root file system.
func (s *Store) ResolveOver(ctx context.Context, base string, layers []string, ids runtime.IDMap) (Resolved, error) {
	res, err := s.Resolve(ctx, base, ids)
	if err != nil {
		return Resolved{}, err
	}
	if len(layers) == 0 {
		return res, nil
	}
	if len(layers)+len(res.Root.Layers) > maxLayers {
		return Resolved{}, errdefs.New(errdefs.InvalidArgument, "a root of %d layers, over the %d a sandbox's root can stack: snapshot a sandbox made from a snapshot's snapshot less deeply", len(layers)+len(res.Root.Layers), maxLayers)
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	top, err := s.layerDirsFor(ctx, layers, ids, "the snapshot cannot be used")
	if err != nil {
		return Resolved{}, fmt.Errorf("snapshot: %w", err)
	}
	res.Root.Layers = append(top, res.Root.Layers...)
	return res, nil
}

// LayerDirs returns stored layers' directories as stored (ids as a sandbox
// sees them), topmost first, for reading (a diff); layers are given
// bottom first.
func (s *Store) LayerDirs(layers []string) []string {
	out := make([]string, 0, len(layers))
	for i := len(layers) - 1; i >= 0; i-- {
		out = append(out, s.layerDir(layers[i]))
	}
	return out
}

// Collect removes the layers (and their range copies) that no image,
// snapshot or cached build step lists any more.
func (s *Store) Collect(ctx context.Context) (api.PruneResult, error) {
	res := api.PruneResult{Images: []string{}}
	if s.db == nil {
		return res, nil
	}
	s.gc.Lock()
	defer s.gc.Unlock()
	err := s.removeUnreferenced(ctx, &res)
	return res, err
}
