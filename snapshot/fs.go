package snapshot

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/layerfs"
)

// overflowID is the id the kernel shows for a host id a mapping lacks.
const overflowID = 65534

// errChanged is what a read reports when an entry is not what it was a
// moment before: the sandbox still writes.
var errChanged = errors.New("changed while it was read (is the sandbox stopped?)")

// tree is a stack opened for reading: each layer's root directory.
type tree struct {
	stack Stack
	roots []int
}

func openStack(s Stack) (*tree, error) {
	t := &tree{stack: s}
	for _, l := range s {
		fd, err := unix.Open(l.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			t.close()
			return nil, fmt.Errorf("open layer %s: %w", l.Dir, err)
		}
		t.roots = append(t.roots, fd)
	}
	return t, nil
}

func (t *tree) close() {
	for _, fd := range t.roots {
		unix.Close(fd)
	}
	t.roots = nil
}

// id maps a host id of a file in layer i to the id the sandbox sees.
func (t *tree) id(i int, host uint32) int {
	ids := t.stack[i].IDs
	if ids.Base == 0 && ids.Size == 0 {
		return int(host) // stored as the sandbox sees it
	}
	if host < ids.Base || host-ids.Base >= ids.Size {
		return overflowID
	}
	return int(host - ids.Base)
}

// dirRef is one layer's directory in a view.
type dirRef struct{ layer, fd int }

// view is a directory of a stack as overlay merges it: the layers that
// hold it as a directory, topmost first, down to the first opaque one or
// the first that holds something else there. A view owns its
// descriptors.
type view []dirRef

func (v view) close() {
	for _, d := range v {
		unix.Close(d.fd)
	}
}

// rootView opens the root of every layer afresh (descriptors of their own,
// so each reads its directory from the start).
func (t *tree) rootView() (view, error) {
	v := make(view, 0, len(t.roots))
	for i, root := range t.roots {
		fd, err := unix.Openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			v.close()
			return nil, fmt.Errorf("open layer %s: %w", t.stack[i].Dir, err)
		}
		v = append(v, dirRef{i, fd})
	}
	return v, nil
}

// entry is what a lookup found: name in directory dirfd of a layer.
type entry struct {
	layer int // index in the stack; -1: nothing there
	pos   int // index in the view it was found in
	dirfd int // borrowed from that view
	name  string
	st    unix.Stat_t
}

var absent = entry{layer: -1}

func (e *entry) ok() bool      { return e.layer >= 0 }
func (e *entry) ftype() uint32 { return e.st.Mode & unix.S_IFMT }
func (e *entry) isDir() bool   { return e.ok() && e.ftype() == unix.S_IFDIR }
func (e *entry) isReg() bool   { return e.ok() && e.ftype() == unix.S_IFREG }
func (e *entry) perm() uint32  { return e.st.Mode & 0o7777 }

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// typeName names a file type as a Change does.
func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "char"
	case unix.S_IFBLK:
		return "block"
	}
	return "unknown"
}

// lookup finds name in v: the topmost layer's entry, or absent under a
// whiteout or where no layer has one.
func lookup(v view, name string) (entry, error) {
	for i, d := range v {
		e := entry{layer: d.layer, pos: i, dirfd: d.fd, name: name}
		if err := unix.Fstatat(d.fd, name, &e.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return absent, err
		}
		if isWhiteout(&e.st) {
			return absent, nil
		}
		return e, nil
	}
	return absent, nil
}

// descend opens directory e (found in v) as a view: e's own layer, and
// below it the directories of that name in v's lower layers until one is
// opaque or a layer holds something else there. Its attributes are read
// again from the open directory.
func descend(v view, e *entry) (view, error) {
	fd, err := openDir(e.dirfd, e.name)
	if err != nil {
		return nil, err
	}
	out := view{{e.layer, fd}}
	if err := unix.Fstat(fd, &e.st); err != nil {
		out.close()
		return nil, err
	}
	opaque, err := isOpaque(fd)
	for _, d := range v[e.pos+1:] {
		if err != nil || opaque {
			break
		}
		var st unix.Stat_t
		if err = unix.Fstatat(d.fd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
			err = nil
			continue
		}
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			break // a whiteout or a non-directory hides what lies below
		}
		var lower int
		if lower, err = openDir(d.fd, e.name); err != nil {
			break
		}
		out = append(out, dirRef{d.layer, lower})
		opaque, err = isOpaque(lower)
	}
	if err != nil {
		out.close()
		return nil, err
	}
	return out, nil
}

