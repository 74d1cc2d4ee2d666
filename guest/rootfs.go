package guest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
)

// stage is where the new root is assembled, on a private tmpfs in the guest's
// own mount namespace.
const stage = "/tmp"

// assembleRoot mounts root's layers as an overlay on the staging tmpfs
// (mountRoot), binds its mounts and the kernel file systems, and pivots
// into it.
func assembleRoot(root guestapi.Root, passed []int) error {
	dir, err := mountRoot(root, passed)
	if err != nil {
		return err
	}
	rootFD, err := openDir("new root", dir)
	if err != nil {
		return err
	}
	defer unix.Close(rootFD)
	for _, m := range root.Mounts {
		if err := bindMount(rootFD, m); err != nil {
			return err
		}
	}
	if err := mountProcDevSys(rootFD, dir); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root under the new one; detaching
	// it leaves no path back to the host.
	if err := unix.Chdir(dir); err != nil {
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

// mountRoot makes mounts private, mounts the staging tmpfs and on it the
// overlay of root's layers, and returns the overlay's directory. Layers
// given as paths are opened first, before the staging tmpfs can hide them,
// and mounted through those descriptors; passed layers (mounts the runtime
// idmapped) are moved onto the staging tmpfs, as the overlay takes only
// paths.
func mountRoot(root guestapi.Root, passed []int) (string, error) {
	if len(root.Layers) == 0 || root.Upper == "" || root.Work == "" {
		return "", fmt.Errorf("root: needs layers, an upper and a work directory")
	}
	var fds []int
	defer func() { closeAll(fds) }()
	lower := make([]string, len(root.Layers))
	moved := map[int]int{} // index in lower -> passed mount
	for i, l := range root.Layers {
		if n, ok := guestapi.ParsePassedLayer(l); ok {
			if n < 0 || n >= len(passed) {
				return "", fmt.Errorf("root: layer %q: %d mounts were passed", l, len(passed))
			}
			moved[i] = passed[n]
			continue
		}
		fd, err := openDir("layer", l)
		if err != nil {
			return "", err
		}
		fds = append(fds, fd)
		lower[i] = fdPath(fd)
	}
	writable := -1 // the passed mount holding upper and work, if any
	if root.Writable != "" {
		n, ok := guestapi.ParsePassedLayer(root.Writable)
		if !ok || n < 0 || n >= len(passed) {
			return "", fmt.Errorf("root: writable %q: %d mounts were passed", root.Writable, len(passed))
		}
		if !filepath.IsLocal(root.Upper) || !filepath.IsLocal(root.Work) {
			return "", fmt.Errorf("root: upper %q and work %q must be names within the writable mount", root.Upper, root.Work)
		}
		writable = passed[n]
	}
	openWritable := func() (upper, work int, err error) {
		if upper, err = openDir("upper layer", root.Upper); err != nil {
			return -1, -1, err
		}
		fds = append(fds, upper)
		if work, err = openDir("work dir", root.Work); err != nil {
			return -1, -1, err
		}
		fds = append(fds, work)
		return upper, work, nil
	}
	var (
		upper, work int
		err         error
	)
	if writable < 0 {
		if upper, work, err = openWritable(); err != nil {
			return "", err
		}
	}

	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return "", fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size=64k"); err != nil {
		return "", fmt.Errorf("mount staging tmpfs: %w", err)
	}
	if writable >= 0 {
		// Upper and work are names within it (local, checked above); the
		// sandbox never sees the mount's root, only upper's contents.
		p := filepath.Join(stage, "writable")
		if err := os.Mkdir(p, 0o700); err != nil {
			return "", fmt.Errorf("make staging writable: %w", err)
		}
		if err := unix.MoveMount(writable, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return "", fmt.Errorf("move passed writable mount into place: %w", err)
		}
		root.Upper, root.Work = filepath.Join(p, root.Upper), filepath.Join(p, root.Work)
		if upper, work, err = openWritable(); err != nil {
			return "", err
		}
	}
	for i, fd := range moved {
		p := filepath.Join(stage, "layer"+strconv.Itoa(i))
		if err := os.Mkdir(p, 0o700); err != nil {
			return "", fmt.Errorf("make staging layer: %w", err)
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return "", fmt.Errorf("move passed layer %d into place: %w", i, err)
		}
		lower[i] = p
	}
	dir := filepath.Join(stage, "root")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("make staging root: %w", err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,userxattr",
		strings.Join(lower, ":"), fdPath(upper), fdPath(work))
	if err := unix.Mount("overlay", dir, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("mount root overlay: %w", err)
	}
	return dir, nil
}

func openDir(what, dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s %s: %w", what, dir, err)
	}
	return fd, nil
}

