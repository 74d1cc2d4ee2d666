// Package layerdiff reads what a sandbox changed: the writable (upper)
// layer of its overlay root, as an OCI layer tar (Write: a template build
// commits each step this way) or as a copy in a layer directory (Copy: a
// snapshot).
//
// The layer is the sandbox's, so its contents are hostile: the walk opens
// every entry relative to its directory's descriptor and follows no
// symlink, reads only regular files, and gives ids as the sandbox sees
// them (host ids outside the sandbox's range become 65534). In a tar,
// overlay's own marks become the OCI format's: a whiteout (a 0/0 character
// device) is a ".wh." entry, an opaque directory ("user.overlay.opaque") a
// ".wh..wh..opq" entry. A copy, an overlay layer itself, keeps them as they
// are. Other "user.overlay." attributes are overlay's and are left out, as
// are attributes outside "user." (they would mean something on the host).
// The caller stops or freezes the sandbox first: a walk of a layer that is
// changing sees some mixture of before and after (Copy's Live pass is the
// exception, made to be followed by a frozen one).
package layerdiff

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/layerfs"
)

// OCI whiteout names.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	overflowID     = 65534
)

// IDs is the sandbox's mapping: ids inside 0..Size-1 are Base..Base+Size-1
// on the host.
type IDs struct{ Base, Size uint32 }

// Options shape the tar.
type Options struct {
	IDs IDs
	// Skip names files (absolute paths in the sandbox) that berth itself
	// wrote into the layer: each is left out while its content ends with
	// the given bytes (an empty value: whatever it holds).
	Skip map[string][]byte
}

// Stats is what a tar holds.
type Stats struct {
	Entries int   // entries written, whiteouts included
	Bytes   int64 // bytes of file content
}

// Write writes the layer in directory upper as a tar to w. Directories
// that hold nothing but skipped files are left out, so a sandbox that
// changed nothing gives an empty tar (Stats.Entries 0).
func Write(w io.Writer, upper string, o Options) (Stats, error) {
	root, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("open the writable layer: %w", err)
	}
	defer unix.Close(root)
	wr := &writer{tw: tar.NewWriter(w), o: o, links: map[[2]uint64]string{}, buf: make([]byte, 1<<20)}
	names, err := readNames(root)
	if err != nil {
		return Stats{}, fmt.Errorf("read the writable layer: %w", err)
	}
	if err := wr.dir(root, "", names); err != nil {
		return wr.stats, err
	}
	return wr.stats, wr.tw.Close()
}

type writer struct {
	tw      *tar.Writer
	o       Options
	stats   Stats
	links   map[[2]uint64]string // device and inode -> first name, for hard links
	pending []*tar.Header        // directories not written yet, outermost first
	buf     []byte
}

// dir writes the entries names of directory dirfd (rel is its name in
// the tar, "" for the root).
func (w *writer) dir(dirfd int, rel string, names []string) error {
	slices.Sort(names)
	for _, name := range names {
		if err := w.entry(dirfd, rel, name); err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) entry(dirfd int, parent, name string) error {
	rel := name
	if parent != "" {
		rel = parent + "/" + name
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat %s: %w", show(rel), err)
	}
	hdr := &tar.Header{Name: rel, Mode: int64(st.Mode & 0o7777), Uid: w.o.IDs.inside(st.Uid), Gid: w.o.IDs.inside(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()).UTC(), Format: tar.FormatPAX}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return w.directory(dirfd, name, hdr)
	case unix.S_IFREG:
		return w.file(dirfd, name, hdr, &st)
	case unix.S_IFLNK:
		target, err := layerfs.ReadLink(dirfd, name)
		if err != nil {
			return fmt.Errorf("read link %s: %w", show(rel), err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return w.write(hdr, nil)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return nil // a device: no sandbox can make one, and no layer may carry one
		}
		return w.write(&tar.Header{Name: joinName(parent, whiteoutPrefix+name), Typeflag: tar.TypeReg,
			ModTime: hdr.ModTime, Format: tar.FormatPAX}, nil)
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		return w.write(hdr, nil)
	}
	return nil // sockets, block devices: nothing a layer carries
}

func (w *writer) directory(dirfd int, name string, hdr *tar.Header) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", show(hdr.Name), err)
	}
	defer unix.Close(fd)
	hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
	opaque := false
	if err := w.xattrs(fd, hdr, &opaque); err != nil {
		return err
	}
	w.pending = append(w.pending, hdr)
	depth := len(w.pending)
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("read %s: %w", show(hdr.Name), err)
	}
	// A directory is written when it is new and empty, opaque, or holds
	// something written; one that holds only skipped files is not a change.
	if len(names) == 0 || opaque {
		if err := w.flush(); err != nil {
			return err
		}
	}
	if opaque {
		if err := w.write(&tar.Header{Name: hdr.Name + opaqueMarker, Typeflag: tar.TypeReg, ModTime: hdr.ModTime, Format: tar.FormatPAX}, nil); err != nil {
			return err
		}
	}
	if err := w.dir(fd, strings.TrimSuffix(hdr.Name, "/"), names); err != nil {
		return err
	}
	w.pending = w.pending[:depth-1] // written or, holding nothing written, left out
	return nil
}

