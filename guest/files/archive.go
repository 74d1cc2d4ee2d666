package files

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

func syncPool(size int) *sync.Pool {
	return &sync.Pool{New: func() any { b := make([]byte, size); return &b }}
}

// WriteArchive writes a tar stream of a path to out: a file as one entry, a
// directory as a tree under its own name (as docker cp does). Symlinks are
// stored as symlinks, hard links once, sockets and devices left out; /proc
// and /sys are not entered.
func (s *Service) WriteArchive(ctx context.Context, w guestapi.Where, reqPath string, out io.Writer) error {
	c, err := s.caller(w)
	if err != nil {
		return err
	}
	p, err := c.abs("path", reqPath)
	if err != nil {
		return err
	}
	return as(c.acc, func() error {
		f, err := s.open(p, unix.O_RDONLY|unix.O_NONBLOCK)
		if err != nil {
			return err
		}
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return pathError(p, err)
		}
		top := path.Base(p)
		if p == "/" {
			top = "."
		}
		a := &archiver{tw: tar.NewWriter(out), links: map[[2]uint64]string{}, n: &namer{}}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if err := a.file(f, top, &st); err != nil {
				return err
			}
		case unix.S_IFDIR:
			if err := a.header(top, &st, ""); err != nil {
				return err
			}
			err = walk(ctx, f, p, 256, func(dir int, name, full string, typ os.FileMode) (bool, error) {
				rel := path.Join(top, strings.TrimPrefix(full, strings.TrimSuffix(p, "/")))
				return true, a.entry(dir, name, rel)
			})
			if err != nil {
				return err
			}
		default:
			return notRegular(p)
		}
		return a.tw.Close()
	})
}

type archiver struct {
	tw    *tar.Writer
	links map[[2]uint64]string // (dev, inode) of files with several links -> first name
	n     *namer
}

func (a *archiver) header(name string, st *unix.Stat_t, target string) error {
	h := &tar.Header{
		Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		Uname: a.n.userName(st.Uid), Gname: a.n.groupName(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag, h.Name = tar.TypeDir, name+"/"
	case unix.S_IFLNK:
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	default:
		h.Typeflag, h.Size = tar.TypeReg, st.Size
	}
	return a.tw.WriteHeader(h)
}

// entry archives name in dir as rel, without following it.
func (a *archiver) entry(dir int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil // gone meanwhile
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR, unix.S_IFIFO:
		return a.header(rel, &st, "")
	case unix.S_IFLNK:
		buf := make([]byte, guestapi.MaxPathLen)
		k, err := unix.Readlinkat(dir, name, buf)
		if err != nil {
			return nil
		}
		return a.header(rel, &st, string(buf[:k]))
	case unix.S_IFREG:
		fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil // unreadable: left out, as tar would warn and go on
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil
		}
		return a.file(f, rel, &st)
	}
	return nil // sockets and devices
}

// file archives an open regular file: a second name of a hard-linked file
// becomes a link entry; a file that shrinks while read is padded, one that
// grows is cut, so the stream stays well-formed.
func (a *archiver) file(f *os.File, rel string, st *unix.Stat_t) error {
	if st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := a.links[key]; ok {
			return a.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: rel, Linkname: first,
				Mode: int64(st.Mode & 0o7777), ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX})
		}
		a.links[key] = rel
	}
	if err := a.header(rel, st, ""); err != nil {
		return err
	}
	bp := copyPool.Get().(*[]byte)
	defer copyPool.Put(bp)
	n, err := io.CopyBuffer(a.tw, io.LimitReader(onlyReader{f}, st.Size), *bp)
	if err != nil {
		var pe *os.PathError
		if !errors.As(err, &pe) {
			return err // the stream's side
		}
	}
	for n < st.Size {
		k, err := a.tw.Write(make([]byte, min(st.Size-n, 32<<10)))
		if err != nil {
			return err
		}
		n += int64(k)
	}
	return nil
}

// onlyReader hides everything but Read (so copies use the given buffer).
type onlyReader struct{ io.Reader }

func (n *namer) userName(uid uint32) string {
	if n.users == nil {
		n.info("/", &unix.Stat_t{})
	}
	return n.users[uid]
}

func (n *namer) groupName(gid uint32) string {
	if n.groups == nil {
		n.info("/", &unix.Stat_t{})
	}
	return n.groups[gid]
}

