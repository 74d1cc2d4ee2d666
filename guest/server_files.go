package guest

import (
	"context"
	"io"
	"net/http"
	"strconv"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest/files"
)

// maxFSBody bounds a file operation's JSON body (a batch upload is the largest).
const maxFSBody = guestapi.MaxBatchBytes*4/3 + 1<<20

func routeFiles(route func(string, handler), fs *files.Service) {
	f := fileServer{fs: fs}
	route("GET "+guestapi.PathFiles, f.download)
	route("PUT "+guestapi.PathFiles, f.upload)
	route("GET "+guestapi.PathArchive, f.archive)
	route("PUT "+guestapi.PathArchive, f.extract)
	route("PUT "+guestapi.PathApply, f.apply)
	route("POST "+guestapi.PathFS+"/{op}", f.op)
	route("GET "+guestapi.PathWatch, f.watch)
}

type fileServer struct{ fs *files.Service }

func where(r *http.Request) guestapi.Where {
	q := r.URL.Query()
	return guestapi.Where{User: q.Get("user"), Cwd: q.Get("cwd")}
}

func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.New(errdefs.InvalidArgument, "%s: %q is not a boolean", name, v)
	}
	return b, nil
}

// ModeParam parses an octal permission mode ("0644", "755").
func modeParam(r *http.Request) (*uint32, error) {
	v := r.URL.Query().Get("mode")
	if v == "" {
		return nil, nil
	}
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m > 0o7777 {
		return nil, errdefs.New(errdefs.InvalidArgument, "mode: %q is not an octal permission mode (0 to 7777)", v)
	}
	m32 := uint32(m)
	return &m32, nil
}

func (f fileServer) download(w http.ResponseWriter, r *http.Request) error {
	file, fi, err := f.fs.OpenFile(where(r), r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	defer file.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	h.Set("Last-Modified", fi.ModifiedAt.Format(http.TimeFormat))
	w.WriteHeader(http.StatusOK)
	_, err = io.Copy(w, file) // the file may change size meanwhile: the transfer just ends short
	return err
}

func (f fileServer) upload(w http.ResponseWriter, r *http.Request) error {
	mode, err := modeParam(r)
	if err != nil {
		return err
	}
	createOnly, err := boolParam(r, "create_only")
	if err != nil {
		return err
	}
	fi, err := f.fs.Upload(where(r), r.URL.Query().Get("path"), files.WriteOptions{Mode: mode, CreateOnly: createOnly}, r.Body)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, fi)
}

func (f fileServer) archive(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/x-tar")
	return f.fs.WriteArchive(r.Context(), where(r), r.URL.Query().Get("path"), w)
}

func (f fileServer) extract(w http.ResponseWriter, r *http.Request) error {
	res, err := f.fs.ExtractArchive(where(r), r.URL.Query().Get("path"), r.Body)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (f fileServer) apply(w http.ResponseWriter, r *http.Request) error {
	res, err := f.fs.ApplyArchive(r.Context(), where(r), r.URL.Query().Get("path"), r.Body)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

// call decodes an op's request, runs it and writes its result.
func call[Req any, Res any](w http.ResponseWriter, r *http.Request, fn func(Req) (Res, error)) error {
	return callCtx(w, r, func(_ context.Context, req Req) (Res, error) { return fn(req) })
}

// callCtx is call for an operation that walks a tree: it stops when the
// request's context ends (the daemon's caller went away).
func callCtx[Req any, Res any](w http.ResponseWriter, r *http.Request, fn func(context.Context, Req) (Res, error)) error {
	var req Req
	if err := decodeBody(w, r, maxFSBody, &req); err != nil {
		return err
	}
	res, err := fn(r.Context(), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (f fileServer) op(w http.ResponseWriter, r *http.Request) error {
	fs := f.fs
	switch op := r.PathValue("op"); op {
	case guestapi.OpStat:
		return call(w, r, fs.Stat)
	case guestapi.OpExists:
		return call(w, r, fs.Exists)
	case guestapi.OpList:
		return callCtx(w, r, fs.List)
	case guestapi.OpMkdir:
		return call(w, r, fs.Mkdir)
	case guestapi.OpMove:
		return call(w, r, fs.Move)
	case guestapi.OpRemove:
		return callCtx(w, r, func(ctx context.Context, req guestapi.RemoveRequest) (struct{}, error) {
			return struct{}{}, fs.Remove(ctx, req)
		})
	case guestapi.OpChmod:
		return call(w, r, fs.Chmod)
	case guestapi.OpChown:
		return callCtx(w, r, fs.Chown)
	case guestapi.OpRead:
		return call(w, r, fs.Read)
	case guestapi.OpWrite:
		return call(w, r, fs.Write)
	case guestapi.OpEdit:
		return call(w, r, fs.Edit)
	case guestapi.OpGlob:
		return callCtx(w, r, fs.Glob)
	case guestapi.OpGrep:
		return callCtx(w, r, fs.Grep)
	case guestapi.OpUpload:
		return call(w, r, func(req guestapi.UploadRequest) (guestapi.UploadResult, error) { return fs.UploadBatch(req), nil })
	case guestapi.OpDownload:
		return call(w, r, func(req guestapi.DownloadRequest) (guestapi.DownloadResult, error) { return fs.DownloadBatch(req), nil })
	default:
		return errdefs.New(errdefs.NotFound, "file operation %q: no such operation", op)
	}
}

func (f fileServer) watch(w http.ResponseWriter, r *http.Request) error {
	recursive, err := boolParam(r, "recursive")
	if err != nil {
		return err
	}
	// The stream (status 200) begins once the watch is set up, so set-up
	// errors are plain error answers and a client that sees the status
	// knows no later change is missed.
	var st *stream
	ready := func() error {
		st = newStream(w)
		return st.rc.Flush()
	}
	return f.fs.Watch(r.Context(), where(r), r.URL.Query().Get("path"), recursive, ready, func(ev guestapi.WatchEvent) error {
		if err := st.enc.Encode(ev); err != nil {
			return err
		}
		return st.rc.Flush()
	})
}
