// Package template builds templates: images made from a Dockerfile, as
// E2B and Daytona make theirs. Each step that changes files (RUN, COPY,
// ADD, WORKDIR) runs in a berth sandbox made from the steps before it;
// the sandbox is stopped and what it changed (its writable layer, read
// by package layerdiff) is stored as a layer, by the same code that
// stores pulled layers. The other instructions change only the image's
// configuration. A step's result is cached under a digest of everything
// it depends on (the image before it, the instruction with its variables
// expanded, the environment, the files it copies), so a rebuild runs
// only the steps whose inputs changed and those after them.
//
// The build context never becomes a directory on the host: its files are
// indexed from the tar the client sent and copied into the step's sandbox
// as a tar, which the sandbox's guest unpacks (path handling happens
// inside the sandbox).
package template

import (
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/labels"
)

// Images is what a build needs of the image store.
type Images interface {
	// Ensure finds (or pulls) an image as tenant's create would.
	Ensure(ctx context.Context, tenant, ref string) (api.Image, error)
	ConfigOf(ctx context.Context, id string) (*v1.ConfigFile, error)
	StoreLayer(ctx context.Context, r io.Reader) (diff string, size int64, err error)
	// StoreBuilt stores a built image named names of tenant's (none: a
	// step's image, which tenant may use by id until Forget).
	StoreBuilt(ctx context.Context, tenant string, cf v1.ConfigFile, names []string, source string) (api.Image, error)
	Forget(ctx context.Context, tenant, id string) error
}

// Cache remembers the layers steps made, by their inputs' digest.
type Cache interface {
	CachedStep(ctx context.Context, key string) (string, error)
	CacheStep(ctx context.Context, key, layer string) error
}

// Sandboxes is what a build needs of the sandbox manager.
type Sandboxes interface {
	Create(ctx context.Context, tenant string, req api.CreateSandboxRequest) (api.Sandbox, error)
	ExecStream(ctx context.Context, tenant, id string, req api.ExecRequest, emit func(api.ExecEvent) error) error
	Extract(ctx context.Context, tenant, id string, where api.Where, path string, body io.Reader, size int64) (api.ArchiveResult, error)
	FS(ctx context.Context, tenant, id, op string, req any) (any, error)
	Stop(ctx context.Context, tenant, id string) (api.Sandbox, error)
	Commit(ctx context.Context, tenant, id string, w io.Writer) (int, error)
	Delete(ctx context.Context, tenant, id string) error
	List(ctx context.Context, tenant string, sel labels.Selector) ([]api.Sandbox, error)
	// SnapshotImage is a snapshot ("snapshot:NAME") as an image config
	// naming stored layers, and a key for its content.
	SnapshotImage(ctx context.Context, tenant, ref string) (v1.ConfigFile, string, error)
}

// Builder builds templates.
type Builder struct {
	images    Images
	cache     Cache
	sandboxes Sandboxes
	dir       string // where build contexts are kept while they build
	log       *slog.Logger
}

// New returns a builder that keeps contexts under dir.
func New(images Images, cache Cache, sandboxes Sandboxes, dir string, log *slog.Logger) (*Builder, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("template builds: %w", err)
	}
	// Contexts a killed daemon left.
	if old, err := os.ReadDir(dir); err == nil {
		for _, e := range old {
			os.RemoveAll(path.Join(dir, e.Name()))
		}
	}
	return &Builder{images: images, cache: cache, sandboxes: sandboxes, dir: dir, log: log}, nil
}

// LabelBuild marks the sandboxes a build runs its steps in.
const LabelBuild = "berth.build"

// Sweep deletes the step sandboxes of builds a daemon was running when it
// died: call it at start, before any build. (The steps' unnamed images are
// dangling images, which image prune removes; the contexts went in New.)
func (b *Builder) Sweep(ctx context.Context) error {
	sel, err := labels.ParseSelector(LabelBuild)
	if err != nil {
		return err
	}
	left, err := b.sandboxes.List(ctx, "", sel)
	if err != nil {
		return err
	}
	for _, sb := range left {
		if err := b.sandboxes.Delete(ctx, "", sb.ID); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete the step sandbox %s of an interrupted build: %w", sb.ID, err)
		}
		b.log.Info("deleted the step sandbox of an interrupted build", "sandbox", sb.ID, "template", sb.Labels[LabelBuild])
	}
	return nil
}

