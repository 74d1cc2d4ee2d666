package sandbox

import (
	"context"
	"fmt"
	"io"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guestclient"
)

// fsOp runs one file operation on a guest: it converts the API request,
// fills in the acting user and working directory, asks the guest and
// converts the answer (nil for an operation that answers nothing).
type fsOp func(ctx context.Context, gc *guestclient.Client, req any, user, cwd string) (any, error)

// fsCall makes op's fsOp from its two conversions (wire.go).
func fsCall[AReq, GReq, GRes, ARes any, PG interface {
	*GReq
	Defaults(user, cwd string)
}](op string, in func(AReq) GReq, out func(GRes) ARes) fsOp {
	return func(ctx context.Context, gc *guestclient.Client, req any, user, cwd string) (any, error) {
		r, ok := req.(AReq)
		if !ok {
			return nil, fmt.Errorf("file operation %s: a %T is not its request", op, req)
		}
		g := in(r)
		PG(&g).Defaults(user, cwd)
		var res GRes
		if err := gc.FS(ctx, op, g, &res); err != nil {
			return nil, err
		}
		return out(res), nil
	}
}

// fsOps are the file operations the API passes to the guest, by name.
var fsOps = map[string]fsOp{
	api.OpStat:     fsCall(guestapi.OpStat, statToGuest, fileInfoToAPI),
	api.OpExists:   fsCall(guestapi.OpExists, statToGuest, existsToAPI),
	api.OpList:     fsCall(guestapi.OpList, listToGuest, listResultToAPI),
	api.OpMkdir:    fsCall(guestapi.OpMkdir, mkdirToGuest, fileInfoToAPI),
	api.OpMove:     fsCall(guestapi.OpMove, moveToGuest, fileInfoToAPI),
	api.OpRemove:   fsCall(guestapi.OpRemove, removeToGuest, func(struct{}) any { return nil }),
	api.OpChmod:    fsCall(guestapi.OpChmod, chmodToGuest, fileInfoToAPI),
	api.OpChown:    fsCall(guestapi.OpChown, chownToGuest, fileInfoToAPI),
	api.OpRead:     fsCall(guestapi.OpRead, readToGuest, readResultToAPI),
	api.OpWrite:    fsCall(guestapi.OpWrite, writeToGuest, fileInfoToAPI),
	api.OpEdit:     fsCall(guestapi.OpEdit, editToGuest, editResultToAPI),
	api.OpGlob:     fsCall(guestapi.OpGlob, globToGuest, globResultToAPI),
	api.OpGrep:     fsCall(guestapi.OpGrep, grepToGuest, grepResultToAPI),
	api.OpUpload:   fsCall(guestapi.OpUpload, uploadToGuest, uploadResultToAPI),
	api.OpDownload: fsCall(guestapi.OpDownload, downloadToGuest, downloadResultToAPI),
}

// fileGuest is the live sandbox of a file request and its acting user and
// working directory: what the request names (checked), else the sandbox's
// defaults.
func (m *Manager) fileGuest(ctx context.Context, tenant, id string, w api.Where) (*liveSandbox, guestapi.Where, error) {
	if w.User != "" {
		if err := m.checkUser("user", w.User); err != nil {
			return nil, guestapi.Where{}, err
		}
	}
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return nil, guestapi.Where{}, err
	}
	spec := m.specOf(ls)
	w.Defaults(spec.User, spec.Workdir)
	return ls, whereToGuest(w), nil
}

// FS runs file operation op (api.Op*) in a running sandbox: req is the op's
// request, a value of its api type; the result is the op's api result, or
// nil for an operation that has none (remove).
func (m *Manager) FS(ctx context.Context, tenant, id, op string, req any) (any, error) {
	call, ok := fsOps[op]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "file operation %q: no such operation", op)
	}
	if w, ok := req.(interface{ ActingUser() string }); ok && w.ActingUser() != "" {
		if err := m.checkUser("user", w.ActingUser()); err != nil {
			return nil, err
		}
	}
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	spec := m.specOf(ls)
	defer m.streaming(ls)()
	res, err := call(ctx, ls.guest, req, spec.User, spec.Workdir)
	return res, m.gone(id, err)
}

// Download streams a file out of a sandbox to w; size is announced first
// through setSize (-1 if the guest gave none).
func (m *Manager) Download(ctx context.Context, tenant, id string, where api.Where, path string, setSize func(int64)) (io.ReadCloser, error) {
	ls, w, err := m.fileGuest(ctx, tenant, id, where)
	if err != nil {
		return nil, err
	}
	done := m.streaming(ls)
	body, size, err := ls.guest.Download(ctx, w, path)
	if err != nil {
		done()
		return nil, m.gone(id, err)
	}
	setSize(size)
	return &activeReader{ReadCloser: body, done: done}, nil
}

// Upload streams body (size bytes, -1 if unknown) into a file of a sandbox.
func (m *Manager) Upload(ctx context.Context, tenant, id string, where api.Where, path string, mode *uint32, createOnly bool, body io.Reader, size int64) (api.FileInfo, error) {
	ls, w, err := m.fileGuest(ctx, tenant, id, where)
	if err != nil {
		return api.FileInfo{}, err
	}
	defer m.streaming(ls)()
	fi, err := ls.guest.Upload(ctx, w, path, mode, createOnly, body, size)
	return fileInfoToAPI(fi), m.gone(id, err)
}

// Archive streams a tar of a path out of a sandbox.
func (m *Manager) Archive(ctx context.Context, tenant, id string, where api.Where, path string) (io.ReadCloser, error) {
	ls, w, err := m.fileGuest(ctx, tenant, id, where)
	if err != nil {
		return nil, err
	}
	done := m.streaming(ls)
	body, err := ls.guest.Archive(ctx, w, path)
	if err != nil {
		done()
		return nil, m.gone(id, err)
	}
	return &activeReader{ReadCloser: body, done: done}, nil
}

// Extract unpacks a tar stream into a directory of a sandbox.
func (m *Manager) Extract(ctx context.Context, tenant, id string, where api.Where, path string, body io.Reader, size int64) (api.ArchiveResult, error) {
	ls, w, err := m.fileGuest(ctx, tenant, id, where)
	if err != nil {
		return api.ArchiveResult{}, err
	}
	defer m.streaming(ls)()
	res, err := ls.guest.Extract(ctx, w, path, body, size)
	return archiveResultToAPI(res), m.gone(id, err)
}

// Watch relays changes under a directory of a sandbox to emit until ctx
// ends or the directory goes; ready is called once the watch is on.
func (m *Manager) Watch(ctx context.Context, tenant, id string, where api.Where, path string, recursive bool, ready func() error, emit func(api.WatchEvent) error) error {
	ls, w, err := m.fileGuest(ctx, tenant, id, where)
	if err != nil {
		return err
	}
	defer m.streaming(ls)()
	st, err := ls.guest.Watch(ctx, w, path, recursive)
	if err != nil {
		return m.gone(id, err)
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
		if err := emit(watchEventToAPI(ev)); err != nil {
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
