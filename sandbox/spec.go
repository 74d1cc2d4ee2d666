package sandbox

import (
	"context"
	"fmt"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

// resolve turns a normalized request into the one runtime.Spec its runtime
// realizes: the sandbox's own range of host ids (idRange, see idRanges),
// the image's layers and mounts prepared for it, the network attachment and
// the limits. Create, start and the warm pool all come through here, so
// what a sandbox is made of is decided in this one place; the network and
// snapshot subsystems add their parts here too.
//
// A runtime that idmaps layers gets the image as one copy for every
// sandbox, mounted through each one's range; for another the image store
// keeps a copy owned by the range (made the first time a range is used).
// The sandbox's writable layer gets, at each boot, the files its network
// needs: the resolver, and the trust of the sandbox's CA.
//
// imageRef is what to resolve: the id of the stored image the sandbox is
// pinned to, or the host image.
func (m *Manager) resolve(ctx context.Context, id string, idRange uint32, req api.CreateSandboxRequest, imageRef string) (runtime.Spec, error) {
	t, err := m.tier(req.Runtime)
	if err != nil {
		return runtime.Spec{}, err
	}
	users := m.cfg.IDMap.Range(idRange)
	layers := users
	if t.caps.IDMappedLayers {
		layers = image.Unmapped
	}
	img, err := m.resolveImage(ctx, imageRef, layers)
	if err != nil {
		return runtime.Spec{}, err
	}
	netw, files, err := m.networkSpec(ctx, id, networkOf(req), img.Root.Layers)
	if err != nil {
		return runtime.Spec{}, err
	}
	return runtime.Spec{
		ID:       id,
		Hostname: id,
		Root:     img.Root,
		Mounts:   img.Mounts,
		Users:    users,
		Network:  netw,
		Limits:   runtime.Limits(req.Limits),
		Files:    files,
	}, nil
}

// imageRef is what a sandbox's root resolves from: its pinned image, or
// the image it names (the host image has no id).
func imageRef(rec store.Sandbox) string {
	if rec.ImageID != "" {
		return rec.ImageID
	}
	return rec.Image
}

// resolveImage prepares a stored image, the host image or a snapshot (its
// layers over its base) for a sandbox whose layers map as ids.
func (m *Manager) resolveImage(ctx context.Context, ref string, ids runtime.IDMap) (image.Resolved, error) {
	if !isSnapshotID(ref) {
		return m.images.Resolve(ctx, ref, ids)
	}
	si, err := m.snapshotImages()
	if err != nil {
		return image.Resolved{}, err
	}
	sn, err := m.store.GetSnapshot(ctx, ref)
	if err != nil {
		return image.Resolved{}, err
	}
	res, err := si.ResolveOver(ctx, sn.Base, sn.Layers, ids)
	if err != nil {
		return image.Resolved{}, fmt.Errorf("snapshot %s: %w", sn.ID, err)
	}
	res.Root.Image = api.SnapshotPrefix + sn.ID
	return res, nil
}