// Build builds template req.Name from Dockerfile req.Dockerfile of the
// build context (tar stream context), emitting the build's log. A build
// that fails stores no template; the steps it finished stay cached.
func (b *Builder) Build(ctx context.Context, tenant string, req api.BuildTemplateRequest, context io.Reader, emit func(api.BuildEvent) error) (api.BuildResult, error) {
	if req.Name == "" {
		return api.BuildResult{}, errdefs.New(errdefs.InvalidArgument, "name: give the template a name")
	}
	if req.Name == image.Host {
		return api.BuildResult{}, errdefs.New(errdefs.InvalidArgument, "name: %q is the built-in image", req.Name)
	}
	if _, err := name.NewTag(req.Name); err != nil {
		return api.BuildResult{}, errdefs.New(errdefs.InvalidArgument, "name: %q: %v", req.Name, err)
	}
	if req.Dockerfile == "" {
		req.Dockerfile = "Dockerfile"
	}
	bc, err := readContext(b.dir, context)
	if err != nil {
		return api.BuildResult{}, err
	}
	defer bc.close()
	df, err := bc.file(strings.TrimPrefix(path.Clean("/"+req.Dockerfile), "/"))
	if err != nil {
		return api.BuildResult{}, errdefs.New(errdefs.InvalidArgument, "dockerfile: %q is not a file in the build context", req.Dockerfile)
	}
	steps, err := parse(df)
	if err != nil {
		return api.BuildResult{}, err
	}
	r := &run{b: b, ctx: ctx, tenant: tenant, req: req, bc: bc, emit: emit, lex: shell.NewLex('\\'),
		args: map[string]string{}, shell: []string{"/bin/sh", "-c"}}
	for i, in := range steps {
		if err := r.step(i+1, len(steps), in); err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return api.BuildResult{}, fmt.Errorf("step %d/%d (Dockerfile line %d: %s): %w", i+1, len(steps), in.line, in.original, err)
		}
	}
	r.cf.Architecture, r.cf.OS = goruntime.GOARCH, "linux"
	img, err := b.images.StoreBuilt(ctx, tenant, r.cf, []string{req.Name}, image.BuiltPrefix+req.Dockerfile)
	if err != nil {
		return api.BuildResult{}, err
	}
	b.log.Info("template built", "name", req.Name, "image", img.ID, "executed", r.executed, "cached", r.cached)
	return api.BuildResult{Image: img, Executed: r.executed, CachedSteps: r.cached}, nil
}

// run is one build's state as its steps go.
type run struct {
	b      *Builder
	ctx    context.Context
	tenant string
	req    api.BuildTemplateRequest
	bc     *buildContext
	emit   func(api.BuildEvent) error
	lex    *shell.Lex

	cf       v1.ConfigFile
	key      string            // the digest of every input so far
	args     map[string]string // ARGs in scope
	global   map[string]string // ARGs before FROM
	shell    []string
	from     bool
	cmdSet   bool
	executed int
	cached   int
}

func (r *run) step(n, of int, in instruction) error {
	ev := api.BuildEvent{Type: api.BuildStep, Step: n, Steps: of, Instruction: in.original, Line: in.line}
	announce := func(cached bool) error {
		ev.Cached = cached
		return r.emit(ev)
	}
	switch in.cmd {
	case "from":
		if err := announce(false); err != nil {
			return err
		}
		return r.fromImage(in)
	case "arg":
		if err := announce(false); err != nil {
			return err
		}
		return r.arg(in)
	case "run", "copy", "add", "workdir":
		return r.layerStep(in, announce)
	}
	if err := announce(false); err != nil {
		return err
	}
	c := &r.cf.Config
	switch in.cmd {
	case "env", "label":
		if len(in.args)%3 != 0 {
			return in.errorf("want KEY=VALUE pairs")
		}
		env := r.envGetter()
		for i := 0; i < len(in.args); i += 3 {
			k, err := r.expand(in.args[i], env)
			if err != nil {
				return err
			}
			v, err := r.expand(in.args[i+1], env)
			if err != nil {
				return err
			}
			if in.cmd == "env" {
				c.Env = setEnv(c.Env, k, v)
			} else {
				if c.Labels == nil {
					c.Labels = map[string]string{}
				}
				c.Labels[k] = v
			}
		}
	case "user":
		u, err := r.expand(in.args[0], r.envGetter())
		if err != nil {
			return err
		}
		c.User = u
	case "entrypoint":
		c.Entrypoint = r.commandOf(in)
		if !r.cmdSet {
			c.Cmd = nil // as Docker: an ENTRYPOINT drops the base image's CMD
		}
	case "cmd":
		c.Cmd, r.cmdSet = r.commandOf(in), true
	case "expose":
		if c.ExposedPorts == nil {
			c.ExposedPorts = map[string]struct{}{}
		}
		for _, a := range in.args {
			p, err := r.expand(a, r.envGetter())
			if err != nil {
				return err
			}
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			c.ExposedPorts[p] = struct{}{}
		}
	case "shell":
		if !in.json || len(in.args) == 0 {
			return in.errorf("SHELL takes the JSON form: SHELL [\"/bin/bash\", \"-c\"]")
		}
		r.shell = slices.Clone(in.args)
	}
	r.chain(in.cmd, in.args, c)
	return nil
}

