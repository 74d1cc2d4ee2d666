// Package layerfs reads the entries of a layer directory through
// descriptors and without following a link: link targets, user extended
// attributes with overlay's opaque mark, and whether a file is one berth
// wrote. A sandbox's writable layer is hostile, so what it reads is
// bounded: link targets and attribute lists to 64 KiB.
package layerfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Overlay's extended attributes, as overlay writes them when mounted with
// userxattr (inside a user namespace): an opaque directory hides what the
// layers below it hold.
const (
	OverlayPrefix = "user.overlay."
	Opaque        = "user.overlay.opaque"
)

// maxRead bounds a link target, an attribute list and an attribute value.
const maxRead = 1 << 16

// ReadLink returns the target of symlink name in directory dirfd.
func ReadLink(dirfd int, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		if len(buf) >= maxRead {
			return "", errors.New("link target too long")
		}
		buf = make([]byte, len(buf)*4)
	}
}

// XattrNames lists fd's extended attributes (none where the file system
// has none).
func XattrNames(fd int) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < maxRead {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	}
}

// GetXattr returns the value of fd's extended attribute name.
func GetXattr(fd int, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Fgetxattr(fd, name, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < maxRead {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// Xattr is an extended attribute.
type Xattr struct {
	Name  string
	Value []byte
}

// UserXattrs reads fd's user.* extended attributes, overlay's own
// excepted, and whether overlay marked it opaque. An attribute removed
// since it was listed is left out.
func UserXattrs(fd int) (attrs []Xattr, opaque bool, err error) {
	names, err := XattrNames(fd)
	if err != nil {
		return nil, false, err
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "user.") {
			continue
		}
		v, err := GetXattr(fd, n)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("attribute %q: %w", n, err)
		}
		if strings.HasPrefix(n, OverlayPrefix) {
			opaque = opaque || n == Opaque && string(v) == "y"
			continue
		}
		attrs = append(attrs, Xattr{n, v})
	}
	return attrs, opaque, nil
}

// PAX records attrs in hdr, as tar carries extended attributes.
func PAX(hdr *tar.Header, attrs []Xattr) {
	for _, a := range attrs {
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+a.Name] = string(a.Value)
	}
}

// Skipped says whether the regular file open as fd, size bytes long, at
// abs (its path in the sandbox) is one of berth's that skip leaves out:
// skip names it, and it ends with the bytes skip gives (any content when
// they are empty). A file over 64 MiB is never berth's.
func Skipped(skip map[string][]byte, abs string, fd int, size int64) bool {
	tail, ok := skip[abs]
	if !ok {
		return false
	}
	if len(tail) == 0 {
		return true
	}
	if size < int64(len(tail)) || size > 64<<20 {
		return false
	}
	got := make([]byte, len(tail))
	n, err := ReadAt(fd, got, size-int64(len(tail)))
	return err == nil && n == len(got) && bytes.Equal(got, tail)
}

// ReadAt reads len(buf) bytes at off, or fewer at the end of the file.
func ReadAt(fd int, buf []byte, off int64) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], off+int64(n))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}
