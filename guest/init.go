// Package guest is berth's agent inside a sandbox: it runs as the sandbox's
// init, builds its root filesystem, hardens itself, and serves the guest
// protocol (api/guestapi) to the daemon. It never imports daemon code.
package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/guest/files"
	"github.com/berthsh/berth/guest/proc"
	"github.com/berthsh/berth/internal/fds"
	"github.com/berthsh/berth/seccomp"
)

// File descriptors the runtime passes to the guest.
const (
	configFD = 3 // InitConfig JSON, then EOF
	statusFD = 4 // the guest writes StatusReady or an error JSON line
)

// stage is where the new root is assembled, on a private tmpfs in the guest's
// own mount namespace.
const stage = "/tmp"

// Main is the guest's entry point as the sandbox's init. It returns only on failure.
func Main(ctx context.Context, log *slog.Logger) error {
	// Nothing the runtime handed us beyond stdio may reach the workload; the
	// config and status pipes are closed below once used.
	if err := fds.CloseOnExecFrom(3); err != nil {
		return fmt.Errorf("mark descriptors close-on-exec: %w", err)
	}
	status := os.NewFile(statusFD, "status")
	cfgFile := os.NewFile(configFD, "config")
	var cfg guestapi.InitConfig
	err := json.NewDecoder(io.LimitReader(cfgFile, 1<<20)).Decode(&cfg)
	cfgFile.Close()
	if err != nil {
		return reportFailure(status, fmt.Errorf("read init config: %w", err))
	}
	t0 := time.Now()
	ln, err := setup(cfg, log)
	if err != nil {
		return reportFailure(status, err)
	}
	table := proc.NewTable(log, proc.Defaults{Hostname: cfg.Hostname})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reaped := make(chan error, 1)
	go func() { reaped <- table.Run(ctx) }()

	if _, err := status.WriteString(guestapi.StatusReady + "\n"); err != nil {
		return fmt.Errorf("report ready: %w", err)
	}
	status.Close()
	log.Info("guest ready", "id", cfg.ID, "setup", time.Since(t0))
	// Off the create's critical path; new threads inherit the seccomp filter
	// and the reduced capabilities of the thread that clones them.
	go reserveThreads(threadReserve)
	fs, err := files.New("/")
	if err != nil {
		return err
	}
	defer fs.Close()
	err = Serve(ctx, ln, cfg.Token, table, fs, log)
	cancel()
	table.Close()
	<-reaped
	return err
}

// threadReserve is how many idle OS threads the guest keeps for later.
const threadReserve = 8

// reserveThreads makes the Go runtime create n OS threads now and keep them
// idle. The guest's threads count against the sandbox's pids limit, and the
// runtime aborts the process when it cannot create a thread it needs: under
// a fork bomb at the limit, a guest that needed a new thread would die with
// its sandbox. With a reserve it reuses idle threads instead. (Locking n
// goroutines at once forces n threads; unlocking parks them, not frees them.)
func reserveThreads(n int) {
	var locked, release sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	for range n {
		go func() {
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	release.Done()
}

func reportFailure(status *os.File, err error) error {
	b, _ := json.Marshal(guestapi.Error{Class: "internal", Message: err.Error()})
	status.Write(append(b, '\n'))
	status.Close()
	return err
}

// setup builds the sandbox: control socket, root filesystem, pivot, hostname,
// loopback, and finally drops privileges. It returns the control listener.
func setup(cfg guestapi.InitConfig, log *slog.Logger) (net.Listener, error) {
	t := time.Now()
	lap := func(phase string) {
		log.Debug("setup", "phase", phase, "took", time.Since(t))
		t = time.Now()
	}
	// The control socket is bound at a host path, before the pivot makes that
	// path unreachable. Only the daemon (host root) can connect to it.
	// It is bound through a descriptor of its directory so that a long state
	// dir cannot overflow sun_path.
	ctl, err := unix.Open(cfg.ControlDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open control dir: %w", err)
	}
	defer unix.Close(ctl)
	sock := fmt.Sprintf("/proc/self/fd/%d/%s", ctl, guestapi.ControlSocketName)
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on control socket: %w", err)
	}
	// Go would unlink the path on Close; it is not ours to unlink once pivoted.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	// Layers are opened now, from inside our mount namespace, so that the
	// staging tmpfs below cannot hide them.
	layers := map[string]string{"lower": cfg.ImageDir, "upper": cfg.UpperDir, "work": cfg.WorkDir}
	fds := map[string]int{}
	for name, dir := range layers {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s layer %s: %w", name, dir, err)
		}
		defer unix.Close(fd)
		fds[name] = fd
	}
	lap("listen+open")
	if err := buildRoot(cfg, fds); err != nil {
		return nil, err
	}
	lap("root")
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return nil, fmt.Errorf("sethostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return nil, err
	}
	// The guest holds the control listener: nothing inside may read its memory
	// or descriptors (ptrace and /proc/1/fd need it dumpable).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("set not dumpable: %w", err)
	}
	lap("identity")
	if err := capability.Restrict(capability.Default()); err != nil {
		return nil, fmt.Errorf("drop capabilities: %w", err)
	}
	if cfg.Seccomp {
		prog, err := seccomp.Default().Assemble()
		if err != nil {
			return nil, fmt.Errorf("assemble seccomp profile: %w", err)
		}
		if err := seccomp.Install(prog); err != nil {
			return nil, fmt.Errorf("install seccomp profile: %w", err)
		}
	}
	lap("harden")
	return ln, nil
}