func (r *run) fromImage(in instruction) error {
	ref, err := r.expand(in.args[0], envMap(r.global))
	if err != nil {
		return err
	}
	r.from = true
	switch ref {
	case "scratch":
		r.cf = v1.ConfigFile{}
		r.key = r.fromKey("scratch")
		return nil
	case image.Host:
		return in.errorf("the host image is a view of this host's directories, not an image to build on: start FROM an OCI image or scratch")
	}
	if strings.HasPrefix(ref, api.SnapshotPrefix) {
		cf, key, err := r.b.sandboxes.SnapshotImage(r.ctx, r.tenant, ref)
		if err != nil {
			return err
		}
		r.cf = cf
		r.key = r.fromKey(key)
		return nil
	}
	img, err := r.b.images.Ensure(r.ctx, r.tenant, ref)
	if err != nil {
		return err
	}
	cf, err := r.b.images.ConfigOf(r.ctx, img.ID)
	if err != nil {
		return err
	}
	r.cf = v1.ConfigFile{Config: cf.Config, RootFS: v1.RootFS{Type: "layers", DiffIDs: cf.RootFS.DiffIDs}}
	r.key = r.fromKey(img.ID)
	return nil
}

// fromKey begins the build's digest at its base. The tenant is in it, so
// that a tenant's build never hits a step another tenant's build cached
// (and so learns nothing of what others build); the operator's keys are
// as they were before tenants.
func (r *run) fromKey(base string) string {
	if r.tenant == "" {
		return digest("from", base)
	}
	return digest("from", "tenant", r.tenant, base)
}

func (r *run) arg(in instruction) error {
	scope := r.args
	if !r.from {
		if r.global == nil {
			r.global = map[string]string{}
		}
		scope = r.global
	}
	for _, a := range in.args {
		k, def, hasDef := strings.Cut(a, "=")
		v, given := r.req.Args[k]
		if !given {
			if !hasDef {
				if g, ok := r.global[k]; ok && r.from { // a global ARG redeclared
					scope[k] = g
				}
				continue
			}
			var err error
			if v, err = r.expand(def, r.envGetter()); err != nil {
				return err
			}
		}
		scope[k] = v
	}
	if r.from {
		r.chain("arg", []string{fmt.Sprint(sortedPairs(r.args))}, nil)
	}
	return nil
}

// layerStep runs a step that changes files, or takes its layer from the
// cache.
func (r *run) layerStep(in instruction, announce func(bool) error) error {
	var (
		payload []string
		do      func(id string) error
	)
	switch in.cmd {
	case "run":
		argv := r.commandOf(in)
		env := r.execEnv()
		user, workdir := r.user(), r.workdir()
		payload = append([]string{"user=" + user, "workdir=" + workdir}, argv...)
		payload = append(payload, sortedPairs(env)...)
		do = func(id string) error { return r.execute(id, argv, env, user, workdir) }
	case "workdir":
		dir, err := r.expand(in.args[0], r.envGetter())
		if err != nil {
			return err
		}
		if !path.IsAbs(dir) {
			dir = path.Join(r.workdir(), dir)
		}
		r.cf.Config.WorkingDir = path.Clean(dir)
		payload = []string{r.cf.Config.WorkingDir}
		do = func(id string) error {
			_, err := r.b.sandboxes.FS(r.ctx, r.tenant, id, api.OpMkdir, api.MkdirRequest{Where: asRoot, Path: r.cf.Config.WorkingDir, Parents: true})
			return err
		}
	default: // copy, add
		c, err := r.copyPlan(in)
		if err != nil {
			return err
		}
		payload = []string{c.dest, c.chown, c.sum}
		do = func(id string) error { return r.copyInto(id, c) }
	}
	r.chain(in.cmd, payload, nil)
	if !r.req.NoCache {
		if layer, err := r.b.cache.CachedStep(r.ctx, r.key); err == nil {
			r.cached++
			r.addLayer(layer)
			return announce(true)
		} else if !errdefs.IsNotFound(err) {
			return err
		}
	}
	if err := announce(false); err != nil {
		return err
	}
	layer, err := r.inSandbox(do)
	if err != nil {
		return err
	}
	r.executed++
	if err := r.b.cache.CacheStep(r.ctx, r.key, layer); err != nil {
		return err
	}
	r.addLayer(layer)
	return nil
}

