// Package gvisor is berth's user-space-kernel tier: each sandbox is a gVisor
// sandbox that runsc starts from an OCI bundle this runtime writes, with the
// berth guest as its init, on the same writable layer over the same image
// layers as the native runtime and in a cgroup made by the same code.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/cgroup"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/hostpath"
	"github.com/berthsh/berth/internal/hostproc"
	"github.com/berthsh/berth/internal/tun"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/layer"
	"github.com/berthsh/berth/runtime/local"
)

// Name is the runtime's registered name.
const Name = "gvisor"

// Platforms runsc can run sandboxes on: systrap (seccomp traps, works
// everywhere), kvm (hardware virtualization, where /dev/kvm works) and
// ptrace (slow, for old kernels).
var Platforms = []string{"systrap", "kvm", "ptrace"}

// controlSocket is the guest's control socket in a sandbox's ctl directory.
const controlSocket = "guest.sock"

// The sentry and the gofer, gVisor's kernel and file server, run in the
// sandbox's cgroup with the workload: their own threads and memory are
// charged there too, so the cgroup gets this much above the limits asked
// for, which then bound what runs inside as they do on native.
const (
	sentryPids   = 256
	sentryMemory = 96 << 20
)

// Options tune the gvisor runtime beyond runtime.Config.
type Options struct {
	// Runsc is the runsc binary; "" finds it on PATH.
	Runsc string
	// Platform is runsc's platform (Platforms); "" is systrap.
	Platform string
	// CgroupRoot names berth's group under each cgroup hierarchy.
	CgroupRoot string
	// Debug keeps runsc's debug logs in each sandbox's directory.
	Debug bool
	// NoSeccomp leaves berth's seccomp profile out of sandboxes (gVisor's
	// kernel alone stands between them and the host; for tests that show
	// what gVisor stops by itself).
	NoSeccomp bool
}

// Runtime is the gvisor runtime.
type Runtime struct {
	*local.Host // directories, cgroups, and the optional interfaces served from them

	cfg     runtime.Config
	opts    Options
	log     *slog.Logger
	caps    runtime.Capabilities
	runsc   string
	guest   string // the guest binary's name in binDir
	base    string // the read-only layer of the mount points berth needs
	watcher *hostproc.Watcher

	fixed  sync.Map // sandbox id -> its bootLimits, fixed at boot
	paused sync.Map // sandbox id -> whether runsc paused it, as this daemon last left it (see pause.go)
}

// persisted is the runtime-private state the manager keeps for each sandbox.
type persisted struct {
	// Pid and StartTime name the sandbox's runsc-sandbox process (the sentry).
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	Token     string `json:"token"`
	Owner     uint32 `json:"owner"`
	OpenFiles int64  `json:"open_files,omitempty"`
	Pids      int64  `json:"pids,omitempty"`
	// Checkpoint names the image, in the sandbox's directory, of a
	// checkpointed sandbox ("" while it runs or is stopped).
	Checkpoint string `json:"checkpoint,omitempty"`
}

// Factory returns a runtime.Factory for the gvisor runtime with opts.
func Factory(opts Options) runtime.Factory {
	return func(cfg runtime.Config) (runtime.Runtime, error) { return New(cfg, opts) }
}

// New checks that runsc runs here and prepares the runtime's state directory.
func New(cfg runtime.Config, opts Options) (*Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("gvisor runtime needs root (runsc runs sandboxes as root)")
	}
	if cfg.GuestBinary == "" {
		return nil, errors.New("gvisor runtime: no guest binary configured")
	}
	if opts.Platform == "" {
		opts.Platform = "systrap"
	}
	path, _, err := CheckRunsc(opts)
	if err != nil {
		return nil, err
	}
	if opts.CgroupRoot == "" {
		opts.CgroupRoot = "berth"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cg, err := cgroup.New(opts.CgroupRoot)
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: cgroups: %w", err)
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "sandboxes"), filepath.Join(cfg.StateDir, "runsc")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("gvisor runtime: state dir: %w", err)
		}
	}
	if err := hostpath.CheckSearchable(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("gvisor runtime: state dir: %w", err)
	}
	guest, err := runtime.InstallGuest(cfg.GuestBinary, filepath.Join(cfg.StateDir, "bin"))
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	if err := runtime.CheckGuest(guest); err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	base, err := makeBase(filepath.Join(cfg.StateDir, "base"))
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	w, err := hostproc.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	r := &Runtime{Host: &local.Host{StateDir: cfg.StateDir, Cgroups: cg}, cfg: cfg, opts: opts, log: cfg.Log,
		runsc: path, guest: filepath.Base(guest), base: base, watcher: w}
	r.Freezer = r.kernel // pause in gVisor's kernel (see pause.go)
	r.caps = r.capabilities()
	r.log.Info("gvisor runtime ready", "runsc", path, "platform", opts.Platform, "cgroup_version", cg.Version(), "missing", r.caps.Missing)
	return r, nil
}

