// Package files serves the sandbox's filesystem to the daemon: transfers,
// filesystem operations and the agent tools (read, write, edit, glob, grep).
//
// It runs inside the guest, in the sandbox's own mount namespace, so every
// path resolves inside the sandbox by construction. On top of that, every
// lookup goes through openat2 with RESOLVE_IN_ROOT and RESOLVE_NO_MAGICLINKS
// relative to a root descriptor: the /proc magic links (/proc/1/fd/2,
// /proc/self/root, /proc/*/exe) are refused, because through them the guest
// could reach the descriptors it holds to the host. Objects on procfs are
// refused too (the guest's own /proc/1/mem is not for file tools), and walks
// never follow symlinks.
//
// An operation acts as a user of the sandbox: it runs on a locked OS thread
// whose filesystem uid, gid and groups are that user's (setfsuid is per
// thread), so the kernel checks permissions and new files belong to that
// user, as if a process of theirs had done it.
package files

import (
	"errors"
	"fmt"
	"os"
	"path"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest/proc"
)

// Service serves one root directory ("/" in a sandbox; a temporary
// directory in tests).
type Service struct {
	root   *os.File // O_PATH descriptor of the root
	lookup func(spec string) (proc.Account, error)
}

// New opens root.
func New(root string) (*Service, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open file root %s: %w", root, err)
	}
	return &Service{root: os.NewFile(uintptr(fd), root), lookup: proc.LookupAccount}, nil
}

// Close releases the root descriptor.
func (s *Service) Close() error { return s.root.Close() }

func (s *Service) rootFD() int { return int(s.root.Fd()) }

// caller is the account and working directory of one request.
type caller struct {
	acc proc.Account
	cwd string
}

func (s *Service) caller(w guestapi.Where) (caller, error) {
	acc, err := s.lookup(w.User)
	if err != nil {
		return caller{}, err
	}
	cwd := w.Cwd
	if cwd == "" {
		cwd = acc.Home
	}
	if cwd == "" || !path.IsAbs(cwd) {
		cwd = "/"
	}
	return caller{acc: acc, cwd: cwd}, nil
}

// abs checks a user's path and makes it absolute and clean.
func (c caller) abs(field, p string) (string, error) {
	if p == "" {
		return "", invalidPath(field, p, "is empty")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", invalidPath(field, p, "contains a NUL byte")
	}
	if len(p) > guestapi.MaxPathLen {
		return "", invalidPath(field, p[:64]+"…", fmt.Sprintf("is longer than %d bytes", guestapi.MaxPathLen))
	}
	if !path.IsAbs(p) {
		p = path.Join(c.cwd, p)
	}
	return path.Clean(p), nil
}

func invalidPath(field, p, why string) error {
	return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: %q %s", field, p, why), errdefs.InvalidPath)
}

// as runs fn on an OS thread that acts as acc. If the thread cannot be set
// back to the guest's identity afterwards it stays locked and dies with the
// goroutine, so no other goroutine ever runs with a borrowed identity.
func as(acc proc.Account, fn func() error) error {
	if acc.Self || (acc.UID == 0 && acc.GID == 0 && len(acc.Groups) == 0) {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := become(acc.UID, acc.GID, acc.Groups)
		if err == nil {
			err = fn()
		}
		if become(0, 0, []uint32{}) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// become sets the calling thread's supplementary groups, fsgid and fsuid.
// The raw syscalls change one thread only (libc and Go's syscall package
// would change every thread).
func become(uid, gid uint32, groups []uint32) error {
	var ptr uintptr
	if len(groups) > 0 {
		ptr = uintptr(unsafe.Pointer(&groups[0]))
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), ptr, 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(gid), 0, 0); e == unix.ENOSYS {
		return becomeEffective(uid, gid)
	}
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
	// Both return the previous value; asking again with the same value
	// tells whether the change took.
	g, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(gid), 0, 0)
	u, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
	if uint32(g) != gid || uint32(u) != uid {
		return fmt.Errorf("set filesystem identity to %d:%d: refused", uid, gid)
	}
	return nil
}

// becomeEffective is become where the kernel has no setfsuid (gVisor):
// the thread's effective ids, which the filesystem ids follow. The saved
// ids stay 0, so the thread can become root again; a non-zero effective
// uid clears its effective capabilities meanwhile, as acting as that user
// should. The group goes first: once the uid is not 0, it could not.
func becomeEffective(uid, gid uint32) error {
	const keep = ^uintptr(0) // -1: leave this id as it is
	if uid == 0 {            // back to root: the uid first, for the right to set the gid
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
			return fmt.Errorf("set effective uid 0: %w", e)
		}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
		return fmt.Errorf("set effective gid %d: %w", gid, e)
	}
	if uid != 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
			return fmt.Errorf("set effective uid %d: %w", uid, e)
		}
	}
	return nil
}

// resolve is the openat2 resolution every lookup uses.
const resolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// openat2 opens p (absolute inside the root, or relative to dir) with flags.
func (s *Service) openat2(dir int, p string, flags int, mode uint32) (int, error) {
	if dir < 0 {
		dir = s.rootFD()
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve}
	for {
		fd, err := unix.Openat2(dir, p, &how)
		if err != unix.EINTR && err != unix.EAGAIN {
			return fd, err
		}
	}
}

