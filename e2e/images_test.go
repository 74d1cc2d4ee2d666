package e2e

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testregistry"
	"github.com/berthsh/berth/internal/testutil"
)

// tinyImage is an image of one static program (internal/testtool) and the
// directories and users a sandbox needs, with a config whose env, working
// dir and user are the sandbox's defaults.
func tinyImage(t *testing.T) v1.Image {
	t.Helper()
	bin, err := os.ReadFile(testutil.Program(t, "github.com/berthsh/berth/internal/testtool"))
	if err != nil {
		t.Fatal(err)
	}
	layer := testregistry.Tar(t,
		testregistry.Entry{Name: "bin/", Type: tar.TypeDir},
		testregistry.Entry{Name: "bin/testtool", Body: string(bin), Mode: 0o755},
		testregistry.Entry{Name: "etc/", Type: tar.TypeDir},
		testregistry.Entry{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/testtool\napp:x:1000:1000:app:/srv/app:/bin/testtool\n"},
		testregistry.Entry{Name: "etc/group", Body: "root:x:0:\napp:x:1000:\n"},
		testregistry.Entry{Name: "etc/motd", Body: "from the image\n"},
		testregistry.Entry{Name: "srv/app/", Type: tar.TypeDir, UID: 1000, GID: 1000},
		testregistry.Entry{Name: "usr/share/", Type: tar.TypeDir},
		testregistry.Entry{Name: "usr/share/data", Body: "image data\n"},
	)
	return testregistry.Image(t, v1.Config{Env: []string{"PATH=/bin", "GREETING=from-config"}, WorkingDir: "/srv/app", User: "app"},
		goruntime.GOARCH, testregistry.Layer(t, layer))
}

// TestSandboxFromAnImage pulls an image from a registry on loopback and
// makes sandboxes of it: the image's config gives the defaults (the
// request's win), its files are root's inside and root inside changes them
// through the writable layer, another user cannot, and the image cannot be
// removed while a sandbox uses it. The sandbox stays pinned to its image
// when the name moves, across a stop and start.
//
// It runs twice: with idmapped layers (this kernel's path) and with the
// fallback for kernels without them, a shifted copy of each layer per
// sandbox's id range (--no-idmapped-layers).
func TestSandboxFromAnImage(t *testing.T) {
	t.Run("idmapped", func(t *testing.T) { testSandboxFromAnImage(t, false) })
	t.Run("shifted", func(t *testing.T) { testSandboxFromAnImage(t, true) })
}

func testSandboxFromAnImage(t *testing.T, shifted bool) {
	reg := testregistry.Start(t)
	id := reg.Push(t, "tiny:1", tinyImage(t))
	flags := []string{"--insecure-registry", reg.Host}
	if shifted {
		flags = append(flags, "--no-idmapped-layers")
	}
	d := startDaemon(t, "", flags...)
	copies := func() int {
		m, _ := filepath.Glob(filepath.Join(d.state, "images", "oci", "shifted", "*", "*"))
		return len(m)
	}
	ctx := t.Context()
	ref := reg.Ref("tiny:1")

	// Created without a pull first: the create pulls.
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ImageID != id || sb.User != "app" || sb.Workdir != "/srv/app" || sb.Env["GREETING"] != "from-config" {
		t.Fatalf("sandbox %+v: want the image's id and its config's defaults", sb)
	}
	run := func(id string, req api.ExecRequest) api.ExecResult {
		t.Helper()
		r, err := d.client.Exec(ctx, id, req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := run(sb.ID, api.ExecRequest{Cmd: []string{"testtool", "id"}}); string(r.Stdout) != "uid=1000 gid=1000 cwd=/srv/app\n" {
		t.Fatalf("id: %+v", r)
	}
	if r := run(sb.ID, api.ExecRequest{Cmd: []string{"testtool", "env", "GREETING"}, Env: map[string]string{"GREETING": "from-exec"}}); string(r.Stdout) != "from-exec\n" {
		t.Fatalf("exec env over the image's: %q", r.Stdout)
	}
	// The user cannot change the image's files; root can, in its own layer.
	if r := run(sb.ID, api.ExecRequest{Cmd: []string{"testtool", "write", "/usr/share/data", "user was here"}}); r.ExitCode == 0 {
		t.Fatalf("the image's user wrote root's file in /usr: %+v", r)
	}
	if r := run(sb.ID, api.ExecRequest{Cmd: []string{"testtool", "write", "/etc/motd", "root was here"}, User: "root"}); r.ExitCode != 0 {
		t.Fatalf("root inside could not change the image's /etc/motd: %+v %s", r, r.Stderr)
	}
	if r := run(sb.ID, api.ExecRequest{Cmd: []string{"testtool", "cat", "/etc/motd"}}); string(r.Stdout) != "root was here" {
		t.Fatalf("/etc/motd: %q", r.Stdout)
	}
	// Which path this host took: copies of the layer per id range, or none.
	if n := copies(); (n > 0) != shifted {
		t.Fatalf("%d shifted layer copies with shifted=%v", n, shifted)
	}
	// A second sandbox of the image sees the image, not the first one's change.
	sb2, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Image: id, User: "root", Workdir: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if r := run(sb2.ID, api.ExecRequest{Cmd: []string{"testtool", "cat", "/etc/motd"}}); string(r.Stdout) != "from the image\n" {
		t.Fatalf("a second sandbox sees %q", r.Stdout)
	}
	if r := run(sb2.ID, api.ExecRequest{Cmd: []string{"testtool", "id"}}); string(r.Stdout) != "uid=0 gid=0 cwd=/\n" {
		t.Fatalf("the request's user and workdir: %q", r.Stdout)
	}
	// In use: not removable.
	if _, err := d.client.RemoveImage(ctx, ref); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("remove of an image in use: %v", err)
	}
	// The name moves to another image; the sandbox keeps its own across a stop and start.
	reg.Push(t, "tiny:1", testregistry.Image(t, v1.Config{}, goruntime.GOARCH, testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "other", Body: "x"}))))
	if _, err := d.client.PullImage(ctx, ref, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := run(sb.ID, api.ExecRequest{Cmd: []string{"testtool", "cat", "/etc/motd"}}); string(r.Stdout) != "root was here" {
		t.Fatalf("after the name moved and a restart: %q %s", r.Stdout, r.Stderr)
	}
	for _, s := range []string{sb.ID, sb2.ID} {
		if err := d.client.DeleteSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.client.RemoveImage(ctx, id); err != nil {
		t.Fatalf("remove after the sandboxes went: %v", err)
	}
	// Bad input: an image the registry lacks, a registry that is down.
	if _, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Image: reg.Ref("missing:1")}); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "missing:1") {
		t.Fatalf("create of an unknown image: %v", err)
	}
	if list, _ := d.client.ListSandboxes(ctx, nil); len(list) != 0 {
		t.Fatalf("a failed create left %d sandboxes", len(list))
	}
	reg.Close()
	if _, err := d.client.PullImage(ctx, reg.Ref("tiny:2"), nil); errdefs.ClassOf(err) != errdefs.Unavailable {
		t.Fatalf("pull from a registry that is down: %v", err)
	}
}

