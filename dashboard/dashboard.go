// Package dashboard is berth's web dashboard: a page and its scripts,
// embedded in the binary and served on the daemon's one listener, that
// list a tenant's sandboxes and open each one's events, egress, files and
// a live terminal through the /v1 API with the user's API key.
//
// The page is static: it holds no key and no data, so its routes need
// none. Everything it shows it fetches from the API with the key the user
// typed (kept in the tab's sessionStorage), and a strict
// Content-Security-Policy keeps it from loading or sending anything to
// another origin. The terminal's library (xterm.js) comes from npm at
// build time (make dashboard-assets copies it into assets/vendor); a
// binary built without it serves the rest and says the terminal is
// unavailable.
package dashboard

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/server"
)

//go:embed assets
var assets embed.FS

// file is one embedded file, ready to serve.
type file struct {
	body  []byte
	gz    func() []byte // gzip of body, made at the first request; nil when not smaller
	ctype string
	etag  string
}

// Group serves the dashboard.
type Group struct {
	files map[string]*file // by path under assets/, e.g. "app.js"
}

// New loads the embedded files; each is compressed once, when first asked
// for (at the best level: some 40 ms of CPU for all of them, which a
// daemon's start need not pay).
func New() *Group { return newGroup(assets) }

// newGroup serves the files under assets/ in fsys.
func newGroup(fsys fs.FS) *Group {
	g := &Group{files: map[string]*file{}}
	err := fs.WalkDir(fsys, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ctype, ok := contentTypes[path.Ext(p)]
		if !ok {
			return nil // a source map, a licence: not served
		}
		body, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		f := &file{body: body, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		f.gz = sync.OnceValue(func() []byte {
			var buf bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
			zw.Write(body)
			zw.Close()
			if buf.Len() >= len(body) {
				return nil
			}
			return buf.Bytes()
		})
		g.files[strings.TrimPrefix(p, "assets/")] = f
		return nil
	})
	if err != nil {
		// The files are in the binary: a failure to read them is a bug.
		panic(fmt.Sprintf("dashboard: read the embedded files: %v", err))
	}
	return g
}

// contentTypes are the types of the files the dashboard serves, by
// extension; files of other extensions are not served.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".ico":  "image/x-icon",
}

// Name implements server.Group.
func (g *Group) Name() string { return "dashboard" }

// Routes implements server.Group: the page at / and its files under /ui/.
func (g *Group) Routes(r *server.Router) {
	// The page and its files hold no data and need no key: the login page
	// must load before the user has typed one.
	r = r.Public()
	r.Handle("GET /{$}", func(w http.ResponseWriter, r *http.Request) error {
		return g.serve(w, r, "index.html")
	})
	r.Handle("GET /ui/{path...}", func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("path")
		if name == "index.html" {
			// One address for the page, so that its policy and caching are one.
			return errdefs.New(errdefs.NotFound, "no dashboard file %q: the page is at /", name)
		}
		return g.serve(w, r, name)
	})
}

// HasTerminal says whether the binary carries the terminal's library
// (built with make dashboard-assets).
func (g *Group) HasTerminal() bool {
	_, ok := g.files["vendor/xterm/xterm.mjs"]
	return ok
}

func (g *Group) serve(w http.ResponseWriter, r *http.Request, name string) error {
	f, ok := g.files[name]
	if !ok {
		return errdefs.New(errdefs.NotFound, "no dashboard file %q", name)
	}
	h := w.Header()
	securityHeaders(h, r.Host)
	h.Set("Content-Type", f.ctype)
	// The files change only with the binary: a browser may keep them, and
	// asks (If-None-Match) before each use whether they are still these.
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", f.etag)
	h.Set("Vary", "Accept-Encoding")
	if etagMatch(r.Header.Get("If-None-Match"), f.etag) {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	body := f.body
	if acceptsGzip(r) {
		if gz := f.gz(); gz != nil {
			body = gz
			h.Set("Content-Encoding", "gzip")
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
	return nil
}

// securityHeaders are on every dashboard response. The policy lets the
// page load only its own files and talk only to its own origin (fetch,
// and the terminal's WebSocket, named with ws: and wss: because browsers
// before CSP 3 do not count those as 'self'). Styles may be inline:
// xterm.js sets its colours and sizes in <style> elements it makes; no
// script may be.
func securityHeaders(h http.Header, host string) {
	connect := "'self'"
	if validHost(host) {
		connect += " ws://" + host + " wss://" + host
	}
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "+
		"img-src 'self' data: blob:; connect-src "+connect+"; object-src 'none'; base-uri 'none'; "+
		"form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// validHost accepts a Host header made of a name or address and a port,
// nothing that could end the policy's directive or add another.
func validHost(host string) bool {
	if host == "" || len(host) > 255 {
		return false
	}
	for _, c := range []byte(host) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".-:[]", c) >= 0) {
			return false
		}
	}
	return true
}

func etagMatch(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == etag || t == "*" {
			return true
		}
	}
	return false
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.ReplaceAll(params, " ", "") != "q=0" {
			return true
		}
	}
	return false
}