// CheckRunsc is the gvisor runtime's own check of this host, without
// touching a state dir: the platform is known (and kvm has /dev/kvm), and
// runsc is found and `runsc --version` runs. It returns runsc's path and the
// first line of its version, or why the runtime is unavailable (the error
// New fails with, for berth doctor to show).
func CheckRunsc(opts Options) (path, version string, err error) {
	platform := opts.Platform
	if platform == "" {
		platform = "systrap"
	}
	if !slices.Contains(Platforms, platform) {
		return "", "", fmt.Errorf("gvisor runtime: platform %q: want one of %v", platform, Platforms)
	}
	if platform == "kvm" {
		if _, err := os.Stat("/dev/kvm"); err != nil {
			return "", "", fmt.Errorf("gvisor runtime: platform kvm needs /dev/kvm: %w", err)
		}
	}
	runsc := opts.Runsc
	if runsc == "" {
		runsc = "runsc"
	}
	path, err = exec.LookPath(runsc)
	if err != nil {
		return "", "", fmt.Errorf("gvisor runtime: runsc not found (install it with scripts/runsc.sh, or name it with --runsc): %w", err)
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return path, "", fmt.Errorf("gvisor runtime: %s --version: %v: %s", path, err, bytes.TrimSpace(out))
	}
	version, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	return path, version, nil
}

// makeBase makes the read-only layer at dir that sits under every
// sandbox's image layers: the mount points runsc needs, so that it never
// creates them in a sandbox's writable layer (where they would show in its
// diff and snapshots). An image's own directories of these names win.
func makeBase(dir string) (string, error) {
	for _, d := range []string{"", ".berth", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", fmt.Errorf("base layer: %w", err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return "", fmt.Errorf("base layer: %w", err)
	}
	return dir, nil
}

// capabilities says what this runtime does on this host.
func (r *Runtime) capabilities() runtime.Capabilities {
	c := runtime.Capabilities{
		Limits:       runtime.LimitSupport{CPUs: true, Memory: true, Pids: true, Disk: true, OpenFiles: true},
		NetworkModes: []string{runtime.NetworkNone},
		StopStart:    true,
		UpdateLimits: true,
		GrowDisk:     true,
		Stats:        true,
		Snapshot:     true,
		Missing: map[string]string{
			"idmapped_layers": "runsc serves the root through its gofer, which does not use idmapped mounts: image layers are copied once per sandbox's id range",
		},
	}
	if why := tun.Support(); why != "" {
		c.Missing["network_link"] = why
	} else {
		c.NetworkModes = append(c.NetworkModes, runtime.NetworkLink)
	}
	c.Host = local.HostLimits(r.cfg.StateDir)
	c.Host.OpenFiles = 1 << 20
	if why := layer.DiskSupport(); why != "" {
		c.Limits.Disk, c.GrowDisk = false, false
		c.Missing["disk_bytes"] = why
	}
	c.Pause = true // in gVisor's kernel (see pause.go)
	c.MemoryCheckpoint = true
	return c
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return Name }

// Capabilities implements runtime.Runtime.
func (r *Runtime) Capabilities() runtime.Capabilities { return r.caps }

var (
	_ runtime.Stopper       = (*Runtime)(nil)
	_ runtime.Updater       = (*Runtime)(nil)
	_ runtime.StatsProvider = (*Runtime)(nil)
	_ runtime.Differ        = (*Runtime)(nil)
	_ runtime.Pauser        = (*Runtime)(nil)
	_ runtime.Capturer      = (*Runtime)(nil)
	_ runtime.Archiver      = (*Runtime)(nil)
	_ runtime.Checkpointer  = (*Runtime)(nil)
	_ runtime.Linker        = (*Runtime)(nil)
)