// TestImageCLI drives berth image and berth pool: pull with progress, ls,
// inspect, a warm pool of the image that a create is handed from, rm.
func TestImageCLI(t *testing.T) {
	reg := testregistry.Start(t)
	id := reg.Push(t, "tiny:cli", tinyImage(t))
	d := startDaemon(t, "")
	ref := reg.Ref("tiny:cli")
	if out, errOut, code := d.cli("", "image", "pull", ref); code != 0 || strings.TrimSpace(out) != id {
		t.Fatalf("image pull: %d %q %q", code, out, errOut)
	}
	if out, _, code := d.cli("", "image", "ls"); code != 0 || !strings.Contains(out, ref) || !strings.Contains(out, id[7:19]) {
		t.Fatalf("image ls:\n%s", out)
	}
	if out, _, code := d.cli("", "image", "inspect", ref); code != 0 || !strings.Contains(out, `"working_dir": "/srv/app"`) {
		t.Fatalf("image inspect:\n%s", out)
	}
	if out, errOut, code := d.cli("", "pool", ref+"=1"); code != 0 || !strings.Contains(out, ref) {
		t.Fatalf("pool: %d %q %q", code, out, errOut)
	}
	ctx := t.Context()
	waitFor(t, 30*time.Second, func() bool {
		p, err := d.client.Pools(ctx)
		return err == nil && len(p) == 1 && p[0].Ready == 1
	})
	pooled := d.sandboxDirs()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ImageID != id || sb.User != "app" {
		t.Fatalf("pooled sandbox: %+v", sb)
	}
	if r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"testtool", "id"}}); err != nil || string(r.Stdout) != "uid=1000 gid=1000 cwd=/srv/app\n" {
		t.Fatalf("exec in the handed-over sandbox: %+v %v", r, err)
	}
	if pooled == 0 {
		t.Fatalf("no pooled sandbox on disk before the create")
	}
	// The pool refills; the create was a hand-over (no new boot while it was ready).
	waitFor(t, 30*time.Second, func() bool {
		p, err := d.client.Pools(ctx)
		return err == nil && p[0].Ready == 1
	})
	if _, _, code := d.cli("", "pool", ref+"=0"); code != 0 {
		t.Fatal("pool =0 failed")
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return d.sandboxDirs() == 0 })
	if out, errOut, code := d.cli("", "image", "rm", ref); code != 0 || !strings.Contains(out, "deleted "+id) {
		t.Fatalf("image rm: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := d.cli("", "image", "inspect", ref); code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("inspect after rm: %d %q", code, errOut)
	}
}

