package image_test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/internal/testregistry"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

type ociStore struct {
	*image.Store
	db  *store.Store
	dir string
}

func newOCIStore(t *testing.T, opts ...image.Option) ociStore {
	t.Helper()
	testutil.RequireRoot(t)
	state := testutil.StateDir(t)
	db, err := store.Open(t.Context(), filepath.Join(state, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	dir := filepath.Join(state, "images")
	s, err := image.New(dir, slog.New(slog.DiscardHandler), append([]image.Option{image.WithCatalog(db)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return ociStore{Store: s, db: db, dir: dir}
}

// layerDirs lists the store's layer directories, leftovers included.
func (s ociStore) layerDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.dir, "oci", "layers"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

var arch = goruntime.GOARCH

// twoLayers is an image whose top layer deletes, replaces and hides what
// the bottom one has: a whiteout, an opaque directory, a hard link.
func twoLayers(t *testing.T) v1.Image {
	bottom := testregistry.Tar(t,
		testregistry.Entry{Name: "etc/", Type: tar.TypeDir},
		testregistry.Entry{Name: "etc/os-release", Body: "ID=tiny\n"},
		testregistry.Entry{Name: "etc/gone", Body: "deleted above\n"},
		testregistry.Entry{Name: "opt/app/", Type: tar.TypeDir},
		testregistry.Entry{Name: "opt/app/old", Body: "hidden by an opaque dir\n"},
		testregistry.Entry{Name: "usr/bin/tool", Body: "#!/bin/sh\n", Mode: 0o4755},
		testregistry.Entry{Name: "usr/bin/tool-link", Type: tar.TypeLink, Link: "usr/bin/tool"},
		testregistry.Entry{Name: "etc/localtime", Type: tar.TypeSymlink, Link: "/usr/share/zoneinfo/UTC"},
		testregistry.Entry{Name: "home/app/", Type: tar.TypeDir, UID: 1000, GID: 1000, Mode: 0o750},
		testregistry.Entry{Name: "dev/null", Type: tar.TypeChar},
		testregistry.Entry{Name: "big-id", Body: "x", UID: 2_000_000},
	)
	top := testregistry.Tar(t,
		testregistry.Entry{Name: "etc/.wh.gone"},
		testregistry.Entry{Name: "opt/app/", Type: tar.TypeDir},
		testregistry.Entry{Name: "opt/app/.wh..wh..opq"},
		testregistry.Entry{Name: "opt/app/new", Body: "new\n", Xattrs: map[string]string{"user.note": "kept", "security.capability": "x"}},
	)
	return testregistry.Image(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}, WorkingDir: "/opt/app", User: "1000",
		Entrypoint: []string{"/usr/bin/tool"}, Cmd: []string{"--help"}}, arch,
		testregistry.Layer(t, bottom), testregistry.Layer(t, top))
}

func stat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestPullUnpacksLayersForOverlay pulls a two-layer image from a registry
// on loopback and checks each layer's directory is what overlayfs and a
// sandbox need: whiteouts as 0/0 devices, the opaque marker as
// user.overlay.opaque, hard links, owners as inside (ids beyond a
// sandbox's mapping as nobody), setuid kept, symlinks stored as they are,
// device files and host-meaningful attributes skipped with a note.
func TestPullUnpacksLayersForOverlay(t *testing.T) {
	s := newOCIStore(t)
	reg := testregistry.Start(t)
	img := twoLayers(t)
	id := reg.Push(t, "tiny:1", img)
	var events []api.PullEvent
	got, err := s.Pull(t.Context(), "", reg.Ref("tiny:1"), func(ev api.PullEvent) { events = append(events, ev) })
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != id || len(got.Layers) != 2 || got.Config.WorkingDir != "/opt/app" || got.Config.User != "1000" ||
		strings.Join(got.Config.Entrypoint, " ") != "/usr/bin/tool" || got.Size == 0 {
		t.Fatalf("pulled %+v, want id %s, two layers and the config", got, id)
	}
	if len(events) < 3 || events[0].Status != api.PullResolved || events[0].Total == 0 {
		t.Fatalf("progress %+v: want resolved (with a total), then layer events", events)
	}
	if !strings.Contains(strings.Join(got.Notes, "\n"), "dev/null") || !strings.Contains(strings.Join(got.Notes, "\n"), "security.capability") {
		t.Errorf("notes %q: want the skipped device file and attribute named", got.Notes)
	}
	for _, ref := range []string{reg.Ref("tiny:1"), id, reg.Host + "/tiny@" + id} {
		if l, err := s.Lookup(t.Context(), "", ref); err != nil || l.ID != id {
			t.Errorf("lookup %s: %v, %v", ref, l.ID, err)
		}
	}
	res, err := s.Resolve(t.Context(), reg.Ref("tiny:1"), image.Unmapped)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Root.Layers) != 2 || !res.Root.IDMapped {
		t.Fatalf("resolved %+v", res.Root)
	}
	top, bottom := res.Root.Layers[0], res.Root.Layers[1]
	if st := stat(t, filepath.Join(top, "etc/gone")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("the whiteout is mode %o rdev %d, want a 0/0 character device", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(top, "opt/app"), "user.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque marker: %q, %v", buf[:n], err)
	}
	if n, err := unix.Lgetxattr(filepath.Join(top, "opt/app/new"), "user.note", buf); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("user xattr: %q, %v", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(top, "opt/app/new"), "security.capability", buf); err == nil {
		t.Errorf("security.capability was applied on the host")
	}
	tool, link := stat(t, filepath.Join(bottom, "usr/bin/tool")), stat(t, filepath.Join(bottom, "usr/bin/tool-link"))
	if tool.Ino != link.Ino || tool.Mode&0o7777 != 0o4755 || tool.Uid != 0 {
		t.Errorf("tool %o uid %d ino %d, link ino %d: want a setuid root file and a hard link to it", tool.Mode, tool.Uid, tool.Ino, link.Ino)
	}
	if home := stat(t, filepath.Join(bottom, "home/app")); home.Uid != 1000 || home.Mode&0o777 != 0o750 {
		t.Errorf("home/app uid %d mode %o", home.Uid, home.Mode&0o777)
	}
	if big := stat(t, filepath.Join(bottom, "big-id")); big.Uid != 65534 {
		t.Errorf("a file of uid 2000000 is uid %d on disk, want nobody (65534)", big.Uid)
	}
	if target, err := os.Readlink(filepath.Join(bottom, "etc/localtime")); err != nil || target != "/usr/share/zoneinfo/UTC" {
		t.Errorf("symlink: %q, %v", target, err)
	}
	if _, err := os.Lstat(filepath.Join(bottom, "dev/null")); err == nil {
		t.Errorf("a device file was made")
	}
	// For a runtime that cannot idmap: a copy owned by the range.
	ids := runtime.DefaultIDMap.Range(5)
	shifted, err := s.Resolve(t.Context(), id, ids)
	if err != nil {
		t.Fatal(err)
	}
	sb := shifted.Root.Layers[1]
	if st := stat(t, filepath.Join(sb, "home/app")); st.Uid != ids.HostID+1000 {
		t.Errorf("shifted home/app uid %d, want %d", st.Uid, ids.HostID+1000)
	}
	if st := stat(t, filepath.Join(sb, "usr/bin/tool")); st.Uid != ids.HostID || st.Mode&0o7777 != 0o4755 {
		t.Errorf("shifted tool uid %d mode %o", st.Uid, st.Mode&0o7777)
	}
	if st := stat(t, filepath.Join(shifted.Root.Layers[0], "etc/gone")); st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("shifted whiteout mode %o", st.Mode)
	}
	if n, err := unix.Lgetxattr(filepath.Join(shifted.Root.Layers[0], "opt/app"), "user.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("shifted opaque marker: %q, %v", buf[:n], err)
	}
	if st := stat(t, filepath.Dir(sb)); st.Uid != ids.HostID || st.Mode&0o777 != 0o700 {
		t.Errorf("the range's copies are in a dir of uid %d mode %o, want the range's root and 0700", st.Uid, st.Mode&0o777)
	}
}

// TestConcurrentPullsShareOneDownload: two pulls of one multi-layer image
// at once fetch each blob once.
func TestConcurrentPullsShareOneDownload(t *testing.T) {
	s := newOCIStore(t)
	reg := testregistry.Start(t)
	var layers []v1.Layer
	for i := range 3 {
		layers = append(layers, testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "f" + string(rune('a'+i)), Body: strings.Repeat("x", 1<<20+i)})))
	}
	reg.Push(t, "multi:1", testregistry.Image(t, v1.Config{}, arch, layers...))
	// Hold blob downloads until both pulls have started.
	release := make(chan struct{})
	reg.Hook(func(w http.ResponseWriter, r *http.Request) bool {
		if strings.Contains(r.URL.Path, "/blobs/") {
			<-release
		}
		return false
	})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { _, errs[i] = s.Pull(t.Context(), "", reg.Ref("multi:1"), nil) })
	}
	time.Sleep(200 * time.Millisecond)
	close(release)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range layers {
		d, _ := l.Digest()
		if n := reg.BlobGets(d.String()); n != 1 {
			t.Errorf("layer %s fetched %d times, want once", d, n)
		}
	}
}

