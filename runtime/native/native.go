// Package native is berth's embedded runtime: each sandbox is the berth guest
// running as PID 1 of new user, mount, PID, network, IPC, UTS and cgroup
// namespaces, in its own cgroup, on an overlay root it builds and pivots into.
package native

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/cgroup"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/hostpath"
	"github.com/berthsh/berth/internal/hostproc"
	"github.com/berthsh/berth/internal/osthread"
	"github.com/berthsh/berth/internal/tun"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/layer"
	"github.com/berthsh/berth/runtime/local"
	"github.com/berthsh/berth/spawn"
)

// Name is the runtime's registered name.
const Name = "native"

// controlSocket is the guest's control socket in a sandbox's ctl directory.
const controlSocket = "guest.sock"

// Options tune the native runtime beyond runtime.Config.
type Options struct {
	// NoSeccomp disables the seccomp profile (debugging only).
	NoSeccomp bool
	// CgroupRoot names berth's group under each cgroup hierarchy.
	CgroupRoot string
	// NoIDMappedLayers makes sandboxes use shifted copies of image layers
	// even where the kernel can idmap them.
	NoIDMappedLayers bool
}

// Runtime is the native runtime.
type Runtime struct {
	*local.Host // directories, cgroups, and the optional interfaces served from them

	cfg  runtime.Config
	opts Options
	log  *slog.Logger
	caps runtime.Capabilities

	inits sync.Map // sandbox id -> its init (the guest), an initProc, while running

	// watcher watches the inits of re-attached sandboxes.
	watcher *hostproc.Watcher

	spares  *spareSet      // guests started ahead of their sandboxes
	spawner *spawn.Spawner // starts the guests (the guest binary's spawner mode)
}

// persisted is the runtime-private state the manager keeps for each sandbox.
type persisted struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // clock ticks since boot, /proc/<pid>/stat field 22
	Token     string `json:"token"`
	// Owner is the host uid that owns the sandbox's user namespace, its
	// range's root (0 for sandboxes made before ranges were per sandbox).
	Owner uint32 `json:"owner,omitempty"`
}

// initProc is a running sandbox's init: its pid, and the owner of its user
// namespace, whose ids the daemon takes to act on it (see setOpenFiles).
type initProc struct {
	pid   int
	owner uint32
}

// Factory returns a runtime.Factory for the native runtime with opts.
func Factory(opts Options) runtime.Factory {
	return func(cfg runtime.Config) (runtime.Runtime, error) { return New(cfg, opts) }
}

// New checks the host and prepares the runtime's state directory.
func New(cfg runtime.Config, opts Options) (*Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("native runtime needs root (it creates namespaces and cgroups)")
	}
	if cfg.GuestBinary == "" {
		return nil, errors.New("native runtime: no guest binary configured")
	}
	if opts.CgroupRoot == "" {
		opts.CgroupRoot = "berth"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cg, err := cgroup.New(opts.CgroupRoot)
	if err != nil {
		return nil, fmt.Errorf("native runtime: cgroups: %w", err)
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "sandboxes")} {
		// Traversable (not listable) so that a sandbox's init, an unprivileged
		// uid on the host, can reach its own layers before it pivots.
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("native runtime: state dir: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("native runtime: state dir: %w", err)
		}
	}
	if err := hostpath.CheckSearchable(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("native runtime: state dir: %w", err)
	}
	guestBin, err := runtime.InstallGuest(cfg.GuestBinary, filepath.Join(cfg.StateDir, "bin"))
	if err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	cfg.GuestBinary = guestBin
	if err := runtime.CheckGuest(guestBin); err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	w, err := hostproc.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	r := &Runtime{Host: &local.Host{StateDir: cfg.StateDir, Cgroups: cg}, cfg: cfg, opts: opts, log: cfg.Log, watcher: w, spares: newSpareSet(),
		spawner: spawn.New(guestBin, []string{"berth-guest", "guest", guestapi.SpawnerFlag}, local.GuestEnv(), cfg.Log)}
	if err := r.clearSpares(); err != nil {
		w.Close()
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	r.caps = capabilities(cfg.StateDir)
	if why := cg.CanFreeze(); why != "" {
		r.caps.Missing["pause"] = why
		r.NoFreeze = why
	} else {
		r.caps.Pause = true
	}
	r.caps.Snapshot = true
	r.caps.Missing["memory_checkpoint"] = "the native runtime cannot save processes with their memory (the gvisor runtime can)"
	if opts.NoIDMappedLayers {
		r.caps.Missing["idmapped_layers"] = "turned off (serve --no-idmapped-layers): image layers are copied once per sandbox's id range"
	} else if why := ProbeIDMappedLayers(guestBin, filepath.Join(cfg.StateDir, "probe")); why != "" {
		r.caps.Missing["idmapped_layers"] = why
	} else {
		r.caps.IDMappedLayers = true
	}
	r.log.Info("native runtime ready", "cgroup_version", cg.Version(), "cpus", r.caps.Host.CPUs,
		"memory_bytes", r.caps.Host.MemoryBytes, "disk_bytes", r.caps.Host.DiskBytes,
		"idmapped_layers", r.caps.IDMappedLayers, "missing", r.caps.Missing)
	return r, nil
}