// TestImagePullSurvivesKill kills the daemon with SIGKILL in the middle of
// a pull: the restarted daemon keeps no partial layer, and the pull then
// succeeds; two pulls at once of a multi-layer image fetch each blob once.
func TestImagePullSurvivesKill(t *testing.T) {
	reg := testregistry.Start(t)
	var layers []v1.Layer
	for i := range 3 {
		layers = append(layers, testregistry.Layer(t, testregistry.Tar(t, testregistry.Entry{Name: "f" + string(rune('a'+i)), Body: strings.Repeat(string(rune('a'+i)), 4<<20)})))
	}
	reg.Push(t, "multi:1", testregistry.Image(t, v1.Config{}, goruntime.GOARCH, layers...))
	stall := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	last, _ := layers[2].Digest()
	reg.Hook(func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, last.String()) {
			once.Do(func() { close(started) })
			<-stall
		}
		return false
	})
	d := startDaemon(t, "")
	ctx := t.Context()
	errc := make(chan error, 1)
	go func() { _, err := d.client.PullImage(ctx, reg.Ref("multi:1"), nil); errc <- err }()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the pull did not reach the last layer")
	}
	d.kill9()
	<-errc
	close(stall)
	reg.Hook(nil)
	d.start()
	ents, err := os.ReadDir(d.state + "/images/oci/layers")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp") {
			t.Fatalf("a partial layer %s survived the restart", e.Name())
		}
	}
	if len(ents) > 2 {
		t.Fatalf("%d layer dirs after a pull killed before its third layer", len(ents))
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { _, errs[i] = d.client.PullImage(ctx, reg.Ref("multi:1"), nil) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := reg.BlobGets(last.String()); n != 2 { // the killed pull's and one more
		t.Errorf("the last layer was fetched %d times, want 2 (the killed pull's, then one for both pulls)", n)
	}
}

// debianImage is the Debian image scripts/test-deps.sh builds with
// mmdebstrap (bookworm, minbase, python3 and pip), as one layer.
func debianImage(t *testing.T) v1.Image {
	t.Helper()
	cache := os.Getenv("BERTH_TEST_CACHE")
	if cache == "" {
		cache = "/var/cache/berth-test"
	}
	file := filepath.Join(cache, "debian-bookworm-python-v1.tar")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the Debian test image is missing (make test builds it: scripts/test-deps.sh): %v", err)
	}
	layer, err := tarball.LayerFromFile(file, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		t.Fatal(err)
	}
	return testregistry.Image(t, v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Cmd: []string{"bash"}},
		goruntime.GOARCH, layer)
}

