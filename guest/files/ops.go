package files

import (
	"context"
	"os"
	"path"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest/proc"
)

// namer turns uids and gids into names, reading the account files once.
type namer struct {
	users, groups map[uint32]string
}

func (n *namer) info(p string, st *unix.Stat_t) guestapi.FileInfo {
	if n.users == nil {
		n.users, n.groups = proc.Names()
	}
	name := path.Base(p)
	return guestapi.FileInfo{
		Path: p, Name: name, Type: fileType(st.Mode), Size: st.Size,
		Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid,
		Owner: n.users[st.Uid], Group: n.groups[st.Gid],
		ModifiedAt: time.Unix(st.Mtim.Unix()).UTC(),
	}
}

// statAt describes name in dir (no following), with a symlink's target.
func (n *namer) statAt(dir int, name, p string) (guestapi.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return guestapi.FileInfo{}, pathError(p, err)
	}
	fi := n.info(p, &st)
	if fi.Type == guestapi.TypeSymlink {
		buf := make([]byte, guestapi.MaxPathLen)
		if k, err := unix.Readlinkat(dir, name, buf); err == nil {
			fi.Target = string(buf[:k])
		}
	}
	return fi, nil
}

// stat describes p, following a final symlink unless noFollow.
func (s *Service) stat(p string, noFollow bool, n *namer) (guestapi.FileInfo, error) {
	if p != "/" && noFollow {
		d, name, err := s.parent(p)
		if err != nil {
			return guestapi.FileInfo{}, err
		}
		defer d.Close()
		return n.statAt(int(d.Fd()), name, p)
	}
	f, err := s.open(p, unix.O_PATH)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return guestapi.FileInfo{}, pathError(p, err)
	}
	return n.info(p, &st), nil
}

// Stat describes a path.
func (s *Service) Stat(req guestapi.StatRequest) (guestapi.FileInfo, error) {
	c, err := s.caller(req.Where)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	p, err := c.abs("path", req.Path)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	var fi guestapi.FileInfo
	err = as(c.acc, func() (err error) {
		fi, err = s.stat(p, req.NoFollow, &namer{})
		return err
	})
	return fi, err
}

// Exists says whether a path exists (a dangling symlink does, with NoFollow).
func (s *Service) Exists(req guestapi.StatRequest) (guestapi.ExistsResult, error) {
	fi, err := s.Stat(req)
	switch {
	case err == nil:
		return guestapi.ExistsResult{Exists: true, Type: fi.Type}, nil
	case errdefs.IsNotFound(err):
		return guestapi.ExistsResult{}, nil
	}
	return guestapi.ExistsResult{}, err
}

// List lists a directory to a depth, without following symlinks below it.
func (s *Service) List(ctx context.Context, req guestapi.ListRequest) (guestapi.ListResult, error) {
	c, err := s.caller(req.Where)
	if err != nil {
		return guestapi.ListResult{}, err
	}
	p, err := c.abs("path", req.Path)
	if err != nil {
		return guestapi.ListResult{}, err
	}
	depth, limit := req.Depth, req.Limit
	if depth == 0 {
		depth = 1
	}
	if depth < 1 || depth > 32 {
		return guestapi.ListResult{}, errdefs.New(errdefs.InvalidArgument, "depth: %d is outside 1..32", req.Depth)
	}
	if limit <= 0 || limit > guestapi.MaxGlobResults {
		limit = guestapi.MaxGlobResults
	}
	out := guestapi.ListResult{Entries: []guestapi.FileInfo{}}
	err = as(c.acc, func() error {
		d, err := s.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer d.Close()
		n := &namer{}
		return walk(ctx, d, p, depth, func(dir int, name, full string, _ os.FileMode) (bool, error) {
			if len(out.Entries) >= limit {
				out.Truncated = true
				return false, errStop
			}
			fi, err := n.statAt(dir, name, full)
			if err != nil {
				return false, nil // gone meanwhile
			}
			out.Entries = append(out.Entries, fi)
			return true, nil
		})
	})
	sort.Slice(out.Entries, func(i, j int) bool { return out.Entries[i].Path < out.Entries[j].Path })
	return out, err
}

func modeOr(m *uint32, def uint32) (uint32, error) {
	if m == nil {
		return def, nil
	}
	if *m > 0o7777 {
		return 0, errdefs.New(errdefs.InvalidArgument, "mode: %#o is not a permission mode (at most 07777)", *m)
	}
	return *m, nil
}

// Mkdir makes a directory (with Parents, also its parents, and an existing
// directory is fine).
func (s *Service) Mkdir(req guestapi.MkdirRequest) (guestapi.FileInfo, error) {
	c, err := s.caller(req.Where)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	p, err := c.abs("path", req.Path)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	mode, err := modeOr(req.Mode, 0o755)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	var fi guestapi.FileInfo
	err = as(c.acc, func() error {
		if req.Parents {
			if err := s.mkdirAll(p, mode); err != nil {
				return err
			}
		} else {
			d, name, err := s.parent(p)
			if err != nil {
				return err
			}
			err = unix.Mkdirat(int(d.Fd()), name, mode)
			if err == nil {
				err = unix.Fchmodat(int(d.Fd()), name, mode, 0)
			}
			d.Close()
			if err != nil {
				return pathError(p, err)
			}
		}
		fi, err = s.stat(p, false, &namer{})
		if err == nil && fi.Type != guestapi.TypeDir {
			err = errdefs.WithReason(errdefs.New(errdefs.AlreadyExists, "%s: exists and is not a directory", p), errdefs.NotDirectory)
		}
		return err
	})
	return fi, err
}