// capabilities reads what this host lets the runtime do and give.
func capabilities(stateDir string) runtime.Capabilities {
	c := runtime.Capabilities{
		Limits:       runtime.LimitSupport{CPUs: true, Memory: true, Pids: true, Disk: true, OpenFiles: true},
		NetworkModes: []string{runtime.NetworkNone, runtime.NetworkLink},
		StopStart:    true,
		UpdateLimits: true,
		GrowDisk:     true,
		Stats:        true,
		Missing:      map[string]string{},
	}
	c.Host = local.HostLimits(stateDir)
	// A sandbox's RLIMIT_NOFILE can be set lower than the daemon's own hard
	// limit, never higher (that takes CAP_SYS_RESOURCE).
	var nofile unix.Rlimit
	c.Host.OpenFiles = 1 << 30
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile) == nil && nofile.Max < 1<<30 {
		c.Host.OpenFiles = int64(nofile.Max)
	}
	if why := tun.Support(); why != "" {
		c.NetworkModes = []string{runtime.NetworkNone}
		c.Missing["network_link"] = why
	}
	if why := layer.DiskSupport(); why != "" {
		c.Limits.Disk, c.GrowDisk = false, false
		c.Missing["disk_bytes"] = why
	} else if ok, err := capability.Effective(unix.CAP_SYS_RESOURCE); err != nil || !ok {
		// ext4 grows online only for CAP_SYS_RESOURCE (some hosts, like
		// nested VMs, withhold it even from root).
		c.GrowDisk = false
		c.Missing["grow_disk"] = "growing a running sandbox's disk needs CAP_SYS_RESOURCE, which this daemon lacks"
	}
	return c
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return Name }

// Capabilities implements runtime.Runtime.
func (r *Runtime) Capabilities() runtime.Capabilities { return r.caps }

var (
	_ runtime.Linker        = (*Runtime)(nil)
	_ runtime.Stopper       = (*Runtime)(nil)
	_ runtime.Updater       = (*Runtime)(nil)
	_ runtime.StatsProvider = (*Runtime)(nil)
	_ runtime.Differ        = (*Runtime)(nil)
	_ runtime.Spares        = (*Runtime)(nil)
)

// SetLimits implements runtime.Updater: the kernel applies new limits to a
// running sandbox at once.
func (r *Runtime) SetLimits(ctx context.Context, id string, l runtime.Limits) error {
	cg, err := r.Group(id)
	if err != nil {
		return err
	}
	if err := cg.Set(cgroupLimits(l)); err != nil {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "apply limits")
	}
	if err := r.setOpenFiles(id, l.OpenFiles); err != nil {
		return err
	}
	if l.DiskBytes > 0 {
		return layer.GrowDisk(ctx, r.SandboxDir(id), l.DiskBytes)
	}
	return nil
}