// checkSpec refuses what this runtime cannot realize.
func (r *Runtime) checkSpec(spec runtime.Spec) error {
	return local.CheckSpec(Name, r.caps, spec)
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (*runtime.Instance, error) {
	if err := r.checkSpec(spec); err != nil {
		return nil, err
	}
	return r.Host.Create(ctx, spec, r.log, func(dir string, fill func(context.Context) error) (*runtime.Instance, error) {
		if err := fill(ctx); err != nil {
			return nil, err
		}
		if err := os.Mkdir(filepath.Join(dir, "rootfs"), 0o700); err != nil {
			return nil, fmt.Errorf("make rootfs: %w", err)
		}
		return r.boot(ctx, spec)
	})
}

// Start implements runtime.Stopper: it boots a stopped sandbox again on its
// kept writable layer.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (*runtime.Instance, error) {
	if err := r.checkSpec(spec); err != nil {
		return nil, err
	}
	if err := r.ReadyToStart(spec); err != nil {
		return nil, err
	}
	// What an earlier life left (a sentry that died on its own, a daemon
	// killed mid-stop) is cleared first.
	if err := r.teardown(ctx, spec.ID); err != nil {
		return nil, err
	}
	return r.boot(ctx, spec)
}

// flags are runsc's global flags, the same for every command on a sandbox
// (runsc reads its configuration again at each).
func (r *Runtime) flags(id string) []string {
	// Loopback only in gVisor's own stack, or, with a link, the interface
	// of the sandbox's network namespace copied into it (see link.go).
	network := []string{"--network=none"}
	if linked(r.SandboxDir(id)) {
		network = []string{"--network=sandbox", "--gso=false", "--software-gso=false"}
	}
	f := append([]string{
		"--root=" + filepath.Join(r.cfg.StateDir, "runsc"),
		"--platform=" + r.opts.Platform,
	}, network...)
	f = append(f,
		"--host-uds=create", // the guest binds its control socket on the host
		"--overlay2=none",   // writes go through to the sandbox's writable layer
		"--ignore-cgroups",  // berth's cgroup holds the sandbox (see boot)
	)
	if r.opts.Debug {
		f = append(f, "--debug", "--debug-log="+filepath.Join(r.SandboxDir(id), "runsc")+"/")
	}
	return f
}

// run runs runsc with the sandbox's flags and args, and says what it said
// when it fails.
func (r *Runtime) run(ctx context.Context, id string, args ...string) error {
	_, err := r.output(ctx, id, args...)
	return err
}

// output runs runsc as run does and returns its standard output.
func (r *Runtime) output(ctx context.Context, id string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.runsc, append(r.flags(id), args...)...)
	cmd.Env = []string{}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		said := bytes.TrimSpace(append(stderr.Bytes(), stdout.Bytes()...))
		return nil, fmt.Errorf("runsc %s: %w: %s", args[0], err, local.Truncate(string(said), 1024))
	}
	return stdout.Bytes(), nil
}

// boot writes the bundle, mounts the root, makes the cgroup and starts the
// sandbox on its existing directory. On error it leaves no mount, cgroup,
// runsc state or process behind.
func (r *Runtime) boot(ctx context.Context, spec runtime.Spec) (*runtime.Instance, error) {
	return r.bootFrom(ctx, spec, "", "")
}