// TestDebianImageRootOwnsIt: in a real Debian image, root inside installs a
// local .deb with apt-get, a local wheel with pip into /usr/local, and
// edits /etc/hosts, all through its writable layer, although it is an
// unprivileged uid outside; another user cannot write /usr.
func TestDebianImageRootOwnsIt(t *testing.T) {
	reg := testregistry.Start(t)
	reg.Push(t, "debian:bookworm", debianImage(t))
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Image: reg.Ref("debian:bookworm")})
	if err != nil {
		t.Fatal(err)
	}
	if sb.User != "root" || sb.Workdir != "/" {
		t.Fatalf("defaults of an image without user and working dir: %q %q", sb.User, sb.Workdir)
	}
	sh := func(user, script string) api.ExecResult {
		t.Helper()
		r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: script, User: user, TimeoutMs: 120_000})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// A .deb built here, installed inside with apt-get.
	pkg := t.TempDir()
	os.MkdirAll(filepath.Join(pkg, "DEBIAN"), 0o755)
	os.MkdirAll(filepath.Join(pkg, "usr/bin"), 0o755)
	os.WriteFile(filepath.Join(pkg, "DEBIAN/control"), []byte("Package: berth-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: berth tests <tests@berth.invalid>\nDescription: a package the image tests install\n"), 0o644)
	os.WriteFile(filepath.Join(pkg, "usr/bin/berth-hello"), []byte("#!/bin/sh\necho hello from a deb\n"), 0o755)
	deb := filepath.Join(t.TempDir(), "berth-hello.deb")
	if out, err := exec.Command("dpkg-deb", "--build", "--root-owner-group", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v\n%s", err, out)
	}
	upload := func(path string, file string) {
		t.Helper()
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := d.client.Upload(ctx, sb.ID, path, f, client.FileOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	upload("/tmp/berth-hello.deb", deb)
	if r := sh("", "apt-get install -y /tmp/berth-hello.deb && berth-hello && dpkg -s berth-hello | grep Status"); r.ExitCode != 0 ||
		!strings.Contains(string(r.Stdout), "hello from a deb") || !strings.Contains(string(r.Stdout), "install ok installed") {
		t.Fatalf("apt-get install of a local .deb: %d\n%s\n%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	// A wheel built here, installed with pip into /usr/local.
	whl := filepath.Join(t.TempDir(), "berth_hello-1.0-py3-none-any.whl")
	writeWheel(t, whl)
	upload("/tmp/berth_hello-1.0-py3-none-any.whl", whl)
	if r := sh("", "python3 -m pip install --no-index --break-system-packages /tmp/berth_hello-1.0-py3-none-any.whl && "+
		"python3 -c 'import berth_hello, os; print(berth_hello.GREETING, os.path.dirname(berth_hello.__file__))'"); r.ExitCode != 0 ||
		!strings.Contains(string(r.Stdout), "hi from a wheel /usr/local/lib/python3") {
		t.Fatalf("pip install of a local wheel into /usr/local: %d\n%s\n%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	if r := sh("", "echo '10.9.9.9 berth-test-host' >> /etc/hosts && getent hosts berth-test-host"); r.ExitCode != 0 || !strings.Contains(string(r.Stdout), "10.9.9.9") {
		t.Fatalf("editing /etc/hosts: %d %s %s", r.ExitCode, r.Stdout, r.Stderr)
	}
	if r := sh("1000:1000", "touch /usr/bin/x"); r.ExitCode == 0 {
		t.Fatalf("uid 1000 wrote /usr/bin")
	}
	if r := sh("1000:1000", "touch /usr/local/lib/x"); r.ExitCode == 0 {
		t.Fatalf("uid 1000 wrote /usr/local/lib")
	}
	if r := sh("1000:1000", "echo x >> /etc/hosts"); r.ExitCode == 0 {
		t.Fatalf("uid 1000 wrote /etc/hosts")
	}
}

// writeWheel writes a minimal pure-Python wheel of package berth_hello.
func writeWheel(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zw := zip.NewWriter(f)
	files := map[string]string{
		"berth_hello/__init__.py":                 "GREETING = 'hi from a wheel'\n",
		"berth_hello-1.0.dist-info/METADATA":      "Metadata-Version: 2.1\nName: berth-hello\nVersion: 1.0\n",
		"berth_hello-1.0.dist-info/WHEEL":         "Wheel-Version: 1.0\nGenerator: berth-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"berth_hello-1.0.dist-info/top_level.txt": "berth_hello\n",
	}
	var record strings.Builder
	for _, name := range []string{"berth_hello/__init__.py", "berth_hello-1.0.dist-info/METADATA", "berth_hello-1.0.dist-info/WHEEL", "berth_hello-1.0.dist-info/top_level.txt"} {
		w, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(files[name]))
		record.WriteString(name + ",,\n")
	}
	record.WriteString("berth_hello-1.0.dist-info/RECORD,,\n")
	w, _ := zw.Create("berth_hello-1.0.dist-info/RECORD")
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
}

// tinyImageSaying is tinyImage with GREETING=greeting: another image of
// the same layer.
func tinyImageSaying(t *testing.T, greeting string) v1.Image {
	t.Helper()
	img := tinyImage(t)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	c.Env = []string{"PATH=/bin", "GREETING=" + greeting}
	out, err := mutate.Config(img, c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTenantImages: a tenant's images are its own. Tenant A pulls an
// image from a registry on loopback and tenant B imports another under the
// same name: each name points at its tenant's image, and neither tenant
// can inspect, use (create from) or remove the other's, by name or by id,
// exactly as for an image that does not exist. The operator's image is
// the catalog both use and neither removes; the operator sees every
// tenant's names and removes one tenant's by naming the tenant.
func TestTenantImages(t *testing.T) {
	reg := testregistry.Start(t)
	catalogID := reg.Push(t, "catalog:1", tinyImageSaying(t, "from-the-operator"))
	aID := reg.Push(t, "app:1", tinyImageSaying(t, "from-a"))
	d := startDaemon(t, "", "--insecure-registry", reg.Host)
	ctx := t.Context()
	keyA, keyB, readA := tenantsOf(t, d)
	a, b := d.clientWith(t, keyA.Key), d.clientWith(t, keyB.Key)
	catalog, app := reg.Ref("catalog:1"), reg.Ref("app:1")

	if _, err := d.client.PullImage(ctx, catalog, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d.clientWith(t, readA.Key).PullImage(ctx, app, nil); errdefs.ClassOf(err) != errdefs.PermissionDenied {
		t.Fatalf("a read key pulls: %v", err)
	}
	img, err := a.PullImage(ctx, app, nil)
	if err != nil || img.ID != aID {
		t.Fatalf("A pulls: %+v %v", img, err)
	}
	if img.TenantNames["tenant-a"] == nil {
		t.Errorf("A's pull is not named as A's: %+v", img.TenantNames)
	}
	var buf bytes.Buffer
	tag, err := name.NewTag(app)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.Write(tag, tinyImageSaying(t, "from-b"), &buf); err != nil {
		t.Fatal(err)
	}
	imported, err := b.ImportImages(ctx, &buf, "", nil)
	if err != nil || len(imported) != 1 {
		t.Fatalf("B imports: %+v %v", imported, err)
	}
	bID := imported[0].ID
	if bID == aID {
		t.Fatal("B's image is A's")
	}

	// One name, two tenants, two images; the catalog is both's.
	for _, c := range []struct {
		who      string
		cl       *client.Client
		ref, id  string
		greeting string
	}{
		{"A", a, app, aID, "from-a"},
		{"B", b, app, bID, "from-b"},
		{"A", a, catalog, catalogID, "from-the-operator"},
		{"B", b, catalog, catalogID, "from-the-operator"},
		{"B", b, catalogID, catalogID, "from-the-operator"},
	} {
		sb, err := c.cl.CreateSandbox(ctx, api.CreateSandboxRequest{Image: c.ref})
		if err != nil {
			t.Fatalf("%s creates from %s: %v", c.who, c.ref, err)
		}
		if sb.ImageID != c.id || sb.Env["GREETING"] != c.greeting {
			t.Errorf("%s's sandbox of %s: image %s, GREETING %q; want %s, %q", c.who, c.ref, sb.ImageID, sb.Env["GREETING"], c.id, c.greeting)
		}
		if r, err := c.cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"testtool", "env", "GREETING"}}); err != nil || string(r.Stdout) != c.greeting+"\n" {
			t.Errorf("%s's sandbox of %s says %q, %v", c.who, c.ref, r.Stdout, err)
		}
		if err := c.cl.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}

	// The other tenant's image is exactly a missing one, by name and by id.
	missing := "sha256:" + strings.Repeat("0", 64)
	for _, c := range []struct {
		who        string
		cl         *client.Client
		other, bad string
	}{
		{"A", a, bID, missing},
		{"B", b, aID, missing},
	} {
		for _, ref := range []string{c.other, c.bad} {
			if _, err := c.cl.InspectImage(ctx, ref); !errdefs.IsNotFound(err) {
				t.Errorf("%s inspects %s: %v, want not_found", c.who, ref, err)
			}
			if _, err := c.cl.CreateSandbox(ctx, api.CreateSandboxRequest{Image: ref}); !errdefs.IsNotFound(err) {
				t.Errorf("%s creates from %s: %v, want not_found", c.who, ref, err)
			}
			if _, err := c.cl.RemoveImage(ctx, ref); !errdefs.IsNotFound(err) {
				t.Errorf("%s removes %s: %v, want not_found", c.who, ref, err)
			}
		}
	}
	c := d.clientWith(t, (func() string {
		k, err := d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-c"})
		if err != nil {
			t.Fatal(err)
		}
		return k.Key
	})())
	if _, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: aID}); !errdefs.IsNotFound(err) {
		t.Errorf("C creates from A's image by id: %v", err)
	}
	if _, err := c.InspectImage(ctx, app); !errdefs.IsNotFound(err) {
		t.Errorf("C inspects A's and B's name: %v", err)
	}
	// A tenant's key cannot reach another tenant's names through ?tenant=.
	if status, class, raw := d.call(t, keyA.Key, http.MethodGet, "/v1/images/"+app+"?tenant=tenant-b", nil, nil); class != string(errdefs.InvalidArgument) {
		t.Errorf("A inspects with ?tenant=tenant-b: %d %s", status, raw)
	}

	// Lists: each tenant its own and the catalog.
	ids := func(cl *client.Client) []string {
		imgs, err := cl.ListImages(ctx)
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
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	if got := ids(a); !slices.Equal(got, sorted(aID, catalogID)) {
		t.Errorf("A lists %v", got)
	}
	if got := ids(b); !slices.Equal(got, sorted(bID, catalogID)) {
		t.Errorf("B lists %v", got)
	}
	if got := ids(d.client); !slices.Equal(got, sorted(aID, bID, catalogID)) {
		t.Errorf("the operator lists %v", got)
	}
	op, err := d.client.InspectImage(ctx, bID)
	if err != nil || len(op.Names) != 0 || !slices.Contains(op.TenantNames["tenant-b"], app) {
		t.Errorf("the operator's view of B's image: %+v %v", op, err)
	}

	// The catalog is the operator's: a tenant cannot remove it.
	for _, ref := range []string{catalog, catalogID} {
		if _, err := a.RemoveImage(ctx, ref); errdefs.ClassOf(err) != errdefs.PermissionDenied {
			t.Errorf("A removes the catalog's %s: %v", ref, err)
		}
	}
	// A removes its own; B's image of the same name is untouched.
	if res, err := a.RemoveImage(ctx, app); err != nil || !slices.Equal(res.Images, []string{aID}) {
		t.Fatalf("A removes its image: %+v %v", res, err)
	}
	if _, err := a.InspectImage(ctx, app); !errdefs.IsNotFound(err) {
		t.Errorf("A's removed name: %v", err)
	}
	if img, err := b.InspectImage(ctx, app); err != nil || img.ID != bID {
		t.Errorf("B's image after A's removal: %+v %v", img, err)
	}
	// The operator removes B's name by naming the tenant.
	if status, _, raw := d.call(t, d.key, http.MethodGet, "/v1/images/"+app+"?tenant=tenant-b", nil, nil); status != http.StatusOK || !strings.Contains(raw, bID) {
		t.Errorf("the operator inspects B's name: %d %s", status, raw)
	}
	if out, _, code := d.cli("", "image", "ls"); code != 0 || !regexp.MustCompile(regexp.QuoteMeta(app)+`\s+tenant-b\s+`+bID[7:19]).MatchString(out) ||
		!regexp.MustCompile(regexp.QuoteMeta(catalog)+`\s+-\s+`+catalogID[7:19]).MatchString(out) {
		t.Errorf("the operator's image ls does not show B's name as B's and the catalog's as the operator's:\n%s", out)
	}
	if out, errOut, code := d.cli("", "image", "rm", "--tenant", "tenant-b", app); code != 0 || !strings.Contains(out, "deleted "+bID) {
		t.Errorf("the operator removes B's name: %d %q %q", code, out, errOut)
	}
	if _, err := b.InspectImage(ctx, app); !errdefs.IsNotFound(err) {
		t.Errorf("B's name after the operator removed it: %v", err)
	}
}

// TestHostImagePreparedAtStart: a daemon on a new state directory builds
// the host image (the default) in the background as it starts, so that its
// first create does not wait for the copy; that create uses the image made,
// not a second build.
func TestHostImagePreparedAtStart(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	rts, err := d.client.Runtimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range rts {
		if rt.Name == "native" && (rt.Capabilities == nil || !rt.Capabilities.IDMappedLayers) {
			t.Fatalf("native runtime without idmapped layers here (%+v): this test is of that path", rt.Capabilities)
		}
	}
	marker := filepath.Join(d.state, "images", "unmapped", "host-v*-0", ".berth-image")
	waitFor(t, 30*time.Second, func() bool {
		m, _ := filepath.Glob(marker)
		return len(m) == 1
	})
	if list, err := d.client.ListSandboxes(ctx, nil); err != nil || len(list) != 0 {
		t.Fatalf("sandboxes before any create: %v %v (the pool is off: the image was built by no create)", list, err)
	}
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat", "/etc/hostname"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("exec in the first sandbox: %+v %v", r, err)
	}
	if n := strings.Count(d.log.String(), `msg="host image ready"`); n != 1 {
		t.Fatalf("the host image was made ready %d times, want once (at start):\n%s", n, d.log.String())
	}
}