// setOpenFiles sets RLIMIT_NOFILE (soft and hard) on a sandbox's init, which
// every process it starts inherits; nothing inside can raise a hard limit
// (that takes CAP_SYS_RESOURCE in the host's user namespace). 0 keeps it.
//
// The kernel lets a process change another's limits when it has
// CAP_SYS_RESOURCE over the other's user namespace, or the other's ids are
// all its real ids. The namespace is owned by the sandbox's range, not by
// the daemon, and some hosts (nested VMs) withhold CAP_SYS_RESOURCE even
// from root: so the daemon acts from a thread of its own whose real and
// effective ids are the range's root (osthread.SetIDs), as the init's are.
func (r *Runtime) setOpenFiles(id string, n int64) error {
	if n <= 0 {
		return nil
	}
	v, ok := r.inits.Load(id)
	if !ok {
		return errdefs.New(errdefs.Conflict, "sandbox %s is not running", id)
	}
	proc := v.(initProc)
	set := func() error { return setNofile(id, proc.pid, n) }
	if proc.owner == 0 {
		return set()
	}
	_, err := osthread.Discarded(func(int) error {
		if err := osthread.SetIDs(proc.owner); err != nil {
			return err
		}
		return set()
	})
	return err
}

func setNofile(id string, pid int, n int64) error {
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		return fmt.Errorf("sandbox %s: read open files limit: %w", id, err)
	}
	if uint64(n) > old.Max {
		if ok, _ := capability.Effective(unix.CAP_SYS_RESOURCE); !ok {
			return errdefs.New(errdefs.NotImplemented,
				"limits.open_files: raising it above %d on a running sandbox needs CAP_SYS_RESOURCE, which this daemon lacks", old.Max)
		}
	}
	lim := unix.Rlimit{Cur: uint64(n), Max: uint64(n)}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "limits.open_files: %d", n)
	}
	return nil
}

func cgroupLimits(l runtime.Limits) cgroup.Limits {
	return cgroup.Limits{CPUs: l.CPUs, MemoryBytes: l.MemoryBytes, Pids: l.Pids}
}

// Close stops the runtime's exit monitors of re-attached sandboxes.
// Sandboxes keep running; the waits on sandboxes this daemon started end
// with the sandbox or with the process.
func (r *Runtime) Close() error {
	if err := errors.Join(r.spawner.Close(), r.watcher.Close()); err != nil {
		return fmt.Errorf("native runtime: %w", err)
	}
	return nil
}

// checkSpec refuses what this runtime cannot realize.
func (r *Runtime) checkSpec(spec runtime.Spec) error {
	if err := local.CheckSpec(Name, r.caps, spec); err != nil {
		return err
	}
	// Passed as mounts: the layers, and a disk.
	if spec.Root.IDMapped && len(spec.Root.Layers) >= guestapi.MaxPassed {
		return errdefs.New(errdefs.InvalidArgument, "sandbox %s: %d layers, over the %d the native runtime mounts", spec.ID, len(spec.Root.Layers), guestapi.MaxPassed-1)
	}
	return nil
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ *runtime.Instance, err error) {
	defer func() {
		if err != nil {
			r.DiscardSpare(spec.ID) // handed out for this create, unclaimed
		}
	}()
	if err := r.checkSpec(spec); err != nil {
		return nil, err
	}
	return r.Host.Create(ctx, spec, r.log, func(_ string, fill func(context.Context) error) (*runtime.Instance, error) {
		return r.boot(ctx, spec, fill)
	})
}

// Start implements runtime.Stopper: it boots a stopped sandbox again on its
// kept writable layer.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (*runtime.Instance, error) {
	if err := r.checkSpec(spec); err != nil {
		return nil, err
	}
	// A cgroup left by an init that died on its own is cleared first.
	if cg, err := r.Cgroups.Load(spec.ID); err == nil {
		if err := cg.Kill(); err != nil {
			return nil, fmt.Errorf("clear stale cgroup: %w", err)
		}
		if err := cg.Remove(); err != nil {
			return nil, fmt.Errorf("clear stale cgroup: %w", err)
		}
	}
	return r.boot(ctx, spec, func(context.Context) error { return r.ReadyToStart(spec) })
}

