package sandbox

import (
	"context"
	"fmt"
	"io"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

// ArchiveImages is what archiving needs of the image store (image.Store):
// compressed archives of writable layers, by sandbox id.
type ArchiveImages interface {
	WriteArchive(ctx context.Context, name string, write func(io.Writer) error) (int64, error)
	RestoreArchive(ctx context.Context, name, dir string, base int) error
	RemoveArchive(name string) error
}

// archiver returns what archiving a sandbox of tier t takes, or why it
// cannot be archived.
func (m *Manager) archiver(t *tier) (runtime.Differ, runtime.Archiver, ArchiveImages, error) {
	d, dok := t.rt.(runtime.Differ)
	a, aok := t.rt.(runtime.Archiver)
	if !dok || !aok {
		return nil, nil, nil, t.lacks("archive", "archive a stopped sandbox's files")
	}
	ai, ok := m.images.(ArchiveImages)
	if !ok {
		return nil, nil, nil, errdefs.New(errdefs.NotImplemented, "this daemon's image store cannot keep archives")
	}
	return d, a, ai, nil
}

// archiveLayer turns a stopped sandbox's writable layer into a compressed
// archive and frees its directory (its archive_after ran out). The archive
// is durable before the layer goes; a crash in between leaves both, and
// start restores from the archive.
func (m *Manager) archiveLayer(ctx context.Context, id string) error {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if rec.State != api.StateStopped || rec.ArchiveBytes > 0 {
		return nil // started or archived meanwhile
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return err
	}
	d, a, ai, err := m.archiver(t)
	if err != nil {
		return err
	}
	users := m.cfg.IDMap.Range(rec.IDRange)
	// berth's own files are written again at start: not kept.
	size, err := ai.WriteArchive(ctx, id, func(w io.Writer) error {
		_, err := d.Diff(ctx, id, users, m.berthFiles(ctx, id), w)
		return err
	})
	if err != nil {
		return fmt.Errorf("archive sandbox %s: %w", id, err)
	}
	if err := m.store.SetArchived(ctx, id, size); err != nil {
		if rerr := ai.RemoveArchive(id); rerr != nil {
			m.log.Error("failed archive: remove it", "sandbox", id, "err", rerr)
		}
		return err
	}
	if err := a.ClearLayer(ctx, id); err != nil {
		// The archive is on record: start restores from it over what is left.
		return fmt.Errorf("archive sandbox %s: free its layer: %w", id, err)
	}
	m.log.Info("archived", "sandbox", id, "bytes", size)
	m.emit(id, api.SandboxArchived)
	return nil
}

// unarchive restores an archived sandbox's writable layer before it
// starts, then forgets the archive. The caller holds the operation lock.
func (m *Manager) unarchive(ctx context.Context, rec store.Sandbox, spec runtime.Spec) error {
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return err
	}
	_, a, ai, err := m.archiver(t)
	if err != nil {
		return err
	}
	if err := a.RenewLayer(ctx, spec, func(dir string) error {
		return ai.RestoreArchive(ctx, rec.ID, dir, int(spec.Users.HostID))
	}); err != nil {
		return fmt.Errorf("restore sandbox %s from its archive: %w", rec.ID, err)
	}
	if err := m.store.SetArchived(ctx, rec.ID, 0); err != nil {
		return err
	}
	if err := ai.RemoveArchive(rec.ID); err != nil {
		m.log.Error("remove a restored archive", "sandbox", rec.ID, "err", err)
	}
	return nil
}

// notArchived is the conflict error for what needs an archived sandbox's
// files on disk.
func notArchived(rec store.Sandbox) error {
	if rec.ArchiveBytes == 0 {
		return nil
	}
	return errdefs.WithReason(errdefs.New(errdefs.Conflict, "sandbox %s is archived (its files are compressed until it starts): start it first (berth start %s)", rec.ID, rec.ID), errdefs.SandboxStopped)
}
