package native

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/layer"
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
	return layer.Freeze(ctx, g, id)
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
	return layer.Upper(id, r.sandboxDir(id))
}

// Capture implements runtime.Capturer (see layer.Capture), freezing the
// sandbox with its cgroup.
func (r *Runtime) Capture(ctx context.Context, id string, users runtime.IDMap, skip map[string][]byte, dst string) (runtime.Capture, error) {
	var f layer.Freezer
	g, err := r.cgroups.Load(id)
	switch {
	case err == nil:
		f = g
	case !errors.Is(err, os.ErrNotExist): // not stopped
		return runtime.Capture{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	noFreeze := ""
	if !r.caps.Pause {
		noFreeze = r.caps.Missing["pause"]
	}
	return layer.Capture(ctx, id, r.sandboxDir(id), users, skip, dst, f, noFreeze)
}

// ClearLayer implements runtime.Archiver: the upper and work directories
// go, and a disk of the sandbox's own with them.
func (r *Runtime) ClearLayer(ctx context.Context, id string) error {
	if err := layer.Clear(r.sandboxDir(id)); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// RenewLayer implements runtime.Archiver.
func (r *Runtime) RenewLayer(ctx context.Context, spec runtime.Spec, fill func(dir string) error) error {
	return layer.Renew(ctx, r.sandboxDir(spec.ID), spec, fill)
}