// bootFrom boots the sandbox of spec fresh, or, with image, restores it
// from that checkpoint, whose guest holds token.
func (r *Runtime) bootFrom(ctx context.Context, spec runtime.Spec, image, token string) (_ *runtime.Instance, err error) {
	t0 := time.Now()
	dir := r.SandboxDir(spec.ID)
	defer func() {
		if err != nil {
			if terr := r.teardown(context.WithoutCancel(ctx), spec.ID); terr != nil {
				r.log.Error("failed boot: tear down", "sandbox", spec.ID, "err", terr)
			}
		}
	}()
	root := int(spec.Users.HostID)
	upper, work := layer.Dirs(dir)
	rootfs := filepath.Join(dir, "rootfs")
	if err := mountRoot(rootfs, append(slices.Clone(spec.Root.Layers), r.base), upper, work); err != nil {
		return nil, err
	}
	// runsc covers an empty /tmp with a tmpfs of its own; bound explicitly,
	// /tmp stays on the writable layer (kept across a stop, in snapshots)
	// as on every runtime. Nothing runs in the sandbox yet, so what is
	// checked here is what runsc binds: a directory, never a symlink a
	// sandbox left to steer the bind onto the host.
	var tmp *runtime.Mount
	if fi, err := os.Lstat(filepath.Join(rootfs, "tmp")); err == nil && fi.IsDir() {
		tmp = &runtime.Mount{Source: filepath.Join(rootfs, "tmp"), Target: "/tmp"}
	}
	ctl := filepath.Join(dir, "ctl")
	os.Remove(filepath.Join(ctl, controlSocket))
	if image != "" {
		// The restored kernel looks up the socket file it had bound (the
		// guest binds a new one when woken).
		if err := socketFile(filepath.Join(ctl, controlSocket), root); err != nil {
			return nil, err
		}
	} else { // a restored guest has its bootstrap in memory
		if token, err = local.Token(); err != nil {
			return nil, err
		}
		b := guestapi.Bootstrap{
			ID:       spec.ID,
			Hostname: spec.Hostname,
			Token:    token,
			Listen:   guestapi.ListenUnix + ctlDir + "/" + controlSocket,
			Seccomp:  !r.opts.NoSeccomp,
			Hide:     []string{ctlDir},
		}
		if err := writeJSON(filepath.Join(ctl, bootstrapFile), b, root, root); err != nil {
			return nil, err
		}
	}
	var link *runtime.Link
	netns := ""
	if spec.Network.Mode == runtime.NetworkLink {
		if image != "" {
			return nil, errdefs.New(errdefs.NotImplemented, "sandbox %s: a sandbox with a network link cannot be restored from memory yet", spec.ID)
		}
		if link, err = makeNetns(dir, spec.Network); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				link.File.Close()
			}
		}()
		netns = filepath.Join(dir, netnsFile)
	}
	oci := bundleSpec(spec, rootfs, tmp, ctl, filepath.Join(r.cfg.StateDir, "bin"), netns, r.guest, local.GuestEnv())
	if err := writeJSON(filepath.Join(dir, "config.json"), oci, 0, 0); err != nil {
		return nil, err
	}
	cg, err := r.Cgroups.Create(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	r.Remember(spec.ID, cg)
	if err := cg.Set(cgroupLimits(spec.Limits)); err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "apply limits")
	}
	tPrep := time.Now()
	// runsc starts the sandbox's processes (the sentry, the gofer) as its
	// children: born in the sandbox's cgroup, they stay there.
	pidFile := filepath.Join(dir, "pid")
	os.Remove(pidFile)
	// Its output goes to a file, not a pipe: the sandbox inherits runsc's
	// stdio and would hold a pipe open for its whole life.
	logPath := filepath.Join(dir, "runsc.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("runsc log: %w", err)
	}
	// One runsc for create and start (run --detach): a second would read
	// the bundle and the state again.
	args := []string{"run", "--detach", "--bundle=" + dir, "--pid-file=" + pidFile, spec.ID}
	if image != "" {
		args = []string{"restore", "--detach", "--image-path=" + image, "--bundle=" + dir, "--pid-file=" + pidFile, spec.ID}
	}
	create := exec.CommandContext(ctx, r.runsc, append(r.flags(spec.ID), args...)...)
	create.Env = []string{}
	create.Stdout, create.Stderr = logf, logf
	create.SysProcAttr = &unix.SysProcAttr{Setsid: true} // not in the daemon's session: the sandbox survives it
	err = cg.Start(create, nil)
	logf.Close()
	if err != nil {
		return nil, fmt.Errorf("runsc %s: %w", args[0], err)
	}
	if err := create.Wait(); err != nil {
		return nil, fmt.Errorf("runsc %s: %w: %s", args[0], err, tailFile(logPath))
	}
	tCreate := time.Now()
	pid, err := readPid(pidFile)
	if err != nil {
		return nil, err
	}
	start, err := hostproc.StartTime(pid)
	if err != nil {
		return nil, fmt.Errorf("runsc sandbox %d: %w", pid, err)
	}
	exited, ok, err := r.watcher.Watch(pid, start)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("runsc sandbox %d exited before its start", pid)
	}
	if image != "" {
		if err := r.wake(ctx, spec.ID); err != nil {
			return nil, err
		}
	}
	tStart := time.Now()
	dial := r.dialer(spec.ID, spec.Users.HostID)
	if err := waitReady(ctx, dial, exited); err != nil {
		return nil, fmt.Errorf("guest of %s did not start: %w", spec.ID, err)
	}
	r.log.Debug("create phases", "sandbox", spec.ID, "prepare", tPrep.Sub(t0), "runsc_run", tCreate.Sub(tPrep),
		"watch", tStart.Sub(tCreate), "guest_ready", time.Since(tStart))
	r.fixed.Store(spec.ID, bootLimits{openFiles: spec.Limits.OpenFiles, pids: spec.Limits.Pids})
	st, err := json.Marshal(persisted{Pid: pid, StartTime: start, Token: token, Owner: spec.Users.HostID,
		OpenFiles: spec.Limits.OpenFiles, Pids: spec.Limits.Pids})
	if err != nil {
		return nil, err
	}
	return &runtime.Instance{State: st, Dial: dial, Token: token, Exited: exited, Link: link}, nil
}

