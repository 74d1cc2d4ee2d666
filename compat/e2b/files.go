package e2b

import (
	"compress/gzip"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/server"
)

// routeEnvdREST registers envd's REST routes on its mux.
func (g *Group) routeEnvdREST(mux *http.ServeMux) {
	mux.HandleFunc("GET /files", g.download)
	mux.HandleFunc("POST /files", g.upload)
	mux.HandleFunc("GET /envs", g.envs)
}

// fileUser is who a REST file request acts as: the username parameter,
// else the request's user.
func fileUser(r *http.Request) string {
	if u := r.URL.Query().Get("username"); u != "" {
		return u
	}
	return envdOf(r.Context()).user
}

// writeFileError is writeError with envd's status for a full disk, which
// the SDKs turn into NotEnoughSpaceException.
func (g *Group) writeFileError(w http.ResponseWriter, r *http.Request, err error) {
	if errdefs.ReasonOf(err) == errdefs.NoSpace {
		server.NoteError(r, err)
		writeJSON(w, http.StatusInsufficientStorage, apiError{Code: http.StatusInsufficientStorage, Message: errdefs.Message(err)})
		return
	}
	g.writeError(w, r, err)
}

// download streams a file: GET /files?path=&username=. A directory is
// 400, a missing file 404. The body is gzipped when the client prefers
// it, as envd does; otherwise it has its length.
func (g *Group) download(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	e := envdOf(ctx)
	p := r.URL.Query().Get("path")
	if p == "" {
		g.writeError(w, r, errdefs.New(errdefs.InvalidArgument, "path: missing; name the file to download"))
		return
	}
	where, err := g.resolve(ctx, e, fileUser(r), &p)
	if err != nil {
		g.writeFileError(w, r, err)
		return
	}
	gz, ok := gzipAccepted(r.Header.Get("Accept-Encoding"))
	if !ok {
		g.writeError(w, r, errdefs.New(errdefs.InvalidArgument, "Accept-Encoding: refuses both identity and gzip, the encodings served"))
		return
	}
	var size int64 = -1
	body, err := g.m.Download(ctx, e.tenant, e.id, where, p, func(n int64) { size = n })
	if err != nil {
		g.writeFileError(w, r, err)
		return
	}
	defer body.Close()

	name := path.Base(p)
	h := w.Header()
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": name}))
	ctype := mime.TypeByExtension(path.Ext(name))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	h.Set("Content-Type", ctype)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Vary", "Accept-Encoding")
	var dst io.Writer = w
	var zw *gzip.Writer
	if gz {
		h.Set("Content-Encoding", "gzip")
		zw, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
		dst = zw
	} else if size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	_, err = io.CopyBuffer(dst, struct{ io.Reader }{body}, *bp)
	if err == nil && zw != nil {
		err = zw.Close()
	}
	if err != nil {
		// The status is out: cut the response short, so the client
		// does not take a truncated file for the whole.
		server.NoteError(r, err)
		panic(http.ErrAbortHandler)
	}
}

// copyBufs are the buffers transfers copy through: larger than io.Copy's,
// for fewer writes to the guest and the client.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// gzipAccepted reads Accept-Encoding as envd does: gzip when the client's
// most preferred acceptable coding is gzip (or "*" while identity is
// refused); ok is false when neither gzip nor identity is acceptable.
func gzipAccepted(header string) (gz, ok bool) {
	if strings.TrimSpace(header) == "" {
		return false, true
	}
	type coding struct {
		name string
		q    float64
	}
	var cs []coding
	identityQ, starQ := -1.0, -1.0
	for v := range strings.SplitSeq(header, ",") {
		name, params, _ := strings.Cut(v, ";")
		c := coding{name: strings.ToLower(strings.TrimSpace(name)), q: 1}
		for p := range strings.SplitSeq(params, ";") {
			if k, val, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(k, "q") {
				if q, err := strconv.ParseFloat(val, 64); err == nil {
					c.q = q
				}
			}
		}
		switch c.name {
		case "identity":
			identityQ = c.q
		case "*":
			starQ = c.q
		}
		cs = append(cs, c)
	}
	identityRefused := identityQ == 0 || identityQ < 0 && starQ == 0
	slices.SortStableFunc(cs, func(a, b coding) int {
		switch {
		case a.q > b.q:
			return -1
		case a.q < b.q:
			return 1
		}
		return 0
	})
	for _, c := range cs {
		if c.q <= 0 {
			continue
		}
		switch c.name {
		case "gzip", "x-gzip":
			return true, true
		case "identity":
			return false, true
		case "*":
			return identityRefused, true
		}
	}
	return false, !identityRefused
}