// TestHostileLayers: layers that try to leave their directory, lie about
// their size or digest, or unpack to more than the limit are refused,
// nothing is written outside the store, and the store keeps no partial
// layer.
func TestHostileLayers(t *testing.T) {
	s := newOCIStore(t, image.WithLimits(image.Limits{MaxBytes: 8 << 20}))
	reg := testregistry.Start(t)
	victim := t.TempDir()
	os.Chmod(victim, 0o777)
	good := testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "ok", Body: "fine"}))
	bomb := bytes.Repeat([]byte{0}, 64<<20) // 64 MiB of zeros: a 64 KiB gzip
	bombTar := testregistry.Tar(t, testregistry.Entry{Name: "zeros", Body: string(bomb)})
	truncated := testregistry.Tar(t, testregistry.Entry{Name: "f", Body: strings.Repeat("y", 10000)})
	truncated = truncated[:5000]
	cases := []struct {
		name    string
		entries []testregistry.Entry
		raw     []byte
		class   errdefs.Class
	}{
		{name: "dotdot", class: errdefs.InvalidArgument, entries: []testregistry.Entry{{Name: "../../../" + victim + "/escaped", Body: "x"}}},
		{name: "symlink-parent", class: errdefs.InvalidArgument, entries: []testregistry.Entry{
			{Name: "out", Type: tar.TypeSymlink, Link: victim},
			{Name: "out/escaped", Body: "x"}}},
		{name: "relative-symlink-parent", class: errdefs.InvalidArgument, entries: []testregistry.Entry{
			{Name: "a/b", Type: tar.TypeSymlink, Link: "../../../../../../../../" + victim},
			{Name: "a/b/escaped", Body: "x"}}},
		{name: "hardlink-out", class: errdefs.InvalidArgument, entries: []testregistry.Entry{
			{Name: "passwd", Type: tar.TypeLink, Link: "../../../../etc/passwd"}}},
		{name: "hardlink-through-symlink", class: errdefs.InvalidArgument, entries: []testregistry.Entry{
			{Name: "etc", Type: tar.TypeSymlink, Link: "/etc"},
			{Name: "passwd", Type: tar.TypeLink, Link: "etc/passwd"}}},
		{name: "whiteout-through-symlink", class: errdefs.InvalidArgument, entries: []testregistry.Entry{
			{Name: "v", Type: tar.TypeSymlink, Link: victim},
			{Name: "v/.wh.keep"}}},
		{name: "bomb", class: errdefs.ResourceExhausted, raw: bombTar},
		{name: "truncated", class: errdefs.InvalidArgument, raw: truncated},
	}
	if err := os.WriteFile(filepath.Join(victim, "keep"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := c.raw
			if raw == nil {
				raw = testregistry.Tar(t, c.entries...)
			}
			reg.Push(t, "hostile:"+c.name, testregistry.Image(t, v1.Config{}, arch, good, testregistry.Layer(t, raw)))
			_, err := s.Pull(t.Context(), "", reg.Ref("hostile:"+c.name), nil)
			if errdefs.ClassOf(err) != c.class {
				t.Fatalf("pull: %v (class %q), want %s", err, errdefs.ClassOf(err), c.class)
			}
			ents, _ := os.ReadDir(victim)
			if len(ents) != 1 {
				t.Fatalf("the victim dir holds %d entries: the layer wrote outside the store", len(ents))
			}
			if b, _ := os.ReadFile("/etc/passwd"); !strings.HasPrefix(string(b), "root:") {
				t.Fatalf("/etc/passwd changed")
			}
			for _, d := range s.layerDirs(t) {
				if strings.HasPrefix(d, ".tmp") {
					t.Fatalf("a partial layer %s stayed", d)
				}
			}
			if _, err := s.Lookup(t.Context(), "", reg.Ref("hostile:"+c.name)); !errdefs.IsNotFound(err) {
				t.Fatalf("a refused image is stored: %v", err)
			}
		})
	}
	// The good layer the refused images shared is stored once and whole.
	if dirs := s.layerDirs(t); len(dirs) != 1 {
		t.Errorf("layer dirs %v, want only the good layer's", dirs)
	}
}

