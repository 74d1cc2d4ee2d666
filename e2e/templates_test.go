package e2e

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testregistry"
	"github.com/berthsh/berth/template"
)

// templateDockerfile uses every instruction a template build runs.
const templateDockerfile = `ARG BASE
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/srv/app \
    MODE=test
LABEL org.berth.test="template" version=1
WORKDIR $APP_HOME
COPY app/ ./
COPY --chown=nobody:nogroup data.txt /srv/data/
ADD bundle.tar.gz /opt/bundle/
RUN ["/bin/sh", "-c", "echo exec-form > /srv/exec.txt && ln -s /etc/shadow /srv/leak && mkfifo /srv/fifo"]
RUN echo "$GREETING from $MODE" > greeting.txt && rm /etc/debian_version && useradd -m -u 1001 builder
USER builder
RUN whoami > /home/builder/me.txt
EXPOSE 8080
SHELL ["/bin/bash", "-c"]
ENTRYPOINT ["/bin/sh", "-c"]
CMD ["cat greeting.txt"]
`

// writeContext writes a build context with dockerfile into a new directory.
func writeContext(t *testing.T, dockerfile string) string {
	t.Helper()
	dir := t.TempDir()
	var bundle bytes.Buffer
	zw := gzip.NewWriter(&bundle)
	zw.Write(testregistry.Tar(t, testregistry.Entry{Name: "inside.txt", Body: "from the archive\n"}))
	zw.Close()
	for name, body := range map[string]string{
		"Dockerfile":        dockerfile,
		"app/main.py":       "print('hi')\n",
		"app/lib/util.py":   "X = 1\n",
		"data.txt":          "data\n",
		"bundle.tar.gz":     bundle.String(),
		"secret.env":        "TOKEN=ignored\n",
		".dockerignore":     "secret.env\n**/__pycache__\n",
		"app/__pycache__/x": "junk",
	} {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func contextTar(t *testing.T, dir string) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	if err := client.ContextTar(&b, dir, "Dockerfile"); err != nil {
		t.Fatal(err)
	}
	return &b
}

// TestTemplateBuild builds a template from a Dockerfile on a real Debian
// image: every instruction takes effect in a sandbox made of it, a
// rebuild takes every step from the cache, and a changed last line reruns
// only that line. A bad Dockerfile and a failing RUN store nothing and
// leave no sandbox.
func TestTemplateBuild(t *testing.T) {
	reg := testregistry.Start(t)
	reg.Push(t, "debian:bookworm", debianImage(t))
	d := startDaemon(t, "")
	ctx := t.Context()
	dir := writeContext(t, templateDockerfile)
	req := api.BuildTemplateRequest{Name: "agent-env", Args: map[string]string{"BASE": reg.Ref("debian:bookworm"), "GREETING": "hi"}}

	var steps []api.BuildEvent
	var output strings.Builder
	res, err := d.client.BuildTemplate(ctx, req, contextTar(t, dir), func(ev api.BuildEvent) {
		switch ev.Type {
		case api.BuildStep:
			steps = append(steps, ev)
		case api.BuildStdout, api.BuildStderr:
			output.Write(ev.Data)
		}
	})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, output.String())
	}
	if len(steps) != 17 || res.Executed != 7 || res.CachedSteps != 0 {
		t.Fatalf("first build: %d steps, %d executed, %d cached", len(steps), res.Executed, res.CachedSteps)
	}
	if !res.Image.Template || !slices.Contains(res.Image.Names, "index.docker.io/library/agent-env:latest") {
		t.Fatalf("template image: %+v", res.Image)
	}
	c := res.Image.Config
	if c.User != "builder" || c.WorkingDir != "/srv/app" || c.Labels["org.berth.test"] != "template" || c.Labels["version"] != "1" ||
		!slices.Contains(c.Env, "MODE=test") || !slices.Equal(c.ExposedPorts, []string{"8080/tcp"}) ||
		!slices.Equal(c.Entrypoint, []string{"/bin/sh", "-c"}) || !slices.Equal(c.Cmd, []string{"cat greeting.txt"}) {
		t.Fatalf("template config: %+v", c)
	}
	if slices.ContainsFunc(c.Env, func(kv string) bool { return strings.HasPrefix(kv, "GREETING=") }) {
		t.Fatalf("an ARG landed in the image's env: %v", c.Env)
	}

	// A sandbox of the template.
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "agent-env"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ImageID != res.Image.ID || sb.User != "builder" || sb.Workdir != "/srv/app" {
		t.Fatalf("sandbox of the template: %+v", sb)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: `set -e
cat greeting.txt main.py lib/util.py /srv/exec.txt /opt/bundle/inside.txt /home/builder/me.txt
stat -c '%U:%G %n' /srv/data/data.txt /srv/data /srv/app/main.py
test ! -e /etc/debian_version && echo whited-out
test ! -e secret.env && test ! -e __pycache__ && echo ignored
echo "$MODE $APP_HOME"
test "$(cat /etc/hostname)" = "$(hostname)" && echo own-hostname
readlink /srv/leak
test -p /srv/fifo && echo fifo`})
	if err != nil {
		t.Fatal(err)
	}
	want := "hi from test\nprint('hi')\nX = 1\nexec-form\nfrom the archive\nbuilder\n" +
		"nobody:nogroup /srv/data/data.txt\nnobody:nogroup /srv/data\nroot:root /srv/app/main.py\n" +
		"whited-out\nignored\ntest /srv/app\nown-hostname\n/etc/shadow\nfifo\n"
	if r.ExitCode != 0 || string(r.Stdout) != want {
		t.Fatalf("the template's files: %d\n%s\n%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	// An exec that names no command runs the image's ENTRYPOINT and CMD.
	if r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{}); err != nil || r.ExitCode != 0 || string(r.Stdout) != "hi from test\n" {
		t.Fatalf("exec of the image's default command: %+v %v", r, err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// A warm pool of the template: a create is a hand-over.
	if _, err := d.client.SetPool(ctx, "agent-env", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		p, err := d.client.Pools(ctx)
		return err == nil && len(p) == 1 && p[0].Ready == 1
	})
	pooled, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "agent-env"})
	if err != nil || pooled.ImageID != res.Image.ID || pooled.User != "builder" {
		t.Fatalf("a create from the template's pool: %+v %v", pooled, err)
	}
	if _, err := d.client.SetPool(ctx, "agent-env", 0); err != nil {
		t.Fatal(err)
	}
	if err := d.client.DeleteSandbox(ctx, pooled.ID); err != nil {
		t.Fatal(err)
	}

	// The same build again: every step from the cache, the same image.
	again, err := d.client.BuildTemplate(ctx, req, contextTar(t, dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Executed != 0 || again.CachedSteps != 7 || again.Image.ID != res.Image.ID {
		t.Fatalf("rebuild: %d executed, %d cached, %s (first %s)", again.Executed, again.CachedSteps, again.Image.ID, res.Image.ID)
	}
	// The last RUN changed, through the CLI: only it runs.
	changed := strings.Replace(templateDockerfile, "RUN whoami > /home/builder/me.txt", "RUN whoami > /home/builder/me.txt && echo v2 >> /home/builder/me.txt", 1)
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(changed), 0o644)
	out, errOut, code := d.cli("", "template", "build", "-t", "agent-env:v2", "--build-arg", "BASE="+reg.Ref("debian:bookworm"), "--build-arg", "GREETING=hi", dir)
	if code != 0 || !strings.Contains(errOut, "1 steps ran, 6 from the cache") || strings.Count(errOut, "(cached)") != 6 ||
		!strings.Contains(errOut, "RUN whoami > /home/builder/me.txt && echo v2 >> /home/builder/me.txt\n") {
		t.Fatalf("rebuild with the last RUN changed: %d\n%s\n%s", code, out, errOut)
	}
	if out, _, code := d.cli("", "template", "ls"); code != 0 || !strings.Contains(out, "agent-env:latest") || !strings.Contains(out, "agent-env:v2") {
		t.Fatalf("template ls:\n%s", out)
	}

	// Bad Dockerfiles: the instruction and its line named, nothing stored.
	for _, bad := range []struct{ dockerfile, want string }{
		{"FROM " + reg.Ref("debian:bookworm") + "\nHEALTHCHECK CMD true\n", "line 2: HEALTHCHECK CMD true: HEALTHCHECK is not supported"},
		{"FROM " + reg.Ref("debian:bookworm") + "\nCOPY --from=build /x /y\n", "line 2"},
		{"FROM " + reg.Ref("debian:bookworm") + "\nCOPY missing.txt /x\n", `source "missing.txt" is not in the build context`},
		{"FROM " + reg.Ref("debian:bookworm") + "\nRUN echo partial > /partial && exit 3\n", "exit code 3"},
	} {
		os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(bad.dockerfile), 0o644)
		_, err := d.client.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "broken"}, contextTar(t, dir), nil)
		if !strings.Contains(errdefs.Message(err), bad.want) || (!errdefs.IsInvalidArgument(err) && !errdefs.IsNotFound(err)) {
			t.Errorf("%q: got %v, want an error saying %q", bad.dockerfile, err, bad.want)
		}
	}
	if _, err := d.client.InspectImage(ctx, "broken"); !errdefs.IsNotFound(err) {
		t.Fatalf("a failed build stored a template: %v", err)
	}
	left, err := d.client.ListSandboxesSelector(ctx, template.LabelBuild)
	if err != nil || len(left) != 0 {
		t.Fatalf("build sandboxes left: %v %v", left, err)
	}
	waitFor(t, 10*time.Second, func() bool { return d.sandboxDirs() == 0 })
	// Only the templates are images: the steps' images are gone.
	imgs, err := d.client.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if len(img.Names) == 0 {
			t.Errorf("a step's image was left: %+v", img)
		}
	}
}

