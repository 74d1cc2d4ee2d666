package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berthsh/berth/cgroup"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/layerdiff"
	"github.com/berthsh/berth/runtime"
)

// Pause implements runtime.Pauser with the sandbox's cgroup freezer.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	if !r.caps.Pause {
		return errdefs.New(errdefs.NotImplemented, "pause: %s", r.caps.Missing["pause"])
	}
	g, err := r.group(id)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return freeze(ctx, g, id)
}

// freeze freezes sandbox id's group. A group made by a daemon from before
// the freezer (v1) has no freezer directory: that is a conflict its
// restart resolves.
func freeze(ctx context.Context, g cgroup.Group, id string) error {
	err := g.Freeze(ctx)
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.New(errdefs.Conflict, "sandbox %s was started by an older berth whose sandboxes cannot be frozen: stop and start it once (%v)", id, err)
	}
	return err
}

// Resume implements runtime.Pauser.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	g, err := r.group(id)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return g.Thaw()
}

// WritableLayer implements runtime.Capturer: the overlay's upper directory.
func (r *Runtime) WritableLayer(id string) (string, error) {
	upper, _ := layerDirs(r.sandboxDir(id))
	if _, err := os.Lstat(upper); err != nil {
		return "", errdefs.New(errdefs.NotFound, "sandbox %s has no writable layer: %v", id, err)
	}
	return upper, nil
}

// Capture implements runtime.Capturer. A sandbox that runs is copied
// twice: once while it runs (the bulk, however long it takes), then,
// frozen, only what changed since the first pass began. The freeze lasts
// one walk of the layer plus the files written meanwhile. A paused
// sandbox is frozen already and copied once, as is a stopped one.
func (r *Runtime) Capture(ctx context.Context, id string, users runtime.IDMap, skip map[string][]byte, dst string) (runtime.Capture, error) {
	upper, err := r.WritableLayer(id)
	if err != nil {
		return runtime.Capture{}, err
	}
	o := layerdiff.CopyOptions{IDs: layerdiff.IDs{Base: users.HostID, Size: users.Size}, Skip: skip}
	g, gerr := r.cgroups.Load(id)
	if errors.Is(gerr, os.ErrNotExist) { // stopped
		st, err := layerdiff.Copy(dst, upper, o)
		return captured(st, 0), err
	}
	if gerr != nil {
		return runtime.Capture{}, fmt.Errorf("sandbox %s: %w", id, gerr)
	}
	frozen, err := g.Frozen()
	if err != nil {
		return runtime.Capture{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if frozen { // paused: still already
		st, err := layerdiff.Copy(dst, upper, o)
		return captured(st, 0), err
	}
	if !r.caps.Pause {
		return runtime.Capture{}, errdefs.New(errdefs.NotImplemented, "snapshot of a running sandbox: its processes must be frozen for an instant, and %s; stop it first", r.caps.Missing["pause"])
	}
	first := time.Now()
	live := o
	live.Live = true
	st, err := layerdiff.Copy(dst, upper, live)
	if err != nil {
		return runtime.Capture{}, err
	}
	o.Since, o.FineTimes = first.Add(-layerdiff.SinceMargin), st.FineTimes
	t0 := time.Now()
	if err := freeze(ctx, g, id); err != nil {
		return runtime.Capture{}, fmt.Errorf("sandbox %s: freeze: %w", id, err)
	}
	st, err = layerdiff.Copy(dst, upper, o)
	held := time.Since(t0)
	if terr := g.Thaw(); terr != nil {
		return runtime.Capture{}, errors.Join(err, fmt.Errorf("sandbox %s: thaw: %w", id, terr))
	}
	return captured(st, held), err
}

func captured(st layerdiff.CopyStats, frozen time.Duration) runtime.Capture {
	return runtime.Capture{Entries: st.Entries, Bytes: st.Bytes, Frozen: frozen, Reflinked: st.Reflinked}
}

// ClearLayer implements runtime.Archiver: the upper and work directories
// go, and a disk of the sandbox's own with them.
func (r *Runtime) ClearLayer(ctx context.Context, id string) error {
	dir := r.sandboxDir(id)
	if _, err := os.Stat(filepath.Join(dir, diskImage)); err == nil {
		if err := unmountDisk(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		for _, p := range []string{filepath.Join(dir, diskImage), filepath.Join(dir, diskMount)} {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("sandbox %s: free its disk: %w", id, err)
			}
		}
		return nil
	}
	upper, work := layerDirs(dir)
	for _, p := range []string{upper, work} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("sandbox %s: free its writable layer: %w", id, err)
		}
	}
	return nil
}

// RenewLayer implements runtime.Archiver.
func (r *Runtime) RenewLayer(ctx context.Context, spec runtime.Spec, fill func(dir string) error) error {
	if err := r.ClearLayer(ctx, spec.ID); err != nil { // what a cut-off renew left
		return err
	}
	upper, err := makeLayer(ctx, r.sandboxDir(spec.ID), spec.Limits.DiskBytes, int(spec.Users.HostID))
	if err == nil {
		err = fill(upper)
	}
	if err != nil {
		if cerr := r.ClearLayer(context.WithoutCancel(ctx), spec.ID); cerr != nil {
			r.log.Error("failed renew: clear the layer", "sandbox", spec.ID, "err", cerr)
		}
		return err
	}
	return nil
}