// TestWrongDigests: a registry that serves other bytes than the manifest
// names, or a config whose diff ids do not match the layers' tars, is
// refused.
func TestWrongDigests(t *testing.T) {
	s := newOCIStore(t)
	reg := testregistry.Start(t)
	l := testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "a", Body: "real"}))
	img := testregistry.Image(t, v1.Config{}, arch, l)
	reg.Push(t, "tampered:1", img)
	// The same size as the real blob (the client checks the length), one
	// byte different.
	rc, _ := l.Compressed()
	evil, _ := io.ReadAll(rc)
	evil[len(evil)/2] ^= 0xff
	d, _ := l.Digest()
	reg.Hook(func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) && r.Method == http.MethodGet {
			w.Write(evil)
			return true
		}
		return false
	})
	if _, err := s.Pull(t.Context(), "", reg.Ref("tampered:1"), nil); errdefs.ClassOf(err) != errdefs.InvalidArgument {
		t.Errorf("pull of a tampered blob: %v", err)
	}
	reg.Hook(nil)

	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	lying, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	reg.Push(t, "lying:1", lying)
	if _, err := s.Pull(t.Context(), "", reg.Ref("lying:1"), nil); errdefs.ClassOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "digest") {
		t.Errorf("pull of a config that lies: %v", err)
	}
	for _, d := range s.layerDirs(t) {
		t.Errorf("left %s in the store", d)
	}
}