func (r *run) addLayer(layer string) {
	if layer == "" {
		return
	}
	h, _ := v1.NewHash(layer)
	r.cf.RootFS.DiffIDs = append(r.cf.RootFS.DiffIDs, h)
}

// inSandbox runs do in a sandbox made of the image so far and returns the
// layer of what it changed ("" for nothing). The sandbox and the step's
// image are gone when it returns.
func (r *run) inSandbox(do func(id string) error) (string, error) {
	img, err := r.b.images.StoreBuilt(r.ctx, r.tenant, r.cf, nil, image.BuiltPrefix+r.req.Dockerfile)
	if err != nil {
		return "", err
	}
	defer r.b.images.Forget(context.WithoutCancel(r.ctx), r.tenant, img.ID)
	sb, err := r.b.sandboxes.Create(r.ctx, r.tenant, api.CreateSandboxRequest{Image: img.ID, User: rootID, Workdir: "/",
		Network: r.req.Network, Labels: map[string]string{LabelBuild: labelValue(r.req.Name)},
		Limits: api.Limits{CPUs: r.req.CPUs, MemoryBytes: r.req.MemoryBytes}})
	if err != nil {
		return "", err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), time.Minute)
		defer cancel()
		if err := r.b.sandboxes.Delete(ctx, r.tenant, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			r.b.log.Warn("delete a build step's sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	if err := do(sb.ID); err != nil {
		return "", err
	}
	if _, err := r.b.sandboxes.Stop(r.ctx, r.tenant, sb.ID); err != nil {
		return "", err
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := r.b.sandboxes.Commit(r.ctx, r.tenant, sb.ID, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	layer, _, err := r.b.images.StoreLayer(r.ctx, pr)
	pr.CloseWithError(io.ErrClosedPipe) // the writer stops at once if the store gave up
	if cerr := <-done; cerr != nil {
		return "", cerr
	}
	return layer, err
}

func (r *run) execute(id string, argv []string, env map[string]string, user, workdir string) error {
	var res *api.ExecResult
	err := r.b.sandboxes.ExecStream(r.ctx, r.tenant, id, api.ExecRequest{Cmd: argv, Env: env, User: user, Cwd: workdir},
		func(ev api.ExecEvent) error {
			switch ev.Type {
			case api.EventStdout:
				return r.emit(api.BuildEvent{Type: api.BuildStdout, Data: ev.Data})
			case api.EventStderr:
				return r.emit(api.BuildEvent{Type: api.BuildStderr, Data: ev.Data})
			case api.EventExit:
				res = ev.Result
			}
			return nil
		})
	if err != nil {
		return err
	}
	if res == nil {
		return errdefs.New(errdefs.Internal, "the command's end was not reported")
	}
	if res.ExitCode != 0 {
		why := fmt.Sprintf("exit code %d", res.ExitCode)
		if res.Error != "" {
			why += ": " + res.Error
		}
		if res.OOMKilled {
			why += " (out of memory)"
		}
		return errdefs.New(errdefs.InvalidArgument, "the command failed: %s", why)
	}
	return nil
}

// copyPlan is what a COPY or ADD copies, worked out before it runs.
type copyPlan struct {
	add      bool
	sources  []string // context names
	dest     string   // absolute
	destDir  bool     // dest is a directory (ends with / or several sources)
	chown    string
	sum      string // the digest of every name, mode and content copied
	archives []archive
}

// archive is a context file ADD unpacks, and its kind (see archiveKind).
type archive struct{ name, kind string }

func (r *run) copyPlan(in instruction) (*copyPlan, error) {
	env := r.envGetter()
	words := make([]string, len(in.args))
	for i, a := range in.args {
		w, err := r.expand(a, env)
		if err != nil {
			return nil, err
		}
		words[i] = w
	}
	if len(words) < 2 {
		return nil, in.errorf("%s needs a source and a destination", strings.ToUpper(in.cmd))
	}
	c := &copyPlan{add: in.cmd == "add"}
	for _, f := range in.flags {
		if v, ok := strings.CutPrefix(f, "--chown="); ok {
			var err error
			if c.chown, err = r.expand(v, env); err != nil {
				return nil, err
			}
		}
	}
	dest := words[len(words)-1]
	c.destDir = strings.HasSuffix(dest, "/") || len(words) > 2
	if !path.IsAbs(dest) {
		dest = path.Join(r.workdir(), dest)
	}
	c.dest = path.Clean(dest)
	seen := map[string]bool{}
	for _, src := range words[:len(words)-1] {
		if strings.Contains(src, "://") {
			return nil, in.errorf("%s of a URL is not supported: fetch it with RUN (curl, wget) instead", strings.ToUpper(in.cmd))
		}
		names, err := r.bc.match(src)
		if err != nil {
			return nil, err
		}
		if len(names) > 1 {
			c.destDir = true
		}
		for _, n := range names {
			if seen[n] {
				continue
			}
			seen[n] = true
			if c.add && !r.bc.isDir(n) {
				if kind, err := r.archiveKind(n); err != nil {
					return nil, in.errorf("%s: %v", n, err)
				} else if kind != "" {
					c.archives = append(c.archives, archive{n, kind})
					continue
				}
			}
			c.sources = append(c.sources, n)
		}
	}
	if len(c.archives) > 0 {
		c.destDir = true // an archive unpacks into a directory
	}
	sum := sha256.New()
	fmt.Fprintf(sum, "%t\n", c.destDir)
	if err := r.bc.copyTar(io.Discard, sum, c.sources, ""); err != nil {
		return nil, err
	}
	for _, a := range c.archives {
		fmt.Fprintf(sum, "archive %s %s\n", a.name, r.bc.entries[a.name].digest)
	}
	c.sum = hex.EncodeToString(sum.Sum(nil))
	return c, nil
}

// copyInto copies a plan's files into sandbox id, as root, then gives
// them their owner.
func (r *run) copyInto(id string, c *copyPlan) error {
	root := asRoot
	destDir := c.destDir
	st, err := r.b.sandboxes.FS(r.ctx, r.tenant, id, api.OpStat, api.StatRequest{Where: root, Path: c.dest})
	existed := err == nil
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if fi, ok := st.(api.FileInfo); ok && fi.Type == api.TypeDir {
		destDir = true
	}
	if len(c.sources) == 1 && r.bc.isDir(c.sources[0]) {
		destDir = true
	}
	target, rename := c.dest, ""
	if !destDir {
		if len(c.sources) != 1 {
			return errdefs.New(errdefs.InvalidArgument, "several sources need a destination directory (end it with /)")
		}
		target, rename = path.Dir(c.dest), path.Base(c.dest)
	}
	var top []string // what the copy put into target, for --chown
	if len(c.sources) > 0 {
		f, err := os.CreateTemp(r.bc.dir, "copy-")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		defer f.Close()
		if err := r.bc.copyTar(f, sha256.New(), c.sources, rename); err != nil {
			return err
		}
		size, _ := f.Seek(0, io.SeekCurrent)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if _, err := r.b.sandboxes.Extract(r.ctx, r.tenant, id, root, target, f, size); err != nil {
			return err
		}
		top = r.topNames(c.sources, rename)
	}
	for _, a := range c.archives {
		if err := r.unpackArchive(id, root, a, c.dest); err != nil {
			return err
		}
	}
	if c.chown == "" {
		return nil
	}
	if destDir && !existed {
		top = append(top, "") // the directory the copy made
	}
	for _, t := range top {
		p := path.Join(target, t)
		if _, err := r.b.sandboxes.FS(r.ctx, r.tenant, id, api.OpChown, api.ChownRequest{Where: root, Path: p, Owner: c.chown, Recursive: t != ""}); err != nil {
			return fmt.Errorf("--chown=%s: %w", c.chown, err)
		}
	}
	return nil
}

// topNames are the names a copy puts directly into its target directory.
func (r *run) topNames(sources []string, rename string) []string {
	if rename != "" {
		return []string{rename}
	}
	var out []string
	for _, s := range sources {
		if !r.bc.isDir(s) {
			out = append(out, path.Base(s))
			continue
		}
		prefix := s + "/"
		if s == "" {
			prefix = ""
		}
		for _, n := range r.bc.names {
			if rest, ok := strings.CutPrefix(n, prefix); ok && n != "" && rest != "" && !strings.Contains(rest, "/") {
				out = append(out, rest)
			}
		}
	}
	return out
}

// archiveKind says whether an ADD source is an archive ADD unpacks:
// "tar", "gzip" or "bzip2"; "" for any other file.
func (r *run) archiveKind(n string) (string, error) {
	f, err := os.Open(r.bc.entries[n].blob)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 512)
	k, _ := io.ReadFull(f, head)
	head = head[:k]
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return "gzip", nil
	case bytes.HasPrefix(head, []byte("BZh")):
		return "bzip2", nil
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return "", fmt.Errorf("an xz archive: ADD unpacks tar, gzip and bzip2 archives; unpack this one with RUN")
	case len(head) >= 262 && string(head[257:262]) == "ustar":
		return "tar", nil
	}
	return "", nil
}