// mountPoint opens directory target of the new root (made if missing) with
// every lookup confined to it: a layer's symlink (an image's /usr pointing
// at "../../..") cannot send a mount outside the sandbox's root.
func mountPoint(rootFD int, target string, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | resolve}
	rel := strings.Trim(filepath.Clean("/"+target), "/")
	if rel == "" {
		return 0, fmt.Errorf("mount target %q: the root itself", target)
	}
	dir, err := unix.Dup(rootFD)
	if err != nil {
		return 0, err
	}
	for _, name := range strings.Split(rel, "/") {
		fd, err := unix.Openat2(dir, name, &how)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(dir, name, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				fd, err = unix.Openat2(dir, name, &how)
			}
		}
		unix.Close(dir)
		if err != nil {
			return 0, fmt.Errorf("mount target %s: %w", target, err)
		}
		dir = fd
	}
	return dir, nil
}

// bindMount binds m.Source at m.Target of the new root; read-only mounts
// keep the flags the kernel locks on mounts from a more privileged namespace.
func bindMount(rootFD int, m guestapi.Mount) error {
	fd, err := mountPoint(rootFD, m.Target, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount(m.Source, fdPath(fd), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", m.Source, m.Target, err)
	}
	if !m.ReadOnly {
		return nil
	}
	// fd is the directory under the new mount; the remount needs the mount.
	top, err := mountPoint(rootFD, m.Target, 0)
	if err != nil {
		return err
	}
	defer unix.Close(top)
	return remountReadOnly(fdPath(top), m.Target)
}

// remountReadOnly makes the bind mount at dst read-only.
func remountReadOnly(dst, name string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", name, err)
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
		return fmt.Errorf("make %s read-only: %w", name, err)
	}
	return nil
}

// devices are the host device nodes bound into the sandbox's /dev (a user
// namespace cannot mknod).
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// mountProcDevSys mounts /proc, a minimal /dev and a read-only /sys in the
// new root at dir. Their mount points must be real directories (or absent):
// the paths below them are used as they are, so a symlinked /proc in an
// image is refused rather than followed.
func mountProcDevSys(rootFD int, dir string) error {
	mountAt := func(target, source, fstype string, flags uintptr, data string) error {
		fd, err := mountPoint(rootFD, target, unix.RESOLVE_NO_SYMLINKS)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Mount(source, fdPath(fd), fstype, flags, data); err != nil {
			return fmt.Errorf("mount /%s: %w", target, err)
		}
		return nil
	}
	if err := mountAt("proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := mountAt("dev", "tmpfs", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return err
	}
	// From here on /dev is our own tmpfs: paths below it are ours.
	p := func(rel string) string { return filepath.Join(dir, rel) }
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
	if err := mountAt("sys", "sysfs", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	return maskPaths(dir)
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
// empty read-only tmpfs) and makes readOnlyPaths read-only. The directories
// share one tmpfs, mounted on the first and bound onto the others: a bind
// is half the cost of a new file system, at the mount and at the
// sandbox's end.
func maskPaths(root string) error {
	empty := "" // the masked directory the empty tmpfs is mounted on
	for _, m := range maskedPaths {
		dst := filepath.Join(root, m)
		fi, err := os.Lstat(dst)
		if err != nil {
			continue // not on this kernel
		}
		switch {
		case fi.IsDir() && empty == "":
			err = unix.Mount("tmpfs", dst, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=0555")
			empty = dst
		case fi.IsDir():
			// A bind keeps its source's flags, and the file system itself
			// is read-only.
			err = unix.Mount(empty, dst, "", unix.MS_BIND, "")
		default:
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
	// Up already where the runtime made the network (gVisor, which has no
	// SIOCGIFFLAGS for it).
	if lo, err := net.InterfaceByName("lo"); err == nil && lo.Flags&net.FlagUp != 0 {
		return nil
	}
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
