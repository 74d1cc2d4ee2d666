// Package local is what the runtimes that run sandboxes on this host share:
// a sandbox's directory with its writable layer, its cgroup, the optional
// runtime interfaces served from those two (usage, freezing, captures,
// archives, diffs), and the dial of a guest's control socket. A runtime
// embeds a Host and adds how it starts a sandbox and reaches its guest.
package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/cgroup"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/layerdiff"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/layer"
)

// Host serves a runtime's sandboxes from their directories under
// StateDir/sandboxes and their cgroups.
type Host struct {
	StateDir string
	Cgroups  cgroup.Manager
	// NoFreeze says why groups cannot be frozen here ("": they can).
	NoFreeze string
	// Freezer, when set, is what pauses sandbox id, whose group is g, for
	// Pause, Resume and Capture, in place of g's own freezer.
	Freezer func(id string, g cgroup.Group) layer.Freezer

	groups sync.Map // sandbox id -> cgroup.Group of running sandboxes (a cache)
	// retired keeps a stopped sandbox's last OOM count (int64) until it
	// boots again or goes: whoever asks why it ended (an exec whose guest
	// went away) may ask after its group is gone.
	retired sync.Map
}

// SandboxDir is sandbox id's directory.
func (h *Host) SandboxDir(id string) string { return filepath.Join(h.StateDir, "sandboxes", id) }

// Group returns running sandbox id's cgroup, from the cache when it can:
// a conflict when it has none.
func (h *Host) Group(id string) (cgroup.Group, error) {
	if g, ok := h.groups.Load(id); ok {
		return g.(cgroup.Group), nil
	}
	g, err := h.Cgroups.Load(id)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Conflict, err, "sandbox %s has no cgroup (is it running?)", id)
	}
	h.groups.Store(id, g)
	return g, nil
}

// Remember caches a group the runtime just made for sandbox id (a new
// life: a count Retire kept goes).
func (h *Host) Remember(id string, g cgroup.Group) {
	h.retired.Delete(id)
	h.groups.Store(id, g)
}

// Retire drops sandbox id's group from the cache and keeps g's OOM count:
// call it before the group is killed and removed.
func (h *Host) Retire(id string, g cgroup.Group) {
	h.groups.Delete(id)
	if n, err := g.OOMKills(); err == nil {
		h.retired.Store(id, n)
	}
}

// Forget drops all the Host knows of sandbox id (it stopped, and what it
// ended with no longer matters, or it was deleted).
func (h *Host) Forget(id string) {
	h.groups.Delete(id)
	h.retired.Delete(id)
}

// Stats implements runtime.StatsProvider from the sandbox's cgroup and the
// size of its writable layer.
func (h *Host) Stats(ctx context.Context, id string) (runtime.Usage, error) {
	cg, err := h.Group(id)
	if err != nil {
		return runtime.Usage{}, err
	}
	st, err := cg.Stats()
	if err != nil {
		return runtime.Usage{}, fmt.Errorf("sandbox %s: cgroup stats: %w", id, err)
	}
	return runtime.Usage{CPUSeconds: float64(st.CPUUsageNs) / 1e9, MemoryBytes: st.MemoryCurrent,
		MemoryPeakBytes: st.MemoryPeak, Pids: st.Pids, OOMKills: st.OOMKills,
		DiskBytes: layer.Usage(ctx, h.SandboxDir(id))}, nil
}

// OOMKills implements runtime.StatsProvider; for a sandbox stopped since
// it last ran, the count it ended with (Retire).
func (h *Host) OOMKills(ctx context.Context, id string) (int64, error) {
	cg, err := h.Group(id)
	if err == nil {
		var n int64
		if n, err = cg.OOMKills(); err == nil {
			return n, nil
		}
	}
	if n, ok := h.retired.Load(id); ok { // gone meanwhile
		return n.(int64), nil
	}
	return 0, err
}

// LimitHits implements runtime.StatsProvider.
func (h *Host) LimitHits(ctx context.Context, id string) (runtime.LimitHits, error) {
	cg, err := h.Group(id)
	if err != nil {
		return runtime.LimitHits{}, err
	}
	hits, err := cg.LimitHits()
	if err != nil {
		return runtime.LimitHits{}, err
	}
	return runtime.LimitHits{Pids: hits.Pids, CPUThrottled: hits.CPUThrottled, DiskFull: layer.DiskFull(h.SandboxDir(id))}, nil
}