// wake tells a suspended guest to listen again (guestapi.RelistenSignal).
func (r *Runtime) wake(ctx context.Context, id string) error {
	return r.run(ctx, id, "kill", id, strconv.Itoa(guestapi.RelistenSignal))
}

// socketFile leaves a unix socket file at path, owned by uid, with nothing
// listening on it. It binds through a descriptor of the directory, so that
// a long state dir cannot overflow sun_path.
func socketFile(path string, uid int) error {
	fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("control socket file: %w", err)
	}
	defer unix.Close(fd)
	short := fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(path))
	ln, err := net.Listen("unix", short)
	if err != nil {
		return fmt.Errorf("control socket file: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if err := os.Chown(path, uid, uid); err != nil {
		return fmt.Errorf("control socket file: %w", err)
	}
	return nil
}

// checkpointDir is where a sandbox's checkpoint image is kept.
const checkpointDir = "checkpoint"

// Checkpoint implements runtime.Checkpointer with runsc checkpoint: the
// sandbox's kernel, processes and memory go to an image in its directory,
// and the sandbox ends. Its guest was suspended: on failure it is woken,
// and runs on as it was.
func (r *Runtime) Checkpoint(ctx context.Context, id string, state json.RawMessage) (json.RawMessage, error) {
	var st persisted
	if err := json.Unmarshal(state, &st); err != nil {
		return nil, fmt.Errorf("sandbox %s: bad runtime state: %w", id, err)
	}
	img := filepath.Join(r.SandboxDir(id), checkpointDir)
	if err := os.RemoveAll(img); err != nil {
		return nil, fmt.Errorf("sandbox %s: clear the checkpoint: %w", id, err)
	}
	if err := os.Mkdir(img, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox %s: checkpoint: %w", id, err)
	}
	if err := r.run(ctx, id, "checkpoint", "--image-path="+img, id); err != nil {
		os.RemoveAll(img)
		if werr := r.wake(context.WithoutCancel(ctx), id); werr != nil {
			return nil, fmt.Errorf("sandbox %s: %w (and its guest was not woken: %v)", id, err, werr)
		}
		if rerr := waitReady(context.WithoutCancel(ctx), r.dialer(id, st.Owner), nil); rerr != nil {
			return nil, fmt.Errorf("sandbox %s: %w (and its guest did not listen again: %v)", id, err, rerr)
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: checkpoint failed; it runs on", id)
	}
	// Saved: the sandbox ends on its own; what is left of it goes.
	if err := hostproc.WaitExit(st.Pid, st.StartTime, 10*time.Second); err != nil {
		r.log.Warn("checkpointed sandbox did not exit; killing it", "sandbox", id, "err", err)
	}
	if err := r.teardown(ctx, id); err != nil {
		r.log.Error("checkpointed sandbox: tear down", "sandbox", id, "err", err)
	}
	st.Checkpoint = checkpointDir
	return json.Marshal(st)
}

// Restore implements runtime.Checkpointer with runsc restore; the image
// goes once the sandbox runs again.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, state json.RawMessage) (*runtime.Instance, error) {
	var st persisted
	if err := json.Unmarshal(state, &st); err != nil {
		return nil, fmt.Errorf("sandbox %s: bad runtime state: %w", spec.ID, err)
	}
	if st.Checkpoint == "" {
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s has no checkpoint to restore", spec.ID)
	}
	if err := r.checkSpec(spec); err != nil {
		return nil, err
	}
	dir := r.SandboxDir(spec.ID)
	if _, err := layer.Ready(spec.ID, dir); err != nil {
		return nil, err
	}
	if err := r.teardown(ctx, spec.ID); err != nil {
		return nil, err
	}
	img := filepath.Join(dir, st.Checkpoint)
	inst, err := r.bootFrom(ctx, spec, img, st.Token)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(img); err != nil {
		r.log.Warn("restored sandbox: remove its checkpoint", "sandbox", spec.ID, "err", err)
	}
	return inst, nil
}

