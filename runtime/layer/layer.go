// Package layer keeps a sandbox's writable layer on the host, the same for
// every runtime that stacks it over image layers: overlayfs's upper and work
// directories in the sandbox's directory (on a disk of its own when the
// sandbox has a disk limit), the files it starts with, and consistent
// copies of it while it runs.
package layer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/layerdiff"
	"github.com/berthsh/berth/runtime"
)

// Make makes a sandbox's writable layer in its directory dir: the overlay's
// upper and work directories, owned by root (the sandbox's root, as the
// host sees it), on a disk of its own of diskBytes (0: none). It returns
// upper.
func Make(ctx context.Context, dir string, diskBytes int64, root int) (string, error) {
	if diskBytes > 0 {
		if err := makeDisk(ctx, dir, diskBytes, root); err != nil {
			return "", err
		}
	}
	upper, work := Dirs(dir)
	if err := MakeDir(upper, 0o755, root); err != nil {
		return "", err
	}
	return upper, MakeDir(work, 0o700, root)
}

// MakeDir makes directory p with mode, owned by root.
func MakeDir(p string, mode os.FileMode, root int) error {
	if err := os.Mkdir(p, mode); err != nil {
		return fmt.Errorf("make %s: %w", filepath.Base(p), err)
	}
	if err := os.Chown(p, root, root); err != nil {
		return fmt.Errorf("chown %s: %w", filepath.Base(p), err)
	}
	return nil
}

// Ready makes the layer of sandbox directory dir usable before a start: its
// disk mounted again (after a host reboot), and upper there. It returns upper.
func Ready(id, dir string) (string, error) {
	if HasDisk(dir) {
		if err := MountDisk(dir); err != nil {
			return "", err
		}
	}
	upper, _ := Dirs(dir)
	if !exists(upper) {
		return "", errdefs.New(errdefs.NotFound, "sandbox %s has no files to start from", id)
	}
	return upper, nil
}

// HasDisk says whether the layer in dir is on a disk of its own.
func HasDisk(dir string) bool { return exists(filepath.Join(dir, diskImage)) }

// Upper is the upper directory of sandbox id's layer in dir, for reading
// (a diff or a copy) while it runs. Its contents are the sandbox's: hostile.
func Upper(id, dir string) (string, error) {
	upper, _ := Dirs(dir)
	if _, err := os.Lstat(upper); err != nil {
		return "", errdefs.New(errdefs.NotFound, "sandbox %s has no writable layer: %v", id, err)
	}
	return upper, nil
}

// Usage adds up the allocated size of the files of the layer in dir
// (st_blocks, like du), stopping early when ctx ends.
func Usage(ctx context.Context, dir string) int64 {
	upper, _ := Dirs(dir)
	var total int64
	filepath.WalkDir(upper, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if ctx.Err() != nil {
			return filepath.SkipAll
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				total += st.Blocks * 512
			}
		}
		return nil
	})
	return total
}

// Clear removes the layer in dir: the upper and work directories, and a
// disk of the sandbox's own with them.
func Clear(dir string) error {
	if HasDisk(dir) {
		if err := UnmountDisk(dir); err != nil {
			return err
		}
		for _, p := range []string{filepath.Join(dir, diskImage), filepath.Join(dir, diskMount)} {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("free its disk: %w", err)
			}
		}
		return nil
	}
	upper, work := Dirs(dir)
	for _, p := range []string{upper, work} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("free its writable layer: %w", err)
		}
	}
	return nil
}

// Renew gives the sandbox of spec, in dir, an empty layer (on a disk of
// spec's limit), after clearing what is there, and calls fill with its
// upper directory; on error the layer is cleared again.
func Renew(ctx context.Context, dir string, spec runtime.Spec, fill func(dir string) error) error {
	if err := Clear(dir); err != nil { // what a cut-off renew left
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	upper, err := Make(ctx, dir, spec.Limits.DiskBytes, int(spec.Users.HostID))
	if err == nil {
		err = fill(upper)
	}
	if err != nil {
		if cerr := Clear(dir); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clear the layer again: %w", cerr))
		}
		return err
	}
	return nil
}

// Freezer stops and restarts every process of a running sandbox (its cgroup).
type Freezer interface {
	Frozen() (bool, error)
	Freeze(ctx context.Context) error
	Thaw() error
}

// Capture copies the layer of sandbox id in dir into empty directory dst
// as an image layer (see runtime.Capturer). f is the sandbox's freezer, nil
// when it is stopped; noFreeze, when not empty, says why a running sandbox
// cannot be frozen. A sandbox that runs is copied twice: once while it
// runs (the bulk, however long it takes), then, frozen, only what changed
// since the first pass began. The freeze lasts one walk of the layer plus
// the files written meanwhile. A paused sandbox is frozen already and
// copied once, as is a stopped one.
func Capture(ctx context.Context, id, dir string, users runtime.IDMap, skip map[string][]byte, dst string, f Freezer, noFreeze string) (runtime.Capture, error) {
	upper, err := Upper(id, dir)
	if err != nil {
		return runtime.Capture{}, err
	}
	o := layerdiff.CopyOptions{IDs: layerdiff.IDs{Base: users.HostID, Size: users.Size}, Skip: skip}
	if f == nil { // stopped
		st, err := layerdiff.Copy(dst, upper, o)
		return captured(st, 0), err
	}
	frozen, err := f.Frozen()
	if err != nil {
		return runtime.Capture{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if frozen { // paused: still already
		st, err := layerdiff.Copy(dst, upper, o)
		return captured(st, 0), err
	}
	if noFreeze != "" {
		return runtime.Capture{}, errdefs.New(errdefs.NotImplemented, "snapshot of a running sandbox: its processes must be frozen for an instant, and %s; stop it first", noFreeze)
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
	if err := Freeze(ctx, f, id); err != nil {
		return runtime.Capture{}, fmt.Errorf("sandbox %s: freeze: %w", id, err)
	}
	st, err = layerdiff.Copy(dst, upper, o)
	held := time.Since(t0)
	if terr := f.Thaw(); terr != nil {
		return runtime.Capture{}, errors.Join(err, fmt.Errorf("sandbox %s: thaw: %w", id, terr))
	}
	return captured(st, held), err
}

// Freeze freezes sandbox id with f. A group made by a daemon from before
// the freezer (v1) has no freezer directory: that is a conflict its
// restart resolves.
func Freeze(ctx context.Context, f Freezer, id string) error {
	err := f.Freeze(ctx)
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.New(errdefs.Conflict, "sandbox %s was started by an older berth whose sandboxes cannot be frozen: stop and start it once (%v)", id, err)
	}
	return err
}

func captured(st layerdiff.CopyStats, frozen time.Duration) runtime.Capture {
	return runtime.Capture{Entries: st.Entries, Bytes: st.Bytes, Frozen: frozen, Reflinked: st.Reflinked}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