// TestPullErrors: an unknown image is not_found naming it; a registry that
// is down is unavailable; a bad reference is invalid_argument.
func TestPullErrors(t *testing.T) {
	s := newOCIStore(t)
	reg := testregistry.Start(t)
	if _, err := s.Pull(t.Context(), "", reg.Ref("nothing:here"), nil); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "nothing:here") {
		t.Errorf("unknown image: %v", err)
	}
	if _, err := s.Pull(t.Context(), "", "Not A Ref!", nil); errdefs.ClassOf(err) != errdefs.InvalidArgument {
		t.Errorf("bad reference: %v", err)
	}
	host := reg.Host
	reg.Close()
	if _, err := s.Pull(t.Context(), "", host+"/gone:1", nil); errdefs.ClassOf(err) != errdefs.Unavailable {
		t.Errorf("registry down: %v (class %s)", err, errdefs.ClassOf(err))
	}
	if _, err := s.Lookup(t.Context(), "", "never-pulled:1"); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "never-pulled:1") {
		t.Errorf("lookup of an image never pulled: %v", err)
	}
}

// TestInterruptedPull: a pull cut off mid-layer leaves no partial layer;
// the next pull fetches what is missing and succeeds. (The daemon killed
// mid-pull is e2e's TestImagePullSurvivesKill.)
func TestInterruptedPull(t *testing.T) {
	s := newOCIStore(t)
	reg := testregistry.Start(t)
	small := testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "small", Body: "s"}))
	bigTar := testregistry.Tar(t, testregistry.Entry{Name: "big", Body: strings.Repeat("0123456789abcdef", 1<<18)})
	big := testregistry.Layer(t, bigTar)
	reg.Push(t, "cut:1", testregistry.Image(t, v1.Config{}, arch, small, big))
	bd, _ := big.Digest()
	reg.Hook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, bd.String()) {
			rc, _ := big.Compressed()
			b, _ := io.ReadAll(rc)
			w.Header().Set("Content-Length", "999999999")
			w.Write(b[:len(b)/2])
			panic(http.ErrAbortHandler) // the connection drops mid-blob
		}
		return false
	})
	if _, err := s.Pull(t.Context(), "", reg.Ref("cut:1"), nil); err == nil {
		t.Fatal("a pull cut off mid-layer succeeded")
	}
	for _, d := range s.layerDirs(t) {
		if strings.HasPrefix(d, ".tmp") {
			t.Fatalf("a partial layer %s stayed", d)
		}
	}
	reg.Hook(nil)
	sd, _ := small.Digest()
	before := reg.BlobGets(sd.String())
	if _, err := s.Pull(t.Context(), "", reg.Ref("cut:1"), nil); err != nil {
		t.Fatal(err)
	}
	if reg.BlobGets(sd.String()) != before {
		t.Errorf("the layer stored by the cut-off pull was fetched again")
	}
}

