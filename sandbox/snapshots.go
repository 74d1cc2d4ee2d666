package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/layerdiff"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

// SnapshotImages is what snapshots need of the image store beyond Images:
// a layer copied from a sandbox, roots stacked from such layers, and the
// removal of layers nothing lists any more (image.Store).
type SnapshotImages interface {
	CopyLayer(ctx context.Context, fill func(dir string) (size int64, empty bool, err error)) (name string, size int64, err error)
	ResolveOver(ctx context.Context, base string, layers []string, ids runtime.IDMap) (image.Resolved, error)
	LayerDirs(layers []string) []string
	Collect(ctx context.Context) (api.PruneResult, error)
}

// snapshotIDPrefix begins a snapshot's id, which sandboxes made from it
// carry as their image id.
const snapshotIDPrefix = "snap-"

func isSnapshotID(ref string) bool { return strings.HasPrefix(ref, snapshotIDPrefix) }

var snapshotNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`) })

func (m *Manager) snapshotImages() (SnapshotImages, error) {
	si, ok := m.images.(SnapshotImages)
	if !ok {
		return nil, errdefs.New(errdefs.NotImplemented, "this daemon's image store cannot keep snapshots")
	}
	return si, nil
}

// snapshottable is the conflict error unless a sandbox's state lets its
// files be captured: running (frozen for an instant), paused or stopped.
func snapshottable(rec store.Sandbox, what string) error {
	switch rec.State {
	case api.StateRunning, api.StatePaused, api.StateStopped:
		return notArchived(rec)
	}
	return errdefs.New(errdefs.Conflict, "sandbox %s is %s; %s a running, paused or stopped sandbox", rec.ID, rec.State, what)
}

// Snapshot captures a sandbox's files as a named snapshot. A running
// sandbox keeps running; its processes are frozen for the capture's last
// pass only (Snapshot.FrozenMs says how long).
func (m *Manager) Snapshot(ctx context.Context, tenant, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	if !snapshotNameRE().MatchString(req.Name) {
		return api.Snapshot{}, errdefs.New(errdefs.InvalidArgument, "name: %q is not a snapshot name (letters, digits and \"._-\", up to 128, starting with a letter or digit)", req.Name)
	}
	if err := labels.Validate(req.Labels); err != nil {
		return api.Snapshot{}, err
	}
	if _, err := m.store.SnapshotByName(ctx, tenant, req.Name); err == nil {
		return api.Snapshot{}, errdefs.New(errdefs.AlreadyExists, "snapshot %q already exists", req.Name)
	}
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	if err := snapshottable(rec, "snapshot"); err != nil {
		return api.Snapshot{}, err
	}
	release, err := m.admitSnapshot(ctx, rec.Tenant)
	if err != nil {
		return api.Snapshot{}, err
	}
	defer release()
	sn, err := m.capture(ctx, rec, req.Name, req.Labels, true)
	if err != nil {
		return api.Snapshot{}, err
	}
	return snapshotToAPI(sn), nil
}

// capture copies a sandbox's writable layer into the image store and
// records it as a snapshot named name ("" for a fork's). When the sandbox
// changed nothing over its image, nothing is stored unless always: sn then
// has no ID (only Frozen). The caller holds the sandbox's operation lock.
func (m *Manager) capture(ctx context.Context, rec store.Sandbox, name string, lbls map[string]string, always bool) (sn store.Snapshot, err error) {
	si, err := m.snapshotImages()
	if err != nil {
		return sn, err
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return sn, err
	}
	c, ok := t.rt.(runtime.Capturer)
	if !ok || !t.caps.Snapshot {
		return sn, t.lacks("snapshot", "snapshot a sandbox")
	}
	spec, err := recordSpec(rec)
	if err != nil {
		return sn, err
	}
	sn = store.Snapshot{Tenant: rec.Tenant, Name: name, Sandbox: rec.ID, Base: image.Host, Image: rec.Image, Labels: lbls, CreatedAt: m.cfg.Now().UTC()}
	if rec.ImageID != "" {
		sn.Base = rec.ImageID
	}
	if isSnapshotID(rec.ImageID) {
		parent, err := m.store.GetSnapshot(ctx, rec.ImageID)
		if err != nil {
			return sn, err
		}
		sn.Base, sn.Parent, sn.Layers, sn.Image = parent.Base, parent.ID, parent.Layers, parent.Image
	}
	if sn.Config, err = json.Marshal(snapshotConfig{Env: spec.Env, Workdir: spec.Workdir, User: spec.User, Runtime: spec.Runtime}); err != nil {
		return sn, err
	}
	var capt runtime.Capture
	skip := m.berthFiles(ctx, rec.ID)
	users := m.cfg.IDMap.Range(rec.IDRange)
	layer, size, err := si.CopyLayer(ctx, func(dir string) (int64, bool, error) {
		var err error
		capt, err = c.Capture(ctx, rec.ID, users, skip, dir)
		return capt.Bytes, capt.Entries == 0, err
	})
	if errors.Is(err, syscall.ENOSPC) {
		return sn, errdefs.Wrap(errdefs.ResourceExhausted, err, "snapshot of %s: the state directory's disk is full; nothing was kept", rec.ID)
	}
	if err != nil {
		return sn, err
	}
	sn.Frozen = capt.Frozen
	if layer == "" && !always {
		return store.Snapshot{Frozen: capt.Frozen}, nil
	}
	if layer != "" {
		sn.Layers = append(append([]string(nil), sn.Layers...), layer)
		sn.Size = size
	}
	if sn.ID, err = newSnapshotID(); err != nil {
		m.collect(ctx)
		return sn, err
	}
	if err := m.store.PutSnapshot(ctx, sn); err != nil {
		m.collect(ctx)
		return sn, err
	}
	m.log.Info("snapshot", "sandbox", rec.ID, "snapshot", sn.ID, "name", name, "entries", capt.Entries,
		"bytes", capt.Bytes, "frozen", capt.Frozen, "reflinked", capt.Reflinked)
	return sn, nil
}

// snapshotConfig is a snapshot's defaults for sandboxes made from it: the
// source's.
type snapshotConfig struct {
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	User    string            `json:"user,omitempty"`
	Runtime string            `json:"runtime,omitempty"`
}

// collect removes the layers nothing lists any more, logging a failure
// (the next collect or prune tries again).
func (m *Manager) collect(ctx context.Context) {
	si, err := m.snapshotImages()
	if err != nil {
		return
	}
	if _, err := si.Collect(context.WithoutCancel(ctx)); err != nil {
		m.log.Error("remove unused layers", "err", err)
	}
}

func newSnapshotID() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return snapshotIDPrefix + hex.EncodeToString(b), nil
}

func snapshotToAPI(sn store.Snapshot) api.Snapshot {
	out := api.Snapshot{ID: sn.ID, Name: sn.Name, Sandbox: sn.Sandbox, Image: sn.Image, Parent: sn.Parent,
		SizeBytes: sn.Size, Labels: sn.Labels, FrozenMs: float64(sn.Frozen.Microseconds()) / 1000, CreatedAt: sn.CreatedAt}
	if sn.Base != image.Host {
		out.BaseImageID = sn.Base
	}
	return out
}

// snapshot finds the tenant's snapshot by name, "snapshot:NAME" or id. A
// name may begin as ids do ("snap-daily"): what is no id is a name.
func (m *Manager) snapshot(ctx context.Context, tenant, ref string) (store.Snapshot, error) {
	ref = strings.TrimPrefix(ref, api.SnapshotPrefix)
	if isSnapshotID(ref) {
		sn, err := m.store.GetSnapshot(ctx, ref)
		if err == nil && (tenant == "" || sn.Tenant == tenant) {
			return sn, nil
		}
		if err != nil && !errdefs.IsNotFound(err) {
			return sn, err
		}
	}
	return m.store.SnapshotByName(ctx, tenant, ref)
}

// GetSnapshot returns a snapshot with the sandboxes made from it.
func (m *Manager) GetSnapshot(ctx context.Context, tenant, ref string) (api.Snapshot, error) {
	sn, err := m.snapshot(ctx, tenant, ref)
	if err != nil {
		return api.Snapshot{}, err
	}
	out := snapshotToAPI(sn)
	if out.InUse, err = m.store.ImageUsers(ctx, sn.ID); err != nil {
		return api.Snapshot{}, err
	}
	return out, nil
}

// ListSnapshots returns the tenant's named snapshots that match sel.
func (m *Manager) ListSnapshots(ctx context.Context, tenant string, sel labels.Selector) ([]api.Snapshot, error) {
	all, err := m.store.ListSnapshots(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := []api.Snapshot{}
	for _, sn := range all {
		if sel.Matches(sn.Labels) {
			out = append(out, snapshotToAPI(sn))
		}
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot and the layers only it had; one that a
// sandbox is made from is refused (conflict naming them). Sandboxes made
// from its snapshots keep its layers.
func (m *Manager) DeleteSnapshot(ctx context.Context, tenant, ref string) error {
	sn, err := m.snapshot(ctx, tenant, ref)
	if err != nil {
		return err
	}
	if err := m.store.DeleteSnapshot(ctx, sn.ID); err != nil {
		return err
	}
	m.collect(ctx)
	m.releaseSnapshot(ctx, sn.Parent) // a fork's, kept for this one
	return nil
}

// releaseSnapshot removes a fork's unnamed snapshot once no sandbox is
// made from it any more.
func (m *Manager) releaseSnapshot(ctx context.Context, id string) {
	if !isSnapshotID(id) {
		return
	}
	gone, err := m.store.DeleteUnusedSnapshot(context.WithoutCancel(ctx), id)
	if err != nil {
		m.log.Error("remove a fork's snapshot", "snapshot", id, "err", err)
		return
	}
	if gone {
		m.collect(ctx)
	}
}

// snapshotDefaults fills a create request from snapshot sn's defaults, as
// normalize does from an image's config, and returns the id that pins it.
func (m *Manager) snapshotDefaults(sn store.Snapshot, req api.CreateSandboxRequest) (api.CreateSandboxRequest, error) {
	var c snapshotConfig
	if err := json.Unmarshal(sn.Config, &c); err != nil {
		return req, errdefs.New(errdefs.Internal, "snapshot %s: bad config: %v", sn.ID, err)
	}
	if req.Workdir == "" {
		req.Workdir = c.Workdir
	}
	if req.User == "" {
		req.User = c.User
	}
	if len(c.Env) > 0 {
		env := make(map[string]string, len(c.Env)+len(req.Env))
		for k, v := range c.Env {
			env[k] = v
		}
		for k, v := range req.Env {
			env[k] = v
		}
		req.Env = env
	}
	return req, nil
}

// SnapshotImage is snapshot ref as an image a template builds on: its base
// image's configuration (with the snapshot's env, user and workdir) and
// layers, and the snapshot's layers stored again as content-addressed
// layers (a tar of each, as a pulled layer is stored), so that the
// template names only digests. A snapshot of a host-image sandbox has no
// image under it and is refused. key identifies the snapshot's content.
func (m *Manager) SnapshotImage(ctx context.Context, tenant, ref string) (cf v1.ConfigFile, key string, err error) {
	si, err := m.snapshotImages()
	if err != nil {
		return cf, "", err
	}
	ls, ok := m.images.(layerStore)
	if !ok {
		return cf, "", errdefs.New(errdefs.NotImplemented, "this daemon's image store cannot store layers")
	}
	sn, err := m.snapshot(ctx, tenant, ref)
	if err != nil {
		return cf, "", err
	}
	if sn.Base == image.Host {
		return cf, "", errdefs.New(errdefs.InvalidArgument, "snapshot %s is of a sandbox made from the host image, a view of this host's directories, not an image to build on", snapshotName(sn))
	}
	base, err := ls.ConfigOf(ctx, sn.Base)
	if err != nil {
		return cf, "", err
	}
	cf = v1.ConfigFile{Config: base.Config, RootFS: v1.RootFS{Type: "layers", DiffIDs: slices.Clone(base.RootFS.DiffIDs)}}
	var c snapshotConfig
	if err := json.Unmarshal(sn.Config, &c); err == nil {
		cf.Config.WorkingDir, cf.Config.User = c.Workdir, c.User
		cf.Config.Env = nil
		for _, k := range slices.Sorted(maps.Keys(c.Env)) {
			cf.Config.Env = append(cf.Config.Env, k+"="+c.Env[k])
		}
	}
	dirs := si.LayerDirs(sn.Layers) // topmost first
	for i := len(dirs) - 1; i >= 0; i-- {
		pr, pw := io.Pipe()
		go func() { // owned here: ends with the pipe, which StoreLayer reads to the end or closes
			_, err := layerdiff.Write(pw, dirs[i], layerdiff.Options{IDs: layerdiff.IDs{Base: image.Unmapped.HostID, Size: image.Unmapped.Size}})
			pw.CloseWithError(err)
		}()
		diff, _, err := ls.StoreLayer(ctx, pr)
		pr.CloseWithError(io.ErrClosedPipe)
		if err != nil {
			return cf, "", fmt.Errorf("snapshot %s: store its layer for a template: %w", snapshotName(sn), err)
		}
		if diff == "" {
			continue
		}
		h, err := v1.NewHash(diff)
		if err != nil {
			return cf, "", err
		}
		cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, h)
	}
	return cf, sn.ID, nil
}

// layerStore is what SnapshotImage needs of the image store (image.Store).
type layerStore interface {
	ConfigOf(ctx context.Context, id string) (*v1.ConfigFile, error)
	StoreLayer(ctx context.Context, r io.Reader) (diff string, size int64, err error)
}