// Checkpointed implements runtime.Checkpointer.
func (r *Runtime) Checkpointed(state json.RawMessage) bool {
	var st persisted
	return json.Unmarshal(state, &st) == nil && st.Checkpoint != ""
}

// mountRoot mounts the sandbox's root at dir on the host: layers, topmost
// first, under its writable layer. runsc's gofer serves it to the sandbox.
func mountRoot(dir string, layers []string, upper, work string) error {
	for _, l := range layers {
		if strings.ContainsAny(l, ",:") {
			return fmt.Errorf("layer %q: a path with ',' or ':' cannot be an overlay layer", l)
		}
	}
	opts := "lowerdir=" + strings.Join(layers, ":") + ",upperdir=" + upper + ",workdir=" + work
	if len(opts) >= unix.Getpagesize() {
		return errdefs.New(errdefs.InvalidArgument, "%d layers are too many for one overlay mount here", len(layers))
	}
	if err := unix.Mount("overlay", dir, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the root: %w", err)
	}
	return nil
}

// readPid reads the pid runsc create wrote.
func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("runsc pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("runsc pid file: %q is not a pid", b)
	}
	return pid, nil
}

// waitReady waits until the guest accepts on its control socket, the
// sandbox exits, or ctx ends.
func waitReady(ctx context.Context, dial func(context.Context) (net.Conn, error), exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	wait := 200 * time.Microsecond
	for {
		c, err := dial(ctx)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited: // never, when nil
			return errors.New("the sandbox exited during set-up")
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Millisecond)
	}
}

// dialer connects to the sandbox's control socket and checks, with the
// kernel's word (SO_PEERCRED), that the listener runs as the sandbox's
// root: the gofer that bound it for the guest, in the sandbox's user
// namespace, whose host ids belong to this sandbox alone.
func (r *Runtime) dialer(id string, owner uint32) func(ctx context.Context) (net.Conn, error) {
	ctl := filepath.Join(r.SandboxDir(id), "ctl")
	return func(ctx context.Context) (net.Conn, error) {
		return local.Dial(ctx, id, ctl, controlSocket, func(cred unix.Ucred) error {
			if cred.Uid != owner {
				return fmt.Errorf("control socket is held by uid %d, not the sandbox's root %d", cred.Uid, owner)
			}
			return nil
		})
	}
}

// Attach implements runtime.Runtime.
func (r *Runtime) Attach(ctx context.Context, id string, state json.RawMessage) (*runtime.Instance, error) {
	var st persisted
	if err := json.Unmarshal(state, &st); err != nil {
		return nil, fmt.Errorf("sandbox %s: bad runtime state: %w", id, err)
	}
	if st.Checkpoint != "" {
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s is checkpointed: restore it", id)
	}
	exited, ok, err := r.watcher.Watch(st.Pid, st.StartTime)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if !ok {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s: its gVisor sandbox (pid %d) is gone", id, st.Pid)
	}
	r.fixed.Store(id, bootLimits{openFiles: st.OpenFiles, pids: st.Pids})
	return &runtime.Instance{State: state, Dial: r.dialer(id, st.Owner), Token: st.Token, Exited: exited}, nil
}

// Stop implements runtime.Stopper: every process of the sandbox ends, its
// runsc state, root mount and cgroup go; its files stay for Start.
// Stopping what is stopped is not an error.
func (r *Runtime) Stop(ctx context.Context, id string, state json.RawMessage) error {
	if err := r.teardown(ctx, id); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(r.SandboxDir(id), checkpointDir)); err != nil {
		return fmt.Errorf("sandbox %s: discard its checkpoint: %w", id, err)
	}
	return nil
}