func (r *run) unpackArchive(id string, root api.Where, a archive, dest string) error {
	n := a.name
	f, err := os.Open(r.bc.entries[n].blob)
	if err != nil {
		return err
	}
	defer f.Close()
	var in io.Reader = bufio.NewReader(f)
	switch a.kind {
	case "gzip":
		z, err := gzip.NewReader(in)
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "%s: %v", n, err)
		}
		defer z.Close()
		in = z
	case "bzip2":
		in = bzip2.NewReader(in)
	}
	if _, err := r.b.sandboxes.Extract(r.ctx, r.tenant, id, root, dest, in, -1); err != nil {
		return fmt.Errorf("unpack %s: %w", n, err)
	}
	return nil
}

// commandOf is a RUN's, CMD's or ENTRYPOINT's argv: the exec form as
// written, the shell form through the shell.
func (r *run) commandOf(in instruction) []string {
	if in.json {
		return slices.Clone(in.args)
	}
	if len(in.args) == 0 {
		return nil
	}
	return append(slices.Clone(r.shell), strings.Join(in.args, " "))
}

// rootID is root by number: an image need not have an /etc/passwd.
const rootID = "0:0"

var asRoot = api.Where{User: rootID, Cwd: "/"}

func (r *run) user() string {
	if r.cf.Config.User == "" {
		return rootID
	}
	return r.cf.Config.User
}