// maxArchiveEntries bounds the entries of one tar upload.
const maxArchiveEntries = 1 << 20

// ExtractArchive unpacks a tar stream into a directory (made if missing), as
// the caller. Entries are first written to a staging directory inside the
// destination, where every lookup stays beneath it and follows no symlink
// (so an entry cannot write through a symlink an earlier entry made); a
// stream that is malformed, truncated or holds a forbidden entry is rejected
// and the staging directory removed, leaving nothing. A complete stream is
// then moved into place, merging with existing directories and replacing
// existing files.
func (s *Service) ExtractArchive(w guestapi.Where, reqPath string, in io.Reader) (guestapi.ArchiveResult, error) {
	c, err := s.caller(w)
	if err != nil {
		return guestapi.ArchiveResult{}, err
	}
	p, err := c.abs("path", reqPath)
	if err != nil {
		return guestapi.ArchiveResult{}, err
	}
	var res guestapi.ArchiveResult
	err = as(c.acc, func() error {
		made, err := s.mkdirAllMade(p, 0o755)
		if err != nil {
			s.unmake(p, made)
			return err
		}
		// A stream that is refused leaves nothing, the directories made
		// for it included.
		if err := s.extractInto(p, in, &res); err != nil {
			s.unmake(p, made)
			return err
		}
		return nil
	})
	return res, err
}

// extractInto unpacks a tar stream beside p, in a staging directory that
// goes either way, and merges it into p.
func (s *Service) extractInto(p string, in io.Reader, res *guestapi.ArchiveResult) error {
	dest, err := s.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer dest.Close()
	stageName := tempName("extract")
	if err := unix.Mkdirat(int(dest.Fd()), stageName, 0o700); err != nil {
		return pathError(p, err)
	}
	defer removeAt(context.Background(), int(dest.Fd()), stageName, path.Join(p, stageName), true)
	sfd, err := unix.Openat(int(dest.Fd()), stageName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError(p, err)
	}
	stage := os.NewFile(uintptr(sfd), path.Join(p, stageName))
	defer stage.Close()
	x := &extraction{stage: sfd, res: res, dirModes: map[string]uint32{}}
	if err := x.run(tar.NewReader(in)); err != nil {
		return err
	}
	if err := merge(sfd, int(dest.Fd()), p); err != nil {
		return err
	}
	// Modes last: a 0555 directory must first take its entries, and a
	// directory moves only while writable (its ".." changes).
	return x.applyDirModes(int(dest.Fd()))
}

func badArchive(format string, args ...any) error {
	return errdefs.New(errdefs.InvalidArgument, "archive: "+format, args...)
}

// beneath opens rel below dir, following no symlink.
func beneath(dir int, rel string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	return unix.Openat2(dir, rel, &how)
}

// parentBeneath opens (making them) the directories that hold rel below
// stage, and returns the directory and rel's last element.
func parentBeneath(stage int, rel string) (int, string, error) {
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		fd, err := unix.Dup(stage)
		return fd, name, err
	}
	cur, err := unix.Dup(stage)
	if err != nil {
		return -1, "", err
	}
	for _, part := range strings.Split(dir, "/") {
		if err := unix.Mkdirat(cur, part, 0o755); err != nil && err != unix.EEXIST {
			unix.Close(cur)
			return -1, "", err
		}
		next, err := beneath(cur, part, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(cur)
		if err != nil {
			return -1, "", err
		}
		cur = next
	}
	return cur, name, nil
}

// entryName checks and cleans an entry's name: relative, inside.
func entryName(raw string) (string, error) {
	if strings.IndexByte(raw, 0) >= 0 || len(raw) > guestapi.MaxPathLen {
		return "", badArchive("entry %q: not a valid name", truncateName(raw))
	}
	name := path.Clean(strings.TrimLeft(raw, "/"))
	if name == "." || name == "" {
		return ".", nil
	}
	if name == ".." || strings.HasPrefix(name, "../") {
		return "", badArchive("entry %q: leads outside the destination", truncateName(raw))
	}
	return name, nil
}

