package snapshot

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/layerfs"
)

// OCI layer whiteout prefix.
const whiteoutPrefix = ".wh."

// WriteTar writes changes (as Changes lists them, with the same to) as an
// OCI layer tar read from to: added and modified entries with their
// content and user.* extended attributes, a ".wh.NAME" whiteout for each
// deleted one, parents before children, ids as the sandbox sees them. The
// directories above a change are written too, with their attributes in
// to, so that the layer applied over the old stack leaves them as they
// were. A deleted or replaced directory's old entries need no whiteouts
// of their own: its whiteout or replacement hides them. Hard links are
// written as files; sockets and devices, which no layer carries, are left
// out.
func WriteTar(ctx context.Context, w io.Writer, changes []Change, to Stack) error {
	t, err := openStack(to)
	if err != nil {
		return err
	}
	defer t.close()
	if !slices.IsSortedFunc(changes, byPath) {
		changes = slices.SortedFunc(slices.Values(changes), byPath)
	}
	tw := &tarWriter{tw: tar.NewWriter(w), t: t, dirs: map[string]bool{}, buf: make([]byte, 1<<20)}
	for i, c := range changes {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := checkPath(c.Path); err != nil {
			return err
		}
		if err := tw.parents(c.Path); err != nil {
			return err
		}
		if c.Kind == Deleted {
			dir, base := path.Split(c.Path[1:])
			if err := tw.header(&tar.Header{Name: dir + whiteoutPrefix + base, Typeflag: tar.TypeReg,
				ModTime: time.Unix(0, 0).UTC(), Format: tar.FormatPAX}, -1); err != nil {
				return err
			}
			continue
		}
		if err := tw.entry(c.Path, c.newAt, c.Type); err != nil {
			return err
		}
	}
	if err := tw.tw.Close(); err != nil {
		return fmt.Errorf("write the tar: %w", err)
	}
	return nil
}

func byPath(a, b Change) int { return strings.Compare(a.Path, b.Path) }

type tarWriter struct {
	tw   *tar.Writer
	t    *tree
	dirs map[string]bool // directories written
	buf  []byte
}

// parents writes the directories above p that are not written yet.
func (w *tarWriter) parents(p string) error {
	for i := 1; i < len(p); i++ {
		if p[i] != '/' || w.dirs[p[:i]] {
			continue
		}
		if err := w.entry(p[:i], 0, "dir"); err != nil {
			return err
		}
	}
	return nil
}

// entry writes p as to holds it (read from layer hint when known); typ is
// what the change said it is.
func (w *tarWriter) entry(p string, hint int, typ string) error {
	e, v, err := w.t.find(p, hint)
	if err != nil {
		return fmt.Errorf("%s: %w", show(p), err)
	}
	defer v.close()
	if !e.ok() || typeName(e.st.Mode) != typ {
		return fmt.Errorf("%s: %w", show(p), errChanged)
	}
	hdr := &tar.Header{Name: p[1:], Mode: int64(e.perm()), Uid: w.t.id(e.layer, e.st.Uid), Gid: w.t.id(e.layer, e.st.Gid),
		ModTime: time.Unix(e.st.Mtim.Unix()).UTC(), Format: tar.FormatPAX}
	switch e.ftype() {
	case unix.S_IFDIR:
		hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		w.dirs[p] = true
		fd, err := openDir(e.dirfd, e.name)
		if err != nil {
			return fmt.Errorf("%s: %w", show(p), err)
		}
		defer unix.Close(fd)
		if err := w.xattrs(fd, hdr); err != nil {
			return fmt.Errorf("%s: %w", show(p), err)
		}
		return w.header(hdr, -1)
	case unix.S_IFREG:
		fd, err := openFile(&e)
		if err != nil {
			return fmt.Errorf("%s: %w", show(p), err)
		}
		defer unix.Close(fd)
		hdr.Typeflag, hdr.Size = tar.TypeReg, e.st.Size
		if err := w.xattrs(fd, hdr); err != nil {
			return fmt.Errorf("%s: %w", show(p), err)
		}
		return w.header(hdr, fd)
	case unix.S_IFLNK:
		target, err := layerfs.ReadLink(e.dirfd, e.name)
		if err != nil {
			return fmt.Errorf("read link %s: %w", show(p), err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return w.header(hdr, -1)
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		return w.header(hdr, -1)
	}
	return nil // a socket or a device: nothing a layer carries
}

func (w *tarWriter) xattrs(fd int, hdr *tar.Header) error {
	attrs, _, err := layerfs.UserXattrs(fd)
	if err != nil {
		return err
	}
	layerfs.PAX(hdr, attrs)
	return nil
}

// header writes hdr and, for a regular file, hdr.Size bytes from fd.
func (w *tarWriter) header(hdr *tar.Header, fd int) error {
	p := "/" + strings.TrimSuffix(hdr.Name, "/")
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write %s: %w", show(p), err)
	}
	if fd < 0 || hdr.Size == 0 {
		return nil
	}
	n, err := io.CopyBuffer(w.tw, io.LimitReader(&fdReader{fd: fd}, hdr.Size), w.buf)
	if err != nil {
		return fmt.Errorf("write %s: %w", show(p), err)
	}
	if n != hdr.Size {
		return fmt.Errorf("%s shrank while it was read (is the sandbox stopped?)", show(p))
	}
	return nil
}

// fdReader reads a descriptor it does not own from the start.
type fdReader struct {
	fd  int
	off int64
}

func (r *fdReader) Read(b []byte) (int, error) {
	n, err := layerfs.ReadAt(r.fd, b, r.off)
	r.off += int64(n)
	if n == 0 && err == nil && len(b) > 0 {
		return 0, io.EOF
	}
	return n, err
}
