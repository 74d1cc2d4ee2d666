package image

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/errdefs"
)

// Layers are unpacked by the daemon, as root, from tars that anyone could
// have written, into a directory that becomes an overlay lower layer. The
// unpacker therefore never resolves a path through the file system the way
// a tar tool would: every entry's name is checked (no "..", nothing
// outside), its parent is opened beneath the layer's root with openat2 and
// no symlink followed (a symlink in the layer, absolute or not, is stored
// as it is and only ever followed inside a sandbox), and the entry is made
// with *at calls relative to that parent. What overlayfs needs becomes its
// own form: a ".wh.NAME" entry a whiteout (character device 0/0), a
// ".wh..wh..opq" entry the user.overlay.opaque attribute that a root
// mounted with userxattr (as the guest mounts it) reads.

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	opaqueXattr    = "user.overlay.opaque"
	// maxID is the highest id a layer's file keeps: ids outside a
	// sandbox's mapping become nobody's, as a sandbox would see them.
	maxID  = 65535
	nobody = 65534
)

// Limits bound what a pull may unpack; a layer over them is refused, and
// nothing of it stays.
type Limits struct {
	// MaxBytes bounds an image's unpacked bytes (default 64 GiB).
	MaxBytes int64
	// MaxEntries bounds an image's files, directories and links (default
	// 4,000,000).
	MaxEntries int64
	// MinFree is what the store's file system keeps free while a layer
	// unpacks (default 1 GiB).
	MinFree int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes == 0 {
		l.MaxBytes = 64 << 30
	}
	if l.MaxEntries == 0 {
		l.MaxEntries = 4_000_000
	}
	if l.MinFree == 0 {
		l.MinFree = 1 << 30
	}
	return l
}

// budget counts what an image's layers unpacked against its limits; the
// layers of one pull unpack at once, so it is safe for concurrent use.
type budget struct {
	lim        Limits
	dir        string // on the file system that must keep MinFree
	mu         sync.Mutex
	bytes      int64
	entries    int64
	sinceCheck int64
}

func (b *budget) entry() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.entries++
	if b.entries > b.lim.MaxEntries {
		return errdefs.New(errdefs.ResourceExhausted, "the image has over %d entries (the daemon's limit)", b.lim.MaxEntries)
	}
	return nil
}

// add counts n bytes of a layer already stored.
func (b *budget) add(n int64) {
	b.mu.Lock()
	b.bytes += n
	b.mu.Unlock()
}

// charge accounts n bytes about to be written.
func (b *budget) charge(n int64) error {
	b.mu.Lock()
	b.bytes += n
	over := b.bytes > b.lim.MaxBytes
	b.sinceCheck += n
	check := b.sinceCheck >= 64<<20
	if check {
		b.sinceCheck = 0
	}
	b.mu.Unlock()
	if over {
		return errdefs.New(errdefs.ResourceExhausted, "the image unpacks to over %d bytes (the daemon's limit)", b.lim.MaxBytes)
	}
	if !check {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(b.dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", b.dir, err)
	}
	if free := int64(st.Bavail) * st.Bsize; free < b.lim.MinFree {
		return errdefs.New(errdefs.ResourceExhausted, "the image store's file system has %d bytes free, under the %d it keeps", free, b.lim.MinFree)
	}
	return nil
}

// unpacked is what unpacking a layer made.
type unpacked struct {
	bytes int64
	notes []string // what was skipped, and why
}

// unpackLayer unpacks tar stream r into the empty directory dir.
func unpackLayer(dir string, r io.Reader, b *budget) (unpacked, error) {
	return unpackLayerAt(dir, r, b, 0)
}

// unpackLayerAt is unpackLayer with every id moved up by base (a
// sandbox's range: its writable layer restored from an archive).
func unpackLayerAt(dir string, r io.Reader, b *budget, base int) (unpacked, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return unpacked{}, fmt.Errorf("open layer dir: %w", err)
	}
	defer unix.Close(root)
	u := &unpacker{root: root, b: b, base: base}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return unpacked{}, errdefs.New(errdefs.InvalidArgument, "layer: not a valid tar: %v", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return unpacked{}, fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	return unpacked{bytes: u.bytes, notes: u.notes}, nil
}

type unpacker struct {
	root  int
	base  int // added to every id
	b     *budget
	bytes int64
	notes []string
	buf   []byte
}

func (u *unpacker) note(format string, args ...any) {
	if len(u.notes) < 20 {
		u.notes = append(u.notes, fmt.Sprintf(format, args...))
	} else if len(u.notes) == 20 {
		u.notes = append(u.notes, "… (more skipped)")
	}
}

// entryName checks a tar name and returns it relative to the layer's root
// ("" for the root itself).
func entryName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", errdefs.New(errdefs.InvalidArgument, "the name holds a NUL byte")
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
		case "..":
			return "", errdefs.New(errdefs.InvalidArgument, "the name climbs out with \"..\" (a hostile layer)")
		default:
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "/"), nil
}