func openDir(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return -1, errChanged
	}
	return fd, err
}

func isOpaque(fd int) (bool, error) {
	var v [2]byte
	n, err := unix.Fgetxattr(fd, layerfs.Opaque, v[:])
	switch {
	case err == nil:
		return n == 1 && v[0] == 'y', nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.ERANGE):
		return false, nil
	}
	return false, err
}

// find looks p up in t: in layer hint (a Change's, index + 1) when it
// names one, else through the stack as overlay would. The returned view
// holds e's directory and is the caller's to close (nil when absent).
func (t *tree) find(p string, hint int) (entry, view, error) {
	if hint > 0 && hint <= len(t.roots) {
		return t.findIn(hint-1, p)
	}
	v, err := t.rootView()
	if err != nil {
		return absent, nil, err
	}
	dirs, base := path.Split(p[1:])
	for _, name := range strings.Split(strings.TrimSuffix(dirs, "/"), "/") {
		if name == "" {
			break // p is in the root
		}
		e, err := lookup(v, name)
		if err != nil || !e.isDir() {
			v.close()
			return absent, nil, err // a path through a non-directory: absent
		}
		nv, err := descend(v, &e)
		v.close()
		if err != nil {
			return absent, nil, err
		}
		v = nv
	}
	e, err := lookup(v, base)
	if err != nil || !e.ok() {
		v.close()
		return absent, nil, err
	}
	return e, v, nil
}

// findIn looks p up in layer i alone, beneath its root and through no
// symlink.
func (t *tree) findIn(i int, p string) (entry, view, error) {
	dir, base := path.Split(p[1:])
	var fd int
	var err error
	if dir == "" {
		fd, err = unix.Openat(t.roots[i], ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	} else {
		how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
		fd, err = unix.Openat2(t.roots[i], strings.TrimSuffix(dir, "/"), &how)
	}
	if errors.Is(err, unix.ENOENT) {
		return absent, nil, nil
	}
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return absent, nil, errChanged
	}
	if err != nil {
		return absent, nil, err
	}
	v := view{{i, fd}}
	e := entry{layer: i, dirfd: fd, name: base}
	if err := unix.Fstatat(fd, base, &e.st, unix.AT_SYMLINK_NOFOLLOW); err != nil || isWhiteout(&e.st) {
		v.close()
		if errors.Is(err, unix.ENOENT) {
			err = nil
		}
		return absent, nil, err
	}
	return e, v, nil
}

// openFile opens regular file e for reading and checks that it is still
// the file that was looked up.
func openFile(e *entry) (int, error) {
	fd, err := unix.Openat(e.dirfd, e.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
			return -1, errChanged
		}
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Ino != e.st.Ino || st.Dev != e.st.Dev {
		unix.Close(fd)
		return -1, errChanged
	}
	e.st = st
	return fd, nil
}

// readDirNames appends the names in directory fd (read from its start).
func readDirNames(fd int, buf []byte, names []string) ([]string, error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return names, err
	}
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return names, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// show makes a name from a layer safe to print in a message: quoted, with
// escapes, when it holds anything but printable text.
func show(s string) string {
	if !needsQuote(s) {
		return s
	}
	return strconv.Quote(s)
}

// needsQuote reports whether s holds a byte that is not valid UTF-8, a
// control or formatting character (newlines, terminal escapes, bidi
// overrides), or a quote or backslash.
func needsQuote(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f || c == '"' || c == '\\' {
				return true
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !unicode.IsPrint(r) {
			return true
		}
		i += n
	}
	return false
}

// checkPath checks a Change's path: absolute, clean, not the root.
func checkPath(p string) error {
	if len(p) < 2 || p[0] != '/' || path.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("change path %s: not a clean absolute path below /", show(p))
	}
	return nil
}