// Pause implements runtime.Pauser with the sandbox's freezer (its cgroup's,
// unless Freezer says otherwise): every process in it stops.
func (h *Host) Pause(ctx context.Context, id string) error {
	if h.NoFreeze != "" {
		return errdefs.New(errdefs.NotImplemented, "pause: %s", h.NoFreeze)
	}
	g, err := h.Group(id)
	if err != nil {
		return err
	}
	return layer.Freeze(ctx, h.freezer(id, g), id)
}

// Resume implements runtime.Pauser.
func (h *Host) Resume(ctx context.Context, id string) error {
	g, err := h.Group(id)
	if err != nil {
		return err
	}
	return h.freezer(id, g).Thaw()
}

// freezer is what pauses sandbox id, whose group is g.
func (h *Host) freezer(id string, g cgroup.Group) layer.Freezer {
	if h.Freezer != nil {
		return h.Freezer(id, g)
	}
	return g
}

// Diff implements runtime.Differ: the layer's upper directory, read by
// package layerdiff.
func (h *Host) Diff(ctx context.Context, id string, users runtime.IDMap, skip map[string][]byte, w io.Writer) (int, error) {
	upper, _ := layer.Dirs(h.SandboxDir(id))
	st, err := layerdiff.Write(w, upper, layerdiff.Options{IDs: layerdiff.IDs{Base: users.HostID, Size: users.Size}, Skip: skip})
	if err != nil {
		return st.Entries, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return st.Entries, nil
}

// WritableLayer implements runtime.Capturer: the overlay's upper directory.
func (h *Host) WritableLayer(id string) (string, error) {
	return layer.Upper(id, h.SandboxDir(id))
}

// Capture implements runtime.Capturer (see layer.Capture), freezing a
// running sandbox with its freezer.
func (h *Host) Capture(ctx context.Context, id string, users runtime.IDMap, skip map[string][]byte, dst string) (runtime.Capture, error) {
	var f layer.Freezer
	g, err := h.Cgroups.Load(id)
	switch {
	case err == nil:
		f = h.freezer(id, g)
	case !errors.Is(err, os.ErrNotExist): // not stopped
		return runtime.Capture{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return layer.Capture(ctx, id, h.SandboxDir(id), users, skip, dst, f, h.NoFreeze)
}

// ClearLayer implements runtime.Archiver: the upper and work directories
// go, and a disk of the sandbox's own with them.
func (h *Host) ClearLayer(ctx context.Context, id string) error {
	if err := layer.Clear(h.SandboxDir(id)); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// RenewLayer implements runtime.Archiver.
func (h *Host) RenewLayer(ctx context.Context, spec runtime.Spec, fill func(dir string) error) error {
	return layer.Renew(ctx, h.SandboxDir(spec.ID), spec, fill)
}

// Dial connects to the unix socket named socket in directory dir (through
// a descriptor of dir, so that a long state dir cannot overflow sun_path)
// and has check judge its peer by the kernel's word (SO_PEERCRED). Every
// failure is unavailable.
func Dial(ctx context.Context, id, dir, socket string, check func(unix.Ucred) error) (net.Conn, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s control channel", id)
	}
	defer unix.Close(fd)
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, socket))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s control channel", id)
	}
	if err := checkPeer(c.(*net.UnixConn), check); err != nil {
		c.Close()
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s control channel", id)
	}
	return c, nil
}

func checkPeer(c *net.UnixConn, check func(unix.Ucred) error) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return credErr
	}
	return check(*cred)
}

// Token is a new random token for a guest.
func Token() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// GuestEnv is the guest's whole environment: nothing of the daemon's enters
// a sandbox. GOMAXPROCS=1: the guest mostly waits on pipes and children,
// and fewer threads make its start cheaper (hardening stops every thread
// once per capability dropped).
func GuestEnv() []string {
	env := []string{"GOMAXPROCS=1"}
	if v := os.Getenv("BERTH_GUEST_DEBUG"); v != "" {
		env = append(env, "BERTH_GUEST_DEBUG="+v)
	}
	return env
}