// parent opens the directory that holds rel, beneath the root and through
// no symlink, making missing directories (root's, 0755) on the way.
func (u *unpacker) parent(rel string) (int, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		fd, err := unix.Openat(u.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return fd, base, err
	}
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	fd, err := unix.Openat2(u.root, dir, how)
	if err == nil {
		return fd, base, nil
	}
	if err == unix.ELOOP || err == unix.ENOTDIR || err == unix.EXDEV {
		return -1, "", errdefs.New(errdefs.InvalidArgument, "its directory %q is a symlink or not a directory in the layer (a hostile layer)", dir)
	}
	if err != unix.ENOENT {
		return -1, "", fmt.Errorf("open %s: %w", dir, err)
	}
	// Tars may omit directory entries: make each missing one.
	fd, err = unix.Openat(u.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", err
	}
	for _, p := range strings.Split(dir, "/") {
		if err := unix.Mkdirat(fd, p, 0o755); err != nil && err != unix.EEXIST {
			unix.Close(fd)
			return -1, "", fmt.Errorf("make %s: %w", dir, err)
		}
		next, err := unix.Openat(fd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, "", errdefs.New(errdefs.InvalidArgument, "its directory %q is a symlink or not a directory in the layer (a hostile layer)", dir)
		}
		fd = next
	}
	return fd, base, nil
}