// buildRoot assembles the root on the staging tmpfs and pivots into it.
func buildRoot(cfg guestapi.InitConfig, fds map[string]int) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size=64k"); err != nil {
		return fmt.Errorf("mount staging tmpfs: %w", err)
	}
	root := filepath.Join(stage, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return fmt.Errorf("make staging root: %w", err)
	}
	opts := fmt.Sprintf("lowerdir=/proc/self/fd/%d,upperdir=/proc/self/fd/%d,workdir=/proc/self/fd/%d,userxattr",
		fds["lower"], fds["upper"], fds["work"])
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount root overlay: %w", err)
	}
	for _, src := range cfg.ReadOnlyBinds {
		if err := bindReadOnly(src, filepath.Join(root, src)); err != nil {
			return err
		}
	}
	if err := mountProcDevSys(root); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root under the new one; detaching
	// it leaves no path back to the host.
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir to new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	return nil
}

// bindReadOnly binds a host directory read-only, keeping the flags the kernel
// locks on mounts inherited from a more privileged namespace.
func bindReadOnly(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("make bind target %s: %w", dst, err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dst, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	for _, f := range []struct{ st, ms uintptr }{
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if uintptr(st.Flags)&f.st != 0 {
			flags |= f.ms
		}
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", dst, err)
	}
	return nil
}

// devices are the host device nodes bound into the sandbox's /dev (a user
// namespace cannot mknod).
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

func mountProcDevSys(root string) error {
	p := func(rel string) string { return filepath.Join(root, rel) }
	for _, d := range []string{"proc", "dev", "sys"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			return fmt.Errorf("make /%s: %w", d, err)
		}
	}
	if err := unix.Mount("proc", p("proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := unix.Mount("tmpfs", p("dev"), "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range devices {
		dst := p("dev/" + d)
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o666)
		if err != nil {
			return fmt.Errorf("make /dev/%s: %w", d, err)
		}
		f.Close()
		if err := unix.Mount("/dev/"+d, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	for _, d := range []string{"pts", "shm", "mqueue"} {
		if err := os.Mkdir(p("dev/"+d), 0o755); err != nil {
			return fmt.Errorf("make /dev/%s: %w", d, err)
		}
	}
	if err := unix.Mount("devpts", p("dev/pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mount("shm", p("dev/shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=64m"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	if err := unix.Mount("mqueue", p("dev/mqueue"), "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /dev/mqueue: %w", err)
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, p("dev/"+name)); err != nil {
			return fmt.Errorf("link /dev/%s: %w", name, err)
		}
	}
	if err := unix.Mount("", p("dev"), "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make /dev read-only: %w", err)
	}
	// sysfs needs a network namespace owned by our user namespace, which we have.
	if err := unix.Mount("sysfs", p("sys"), "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	return maskPaths(root)
}

// maskedPaths are hidden inside a sandbox: kernel memory, keys, timers and
// firmware that say much about the host and other tenants, or reach it.
var maskedPaths = []string{
	"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats",
	"/proc/kallsyms", "/proc/kpagecount", "/proc/kpageflags", "/proc/kpagecgroup", "/proc/sysrq-trigger",
	"/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware", "/sys/kernel/debug", "/sys/kernel/security",
	"/sys/devices/virtual/powercap",
}

// readOnlyPaths stay visible but cannot be written, even by root inside.
var readOnlyPaths = []string{"/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"}

// maskPaths hides maskedPaths (files under /dev/null, directories under an
// empty read-only tmpfs) and makes readOnlyPaths read-only.
func maskPaths(root string) error {
	for _, m := range maskedPaths {
		dst := filepath.Join(root, m)
		fi, err := os.Lstat(dst)
		if err != nil {
			continue // not on this kernel
		}
		if fi.IsDir() {
			err = unix.Mount("tmpfs", dst, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=0555")
		} else {
			err = unix.Mount("/dev/null", dst, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", m, err)
		}
	}
	for _, ro := range readOnlyPaths {
		dst := filepath.Join(root, ro)
		if _, err := os.Lstat(dst); err != nil {
			continue
		}
		if err := unix.Mount(dst, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", ro, err)
		}
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", ro, err)
		}
	}
	return nil
}

// loopbackUp brings up lo, the only interface of a sandbox without a network.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}