// Move renames a file or directory.
func (s *Service) Move(req guestapi.MoveRequest) (guestapi.FileInfo, error) {
	c, err := s.caller(req.Where)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	from, err := c.abs("from", req.From)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	to, err := c.abs("to", req.To)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	var fi guestapi.FileInfo
	err = as(c.acc, func() error {
		fd, fname, err := s.parent(from)
		if err != nil {
			return err
		}
		defer fd.Close()
		td, tname, err := s.parent(to)
		if err != nil {
			return err
		}
		defer td.Close()
		flags := uint(unix.RENAME_NOREPLACE)
		if req.Overwrite {
			flags = 0
		}
		if err := unix.Renameat2(int(fd.Fd()), fname, int(td.Fd()), tname, flags); err != nil {
			if err == unix.ENOENT {
				return pathError(from, err)
			}
			return pathError(to, err)
		}
		fi, err = (&namer{}).statAt(int(td.Fd()), tname, to)
		return err
	})
	return fi, err
}

// Remove removes a path; a tree only with Recursive.
func (s *Service) Remove(ctx context.Context, req guestapi.RemoveRequest) error {
	c, err := s.caller(req.Where)
	if err != nil {
		return err
	}
	p, err := c.abs("path", req.Path)
	if err != nil {
		return err
	}
	return as(c.acc, func() error {
		d, name, err := s.parent(p)
		if err != nil {
			if req.Force && errdefs.IsNotFound(err) {
				return nil
			}
			return err
		}
		defer d.Close()
		err = removeAt(ctx, int(d.Fd()), name, p, req.Recursive)
		if req.Force && errdefs.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// removeAt removes name in dir; a directory's contents only if recursive.
// It never follows symlinks and never leaves the filesystem of dir.
func removeAt(ctx context.Context, dir int, name, p string, recursive bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := unix.Unlinkat(dir, name, 0)
	if err == nil {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return pathError(p, err)
	}
	var st unix.Stat_t
	if serr := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return pathError(p, err)
	}
	err = unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
	if err == nil || err != unix.ENOTEMPTY && err != unix.EEXIST {
		return pathErrorOrNil(p, err)
	}
	if !recursive {
		return errdefs.New(errdefs.Conflict, "%s: directory not empty (remove it recursively)", p)
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError(p, err)
	}
	sub := os.NewFile(uintptr(fd), p)
	for {
		names, rerr := sub.Readdirnames(1024)
		for _, n := range names {
			if err := removeAt(ctx, fd, n, path.Join(p, n), true); err != nil {
				sub.Close()
				return err
			}
		}
		if rerr != nil || len(names) == 0 {
			break
		}
	}
	sub.Close()
	return pathErrorOrNil(p, unix.Unlinkat(dir, name, unix.AT_REMOVEDIR))
}

func pathErrorOrNil(p string, err error) error {
	if err == nil {
		return nil
	}
	return pathError(p, err)
}

// Chmod sets a path's permission bits (following a final symlink).
func (s *Service) Chmod(req guestapi.ChmodRequest) (guestapi.FileInfo, error) {
	c, err := s.caller(req.Where)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	p, err := c.abs("path", req.Path)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	if _, err := modeOr(&req.Mode, 0); err != nil {
		return guestapi.FileInfo{}, err
	}
	var fi guestapi.FileInfo
	err = as(c.acc, func() error {
		f, err := s.open(p, unix.O_PATH)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := fchmod(f, req.Mode); err != nil {
			return pathError(p, err)
		}
		fi, err = s.stat(p, false, &namer{})
		return err
	})
	return fi, err
}

// fchmod changes the mode of an O_PATH descriptor: fchmod refuses those, so
// it goes through the descriptor's own /proc/self/fd entry, which names
// exactly the object already opened (not a path resolved again).
func fchmod(f *os.File, mode uint32) error {
	return unix.Fchmodat(unix.AT_FDCWD, procFD(f), mode, 0)
}

func procFD(f *os.File) string {
	return "/proc/self/fd/" + itoa(int(f.Fd()))
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// Chown sets a path's owner (following a final symlink; recursive trees do
// not follow the symlinks inside them).
func (s *Service) Chown(ctx context.Context, req guestapi.ChownRequest) (guestapi.FileInfo, error) {
	c, err := s.caller(req.Where)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	p, err := c.abs("path", req.Path)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	if req.Owner == "" {
		return guestapi.FileInfo{}, errdefs.New(errdefs.InvalidArgument, "owner: is empty")
	}
	uid, gid, err := proc.LookupOwner(req.Owner)
	if err != nil {
		return guestapi.FileInfo{}, err
	}
	var fi guestapi.FileInfo
	err = as(c.acc, func() error {
		f, err := s.open(p, unix.O_PATH)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.Fchownat(int(f.Fd()), "", int(uid), int(gid), unix.AT_EMPTY_PATH); err != nil {
			return pathError(p, err)
		}
		if req.Recursive {
			var st unix.Stat_t
			if unix.Fstat(int(f.Fd()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				d, err := s.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
				if err != nil {
					return err
				}
				defer d.Close()
				err = walk(ctx, d, p, 64, func(dir int, name, full string, _ os.FileMode) (bool, error) {
					if err := unix.Fchownat(dir, name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
						return false, pathError(full, err)
					}
					return true, nil
				})
				if err != nil {
					return err
				}
			}
		}
		fi, err = s.stat(p, false, &namer{})
		return err
	})
	return fi, err
}