func (u *unpacker) entry(hdr *tar.Header, tr io.Reader) error {
	rel, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	if err := u.b.entry(); err != nil {
		return err
	}
	if rel == "" { // the root: its attributes come from the image's own root
		return nil
	}
	dirfd, base, err := u.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	if base == opaqueMarker {
		if err := unix.Fsetxattr(dirfd, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark opaque: %w", err)
		}
		return nil
	}
	if name, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
		if name == "" || name == "." || name == ".." {
			return errdefs.New(errdefs.InvalidArgument, "a whiteout of nothing")
		}
		if err := u.clear(dirfd, name, false); err != nil {
			return err
		}
		if err := unix.Mknodat(dirfd, name, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("whiteout: %w", err)
		}
		return nil
	}
	uid, gid := clampID(hdr.Uid)+u.base, clampID(hdr.Gid)+u.base
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := u.clear(dirfd, base, true); err != nil {
			return err
		}
		if err := unix.Mkdirat(dirfd, base, 0o700); err != nil && err != unix.EEXIST {
			return err
		}
		fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return u.attrs(fd, hdr, uid, gid, mode)
	case tar.TypeReg, 0: // 0: the old TypeRegA
		if err := u.clear(dirfd, base, false); err != nil {
			return err
		}
		if hdr.Size < 0 {
			return errdefs.New(errdefs.InvalidArgument, "a negative size")
		}
		if err := u.b.charge(hdr.Size); err != nil {
			return err
		}
		fd, err := unix.Openat(dirfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		defer f.Close()
		if u.buf == nil {
			u.buf = make([]byte, 1<<20)
		}
		n, err := io.CopyBuffer(struct{ io.Writer }{f}, io.LimitReader(tr, hdr.Size), u.buf)
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if n != hdr.Size {
			return errdefs.New(errdefs.InvalidArgument, "truncated: %d of %d bytes", n, hdr.Size)
		}
		u.bytes += n
		if err := u.attrs(int(f.Fd()), hdr, uid, gid, mode); err != nil {
			return err
		}
		return u.times(dirfd, base, hdr)
	case tar.TypeSymlink:
		if err := u.clear(dirfd, base, false); err != nil {
			return err
		}
		if strings.IndexByte(hdr.Linkname, 0) >= 0 || hdr.Linkname == "" {
			return errdefs.New(errdefs.InvalidArgument, "a symlink to an empty or NUL-holding target")
		}
		if err := unix.Symlinkat(hdr.Linkname, dirfd, base); err != nil {
			return err
		}
		if err := unix.Fchownat(dirfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return u.times(dirfd, base, hdr)
	case tar.TypeLink:
		target, err := entryName(hdr.Linkname)
		if err != nil || target == "" {
			return errdefs.New(errdefs.InvalidArgument, "a hard link to %q, outside the layer (a hostile layer)", hdr.Linkname)
		}
		tdir, tbase, err := u.parent(target)
		if err != nil {
			return err
		}
		defer unix.Close(tdir)
		if err := u.clear(dirfd, base, false); err != nil {
			return err
		}
		if err := unix.Linkat(tdir, tbase, dirfd, base, 0); err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
		}
		return nil
	case tar.TypeFifo:
		if err := u.clear(dirfd, base, false); err != nil {
			return err
		}
		if err := unix.Mknodat(dirfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return err
		}
		if err := unix.Fchownat(dirfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.Fchmodat(dirfd, base, mode, 0)
	case tar.TypeChar, tar.TypeBlock:
		u.note("skipped device file /%s: a sandbox's /dev is its own", rel)
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	default:
		u.note("skipped /%s: tar entry type %q", rel, hdr.Typeflag)
		return nil
	}
}

// clear makes room for a new entry called base in dirfd: an earlier entry
// of that name in this layer goes (a directory only if empty), unless it
// is a directory and keepDir says a directory comes again.
func (u *unpacker) clear(dirfd int, base string, keepDir bool) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return nil
		}
		if err := unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR); err != nil {
			return errdefs.New(errdefs.InvalidArgument, "replaces a directory that is not empty: %v", err)
		}
		return nil
	}
	return unix.Unlinkat(dirfd, base, 0)
}

// attrs sets an open file's or directory's owner, mode and extended
// attributes: user.* ones are kept; others (security.capability,
// trusted.*) would mean something on the host, so they are skipped with a
// note.
func (u *unpacker) attrs(fd int, hdr *tar.Header, uid, gid int, mode uint32) error {
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, mode); err != nil { // after chown, which clears setuid
		return err
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if !strings.HasPrefix(name, "user.") || strings.HasPrefix(name, "user.overlay.") {
			u.note("skipped extended attribute %s of /%s", name, strings.TrimPrefix(hdr.Name, "/"))
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("xattr %s: %w", name, err)
		}
	}
	return nil
}

func (u *unpacker) times(dirfd int, base string, hdr *tar.Header) error {
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if !hdr.AccessTime.IsZero() {
		ts[0] = unix.NsecToTimespec(hdr.AccessTime.UnixNano())
	}
	if err := unix.UtimesNanoAt(dirfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func clampID(id int) int {
	if id < 0 || id > maxID {
		return nobody
	}
	return id
}

// bufferedReader is the reader unpackLayer reads a layer through: tar's
// small reads of headers would otherwise each reach the decompressor.
func bufferedReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 1<<20) }