// Truncate cuts s to n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// CheckSpec refuses what a runtime named name, with caps, cannot realize:
// no root, no user mapping (or root mapped to the host's), idmapped layers
// or a network mode or a disk limit it lacks, each with its reason.
func CheckSpec(name string, caps runtime.Capabilities, spec runtime.Spec) error {
	if len(spec.Root.Layers) == 0 {
		return errdefs.New(errdefs.InvalidArgument, "sandbox %s: the spec has no root file system", spec.ID)
	}
	if spec.Users.Size == 0 || spec.Users.HostID == 0 {
		return errdefs.New(errdefs.InvalidArgument, "sandbox %s: the spec has no user mapping (or maps root to the host's)", spec.ID)
	}
	if spec.Root.IDMapped && !caps.IDMappedLayers {
		return errdefs.New(errdefs.NotImplemented, "sandbox %s: idmapped layers: %s", spec.ID, caps.Missing["idmapped_layers"])
	}
	if !slices.Contains(caps.NetworkModes, spec.Network.Mode) {
		if why := caps.Missing["network_link"]; why != "" && spec.Network.Mode == runtime.NetworkLink {
			return errdefs.New(errdefs.NotImplemented, "sandbox %s: network link: %s", spec.ID, why)
		}
		return errdefs.New(errdefs.InvalidArgument, "sandbox %s: network mode %q: the %s runtime attaches %v", spec.ID, spec.Network.Mode, name, caps.NetworkModes)
	}
	if spec.Limits.DiskBytes > 0 && !caps.Limits.Disk {
		return errdefs.New(errdefs.NotImplemented, "limits.disk_bytes: %s", caps.Missing["disk_bytes"])
	}
	return nil
}

// makeSandbox makes sandbox spec's directory, owned by the daemon, its
// group the sandbox's root, and returns fill, which makes what goes in it:
// a ctl directory of the sandbox's root for the guest's control socket, and
// the writable layer (on a disk of its own with a disk limit) holding the
// spec's files. A runtime may fill it while its guest starts (they do not
// depend on each other until the bootstrap). undo removes all of it, filled
// or not (for a create that fails later); on error nothing is left.
func (h *Host) makeSandbox(spec runtime.Spec) (dir string, fill func(context.Context) error, undo func() error, err error) {
	dir = h.SandboxDir(spec.ID)
	if err := os.Mkdir(dir, 0o710); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", nil, nil, errdefs.New(errdefs.AlreadyExists, "sandbox %q already has a directory", spec.ID)
		}
		return "", nil, nil, fmt.Errorf("make sandbox dir: %w", err)
	}
	undo = func() error {
		uerr := layer.UnmountDisk(dir)
		if uerr != nil {
			uerr = fmt.Errorf("unmount disk: %w", uerr)
		}
		return errors.Join(uerr, os.RemoveAll(dir))
	}
	root := int(spec.Users.HostID)
	if err := os.Chown(dir, 0, root); err != nil {
		return "", nil, nil, errors.Join(fmt.Errorf("chown sandbox dir: %w", err), undo())
	}
	fill = func(ctx context.Context) error {
		if err := layer.MakeDir(filepath.Join(dir, "ctl"), 0o700, root); err != nil {
			return err
		}
		upper, err := layer.Make(ctx, dir, spec.Limits.DiskBytes, root)
		if err != nil {
			return err
		}
		return layer.WriteFiles(upper, spec.Hostname, spec.Files, root)
	}
	return dir, fill, undo, nil
}

// HostLimits are this host's ceilings of one sandbox's CPUs and memory, and
// of its disk from the file system of stateDir, where writable layers live.
// (Open files are each runtime's own.)
func HostLimits(stateDir string) runtime.HostLimits {
	var h runtime.HostLimits
	var cpus unix.CPUSet
	if unix.SchedGetaffinity(0, &cpus) == nil {
		h.CPUs = float64(cpus.Count())
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		h.MemoryBytes = int64(si.Totalram) * int64(si.Unit)
	}
	var st unix.Statfs_t
	if unix.Statfs(stateDir, &st) == nil {
		h.DiskBytes = int64(st.Blocks) * st.Bsize
	}
	return h
}

// ReadyToStart makes stopped sandbox spec's layer usable again (its disk
// mounted after a host reboot) and writes the spec's files into it.
func (h *Host) ReadyToStart(spec runtime.Spec) error {
	upper, err := layer.Ready(spec.ID, h.SandboxDir(spec.ID))
	if err != nil {
		return err
	}
	return layer.WriteFiles(upper, spec.Hostname, spec.Files, int(spec.Users.HostID))
}

// Create makes sandbox spec's directory (makeSandbox) and has boot start
// the sandbox in it; boot calls fill, which fills the directory, before
// its guest needs what is in it. If boot fails, the directory goes (and a
// failure to remove it is logged).
func (h *Host) Create(ctx context.Context, spec runtime.Spec, log *slog.Logger, boot func(dir string, fill func(context.Context) error) (*runtime.Instance, error)) (*runtime.Instance, error) {
	dir, fill, undo, err := h.makeSandbox(spec)
	if err != nil {
		return nil, err
	}
	inst, err := boot(dir, fill)
	if err != nil {
		if uerr := undo(); uerr != nil {
			log.Error("failed create: remove the sandbox's directory", "sandbox", spec.ID, "err", uerr)
		}
		return nil, err
	}
	return inst, nil
}
