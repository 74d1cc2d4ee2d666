package layer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/errdefs"
)

// A sandbox with a disk limit keeps its writable layer on a file system of
// its own: an ext4 image (sparse, so it takes only what is written) attached
// to a loop device and mounted at <sandbox>/disk. A full layer is ENOSPC
// inside the sandbox; the host's disk is never filled past the limit.
// Without a limit the layer lives in the sandbox directory itself.
const (
	diskImage = "disk.img"
	diskMount = "disk"
)

// DiskRoot is the mount point of sandbox directory dir's disk, when it has
// one: the file system that holds upper and work (named DiskUpper and
// DiskWork in it).
func DiskRoot(dir string) (string, bool) {
	if _, err := os.Stat(filepath.Join(dir, diskImage)); err != nil {
		return "", false
	}
	return filepath.Join(dir, diskMount), true
}

// DiskUpper and DiskWork are the upper and work directories in a disk.
const (
	DiskUpper = "upper"
	DiskWork  = "work"
)

// Dirs returns the overlay upper and work directories of a sandbox.
func Dirs(dir string) (upper, work string) {
	if disk, ok := DiskRoot(dir); ok {
		dir = disk
	}
	return filepath.Join(dir, DiskUpper), filepath.Join(dir, DiskWork)
}

// DiskSupport says why this host cannot give sandboxes disks of their own,
// or "" when it can: that takes mkfs.ext4 and loop devices.
func DiskSupport() string {
	if _, err := os.Stat(tool("mkfs.ext4")); err != nil {
		return "needs mkfs.ext4 (Debian package e2fsprogs) on the host"
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "needs loop devices (/dev/loop-control: " + err.Error() + ")"
	}
	return ""
}

// makeDisk creates and mounts a sandbox's disk of size bytes, its root
// owned by owner (root inside the sandbox).
func makeDisk(ctx context.Context, dir string, size int64, owner int) error {
	img := filepath.Join(dir, diskImage)
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("size disk image: %w", err)
	}
	// No journal (a sandbox's layer is disposable), lazy initialisation
	// (creation in milliseconds), no reserved blocks, no discard pass.
	mkfs := exec.CommandContext(ctx, tool("mkfs.ext4"), "-q", "-F", "-O", "^has_journal", "-m", "0",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner="+strconv.Itoa(owner)+":"+strconv.Itoa(owner), img)
	if out, err := mkfs.CombinedOutput(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return errdefs.New(errdefs.NotImplemented, "limits.disk_bytes: needs mkfs.ext4 (Debian package e2fsprogs) on the host")
		}
		return fmt.Errorf("mkfs.ext4: %w: %s", err, bytes.TrimSpace(out))
	}
	return MountDisk(dir)
}

// MountDisk attaches a sandbox's disk image to a free loop device and mounts
// it, unless it is mounted already (a daemon restart); after a host reboot
// it mounts it again. The loop device clears itself when unmounted.
func MountDisk(dir string) error {
	mnt := filepath.Join(dir, diskMount)
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make disk mount point: %w", err)
	}
	if mounted(dir, mnt) {
		return nil
	}
	img, err := os.OpenFile(filepath.Join(dir, diskImage), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open disk image: %w", err)
	}
	defer img.Close()
	loop, err := attachLoop(img)
	if err != nil {
		return err
	}
	defer loop.Close()
	if err := unix.Mount(loop.Name(), mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mount disk %s: %w", loop.Name(), err)
	}
	return nil
}

// mounted reports whether mnt is a mount point (its device differs from dir's).
func mounted(dir, mnt string) bool {
	var a, b unix.Stat_t
	return unix.Stat(dir, &a) == nil && unix.Stat(mnt, &b) == nil && a.Dev != b.Dev
}

// attachLoop binds img to a free loop device with autoclear.
func attachLoop(img *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.NotImplemented, err, "limits.disk_bytes: needs loop devices")
	}
	defer ctl.Close()
	for range 16 { // another process may take the device we were offered
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open loop device: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if err != unix.EBUSY {
			return nil, fmt.Errorf("attach loop device: %w", err)
		}
	}
	return nil, fmt.Errorf("attach loop device: every free device was taken meanwhile")
}

// UnmountDisk unmounts a sandbox's disk if it has one mounted (the loop
// device then detaches itself).
func UnmountDisk(dir string) error {
	mnt := filepath.Join(dir, diskMount)
	if !mounted(dir, mnt) {
		return nil
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount disk: %w", err)
		}
	}
	return nil
}

// DiskFull says whether a sandbox's disk (if it has one) is full: less than
// 1 MiB or 1% of it left (a write that failed with ENOSPC leaves a few
// blocks too small for it).
func DiskFull(dir string) bool {
	mnt := filepath.Join(dir, diskMount)
	if !mounted(dir, mnt) {
		return false
	}
	var st unix.Statfs_t
	if unix.Statfs(mnt, &st) != nil {
		return false
	}
	free := st.Bavail * uint64(st.Bsize)
	return free < 1<<20 || st.Bavail < st.Blocks/100
}

// GrowDisk enlarges a mounted disk to size bytes: the image, then the loop
// device's capacity, then the file system (ext4 grows online).
func GrowDisk(ctx context.Context, dir string, size int64) error {
	img := filepath.Join(dir, diskImage)
	st, err := os.Stat(img)
	if err != nil {
		return errdefs.New(errdefs.InvalidArgument, "limits.disk_bytes: the sandbox was created without a disk limit; one cannot be added later")
	}
	if size < st.Size() {
		return errdefs.New(errdefs.InvalidArgument, "limits.disk_bytes: %d is outside %d..(host) (a disk only grows)", size, st.Size())
	}
	if size == st.Size() {
		return nil
	}
	// ext4 grows online only for CAP_SYS_RESOURCE (some hosts, like nested
	// VMs, withhold it even from root): refuse before changing anything.
	if ok, err := capability.Effective(unix.CAP_SYS_RESOURCE); err != nil || !ok {
		return errdefs.New(errdefs.NotImplemented, "limits.disk_bytes: growing a running sandbox's disk needs CAP_SYS_RESOURCE, which this daemon lacks")
	}
	dev, err := loopOf(img)
	if err != nil {
		return err
	}
	if err := os.Truncate(img, size); err != nil {
		return fmt.Errorf("grow disk image: %w", err)
	}
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	_, err = unix.IoctlRetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY)
	f.Close()
	if err != nil {
		return fmt.Errorf("grow %s: %w", dev, err)
	}
	if out, err := exec.CommandContext(ctx, tool("resize2fs"), dev).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// tool finds an e2fsprogs program: on PATH, else in the sbin directories
// a daemon's PATH may lack.
func tool(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(dir, name); exists(p) {
			return p
		}
	}
	return name
}

// loopOf finds the loop device backed by img.
func loopOf(img string) (string, error) {
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range devs {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == img {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p))), nil
		}
	}
	return "", fmt.Errorf("no loop device holds %s", img)
}
