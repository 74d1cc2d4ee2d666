// Package testregistry runs an OCI registry on loopback for tests
// (go-containerregistry's in-process registry) and builds the images tests
// push to it: no registry on the internet is reachable where berth's tests
// run, and tests must not depend on one.
package testregistry

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Registry is a registry on loopback that counts the blobs it serves.
type Registry struct {
	// Host is host:port, to put in image references.
	Host string
	srv  *httptest.Server

	mu    sync.Mutex
	blobs map[string]int // GETs of each blob digest
	// hook, when set, serves a request instead of the registry (true) or
	// lets it through (false).
	hook func(w http.ResponseWriter, r *http.Request) bool
}

// Start runs a registry until the test ends.
func Start(tb testing.TB) *Registry {
	tb.Helper()
	reg := &Registry{blobs: map[string]int{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
			d := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
			reg.mu.Lock()
			reg.blobs[d]++
			reg.mu.Unlock()
		}
		reg.mu.Lock()
		hook := reg.hook
		reg.mu.Unlock()
		if hook != nil && hook(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	}))
	tb.Cleanup(reg.srv.Close)
	reg.Host = strings.TrimPrefix(reg.srv.URL, "http://")
	return reg
}

// Hook makes fn see every request first; it serves the ones it returns
// true for. nil removes the hook.
func (r *Registry) Hook(fn func(w http.ResponseWriter, req *http.Request) bool) {
	r.mu.Lock()
	r.hook = fn
	r.mu.Unlock()
}

// BlobGets is how often blob digest was fetched.
func (r *Registry) BlobGets(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobs[digest]
}

// Close stops the registry (it is down from then on).
func (r *Registry) Close() { r.srv.CloseClientConnections(); r.srv.Close() }

// Ref is the reference of repo:tag on this registry.
func (r *Registry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

// Push pushes img as ref (a reference on this registry) and returns its
// manifest digest.
func (r *Registry) Push(tb testing.TB, repoTag string, img v1.Image) string {
	tb.Helper()
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		tb.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		tb.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		tb.Fatal(err)
	}
	return d.String()
}

// Entry is one member of a layer's tar.
type Entry struct {
	Name     string
	Type     byte // tar.TypeReg when 0
	Body     string
	Size     int64 // for a header that lies about its size; else len(Body)
	Link     string
	Mode     int64
	UID, GID int
	Xattrs   map[string]string
}

// Tar is the tar of entries.
func Tar(tb testing.TB, entries ...Entry) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.Name, Typeflag: e.Type, Linkname: e.Link, Mode: e.Mode, Uid: e.UID, Gid: e.GID,
			ModTime: time.Unix(1_700_000_000, 0), Format: tar.FormatPAX}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.Body))
		}
		for k, v := range e.Xattrs {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(hdr); err != nil {
			tb.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// Layer is a gzipped layer of tar bytes.
func Layer(tb testing.TB, tarBytes []byte) v1.Layer {
	tb.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// Image is an image of layers (bottom first) with cfg, for linux on the
// host's architecture.
func Image(tb testing.TB, cfg v1.Config, arch string, layers ...v1.Layer) v1.Image {
	tb.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		tb.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		tb.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", arch, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		tb.Fatal(err)
	}
	return img
}