// boot starts the sandbox's guest, on a spare started for it (claimSpare)
// or on a new one in a new cgroup, and has fill ready the directory's
// contents (the writable layer, the spec's files) while the guest starts:
// its runtime and its bounding set's drops (about 1.5 ms) need nothing of
// them, and the bootstrap, which names them, is sent after. On error it
// leaves no cgroup or process behind.
func (r *Runtime) boot(ctx context.Context, spec runtime.Spec, fill func(context.Context) error) (_ *runtime.Instance, err error) {
	t0 := time.Now()
	var undo []func()
	var g *guestProc
	defer func() {
		if err == nil {
			r.log.Debug("booted", "sandbox", spec.ID, "total", time.Since(t0))
		}
		if err != nil {
			err = guestGone(err, spec.ID, g)
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	dir := r.SandboxDir(spec.ID)
	logPath := filepath.Join(dir, "guest.log")
	limits := cgroupLimits(spec.Limits)
	g = r.claimSpare(spec.ID, spec.Users)
	if g != nil {
		undo = append(undo, func() {
			g.end(r.log, spec.ID)
			os.Remove(r.spareLog(spec.ID)) // if it was not moved
		})
		if err := os.Rename(r.spareLog(spec.ID), logPath); err != nil {
			return nil, fmt.Errorf("move the spare guest's log: %w", err)
		}
		if err := g.cg.Set(limits); err != nil {
			return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "apply limits")
		}
	} else {
		if g, err = r.spawn(spec.ID, spec.Users, logPath, &limits); err != nil {
			return nil, err
		}
		undo = append(undo, func() { g.end(r.log, spec.ID) })
	}
	defer g.bootSock.Close()
	defer g.statusR.Close()
	r.Remember(spec.ID, g.cg)
	undo = append(undo, func() { r.Forget(spec.ID) })
	tStart := time.Now()
	token, err := local.Token()
	if err != nil {
		return nil, err
	}
	pid, exited, bootSock, statusR := g.pid, g.exited, g.bootSock, g.statusR
	r.inits.Store(spec.ID, initProc{pid: pid, owner: spec.Users.HostID})
	undo = append(undo, func() { r.inits.Delete(spec.ID) })
	// Before the guest reads its bootstrap, so nothing it starts escapes the limit.
	if err := r.setOpenFiles(spec.ID, spec.Limits.OpenFiles); err != nil {
		return nil, err
	}
	tFill := time.Now()
	if err := fill(ctx); err != nil {
		return nil, err
	}
	r.log.Debug("fill", "sandbox", spec.ID, "took", time.Since(tFill))

	upper, work := layer.Dirs(dir)
	mounts := make([]guestapi.Mount, len(spec.Mounts))
	for i, m := range spec.Mounts {
		mounts[i] = guestapi.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly}
	}
	b := guestapi.Bootstrap{
		ID:       spec.ID,
		Hostname: spec.Hostname,
		Token:    token,
		Listen:   guestapi.ListenUnix + filepath.Join(dir, "ctl", controlSocket),
		Root:     &guestapi.Root{Layers: spec.Root.Layers, Upper: upper, Work: work, Mounts: mounts},
		Seccomp:  !r.opts.NoSeccomp,
	}
	var passed []int
	if spec.Root.IDMapped {
		if passed, err = idmapLayers(pid, spec.Root.Layers); err != nil {
			return nil, err
		}
		defer closeAll(passed)
		if err := g.alive(); err != nil { // the user namespace was the guest's
			return nil, fmt.Errorf("guest of %s: %w (log: %s)", spec.ID, err, tailLog(logPath))
		}
		b.Root.Layers = make([]string, len(passed))
		for i := range passed {
			b.Root.Layers[i] = guestapi.PassedLayer(i)
		}
	}
	if disk, ok := layer.DiskRoot(dir); ok {
		// The disk may have been mounted after the guest's mount namespace
		// was made (a spare's; or the fill above): passed as a mount, it
		// reaches the guest either way.
		fd, err := unix.OpenTree(unix.AT_FDCWD, disk, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("open the sandbox's disk as a mount: %w", err)
		}
		defer unix.Close(fd)
		b.Root.Writable = guestapi.PassedLayer(len(passed))
		b.Root.Upper, b.Root.Work = layer.DiskUpper, layer.DiskWork
		passed = append(passed, fd)
	}
	if err := sendBootstrap(bootSock, b, passed); err != nil {
		return nil, fmt.Errorf("send bootstrap: %w", err)
	}
	bootSock.Close()
	// The link is made from outside, in the init's network namespace, while
	// the guest sets itself up.
	var link *runtime.Link
	if spec.Network.Mode == runtime.NetworkLink {
		if link, err = makeLink(pid, spec.Network); err != nil {
			return nil, err
		}
		undo = append(undo, func() { link.File.Close() })
		if err := g.alive(); err != nil { // the network namespace was the guest's
			return nil, fmt.Errorf("guest of %s: %w (log: %s)", spec.ID, err, tailLog(logPath))
		}
	}
	hello, err := waitReady(ctx, statusR, exited)
	if err != nil {
		return nil, fmt.Errorf("guest of %s did not start: %w (log: %s)", spec.ID, err, tailLog(logPath))
	}
	r.log.Debug("create phases", "sandbox", spec.ID, "spare", g.spare, "spawn", tStart.Sub(t0), "guest_setup", time.Since(tStart))
	start, err := hostproc.StartTime(pid)
	if err == nil {
		err = g.alive() // the start time was the guest's
	}
	if err != nil {
		return nil, fmt.Errorf("read guest start time: %w", err)
	}
	st, err := json.Marshal(persisted{Pid: pid, StartTime: start, Token: token, Owner: spec.Users.HostID})
	if err != nil {
		return nil, err
	}
	return &runtime.Instance{State: st, Dial: r.dialer(spec.ID, pid), Token: token, Exited: exited, Link: link, Hello: hello}, nil
}