// open opens an existing path for fn's use and refuses procfs objects.
func (s *Service) open(p string, flags int) (*os.File, error) {
	fd, err := s.openat2(-1, p, flags, 0)
	if err != nil {
		return nil, pathError(p, err)
	}
	if err := notProc(fd, p); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

// notProc refuses objects on procfs and sysfs.
func notProc(fd int, p string) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return pathError(p, err)
	}
	if st.Type == unix.PROC_SUPER_MAGIC || st.Type == unix.SYSFS_MAGIC {
		return errdefs.WithReason(errdefs.New(errdefs.PermissionDenied,
			"%s: berth's file operations do not touch /proc or /sys; use exec", p), errdefs.InvalidPath)
	}
	return nil
}

// parent opens the directory that holds p and returns it with p's last
// element. The root itself has no parent.
func (s *Service) parent(p string) (*os.File, string, error) {
	dir, name := path.Split(p)
	if name == "" || name == "." || name == ".." {
		return nil, "", errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: not allowed on the root directory", p), errdefs.InvalidPath)
	}
	d, err := s.open(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil, "", err
	}
	return d, name, nil
}

// mkdirAll makes p and its missing parents with mode, like mkdir -p.
func (s *Service) mkdirAll(p string, mode uint32) error {
	_, err := s.mkdirAllMade(p, mode)
	return err
}

// mkdirAllMade is mkdirAll that also says the topmost directory it made
// ("" when p existed), for a caller that undoes it on a later failure.
func (s *Service) mkdirAllMade(p string, mode uint32) (made string, err error) {
	if fd, err := s.openat2(-1, p, unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		unix.Close(fd)
		return "", nil
	}
	cur := "/"
	for _, name := range strings.Split(strings.Trim(p, "/"), "/") {
		next := path.Join(cur, name)
		fd, err := s.openat2(-1, next, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == nil {
			unix.Close(fd)
			cur = next
			continue
		}
		if err != unix.ENOENT {
			return made, pathError(next, err)
		}
		d, err := s.open(cur, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return made, err
		}
		err = unix.Mkdirat(int(d.Fd()), name, mode)
		if err == nil {
			if made == "" {
				made = next
			}
			err = unix.Fchmodat(int(d.Fd()), name, mode, 0) // umask-free
		}
		d.Close()
		if err != nil && err != unix.EEXIST {
			return made, pathError(next, err)
		}
		cur = next
	}
	return made, nil
}

// unmake removes the empty directories from p up to made (what mkdirAllMade
// made), deepest first; one that is not empty (something else wrote there
// meanwhile) stops it.
func (s *Service) unmake(p, made string) {
	for made != "" && (p == made || strings.HasPrefix(p, made+"/")) {
		d, name, err := s.parent(p)
		if err != nil {
			return
		}
		err = unix.Unlinkat(int(d.Fd()), name, unix.AT_REMOVEDIR)
		d.Close()
		if err != nil || p == made {
			return
		}
		p = path.Dir(p)
	}
}

// pathError classifies a failed system call on p.
func pathError(p string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s: %w", p, err)
	}
	switch errno {
	case unix.ENOENT:
		return errdefs.New(errdefs.NotFound, "%s: no such file or directory", p)
	case unix.EACCES, unix.EPERM:
		return errdefs.New(errdefs.PermissionDenied, "%s: permission denied", p)
	case unix.EROFS:
		return errdefs.New(errdefs.PermissionDenied, "%s: read-only file system", p)
	case unix.EISDIR:
		return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: is a directory", p), errdefs.IsDirectory)
	case unix.ENOTDIR:
		return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: not a directory", p), errdefs.NotDirectory)
	case unix.EEXIST:
		return errdefs.New(errdefs.AlreadyExists, "%s: already exists", p)
	case unix.ENOTEMPTY:
		return errdefs.New(errdefs.Conflict, "%s: directory not empty", p)
	case unix.ENOSPC, unix.EDQUOT:
		return errdefs.WithReason(errdefs.New(errdefs.ResourceExhausted, "%s: no space left on the sandbox's disk", p), errdefs.NoSpace)
	case unix.EFBIG:
		return errdefs.New(errdefs.ResourceExhausted, "%s: file too large", p)
	case unix.ELOOP:
		return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument,
			"%s: too many symlinks, or a /proc magic link (refused)", p), errdefs.InvalidPath)
	case unix.EXDEV:
		return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: crosses a mount point", p), errdefs.InvalidPath)
	case unix.ENAMETOOLONG:
		return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: name too long", p), errdefs.InvalidPath)
	case unix.ENXIO, unix.ENODEV:
		return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: not a regular file", p), errdefs.NotRegularFile)
	case unix.EINVAL:
		return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: invalid for this file", p), errdefs.InvalidPath)
	case unix.EBUSY:
		return errdefs.New(errdefs.Conflict, "%s: busy (a mount point?)", p)
	}
	return fmt.Errorf("%s: %w", p, err)
}

func notRegular(p string) error {
	return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: not a regular file", p), errdefs.NotRegularFile)
}

func isDir(p string) error {
	return errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "%s: is a directory", p), errdefs.IsDirectory)
}

// fileType names a mode's type.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return guestapi.TypeDir
	case unix.S_IFLNK:
		return guestapi.TypeSymlink
	case unix.S_IFIFO:
		return guestapi.TypeFIFO
	case unix.S_IFSOCK:
		return guestapi.TypeSocket
	case unix.S_IFCHR:
		return guestapi.TypeCharDevice
	case unix.S_IFBLK:
		return guestapi.TypeBlockDevice
	}
	return guestapi.TypeFile
}