// TestTemplateBuildSurvivesKill kills the daemon with SIGKILL while a
// build's RUN step runs: the restarted daemon deletes the step's sandbox
// and the build's context, stores no template, and builds again.
func TestTemplateBuildSurvivesKill(t *testing.T) {
	reg := testregistry.Start(t)
	reg.Push(t, "debian:bookworm", debianImage(t))
	d := startDaemon(t, "")
	ctx := t.Context()
	dir := writeContext(t, "FROM "+reg.Ref("debian:bookworm")+"\nRUN sleep 600\n")
	done := make(chan error, 1)
	go func() {
		_, err := d.client.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "killed"}, contextTar(t, dir), nil)
		done <- err
	}()
	waitFor(t, 60*time.Second, func() bool {
		left, err := d.client.ListSandboxesSelector(ctx, template.LabelBuild)
		return err == nil && len(left) == 1
	})
	d.kill9()
	if err := <-done; err == nil {
		t.Fatal("a build whose daemon was killed succeeded")
	}
	d.start()
	if left, err := d.client.ListSandboxesSelector(ctx, template.LabelBuild); err != nil || len(left) != 0 {
		t.Fatalf("after the restart, build sandboxes: %v %v", left, err)
	}
	waitFor(t, 10*time.Second, func() bool { return d.sandboxDirs() == 0 })
	if ents, _ := os.ReadDir(filepath.Join(d.state, "builds")); len(ents) != 0 {
		t.Fatalf("a build context stayed: %v", ents)
	}
	if _, err := d.client.InspectImage(ctx, "killed"); !errdefs.IsNotFound(err) {
		t.Fatalf("the killed build stored a template: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+reg.Ref("debian:bookworm")+"\nRUN echo ok > /ok\n"), 0o644)
	if res, err := d.client.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "killed"}, contextTar(t, dir), nil); err != nil || res.Executed != 1 {
		t.Fatalf("a build after the restart: %+v %v", res, err)
	}
}