// TestRemoveAndPrune: an image a sandbox is made of cannot be removed (its
// sandboxes are named); a second name is only untagged; removing the image
// removes the layers no other image has; prune removes unnamed, unused
// images.
func TestRemoveAndPrune(t *testing.T) {
	s := newOCIStore(t)
	reg := testregistry.Start(t)
	shared := testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "shared", Body: "s"}))
	own := testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "own", Body: "o"}))
	a := reg.Push(t, "a:1", testregistry.Image(t, v1.Config{}, arch, shared, own))
	reg.Push(t, "b:1", testregistry.Image(t, v1.Config{}, arch, shared))
	ctx := t.Context()
	for _, r := range []string{"a:1", "b:1"} {
		if _, err := s.Pull(ctx, "", reg.Ref(r), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.CreateSandbox(ctx, store.Sandbox{ID: "sb1", State: api.StateRunning, Image: reg.Ref("a:1"), ImageID: a, Runtime: "native", Spec: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Remove(ctx, "", a)
	if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "sb1") {
		t.Fatalf("remove of an image in use: %v", err)
	}
	if img, err := s.Inspect(ctx, "", a); err != nil || len(img.InUse) != 1 {
		t.Fatalf("inspect: %+v, %v", img.InUse, err)
	}
	if err := s.db.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if len(s.layerDirs(t)) != 2 {
		t.Fatalf("layer dirs %v", s.layerDirs(t))
	}
	res, err := s.Remove(ctx, "", reg.Ref("a:1"))
	if err != nil || res.Layers != 1 {
		t.Fatalf("remove a: %+v, %v: want its own layer gone, the shared one kept", res, err)
	}
	if _, err := s.Resolve(ctx, reg.Ref("b:1"), image.Unmapped); err != nil {
		t.Fatalf("b after a's removal: %v", err)
	}
	if _, err := s.Remove(ctx, "", "sha256:"+strings.Repeat("0", 64)); !errdefs.IsNotFound(err) {
		t.Errorf("remove of an unknown id: %v", err)
	}
	// Prune: b is named, so only --all removes it.
	if res, err := s.Prune(ctx, false); err != nil || len(res.Images) != 0 {
		t.Fatalf("prune: %+v, %v", res, err)
	}
	if res, err := s.Prune(ctx, true); err != nil || len(res.Images) != 1 || res.Layers != 1 {
		t.Fatalf("prune --all: %+v, %v", res, err)
	}
	if dirs := s.layerDirs(t); len(dirs) != 0 {
		t.Errorf("layer dirs after prune: %v", dirs)
	}
}

// TestImport stores a docker save tarball and an OCI layout tar.
func TestImport(t *testing.T) {
	s := newOCIStore(t)
	img := twoLayers(t)
	tag, _ := name.NewTag("example.com/team/tiny:2")
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	got, err := s.Import(t.Context(), "", &buf, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Layers) != 2 || got[0].Names[0] != "example.com/team/tiny:2" {
		t.Fatalf("imported %+v", got)
	}
	// An OCI layout, named by the caller.
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	var lt bytes.Buffer
	tw := tar.NewWriter(&lt)
	filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		rel, _ := filepath.Rel(dir, path)
		if fi.IsDir() || err != nil {
			return err
		}
		b, _ := os.ReadFile(path)
		tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
		return nil
	})
	tw.Close()
	got, err = s.Import(t.Context(), "", &lt, "local/tiny:oci", nil)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.Lookup(t.Context(), "", "local/tiny:oci"); err != nil || l.ID != got[0].ID {
		t.Fatalf("lookup of the imported name: %+v, %v", l, err)
	}
	if _, err := s.Import(t.Context(), "", strings.NewReader("not a tar at all"), "", nil); errdefs.ClassOf(err) != errdefs.InvalidArgument {
		t.Errorf("import of garbage: %v", err)
	}
}

