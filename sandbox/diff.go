package sandbox

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/layerdiff"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/snapshot"
	"github.com/berthsh/berth/store"
)

// diffResult is what a sandbox changed over its image or a snapshot.
type diffResult struct {
	against  string
	changes  []snapshot.Change
	from, to snapshot.Stack
	opts     snapshot.Options
}

// Diff compares a sandbox's files with its image, or with snapshot
// against ("snapshot:NAME", a name or an id), the usual question after an
// agent worked from that snapshot: the changes as a list, or with format
// tar (a layer tar: what was added and modified, whiteouts for what was
// deleted) or patch (a unified text diff) written to what out returns
// once the changes are known. A running sandbox's files are read as they
// are, while it writes: a snapshot gives a still view.
func (m *Manager) Diff(ctx context.Context, tenant, id, against, format string, out func() io.Writer) (api.DiffResponse, error) {
	switch format {
	case "", api.DiffJSON, api.DiffTar, api.DiffPatch:
	default:
		return api.DiffResponse{}, errdefs.New(errdefs.InvalidArgument, "format: %q is not json, tar or patch", format)
	}
	d, err := m.diff(ctx, tenant, id, against)
	if err != nil {
		return api.DiffResponse{}, err
	}
	switch format {
	case api.DiffTar:
		return api.DiffResponse{}, snapshot.WriteTar(ctx, out(), d.changes, d.to)
	case api.DiffPatch:
		return api.DiffResponse{}, snapshot.WriteUnified(ctx, out(), d.changes, d.from, d.to, d.opts)
	}
	return api.DiffResponse{Against: d.against, Changes: changesToAPI(d.changes)}, nil
}

func (m *Manager) diff(ctx context.Context, tenant, id, against string) (*diffResult, error) {
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	to, err := m.sandboxStack(ctx, rec)
	if err != nil {
		return nil, err
	}
	d := &diffResult{to: to, opts: snapshot.Options{Skip: m.berthFiles(ctx, id)}}
	if against == "" {
		d.against = rec.Image
		d.from = to[1:]
	} else {
		sn, err := m.snapshot(ctx, tenant, against)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ClassOf(err), err, "against")
		}
		d.against = api.SnapshotPrefix + snapshotName(sn)
		if d.from, err = m.snapshotStack(ctx, sn.Base, sn.Layers); err != nil {
			return nil, err
		}
	}
	if d.changes, err = snapshot.Changes(ctx, d.from, d.to, d.opts); err != nil {
		return nil, err
	}
	return d, nil
}

func snapshotName(sn store.Snapshot) string {
	if sn.Name != "" {
		return sn.Name
	}
	return sn.ID
}

// sandboxStack is a sandbox's root file system for reading: its live
// writable layer over its image's layers as stored.
func (m *Manager) sandboxStack(ctx context.Context, rec store.Sandbox) (snapshot.Stack, error) {
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return nil, err
	}
	c, ok := t.rt.(runtime.Capturer)
	if !ok || !t.caps.Snapshot {
		return nil, t.lacks("snapshot", "read what a sandbox changed")
	}
	switch rec.State {
	case api.StateRunning, api.StatePaused, api.StateStopped:
		if err := notArchived(rec); err != nil {
			return nil, err
		}
	default:
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s is %s; its files can be compared when it is running, paused or stopped", rec.ID, rec.State)
	}
	upper, err := c.WritableLayer(rec.ID)
	if err != nil {
		return nil, err
	}
	users := m.cfg.IDMap.Range(rec.IDRange)
	top := snapshot.Layer{Dir: upper, IDs: layerdiff.IDs{Base: users.HostID, Size: users.Size}}
	ref := imageRef(rec)
	if isSnapshotID(ref) {
		sn, err := m.store.GetSnapshot(ctx, ref)
		if err != nil {
			return nil, err
		}
		base, err := m.snapshotStack(ctx, sn.Base, sn.Layers)
		return append(snapshot.Stack{top}, base...), err
	}
	base, err := m.snapshotStack(ctx, ref, nil)
	return append(snapshot.Stack{top}, base...), err
}

// snapshotStack is image base with stored layers (bottom first) on top,
// as stored: ids as sandboxes see them.
func (m *Manager) snapshotStack(ctx context.Context, base string, layers []string) (snapshot.Stack, error) {
	si, err := m.snapshotImages()
	if err != nil {
		return nil, err
	}
	res, err := si.ResolveOver(ctx, base, layers, image.Unmapped)
	if err != nil {
		return nil, err
	}
	out := make(snapshot.Stack, len(res.Root.Layers))
	for i, dir := range res.Root.Layers {
		out[i] = snapshot.Layer{Dir: dir, IDs: layerdiff.IDs{Base: image.Unmapped.HostID, Size: image.Unmapped.Size}}
	}
	return out, nil
}

func changesToAPI(cs []snapshot.Change) []api.Change {
	out := make([]api.Change, len(cs))
	for i, c := range cs {
		out[i] = api.Change{Path: c.Path, Kind: c.Kind, Type: c.Type, Mode: c.Mode, Size: c.Size, UID: c.UID, GID: c.GID, Link: c.Link}
	}
	return out
}

