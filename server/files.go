package server

import (
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// routeFiles adds the file API: raw and tar transfers, the filesystem
// operations and the agent tools, and watch.
func (a *apiGroup) routeFiles(r *Router) {
	r.Handle("GET /v1/sandboxes/{id}/files", a.download)
	r.Handle("PUT /v1/sandboxes/{id}/files", a.upload)
	r.Handle("GET /v1/sandboxes/{id}/archive", a.archive)
	r.Handle("PUT /v1/sandboxes/{id}/archive", a.extract)
	r.Handle("GET /v1/sandboxes/{id}/fs/watch", a.watch)
	// The operations that only read take a read key.
	reads := r.Reads()
	fsRoute[api.StatRequest](a, reads, api.OpStat)
	fsRoute[api.StatRequest](a, reads, api.OpExists)
	fsRoute[api.ListRequest](a, reads, api.OpList)
	fsRoute[api.MkdirRequest](a, r, api.OpMkdir)
	fsRoute[api.MoveRequest](a, r, api.OpMove)
	fsRoute[api.RemoveRequest](a, r, api.OpRemove)
	fsRoute[api.ChmodRequest](a, r, api.OpChmod)
	fsRoute[api.ChownRequest](a, r, api.OpChown)
	fsRoute[api.ReadRequest](a, reads, api.OpRead)
	fsRoute[api.WriteRequest](a, r, api.OpWrite)
	fsRoute[api.EditRequest](a, r, api.OpEdit)
	fsRoute[api.GlobRequest](a, reads, api.OpGlob)
	fsRoute[api.GrepRequest](a, reads, api.OpGrep)
	fsRoute[api.UploadRequest](a, r, api.OpUpload)
	fsRoute[api.DownloadRequest](a, reads, api.OpDownload)
}

// fsRoute serves POST /v1/sandboxes/{id}/fs/{op}, whose request is a Req;
// an operation with no result answers 204.
func fsRoute[Req any](a *apiGroup, r *Router, op string) {
	r.Handle("POST /v1/sandboxes/{id}/fs/"+op, func(w http.ResponseWriter, r *http.Request) error {
		var req Req
		if err := decode(w, r, &req, maxFSBody); err != nil {
			return err
		}
		res, err := a.m.FS(r.Context(), Tenant(r), r.PathValue("id"), op, req)
		if err != nil {
			return err
		}
		if res == nil {
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
		return writeJSON(w, http.StatusOK, res)
	})
}

// maxFSBody bounds a file operation's body: a batch upload's base64 content.
const maxFSBody = api.MaxBatchBytes*4/3 + 1<<20

func whereQuery(r *http.Request) (api.Where, string, error) {
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		return api.Where{}, "", errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "path: query parameter is required"), errdefs.InvalidPath)
	}
	return api.Where{User: q.Get("user"), Cwd: q.Get("cwd")}, p, nil
}

// acceptsGzip says whether the client asked for a gzip answer.
func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.ReplaceAll(params, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// requestBody is the request's body, decompressed if it came gzipped; size
// is -1 when unknown.
func requestBody(r *http.Request) (io.Reader, int64, error) {
	switch enc := strings.ToLower(r.Header.Get("Content-Encoding")); enc {
	case "", "identity":
		return r.Body, r.ContentLength, nil
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, 0, errdefs.New(errdefs.InvalidArgument, "body: not gzip (%v)", err)
		}
		return &gzipBody{zr}, -1, nil
	default:
		return nil, 0, errdefs.New(errdefs.InvalidArgument, "Content-Encoding: %q is not supported (gzip or none)", enc)
	}
}

// gzipBody classifies a corrupt gzip stream as the client's fault.
type gzipBody struct{ zr *gzip.Reader }

func (g *gzipBody) Read(b []byte) (int, error) {
	n, err := g.zr.Read(b)
	if err != nil && err != io.EOF {
		err = errdefs.Wrap(errdefs.InvalidArgument, err, "body: corrupt gzip")
	}
	return n, err
}

// sendStream copies a download to the client, gzipped if asked for.
func sendStream(w http.ResponseWriter, r *http.Request, body io.Reader, contentType string, size int64) error {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("X-Content-Type-Options", "nosniff")
	if acceptsGzip(r) {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		w.WriteHeader(http.StatusOK)
		zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		if _, err := io.Copy(zw, body); err != nil {
			return err
		}
		return zw.Close()
	}
	if size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	_, err := io.CopyBuffer(w, onlyReader{body}, *bp)
	return err
}

type onlyReader struct{ io.Reader }

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func (a *apiGroup) download(w http.ResponseWriter, r *http.Request) error {
	where, p, err := whereQuery(r)
	if err != nil {
		return err
	}
	var size int64 = -1
	body, err := a.m.Download(r.Context(), Tenant(r), r.PathValue("id"), where, p, func(n int64) { size = n })
	if err != nil {
		return err
	}
	defer body.Close()
	return sendStream(w, r, body, "application/octet-stream", size)
}

func octalMode(r *http.Request) (*uint32, error) {
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

func (a *apiGroup) upload(w http.ResponseWriter, r *http.Request) error {
	where, p, err := whereQuery(r)
	if err != nil {
		return err
	}
	mode, err := octalMode(r)
	if err != nil {
		return err
	}
	createOnly, err := boolQuery(r, "create_only")
	if err != nil {
		return err
	}
	body, size, err := requestBody(r)
	if err != nil {
		return err
	}
	fi, err := a.m.Upload(r.Context(), Tenant(r), r.PathValue("id"), where, p, mode, createOnly, body, size)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, fi)
}

func (a *apiGroup) archive(w http.ResponseWriter, r *http.Request) error {
	where, p, err := whereQuery(r)
	if err != nil {
		return err
	}
	body, err := a.m.Archive(r.Context(), Tenant(r), r.PathValue("id"), where, p)
	if err != nil {
		return err
	}
	defer body.Close()
	// The guest answers once the path opened; its first bytes decide nothing.
	return sendStream(w, r, body, "application/x-tar", -1)
}

func (a *apiGroup) extract(w http.ResponseWriter, r *http.Request) error {
	where, p, err := whereQuery(r)
	if err != nil {
		return err
	}
	body, size, err := requestBody(r)
	if err != nil {
		return err
	}
	res, err := a.m.Extract(r.Context(), Tenant(r), r.PathValue("id"), where, p, body, size)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (a *apiGroup) watch(w http.ResponseWriter, r *http.Request) error {
	where, p, err := whereQuery(r)
	if err != nil {
		return err
	}
	recursive, err := boolQuery(r, "recursive")
	if err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	var enc *json.Encoder
	ready := func() error {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		enc = json.NewEncoder(w)
		return rc.Flush()
	}
	return a.m.Watch(r.Context(), Tenant(r), r.PathValue("id"), where, p, recursive, ready, func(ev api.WatchEvent) error {
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	})
}