func (r *run) workdir() string {
	if r.cf.Config.WorkingDir == "" {
		return "/"
	}
	return r.cf.Config.WorkingDir
}

// runEnv is a RUN's environment: the ARGs in scope, then the image's
// variables (which win, as in Docker).
func (r *run) runEnv() map[string]string {
	env := maps.Clone(r.args)
	for _, kv := range r.cf.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

// execEnv is a RUN's environment as it runs: root's HOME, as Docker
// gives it, when the image names no user and no HOME.
func (r *run) execEnv() map[string]string {
	env := r.runEnv()
	if _, ok := env["HOME"]; !ok && r.cf.Config.User == "" {
		env["HOME"] = "/root"
	}
	return env
}

func (r *run) envGetter() shell.EnvGetter { return envMap(r.runEnv()) }

func (r *run) expand(word string, env shell.EnvGetter) (string, error) {
	out, _, err := r.lex.ProcessWord(word, env)
	if err != nil {
		return "", errdefs.New(errdefs.InvalidArgument, "%q: %v", word, err)
	}
	return out, nil
}

// chain folds a step into the build's digest.
func (r *run) chain(cmd string, payload []string, c *v1.Config) {
	parts := append([]string{r.key, cmd}, payload...)
	if c != nil {
		b, _ := json.Marshal(c)
		parts = append(parts, string(b))
	}
	r.key = digest(parts...)
}

func digest(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			env = slices.Clone(env)
			env[i] = k + "=" + v
			return env
		}
	}
	return append(slices.Clone(env), k+"="+v)
}

func sortedPairs(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// labelValue fits a template name into a label value.
func labelValue(s string) string {
	if r := []rune(s); len(r) > labels.MaxValueLen {
		return string(r[:labels.MaxValueLen])
	}
	return s
}

type envMap map[string]string

func (e envMap) Get(k string) (string, bool) { v, ok := e[k]; return v, ok }
func (e envMap) Keys() []string              { return slices.Sorted(maps.Keys(e)) }