// Apply writes what another sandbox, or a snapshot, changed onto a
// running sandbox: a three-way merge over the other's base (its image, or
// the snapshot's parent). A path both changed differently is a conflict:
// the whole apply is refused, listing them, unless req.Overwrite, when
// theirs wins. The files are written by the sandbox's guest, inside it.
func (m *Manager) Apply(ctx context.Context, tenant, id string, req api.ApplyRequest) (api.ApplyResult, error) {
	if req.From == "" {
		return api.ApplyResult{}, errdefs.New(errdefs.InvalidArgument, "from: required (a sandbox id or snapshot:NAME)")
	}
	if req.From == id {
		return api.ApplyResult{}, errdefs.New(errdefs.InvalidArgument, "from: %s is the sandbox itself", id)
	}
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return api.ApplyResult{}, err
	}
	ours, err := m.sandboxStack(ctx, rec)
	if err != nil {
		return api.ApplyResult{}, err
	}
	theirs, base, err := m.applySource(ctx, tenant, req.From)
	if err != nil {
		return api.ApplyResult{}, err
	}
	// Files berth writes into every sandbox are its own business: not merged.
	skip := map[string][]byte{}
	for p := range m.berthFiles(ctx, id) {
		skip[p] = nil
	}
	skip[trustBundle], skip[caFile] = nil, nil
	changes, conflicts, err := snapshot.Merge(ctx, base, ours, theirs, snapshot.Options{Skip: skip})
	if err != nil {
		return api.ApplyResult{}, err
	}
	res := api.ApplyResult{Changes: changesToAPI(changes)}
	for _, c := range conflicts {
		res.Conflicts = append(res.Conflicts, c.Path)
	}
	if len(conflicts) > 0 && !req.Overwrite {
		shown := res.Conflicts
		if len(shown) > 20 {
			shown = append(shown[:20:20], fmt.Sprintf("… (%d in all)", len(res.Conflicts)))
		}
		err := errdefs.New(errdefs.Conflict, "apply %s onto %s: both changed %s differently; nothing was applied (apply with overwrite to let %s's changes win)",
			req.From, id, strings.Join(shown, ", "), req.From)
		return api.ApplyResult{}, errdefs.WithPaths(errdefs.WithReason(err, errdefs.MergeConflict), res.Conflicts)
	}
	if len(changes) == 0 {
		return res, nil
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { // owned here: the pipe's reader ends when applyTar returns
		err := snapshot.WriteTar(ctx, pw, changes, theirs)
		pw.CloseWithError(err)
		done <- err
	}()
	got, aerr := m.applyTar(ctx, tenant, id, pr, -1)
	pr.CloseWithError(io.ErrClosedPipe)
	if werr := <-done; aerr == nil && werr != nil && werr != io.ErrClosedPipe {
		aerr = werr
	}
	if aerr != nil {
		return api.ApplyResult{}, aerr
	}
	res.Entries, res.Whiteouts, res.Bytes = got.Entries, got.Whiteouts, got.Bytes
	return res, nil
}

// ApplyTar applies a layer tar (diff's format=tar, from this daemon or
// another) onto a running sandbox as it comes: there is no base to merge
// against, so nothing is a conflict. The sandbox's guest applies it
// inside: an entry that would leave the root, or go into /proc, /sys or
// /dev, refuses the whole tar before anything changes.
func (m *Manager) ApplyTar(ctx context.Context, tenant, id string, tarStream io.Reader, size int64) (api.ApplyResult, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	got, err := m.applyTar(ctx, tenant, id, tarStream, size)
	if err != nil {
		return api.ApplyResult{}, err
	}
	return api.ApplyResult{Changes: []api.Change{}, Entries: got.Entries, Whiteouts: got.Whiteouts, Bytes: got.Bytes}, nil
}

// applyTar has sandbox id's guest apply a layer tar at its root, as root.
func (m *Manager) applyTar(ctx context.Context, tenant, id string, tarStream io.Reader, size int64) (guestapi.ApplyResult, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return guestapi.ApplyResult{}, err
	}
	if !slices.Contains(ls.features, guestapi.FeatureApply) {
		return guestapi.ApplyResult{}, errdefs.New(errdefs.NotImplemented, "sandbox %s runs an older guest that cannot apply changes: stop and start it to run the current one", id)
	}
	ls.streams.Add(1) // a long apply is activity
	defer ls.streams.Add(-1)
	res, err := ls.guest.Apply(ctx, guestapi.Where{User: "root"}, "/", tarStream, size)
	return res, m.gone(id, err)
}

// applySource resolves what an apply takes its changes from: a sandbox
// (its files over its image) or a snapshot (its files over its parent's).
func (m *Manager) applySource(ctx context.Context, tenant, from string) (theirs, base snapshot.Stack, err error) {
	if strings.HasPrefix(from, api.SnapshotPrefix) || isSnapshotID(from) {
		sn, err := m.snapshot(ctx, tenant, from)
		if err != nil {
			return nil, nil, errdefs.Wrap(errdefs.ClassOf(err), err, "from")
		}
		if theirs, err = m.snapshotStack(ctx, sn.Base, sn.Layers); err != nil {
			return nil, nil, err
		}
		var parent []string
		if sn.Parent != "" {
			p, err := m.store.GetSnapshot(ctx, sn.Parent)
			if err != nil {
				return nil, nil, fmt.Errorf("snapshot %s's parent: %w", sn.ID, err)
			}
			parent = p.Layers
		}
		base, err = m.snapshotStack(ctx, sn.Base, parent)
		return theirs, base, err
	}
	other, err := m.record(ctx, tenant, from)
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.ClassOf(err), err, "from")
	}
	if theirs, err = m.sandboxStack(ctx, other); err != nil {
		return nil, nil, err
	}
	return theirs, theirs[1:], nil
}