func truncateName(s string) string {
	s = strings.ReplaceAll(s, "\x00", `\0`)
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// run extracts every entry into the staging directory.
func (x *extraction) run(tr *tar.Reader) error {
	bp := copyPool.Get().(*[]byte)
	defer copyPool.Put(bp)
	x.buf = *bp
	res := x.res
	for {
		h, err := tr.Next()
		if err == io.EOF && x.marked != nil && !x.marked.ended() {
			return badArchive("truncated after %d entries: the stream ends without the end-of-archive marker", res.Entries)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errdefs.Wrap(errdefs.InvalidArgument, err, "archive: malformed or truncated after %d entries", res.Entries)
		}
		if x.marked != nil {
			x.marked.entry(h)
		}
		if res.Entries++; res.Entries > maxArchiveEntries {
			return badArchive("more than %d entries", maxArchiveEntries)
		}
		name, err := entryName(h.Name)
		if err != nil {
			return err
		}
		if isSparse(h) {
			return badArchive("entry %q: sparse files are not accepted (their holes would be written out)", truncateName(h.Name))
		}
		mode := uint32(h.Mode) & 0o7777
		if name == "." {
			if h.Typeflag == tar.TypeDir {
				continue
			}
			return badArchive("entry %q: a non-directory at the top", truncateName(h.Name))
		}
		if x.ap != nil {
			skip, err := x.ap.take(name, h)
			if err != nil {
				return err
			}
			if skip {
				continue
			}
		}
		dir, base, err := parentBeneath(x.stage, name)
		if err != nil {
			return entryError(h.Name, err)
		}
		err = x.entry(dir, base, name, h, tr, mode)
		unix.Close(dir)
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeXGlobalHeader {
			x.written++
		}
	}
}

func entryError(name string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) && (errno == unix.ELOOP || errno == unix.EXDEV || errno == unix.ENOTDIR) {
		return badArchive("entry %q: goes through a symlink or a non-directory", truncateName(name))
	}
	if errdefs.ClassOf(err) != errdefs.Internal {
		return err
	}
	return errdefs.Wrap(errdefs.ClassOf(pathError(name, err)), err, "archive: entry %q", truncateName(name))
}

// extraction is one tar upload's state.
type extraction struct {
	stage    int
	buf      []byte
	res      *guestapi.ArchiveResult
	written  int               // entries staged (global headers and whiteouts not counted)
	dirModes map[string]uint32 // applied at the end: a 0555 directory must take its entries first
	ap       *applier          // an apply's rules and metadata; nil for a plain extraction
	marked   *endMarked        // the stream under tr, when its end-of-archive marker is required
}

func (x *extraction) applyDirModes(dest int) error {
	names := make([]string, 0, len(x.dirModes))
	for n := range x.dirModes {
		names = append(names, n)
	}
	// Deepest first, so a parent closes only after its children are set.
	sort.Slice(names, func(i, j int) bool { return strings.Count(names[i], "/") > strings.Count(names[j], "/") })
	for _, n := range names {
		fd, err := beneath(dest, n, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return entryError(n, err)
		}
		err = unix.Fchmodat(unix.AT_FDCWD, "/proc/self/fd/"+itoa(fd), x.dirModes[n], 0)
		unix.Close(fd)
		if err != nil && err != unix.EPERM { // EPERM: an existing directory of another owner keeps its mode
			return entryError(n, err)
		}
	}
	return nil
}