// TestTenantTemplates: a template is its builder's tenant's. Two tenants
// build a template of one name, each its own image; another tenant cannot
// see or use either; a tenant's build never takes a step from another
// tenant's cache (which would tell it what the other built), while its own
// rebuild does; no step image is left.
func TestTenantTemplates(t *testing.T) {
	reg := testregistry.Start(t)
	reg.Push(t, "tiny:1", tinyImage(t))
	// The operator names the registry: a tenant's pull reaches a loopback
	// registry only then (image/tenantnet.go).
	d := startDaemon(t, "", "--insecure-registry", reg.Host)
	ctx := t.Context()
	keyA, keyB, _ := tenantsOf(t, d)
	a, b := d.clientWith(t, keyA.Key), d.clientWith(t, keyB.Key)
	keyC, err := d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-c"})
	if err != nil {
		t.Fatal(err)
	}
	c := d.clientWith(t, keyC.Key)
	dockerfile := func(who string) string {
		return "FROM " + reg.Ref("tiny:1") + "\nCOPY data.txt /srv/data.txt\nENV WHO=" + who + "\n"
	}
	build := func(cl *client.Client, who string) api.BuildResult {
		t.Helper()
		res, err := cl.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "agent"}, contextTar(t, writeContext(t, dockerfile(who))), nil)
		if err != nil {
			t.Fatalf("%s builds: %v", who, err)
		}
		return res
	}
	// Under a memory quota a build's steps need a memory limit, as any
	// sandbox of the tenant does; given one, the build runs within it.
	if _, err := d.client.SetQuota(ctx, "tenant-c", api.Quota{MemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	runStep := dockerfile("limited") // its COPY runs in a step's sandbox
	if _, err := c.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "limited"}, contextTar(t, writeContext(t, runStep)), nil); !errdefs.IsInvalidArgument(err) ||
		!strings.Contains(err.Error(), "limits.memory_bytes") {
		t.Fatalf("a build under a memory quota without a limit: %v", err)
	}
	if _, err := c.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "limited", MemoryBytes: 256 << 20}, contextTar(t, writeContext(t, runStep)), nil); err != nil {
		t.Fatalf("a build under a memory quota with a limit: %v", err)
	}
	if _, err := c.RemoveImage(ctx, "limited"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.SetQuota(ctx, "tenant-c", api.Quota{}); err != nil {
		t.Fatal(err)
	}
	resA := build(a, "a")
	if resA.CachedSteps != 0 || !slices.Contains(resA.Image.TenantNames["tenant-a"], "index.docker.io/library/agent:latest") {
		t.Fatalf("A's build: %d cached, names %v %v", resA.CachedSteps, resA.Image.Names, resA.Image.TenantNames)
	}
	if again := build(a, "a"); again.CachedSteps == 0 || again.Image.ID != resA.Image.ID {
		t.Fatalf("A's rebuild: %d cached, image %s (was %s)", again.CachedSteps, again.Image.ID, resA.Image.ID)
	}
	// B's COPY has A's inputs: without the tenant in the cache key it
	// would be A's cached step.
	resB := build(b, "b")
	if resB.CachedSteps != 0 || resB.Executed == 0 {
		t.Fatalf("B's build took %d steps from the cache (%d ran): another tenant's cache", resB.CachedSteps, resB.Executed)
	}
	if resB.Image.ID == resA.Image.ID {
		t.Fatal("B's template is A's image")
	}

	for _, x := range []struct {
		who string
		cl  *client.Client
		id  string
	}{{"a", a, resA.Image.ID}, {"b", b, resB.Image.ID}} {
		sb, err := x.cl.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "agent"})
		if err != nil {
			t.Fatalf("%s creates from its template: %v", x.who, err)
		}
		if sb.ImageID != x.id || sb.Env["WHO"] != x.who {
			t.Errorf("%s's sandbox of agent: image %s, WHO=%q", x.who, sb.ImageID, sb.Env["WHO"])
		}
		x.cl.DeleteSandbox(ctx, sb.ID)
		tmpls, err := x.cl.ListTemplates(ctx)
		if err != nil || len(tmpls) != 1 || tmpls[0].ID != x.id {
			t.Errorf("%s's templates: %+v %v", x.who, tmpls, err)
		}
	}
	for _, ref := range []string{resA.Image.ID, resB.Image.ID} {
		if _, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: ref}); !errdefs.IsNotFound(err) {
			t.Errorf("C creates from %s: %v, want not_found", ref, err)
		}
	}
	// By name, C's create is one of a name C has never pulled: it is
	// pulled (from Docker Hub, which this host does not reach), exactly as
	// for a name no one has.
	_, errAgent := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "agent"})
	_, errNone := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "never-built-here"})
	if errAgent == nil || errdefs.ClassOf(errAgent) != errdefs.ClassOf(errNone) {
		t.Errorf("C creates from agent: %v; from a name no one has: %v", errAgent, errNone)
	}
	if _, err := c.InspectImage(ctx, "agent"); !errdefs.IsNotFound(err) {
		t.Errorf("C inspects agent: %v, want not_found", err)
	}
	if _, err := b.CreateSandbox(ctx, api.CreateSandboxRequest{Image: resA.Image.ID}); !errdefs.IsNotFound(err) {
		t.Errorf("B creates from A's template by id: %v", err)
	}
	if tmpls, err := c.ListTemplates(ctx); err != nil || len(tmpls) != 0 {
		t.Errorf("C's templates: %+v %v", tmpls, err)
	}
	if tmpls, err := d.client.ListTemplates(ctx); err != nil || len(tmpls) != 2 {
		t.Errorf("the operator's templates: %+v %v", tmpls, err)
	}
	// No step image is left: every image has a name of someone's.
	imgs, err := d.client.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if len(img.Names) == 0 && len(img.TenantNames) == 0 {
			t.Errorf("a step's image was left: %+v", img)
		}
	}
}