// guestRequest prepares `berth guest` in new namespaces, booting from a
// socket (guestapi's BootPipe: the bootstrap socket and the status pipe as
// fds 3 and 4), with the file at logPath as stdout and stderr. The caller
// closes files' Output and Extra once it is started.
func (r *Runtime) guestRequest(logPath string, ids runtime.IDMap) (req spawn.Request, files spawn.Files, bootSock, statusR *os.File, err error) {
	bootSock, guestSock, err := bootSocket()
	if err != nil {
		return req, files, nil, nil, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		bootSock.Close()
		guestSock.Close()
		return req, files, nil, nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		bootSock.Close()
		guestSock.Close()
		statusR.Close()
		statusW.Close()
		return req, files, nil, nil, err
	}
	req = spawn.Request{
		Path: r.cfg.GuestBinary,
		Args: []string{"berth-guest", "guest"},
		Env:  local.GuestEnv(), // nothing of the daemon's environment enters a sandbox
		Dir:  "/",
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP,
		HostID: ids.HostID,
		Size:   ids.Size,
		// The user namespace is owned by the range's root, not the daemon's:
		// the kernel charges per-user counts of everything in a user
		// namespace (inotify instances and watches, pending signals,
		// message queue bytes, processes) to its owner at the host's level,
		// so a sandbox meets its own limits, never host root's or another
		// sandbox's.
		Owner:  ids.HostID,
		Setsid: true, // not in the daemon's session: survives it
		// Dropped before the guest's exec, by the spawner, while the child
		// is one thread: the guest's own drops (a stop-the-world each)
		// then find them made.
		Bounding: capability.Default(),
	}
	files = spawn.Files{Output: logf, Extra: []*os.File{guestSock, statusW}}
	return req, files, bootSock, statusR, nil
}

// guestGone classifies err, a boot's failure, as unavailable when the
// guest has exited without reporting a failure of its own: it was killed
// (from outside, or by the kernel for want of memory) while it started, and
// whatever step noticed first (its user namespace gone, its status pipe
// closed) failed for that. Such a create can be made again; the message
// names the sandbox, and the step stays in the log. An error with a class,
// or one the guest reported, is left as it is.
func guestGone(err error, id string, g *guestProc) error {
	if g == nil || errdefs.ClassOf(err) != errdefs.Internal || errors.As(err, new(guestReport)) || !g.exitedWithin(100*time.Millisecond) {
		return err
	}
	return errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: its guest exited while it started (killed, or out of memory): create it again", id)
}

// guestReport is a failure the guest reported on its status pipe.
type guestReport string

func (e guestReport) Error() string { return string(e) }

// waitReady reads the guest's first status line.
func waitReady(ctx context.Context, statusR *os.File, exited <-chan struct{}) (*guestapi.HelloResponse, error) {
	line := make(chan string, 1)
	go func() { // ends when the guest writes or closes its status pipe (or dies)
		s, _ := bufio.NewReader(statusR).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		s = strings.TrimSpace(s)
		if rest, ok := strings.CutPrefix(s, guestapi.StatusReady+" "); ok {
			var h guestapi.HelloResponse
			if err := json.Unmarshal([]byte(rest), &h); err != nil {
				return nil, fmt.Errorf("the guest's hello: %w", err)
			}
			return &h, nil
		}
		var ge guestapi.Error
		if json.Unmarshal([]byte(s), &ge) == nil && ge.Message != "" {
			return nil, guestReport(local.Truncate(ge.Message, 512))
		}
		return nil, errors.New("guest exited during set-up")
	case <-ctx.Done():
		statusR.Close()
		return nil, ctx.Err()
	}
}