func (x *extraction) entry(dir int, base, rel string, h *tar.Header, tr *tar.Reader, mode uint32) error {
	buf, res := x.buf, x.res
	// A later entry replaces an earlier file of the same name.
	replace := func() {
		var st unix.Stat_t
		if unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			unix.Unlinkat(dir, base, 0)
		}
	}
	if x.ap != nil {
		if err := x.ap.notOverDir(dir, base, h); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		replace()
		if err := unix.Mkdirat(dir, base, 0o700); err != nil && err != unix.EEXIST {
			return entryError(h.Name, err)
		}
		if x.ap != nil {
			return x.ap.stagedDir(dir, base, rel, h)
		}
		x.dirModes[rel] = mode
	case tar.TypeReg, tar.TypeRegA:
		replace()
		fd, err := unix.Openat(dir, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return entryError(h.Name, err)
		}
		f := os.NewFile(uintptr(fd), h.Name)
		n, err := io.CopyBuffer(onlyWriter{f}, tr, buf)
		res.Bytes += n
		switch {
		case err != nil:
		case x.ap != nil:
			err = x.ap.staged(dir, base, h) // owner, mode, attributes, time
		default:
			if err = unix.Fchmod(fd, mode); err == nil {
				ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
				unix.UtimesNanoAt(dir, base, ts, unix.AT_SYMLINK_NOFOLLOW)
			}
		}
		f.Close()
		if err != nil {
			if errdefs.ClassOf(err) != errdefs.Internal {
				return err
			}
			var pe *os.PathError
			if errors.As(err, &pe) {
				return pathError("archive entry "+truncateName(h.Name), pe.Err)
			}
			return errdefs.Wrap(errdefs.InvalidArgument, err, "archive: entry %q: truncated", truncateName(h.Name))
		}
	case tar.TypeSymlink:
		if strings.IndexByte(h.Linkname, 0) >= 0 || h.Linkname == "" || len(h.Linkname) > guestapi.MaxPathLen {
			return badArchive("entry %q: not a valid symlink target", truncateName(h.Name))
		}
		replace()
		if err := unix.Symlinkat(h.Linkname, dir, base); err != nil {
			return entryError(h.Name, err)
		}
		if x.ap != nil {
			return x.ap.staged(dir, base, h)
		}
	case tar.TypeLink:
		target, err := entryName(h.Linkname)
		if err != nil || target == "." {
			return badArchive("entry %q: hard link to %q outside the archive", truncateName(h.Name), truncateName(h.Linkname))
		}
		return x.link(dir, base, target, h.Name)
	case tar.TypeFifo:
		replace()
		if err := unix.Mknodat(dir, base, unix.S_IFIFO|mode, 0); err != nil {
			return entryError(h.Name, err)
		}
		if x.ap != nil {
			return x.ap.staged(dir, base, h)
		}
	case tar.TypeXGlobalHeader:
	default:
		return badArchive("entry %q: type %q (devices and other special files) is not allowed", truncateName(h.Name), string(h.Typeflag))
	}
	return nil
}

// isSparse says whether a header is a GNU sparse file (old or PAX form).
func isSparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// onlyWriter hides everything but Write.
type onlyWriter struct{ io.Writer }

// link hard-links to an earlier regular file of the archive, found beneath
// the staging directory without following symlinks.
func (x *extraction) link(dir int, base, target, name string) error {
	tdir, tname := path.Split(target)
	odir := x.stage
	if tdir != "" {
		fd, err := beneath(x.stage, strings.TrimSuffix(tdir, "/"), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return badArchive("entry %q: hard link to %q, which the archive does not hold", truncateName(name), truncateName(target))
		}
		defer unix.Close(fd)
		odir = fd
	}
	var st unix.Stat_t
	if err := unix.Fstatat(odir, tname, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return badArchive("entry %q: hard link to %q, which is not a file of the archive", truncateName(name), truncateName(target))
	}
	var cur unix.Stat_t
	if unix.Fstatat(dir, base, &cur, unix.AT_SYMLINK_NOFOLLOW) == nil && cur.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Unlinkat(dir, base, 0)
	}
	if err := unix.Linkat(odir, tname, dir, base, 0); err != nil {
		return entryError(name, err)
	}
	return nil
}

// merge moves what stage holds into dest: directories merge, everything else
// replaces what was there.
func merge(stage, dest int, p string) error {
	names, err := readNames(stage)
	if err != nil {
		return pathError(p, err)
	}
	for _, n := range names {
		full := path.Join(p, n)
		var src, dst unix.Stat_t
		if err := unix.Fstatat(stage, n, &src, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathError(full, err)
		}
		derr := unix.Fstatat(dest, n, &dst, unix.AT_SYMLINK_NOFOLLOW)
		if derr == nil && src.Mode&unix.S_IFMT == unix.S_IFDIR && dst.Mode&unix.S_IFMT == unix.S_IFDIR {
			s, err := unix.Openat(stage, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return pathError(full, err)
			}
			d, err := unix.Openat(dest, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				unix.Close(s)
				return pathError(full, err)
			}
			err = merge(s, d, full)
			unix.Close(s)
			unix.Close(d)
			if err != nil {
				return err
			}
			continue
		}
		if err := unix.Renameat(stage, n, dest, n); err != nil {
			return pathError(full, err)
		}
	}
	return nil
}

// readNames lists a directory descriptor's names without closing it.
func readNames(dir int) ([]string, error) {
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(fd), "dir")
	defer d.Close()
	return d.Readdirnames(-1)
}
