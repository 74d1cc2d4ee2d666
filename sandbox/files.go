package sandbox

import (
	"context"
	"io"
	"slices"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// fsOps are the file operations the API passes to the guest.
var fsOps = []string{
	guestapi.OpStat, guestapi.OpExists, guestapi.OpList, guestapi.OpMkdir, guestapi.OpMove,
	guestapi.OpRemove, guestapi.OpChmod, guestapi.OpChown, guestapi.OpRead, guestapi.OpWrite,
	guestapi.OpEdit, guestapi.OpGlob, guestapi.OpGrep, guestapi.OpUpload, guestapi.OpDownload,
}

// defaulter is every file request: it embeds guestapi.Where.
type defaulter interface{ Defaults(user, cwd string) }

// where is the acting user and working directory of a file request: what
// the request names, else the sandbox's defaults.
func (m *Manager) where(ls *liveSandbox, w guestapi.Where) guestapi.Where {
	spec := m.specOf(ls)
	w.Defaults(spec.User, spec.Workdir)
	return w
}

// FS runs a file operation in a running sandbox: req is the op's request
// (with the sandbox's user and working directory filled in), out receives
// the guest's result.
func (m *Manager) FS(ctx context.Context, tenant, id, op string, req defaulter, out any) error {
	if !slices.Contains(fsOps, op) {
		return errdefs.New(errdefs.NotFound, "file operation %q: no such operation", op)
	}
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return err
	}
	spec := m.specOf(ls)
	req.Defaults(spec.User, spec.Workdir)
	defer m.streaming(ls)()
	return ls.guest.FS(ctx, op, req, out)
}

// Download streams a file out of a sandbox to w; size is announced first
// through setSize (-1 if the guest gave none).
func (m *Manager) Download(ctx context.Context, tenant, id string, where guestapi.Where, path string, setSize func(int64)) (io.ReadCloser, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	done := m.streaming(ls)
	body, size, err := ls.guest.Download(ctx, m.where(ls, where), path)
	if err != nil {
		done()
		return nil, err
	}
	setSize(size)
	return &activeReader{ReadCloser: body, done: done}, nil
}

// Upload streams body (size bytes, -1 if unknown) into a file of a sandbox.
func (m *Manager) Upload(ctx context.Context, tenant, id string, where guestapi.Where, path string, mode *uint32, createOnly bool, body io.Reader, size int64) (api.FileInfo, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return api.FileInfo{}, err
	}
	defer m.streaming(ls)()
	return ls.guest.Upload(ctx, m.where(ls, where), path, mode, createOnly, body, size)
}

// Archive streams a tar of a path out of a sandbox.
func (m *Manager) Archive(ctx context.Context, tenant, id string, where guestapi.Where, path string) (io.ReadCloser, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	done := m.streaming(ls)
	body, err := ls.guest.Archive(ctx, m.where(ls, where), path)
	if err != nil {
		done()
		return nil, err
	}
	return &activeReader{ReadCloser: body, done: done}, nil
}

// Extract unpacks a tar stream into a directory of a sandbox.
func (m *Manager) Extract(ctx context.Context, tenant, id string, where guestapi.Where, path string, body io.Reader, size int64) (api.ArchiveResult, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return api.ArchiveResult{}, err
	}
	defer m.streaming(ls)()
	return ls.guest.Extract(ctx, m.where(ls, where), path, body, size)
}

// Watch relays changes under a directory of a sandbox to emit until ctx
// ends or the directory goes; ready is called once the watch is on.
func (m *Manager) Watch(ctx context.Context, tenant, id string, where guestapi.Where, path string, recursive bool, ready func() error, emit func(api.WatchEvent) error) error {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return err
	}
	defer m.streaming(ls)()
	st, err := ls.guest.Watch(ctx, m.where(ls, where), path, recursive)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := ready(); err != nil {
		return err
	}
	for {
		ev, err := st.Next()
		if err == io.EOF || ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if err := emit(ev); err != nil {
			return err
		}
	}
}

// activeReader counts a transfer as activity until it is closed.
type activeReader struct {
	io.ReadCloser
	done func()
}

func (r *activeReader) Close() error {
	err := r.ReadCloser.Close()
	if r.done != nil {
		r.done()
		r.done = nil
	}
	return err
}