// dialer connects to the sandbox's control socket and checks, with the
// kernel's word (SO_PEERCRED), that the listener is the sandbox's init.
func (r *Runtime) dialer(id string, pid int) func(ctx context.Context) (net.Conn, error) {
	ctl := filepath.Join(r.SandboxDir(id), "ctl")
	return func(ctx context.Context) (net.Conn, error) {
		return local.Dial(ctx, id, ctl, controlSocket, func(cred unix.Ucred) error {
			if int(cred.Pid) != pid {
				return fmt.Errorf("control socket is held by pid %d, not the sandbox's init %d", cred.Pid, pid)
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
	exited, ok, err := r.watcher.Watch(st.Pid, st.StartTime)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if !ok {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s: its init (pid %d) is gone", id, st.Pid)
	}
	r.inits.Store(id, initProc{pid: st.Pid, owner: st.Owner})
	return &runtime.Instance{State: state, Dial: r.dialer(id, st.Pid), Token: st.Token, Exited: exited}, nil
}

// Stop implements runtime.Stopper: every process of the sandbox ends and its
// cgroup goes; its files stay for Start. Stopping what is stopped is not an error.
func (r *Runtime) Stop(ctx context.Context, id string, state json.RawMessage) error {
	var st persisted
	if len(state) > 0 {
		if err := json.Unmarshal(state, &st); err != nil {
			r.log.Warn("bad runtime state; stopping by id", "sandbox", id, "err", err)
		}
	}
	t0 := time.Now()
	defer func() { r.log.Debug("stopped", "sandbox", id, "took", time.Since(t0)) }()
	if st.Pid > 0 && hostproc.Alive(st.Pid, st.StartTime) {
		// Killing the init of a PID namespace kills everything in it.
		unix.Kill(st.Pid, unix.SIGKILL)
	}
	r.Forget(id)
	r.inits.Delete(id)
	waited := false
	waitInit := func() error {
		if st.Pid > 0 {
			if err := hostproc.WaitExit(st.Pid, st.StartTime, 5*time.Second); err != nil {
				return fmt.Errorf("sandbox %s: init %d: %w", id, st.Pid, err)
			}
		}
		return nil
	}
	cg, err := r.Cgroups.Load(id)
	if err == nil {
		r.Retire(id, cg)
		// The kernel reaps everything in a PID namespace before its init
		// has exited, so an init's exit (its pidfd, no polling) leaves the
		// group empty but for what joined it from outside, which the kill
		// below then finds at its first look. A frozen init dies only once
		// thawed, which the kill does first. An init that does not die
		// still has the rest of its group killed before Stop says so.
		var initErr error
		if frozen, err := cg.Frozen(); err == nil && !frozen {
			initErr, waited = waitInit(), true
		}
		cg.Kill()
		if initErr != nil {
			return initErr
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sandbox %s: load cgroup: %w", id, err)
	}
	if !waited {
		if err := waitInit(); err != nil {
			return err
		}
	}
	tWait := time.Now()
	if cg != nil {
		if err := cg.Remove(); err != nil {
			return fmt.Errorf("sandbox %s: remove cgroup: %w", id, err)
		}
	}
	r.log.Debug("stop phases", "sandbox", id, "kill_wait", tWait.Sub(t0), "cgroup_remove", time.Since(tWait))
	os.Remove(filepath.Join(r.SandboxDir(id), "ctl", controlSocket))
	return nil
}

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(ctx context.Context, id string, state json.RawMessage) error {
	if err := r.Stop(ctx, id, state); err != nil {
		return err
	}
	r.Forget(id)
	if err := layer.UnmountDisk(r.SandboxDir(id)); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := os.RemoveAll(r.SandboxDir(id)); err != nil {
		return fmt.Errorf("sandbox %s: remove files: %w", id, err)
	}
	return nil
}

func tailLog(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "no log"
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > 2048 {
		f.Seek(-2048, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return local.Truncate(strings.TrimSpace(string(b)), 2048)
}