// TestReadFileStaysInTheImage: the daemon reads an image's file (the trust
// bundle it extends with a sandbox's CA) as the sandbox would see it: an
// image whose file is a symlink to a host file (absolute, or climbing with
// "..") reads nothing of the host, and a whiteout hides a lower layer's file.
func TestReadFileStaysInTheImage(t *testing.T) {
	s := newOCIStore(t)
	reg := testregistry.Start(t)
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("HOST SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, link := range map[string]string{"absolute": secret, "climbing": "../../../../../../../../../../" + secret} {
		reg.Push(t, "trust:"+name, testregistry.Image(t, v1.Config{}, arch, testregistry.Layer(t, testregistry.Tar(t,
			testregistry.Entry{Name: "etc/ssl/certs/ca-certificates.crt", Type: tar.TypeSymlink, Link: link}))))
		if _, err := s.Pull(t.Context(), "", reg.Ref("trust:"+name), nil); err != nil {
			t.Fatal(err)
		}
		res, err := s.Resolve(t.Context(), reg.Ref("trust:"+name), image.Unmapped)
		if err != nil {
			t.Fatal(err)
		}
		b, found, err := image.ReadFile(res.Root.Layers, "etc/ssl/certs/ca-certificates.crt", 1<<20)
		if found || strings.Contains(string(b), "HOST SECRET") {
			t.Fatalf("%s symlink: read %q (found %v, %v) from the host", name, b, found, err)
		}
	}
	bottom := testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "etc/f", Body: "lower"}))
	top := testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "etc/.wh.f"}))
	reg.Push(t, "trust:whiteout", testregistry.Image(t, v1.Config{}, arch, bottom, top))
	if _, err := s.Pull(t.Context(), "", reg.Ref("trust:whiteout"), nil); err != nil {
		t.Fatal(err)
	}
	res, _ := s.Resolve(t.Context(), reg.Ref("trust:whiteout"), image.Unmapped)
	if b, found, _ := image.ReadFile(res.Root.Layers, "etc/f", 1<<20); found {
		t.Fatalf("a whited-out file read as %q", b)
	}
	if b, found, err := image.ReadFile(res.Root.Layers[1:], "etc/f", 1<<20); !found || string(b) != "lower" {
		t.Fatalf("the lower layer alone: %q %v %v", b, found, err)
	}
}