func (w *writer) file(dirfd int, name string, hdr *tar.Header, st *unix.Stat_t) (err error) {
	abs := "/" + hdr.Name
	if st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := w.links[key]; ok {
			skip, err := skippedAt(w.o.Skip, dirfd, name, abs)
			if err != nil {
				return fmt.Errorf("open %s: %w", show(hdr.Name), err)
			}
			if skip {
				return nil
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return w.write(hdr, nil)
		}
		defer func() {
			if err == nil && hdr.Typeflag == tar.TypeReg { // written, not skipped
				w.links[key] = hdr.Name
			}
		}()
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", show(hdr.Name), err)
	}
	f := os.NewFile(uintptr(fd), hdr.Name)
	defer f.Close()
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil || fst.Mode&unix.S_IFMT != unix.S_IFREG || fst.Ino != st.Ino {
		return fmt.Errorf("%s changed while it was read (is the sandbox stopped?)", show(hdr.Name))
	}
	if layerfs.Skipped(w.o.Skip, abs, fd, fst.Size) {
		return nil
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, fst.Size
	if err := w.xattrs(fd, hdr, nil); err != nil {
		return err
	}
	return w.write(hdr, f)
}

// write writes hdr (and, for a regular file, its content from r), the
// directories above it first.
func (w *writer) write(hdr *tar.Header, r io.Reader) error {
	if err := w.flush(); err != nil {
		return err
	}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write %s: %w", show(hdr.Name), err)
	}
	w.stats.Entries++
	if r == nil || hdr.Size == 0 {
		return nil
	}
	n, err := io.CopyBuffer(w.tw, io.LimitReader(r, hdr.Size), w.buf)
	w.stats.Bytes += n
	if err != nil {
		return fmt.Errorf("write %s: %w", show(hdr.Name), err)
	}
	if n != hdr.Size {
		return fmt.Errorf("%s shrank while it was read (is the sandbox stopped?)", show(hdr.Name))
	}
	return nil
}

// flush writes the pending directories.
func (w *writer) flush() error {
	for i, d := range w.pending {
		if d == nil {
			continue
		}
		if err := w.tw.WriteHeader(d); err != nil {
			return fmt.Errorf("write %s: %w", show(d.Name), err)
		}
		w.stats.Entries++
		w.pending[i] = nil
	}
	return nil
}

// xattrs copies fd's user.* extended attributes into hdr (overlay's own
// excepted) and reports the opaque mark.
func (w *writer) xattrs(fd int, hdr *tar.Header, opaque *bool) error {
	attrs, isOpaque, err := userXattrs(fd, hdr.Name)
	if err != nil {
		return err
	}
	if opaque != nil {
		*opaque = isOpaque
	}
	layerfs.PAX(hdr, attrs)
	return nil
}

// userXattrs reads fd's user.* extended attributes, overlay's own
// excepted, and whether overlay marked it opaque; rel names it in errors.
func userXattrs(fd int, rel string) ([]layerfs.Xattr, bool, error) {
	attrs, opaque, err := layerfs.UserXattrs(fd)
	if err != nil {
		return nil, false, fmt.Errorf("attributes of %s: %w", show(rel), err)
	}
	return attrs, opaque, nil
}

// inside maps a host id to the id the sandbox sees.
func (m IDs) inside(host uint32) int {
	if host < m.Base || host-m.Base >= m.Size {
		return overflowID
	}
	return int(host - m.Base)
}

// skippedAt is skipped for name in dirfd (at abs), opened only if skip
// lists it.
func skippedAt(skip map[string][]byte, dirfd int, name, abs string) (bool, error) {
	if _, ok := skip[abs]; !ok {
		return false, nil
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG && layerfs.Skipped(skip, abs, fd, st.Size), nil
}

func joinName(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "/" + name
}

func show(rel string) string { return "/" + strings.TrimSuffix(rel, "/") }

func readNames(dirfd int) ([]string, error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(fd), "dir")
	defer d.Close()
	return d.Readdirnames(-1)
}