// uploaded is envd's answer for one uploaded file.
type uploaded struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload writes files: POST /files?path=&username=, making missing
// parents and replacing what is there. An application/octet-stream body
// is the file at path. A multipart body's parts named "file" are files:
// each at path when it is given, else at the part's file name (a path,
// which envd keeps whole); two parts to one path are refused. The answer
// lists the files written; bodies stream through, gzipped or not.
func (g *Group) upload(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	e := envdOf(ctx)
	target := r.URL.Query().Get("path")
	body, size, err := uploadBody(r)
	if err != nil {
		g.writeError(w, r, err)
		return
	}
	// Relative paths start at the user's home, looked up once.
	where := api.Where{User: fileUser(r)}
	homeKnown := where.User == ""
	put := func(p string, body io.Reader, size int64) (uploaded, error) {
		rel, err := envdPath(&p)
		if err != nil {
			return uploaded{}, err
		}
		if rel && !homeKnown {
			if where.Cwd, err = g.home(ctx, e, where.User); err != nil {
				return uploaded{}, err
			}
			homeKnown = true
		}
		fi, err := g.m.Upload(ctx, e.tenant, e.id, where, p, nil, false, body, size)
		g.watchers.changed(e.tenant, e.id)
		if err != nil {
			return uploaded{}, err
		}
		return uploaded{Path: fi.Path, Name: fi.Name, Type: "file"}, nil
	}

	written := []uploaded{}
	ctype := r.Header.Get("Content-Type")
	mt, params, _ := mime.ParseMediaType(ctype)
	switch {
	case mt == "application/octet-stream":
		if target == "" {
			g.writeError(w, r, errdefs.New(errdefs.InvalidArgument, "path: missing; an application/octet-stream upload is the file the path parameter names"))
			return
		}
		u, err := put(target, body, size)
		if err != nil {
			g.writeFileError(w, r, err)
			return
		}
		written = append(written, u)
	case strings.HasPrefix(mt, "multipart/"):
		if params["boundary"] == "" {
			g.writeError(w, r, errdefs.New(errdefs.InvalidArgument, "Content-Type: %s without a boundary", mt))
			return
		}
		mr := multipart.NewReader(body, params["boundary"])
		seen := map[string]bool{}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				g.writeError(w, r, errdefs.Wrap(errdefs.InvalidArgument, err, "body: malformed multipart"))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			p := target
			if p == "" {
				p = partFileName(part)
			}
			if p == "" {
				part.Close()
				g.writeError(w, r, errdefs.New(errdefs.InvalidArgument, "body: a part named file has no filename, and no path parameter names its file"))
				return
			}
			if seen[p] {
				part.Close()
				g.writeError(w, r, errdefs.New(errdefs.InvalidArgument, "%s: more than one file to this path in one upload; only the first was written", p))
				return
			}
			seen[p] = true
			u, err := put(p, part, -1)
			part.Close()
			if err != nil {
				g.writeFileError(w, r, err)
				return
			}
			written = append(written, u)
		}
	default:
		g.writeError(w, r, errdefs.New(errdefs.InvalidArgument, "Content-Type: %q; send multipart/form-data or application/octet-stream", ctype))
		return
	}
	writeJSON(w, http.StatusOK, written)
}

// partFileName is a part's file name as sent: multipart.Part.FileName
// keeps only its last element, and envd's SDKs send a path.
func partFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// uploadBody is the request body, ungzipped if its Content-Encoding says
// so, and its length (-1 when unknown).
func uploadBody(r *http.Request) (io.Reader, int64, error) {
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return r.Body, r.ContentLength, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, 0, errdefs.Wrap(errdefs.InvalidArgument, err, "body: not gzip, though Content-Encoding says so")
		}
		return gzipBody{zr}, -1, nil
	default:
		return nil, 0, errdefs.New(errdefs.InvalidArgument, "Content-Encoding: %q; send gzip or identity", enc)
	}
}

// gzipBody classifies a corrupt gzip stream as the client's fault.
type gzipBody struct{ zr *gzip.Reader }

func (b gzipBody) Read(p []byte) (int, error) {
	n, err := b.zr.Read(p)
	if err != nil && err != io.EOF {
		err = errdefs.Wrap(errdefs.InvalidArgument, err, "body: corrupt gzip")
	}
	return n, err
}

// envs answers the sandbox's environment variables as a JSON object.
func (g *Group) envs(w http.ResponseWriter, r *http.Request) {
	e := envdOf(r.Context())
	sb, err := g.m.Get(r.Context(), e.tenant, e.id)
	if err != nil {
		g.writeError(w, r, err)
		return
	}
	env := sb.Env
	if env == nil {
		env = map[string]string{}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, env)
}