// TestTenantImages: a tenant's names are its own (another tenant's name or
// id is not_found, like a missing one); the operator's are a catalog every
// tenant uses and only the operator removes; one name in two tenants is
// two images; content is shared and goes only when no one names it.
func TestTenantImages(t *testing.T) {
	reg := testregistry.Start(t)
	s := newOCIStore(t, image.WithInsecureRegistries([]string{reg.Host})) // the operator names it: tenants may reach it
	ctx := t.Context()
	layer := func(body string) v1.Layer {
		return testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "f", Body: body}))
	}
	alphaID := reg.Push(t, "app:alpha", testregistry.Image(t, v1.Config{}, arch, layer("alpha")))
	catID := reg.Push(t, "catalog:1", testregistry.Image(t, v1.Config{}, arch, layer("catalog")))
	if _, err := s.Pull(ctx, "", reg.Ref("catalog:1"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(ctx, "a", reg.Ref("app:alpha"), nil); err != nil {
		t.Fatal(err)
	}
	// Tenant b imports its own image under the same name as a's.
	tag, err := name.NewTag(reg.Ref("app:alpha"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, testregistry.Image(t, v1.Config{}, arch, layer("beta")), &buf); err != nil {
		t.Fatal(err)
	}
	imported, err := s.Import(ctx, "b", &buf, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	betaID := imported[0].ID
	for _, c := range []struct {
		tenant, ref, want string
	}{
		{"a", reg.Ref("app:alpha"), alphaID},
		{"b", reg.Ref("app:alpha"), betaID},
		{"a", reg.Ref("catalog:1"), catID},
		{"b", reg.Ref("catalog:1"), catID},
		{"a", catID, catID},
		{"a", alphaID, alphaID},
		{"", alphaID, alphaID}, // the operator sees every image by id
	} {
		img, err := s.Lookup(ctx, c.tenant, c.ref)
		if err != nil || img.ID != c.want {
			t.Errorf("tenant %q: %s: %s, %v; want %s", c.tenant, c.ref, img.ID, err, c.want)
		}
	}
	for _, c := range []struct{ tenant, ref string }{
		{"b", alphaID},              // a's image by id
		{"a", betaID},               // b's image by id
		{"c", reg.Ref("app:alpha")}, // a's and b's name
		{"", reg.Ref("app:alpha")},  // the operator resolves the operator's names
		{"c", "sha256:" + strings.Repeat("0", 64)},
	} {
		if _, err := s.Lookup(ctx, c.tenant, c.ref); !errdefs.IsNotFound(err) {
			t.Errorf("tenant %q: %s: %v, want not_found", c.tenant, c.ref, err)
		}
		if _, err := s.Inspect(ctx, c.tenant, c.ref); !errdefs.IsNotFound(err) {
			t.Errorf("tenant %q: inspect %s: %v, want not_found", c.tenant, c.ref, err)
		}
		if _, err := s.Remove(ctx, c.tenant, c.ref); !errdefs.IsNotFound(err) {
			t.Errorf("tenant %q: remove %s: %v, want not_found", c.tenant, c.ref, err)
		}
	}
	// Lists: a tenant sees its own and the operator's; the operator every one.
	ids := func(tenant string) []string {
		imgs, err := s.List(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, img := range imgs {
			out = append(out, img.ID)
		}
		slices.Sort(out)
		return out
	}
	want := func(ids ...string) []string { slices.Sort(ids); return ids }
	if got := ids("a"); !slices.Equal(got, want(alphaID, catID)) {
		t.Errorf("a lists %v", got)
	}
	if got := ids("c"); !slices.Equal(got, want(catID)) {
		t.Errorf("c lists %v", got)
	}
	if got := ids(""); !slices.Equal(got, want(alphaID, betaID, catID)) {
		t.Errorf("the operator lists %v", got)
	}
	img, err := s.Inspect(ctx, "", betaID)
	if err != nil || len(img.Names) != 0 || !slices.Contains(img.TenantNames["b"], reg.Ref("app:alpha")) {
		t.Errorf("the operator's view of b's image: names %v, tenant names %v, %v", img.Names, img.TenantNames, err)
	}
	img, err = s.Inspect(ctx, "a", reg.Ref("app:alpha"))
	if err != nil || len(img.TenantNames) != 1 || len(img.TenantNames["a"]) == 0 {
		t.Errorf("a's view of its image: tenant names %v, %v", img.TenantNames, err)
	}
	// The catalog is the operator's to remove.
	if _, err := s.Remove(ctx, "a", reg.Ref("catalog:1")); errdefs.ClassOf(err) != errdefs.PermissionDenied {
		t.Errorf("a removes the operator's image: %v", err)
	}
	if _, err := s.Remove(ctx, "a", catID); errdefs.ClassOf(err) != errdefs.PermissionDenied {
		t.Errorf("a removes the operator's image by id: %v", err)
	}
	// Shared content: the operator names a's image too; a's removal of its
	// name leaves the image to the operator.
	if _, err := s.Pull(ctx, "", reg.Ref("app:alpha"), nil); err != nil {
		t.Fatal(err)
	}
	res, err := s.Remove(ctx, "a", reg.Ref("app:alpha"))
	if err != nil || len(res.Images) != 0 {
		t.Fatalf("a removes its name of a shared image: %+v, %v", res, err)
	}
	if img, err := s.Lookup(ctx, "a", reg.Ref("app:alpha")); err != nil || img.ID != alphaID {
		t.Errorf("a's name gone, the operator's resolves: %s, %v", img.ID, err)
	}
	// b's own sandbox keeps its image from b's removal (conflict naming it);
	// once it is gone, the image and its layer go.
	if err := s.db.CreateSandbox(ctx, store.Sandbox{ID: "sb-b", Tenant: "b", State: api.StateRunning, Image: reg.Ref("app:alpha"), ImageID: betaID, Runtime: "native", Spec: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, "b", reg.Ref("app:alpha")); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "sb-b") {
		t.Fatalf("b removes the image its sandbox is made of: %v", err)
	}
	if img, err := s.Inspect(ctx, "a", alphaID); err != nil || len(img.InUse) != 0 {
		t.Errorf("a sees b's sandbox in in_use: %+v, %v", img.InUse, err)
	}
	if err := s.db.DeleteSandbox(ctx, "sb-b"); err != nil {
		t.Fatal(err)
	}
	res, err = s.Remove(ctx, "b", betaID)
	if err != nil || len(res.Images) != 1 || res.Layers != 1 {
		t.Fatalf("b removes its image by id: %+v, %v", res, err)
	}
	// Another tenant's sandbox made of a tenant's image (of the same
	// content, named by it once): the tenant's removal is no conflict and
	// names nothing of the other's; the image stays, unnamed, for it.
	if _, err := s.Pull(ctx, "c", reg.Ref("catalog:1"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, "", reg.Ref("catalog:1")); err != nil {
		t.Fatal(err)
	}
	if err := s.db.CreateSandbox(ctx, store.Sandbox{ID: "sb-d", Tenant: "d", State: api.StateRunning, Image: "x", ImageID: catID, Runtime: "native", Spec: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	res, err = s.Remove(ctx, "c", reg.Ref("catalog:1"))
	if err != nil || len(res.Images) != 0 {
		t.Fatalf("c removes its name of an image d's sandbox is made of: %+v, %v", res, err)
	}
	if _, err := s.Lookup(ctx, "c", catID); !errdefs.IsNotFound(err) {
		t.Errorf("c still finds the image it removed: %v", err)
	}
	if img, err := s.Lookup(ctx, "d", catID); err != nil || len(img.Names) != 0 {
		t.Errorf("d's sandbox's image: %+v, %v", img, err)
	}
}

// TestBuiltImageGrant: a build's step image (stored without names) is its
// tenant's to use by id until Forget, and no one else's.
func TestBuiltImageGrant(t *testing.T) {
	s := newOCIStore(t)
	ctx := t.Context()
	img, err := s.StoreBuilt(ctx, "a", v1.ConfigFile{OS: "linux", Architecture: arch}, nil, image.BuiltPrefix+"Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Names) != 0 {
		t.Errorf("a step image has names %v", img.Names)
	}
	if _, err := s.Lookup(ctx, "a", img.ID); err != nil {
		t.Errorf("a uses its step image: %v", err)
	}
	if _, err := s.Lookup(ctx, "b", img.ID); !errdefs.IsNotFound(err) {
		t.Errorf("b uses a's step image: %v", err)
	}
	if imgs, err := s.List(ctx, "a"); err != nil || len(imgs) != 0 {
		t.Errorf("a lists its step image: %v, %v", imgs, err)
	}
	if err := s.Forget(ctx, "a", img.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "", img.ID); !errdefs.IsNotFound(err) {
		t.Errorf("a forgotten step image: %v", err)
	}
	named, err := s.StoreBuilt(ctx, "a", v1.ConfigFile{OS: "linux", Architecture: arch}, []string{"agent:1"}, image.BuiltPrefix+"Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "a", "agent:1"); err != nil {
		t.Errorf("a's template: %v", err)
	}
	if _, err := s.Lookup(ctx, "b", "agent:1"); !errdefs.IsNotFound(err) {
		t.Errorf("b finds a's template: %v", err)
	}
	if _, err := s.Lookup(ctx, "b", named.ID); !errdefs.IsNotFound(err) {
		t.Errorf("b finds a's template by id: %v", err)
	}
}

// TestTenantPullsReachPublicRegistriesOnly: a tenant's pull cannot make the
// daemon fetch from the host's loopback (a service there, or a registry
// the operator did not name) and read the answer in the error; the
// operator's pull still can; a tenant's pull carries none of the daemon's
// registry credentials.
func TestTenantPullsReachPublicRegistriesOnly(t *testing.T) {
	secret := "LOOPBACK-SECRET-" + t.Name()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"errors":[{"code":"DENIED","message":%q}]}`, secret)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	s := newOCIStore(t)
	_, err := s.Pull(t.Context(), "a", host+"/x:1", nil)
	if !errdefs.IsPermissionDenied(err) || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "not a public address") {
		t.Fatalf("a tenant's pull from the host's loopback: %v", err)
	}
	// The operator's pull reaches it (and reads what it says).
	if _, err := s.Pull(t.Context(), "", host+"/x:1", nil); err == nil || !strings.Contains(err.Error(), secret) {
		t.Fatalf("the operator's pull: %v", err)
	}
	// A registry the operator named: a tenant reaches it, and its error
	// carries the status and codes, not the body.
	named := newOCIStore(t, image.WithInsecureRegistries([]string{host}))
	_, err = named.Pull(t.Context(), "a", host+"/x:1", nil)
	if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a tenant's pull from a named registry: %v", err)
	}
}