// teardown ends sandbox id's gVisor sandbox, whatever is left of it: runsc's
// state, every process in its cgroup, its root mount and the cgroup.
func (r *Runtime) teardown(ctx context.Context, id string) error {
	r.Forget(id)
	r.fixed.Delete(id)
	r.paused.Delete(id)
	var errs []error
	cg, err := r.Cgroups.Load(id)
	if err == nil {
		// runsc delete signals gVisor's processes and waits for them, which
		// a group frozen by an older berth's pause never lets happen: thaw
		// it first (a pause in gVisor's kernel does not stop a delete).
		if terr := cg.Thaw(); terr != nil {
			errs = append(errs, fmt.Errorf("thaw cgroup: %w", terr))
		}
	}
	if exists(filepath.Join(r.cfg.StateDir, "runsc", id)) || r.known(id) {
		if err := r.run(ctx, id, "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "does not exist") {
			errs = append(errs, err)
		}
	}
	switch {
	case err == nil:
		r.Retire(id, cg) // an OOM ends the whole sandbox here: keep why
		if err := cg.Kill(); err != nil {
			errs = append(errs, fmt.Errorf("kill cgroup: %w", err))
		} else if err := cg.Remove(); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	case !errors.Is(err, os.ErrNotExist):
		errs = append(errs, fmt.Errorf("load cgroup: %w", err))
	}
	rootfs := filepath.Join(r.SandboxDir(id), "rootfs")
	if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount the root: %w", err))
	}
	if err := removeNetns(r.SandboxDir(id)); err != nil {
		errs = append(errs, err)
	}
	os.Remove(filepath.Join(r.SandboxDir(id), "ctl", controlSocket))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// known says whether runsc keeps state for sandbox id (its state files are
// named after the id in runsc's root).
func (r *Runtime) known(id string) bool {
	m, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, "runsc", id+"*"))
	return len(m) > 0
}

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(ctx context.Context, id string, state json.RawMessage) error {
	if err := r.teardown(ctx, id); err != nil {
		return err
	}
	r.Forget(id)
	dir := r.SandboxDir(id)
	if err := layer.UnmountDisk(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("sandbox %s: remove files: %w", id, err)
	}
	return nil
}

// Close stops the runtime's exit watches; sandboxes keep running. It also
// unmounts the empty network namespace runsc pins in its root for the
// gofers it starts (runsc makes it again when it needs it; running gofers
// keep theirs), so that the state directory can be removed once the daemon
// is gone.
func (r *Runtime) Close() error {
	nullNetns := filepath.Join(r.cfg.StateDir, "runsc", "null-netns")
	for unix.Unmount(nullNetns, unix.MNT_DETACH) == nil {
		// concurrent runsc invocations may have stacked several
	}
	if err := r.watcher.Close(); err != nil {
		return fmt.Errorf("gvisor runtime: %w", err)
	}
	return nil
}

// cgroupLimits are the sandbox's limits with room for gVisor's own kernel.
func cgroupLimits(l runtime.Limits) cgroup.Limits {
	c := cgroup.Limits{CPUs: l.CPUs, MemoryBytes: l.MemoryBytes, Pids: l.Pids}
	if c.MemoryBytes > 0 {
		c.MemoryBytes += sentryMemory
	}
	if c.Pids > 0 {
		c.Pids += sentryPids
	}
	return c
}

// bootLimits are the limits gVisor's kernel took as rlimits at boot.
type bootLimits struct{ openFiles, pids int64 }

// SetLimits implements runtime.Updater. Open files and pids are fixed when
// the sandbox boots (RLIMIT_NOFILE and RLIMIT_NPROC inside gVisor's
// kernel, whose tasks are not host processes that prlimit reaches): a
// change of either is refused, and a warm pool's hand-over that needs one
// boots a new sandbox instead.
func (r *Runtime) SetLimits(ctx context.Context, id string, l runtime.Limits) error {
	if v, ok := r.fixed.Load(id); ok {
		b := v.(bootLimits)
		for _, c := range []struct {
			name     string
			now, was int64
		}{{"open_files", l.OpenFiles, b.openFiles}, {"pids", l.Pids, b.pids}} {
			if c.now > 0 && c.now != c.was {
				return errdefs.New(errdefs.NotImplemented, "limits.%s: the gvisor runtime fixes it when a sandbox boots (%d here): create a sandbox with the limit it needs", c.name, c.was)
			}
		}
	}
	cg, err := r.Group(id)
	if err != nil {
		return err
	}
	if err := cg.Set(cgroupLimits(l)); err != nil {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "apply limits")
	}
	if l.DiskBytes > 0 {
		return layer.GrowDisk(ctx, r.SandboxDir(id), l.DiskBytes)
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// tailFile is the end of a log file.
func tailFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "no log"
	}
	return local.Truncate(strings.TrimSpace(string(b[max(0, len(b)-2048):])), 2048)
}
