package files

import (
	"archive/tar"
	"context"
	"io"
	"math"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Whiteout names of the OCI image layer format.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	xattrRecord    = "SCHILY.xattr." // a PAX record carrying an extended attribute
	overlayXattrs  = "user.overlay." // overlayfs's own attributes, never the sandbox's to set
)

// ApplyArchive applies a layer tar onto the directory reqPath as the caller
// (guestapi.FeatureApply has the rules). It runs in three steps:
//
//  1. Stage: the whole stream is extracted into a hidden directory at the
//     destination (same file system, so its entries can be renamed into
//     place), with every lookup beneath it and no symlink followed, as
//     ExtractArchive does; whiteouts are only recorded.
//  2. Plan: what the apply would remove or replace at the destination is
//     checked for mount points, and every implied directory for something
//     other than a directory in its way.
//  3. Apply: whiteouts move what they remove into the staging directory,
//     staged entries are renamed into place (a file over a file replaces
//     it in one rename; a directory and a non-directory trade places in one
//     exchange), and the directories' metadata goes on last, deepest first.
//     The staging directory then goes, and with it what was removed.
//
// Nothing at the destination changes before step 3, so every refusal
// leaves it as it was. Mounts inside the destination are never entered to
// remove anything, and files bound for a mounted directory are copied there
// (beside their path, then renamed over it), as a rename cannot cross.
func (s *Service) ApplyArchive(ctx context.Context, w guestapi.Where, reqPath string, in io.Reader) (guestapi.ApplyResult, error) {
	c, err := s.caller(w)
	if err != nil {
		return guestapi.ApplyResult{}, err
	}
	p, err := c.abs("path", reqPath)
	if err != nil {
		return guestapi.ApplyResult{}, err
	}
	if k, _ := kernelDir(p); k != "" {
		return guestapi.ApplyResult{}, errdefs.WithReason(errdefs.New(errdefs.PermissionDenied,
			"path: %s is in %s, the kernel's: apply does not write there", p, k), errdefs.InvalidPath)
	}
	a := &applier{p: p, owners: c.acc.Self || c.acc.UID == 0,
		dirs: map[string]meta{}, whiteouts: map[string]bool{}, opaque: map[string]bool{}}
	err = as(c.acc, func() error {
		dest, err := s.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer dest.Close()
		a.dest = int(dest.Fd())
		return a.run(ctx, in)
	})
	if err != nil {
		return guestapi.ApplyResult{}, err
	}
	return a.res, nil
}

// applier is one apply's state.
type applier struct {
	p      string // the destination, absolute in the sandbox
	dest   int    // the destination directory
	owners bool   // acting as root: owners and user.* attributes are applied

	stageName string // the staging directory's name in dest
	old       int    // the directory in the staging one where removed things go
	discarded int    // names given out in old

	dirs      map[string]meta // directory entries, by name relative to dest
	whiteouts map[string]bool // names removed, relative to dest
	opaque    map[string]bool // directories emptied, relative to dest ("." for dest)
	res       guestapi.ApplyResult
}

func (a *applier) run(ctx context.Context, in io.Reader) error {
	a.stageName = tempName("apply")
	if err := unix.Mkdirat(a.dest, a.stageName, 0o700); err != nil {
		return pathError(a.p, err)
	}
	stagePath := path.Join(a.p, a.stageName)
	defer removeTree(a.dest, a.stageName, stagePath)
	stage, err := beneath(a.dest, a.stageName, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return pathError(stagePath, err)
	}
	defer unix.Close(stage)
	for _, d := range []string{"new", "old"} {
		if err := unix.Mkdirat(stage, d, 0o700); err != nil {
			return pathError(stagePath, err)
		}
	}
	staged, err := beneath(stage, "new", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return pathError(stagePath, err)
	}
	defer unix.Close(staged)
	if a.old, err = beneath(stage, "old", unix.O_PATH|unix.O_DIRECTORY, 0); err != nil {
		return pathError(stagePath, err)
	}
	defer unix.Close(a.old)

	var counts guestapi.ArchiveResult
	marked := &endMarked{r: in}
	x := &extraction{stage: staged, res: &counts, ap: a, marked: marked}
	if err := x.run(tar.NewReader(marked)); err != nil {
		return err
	}
	a.res.Entries, a.res.Bytes = x.written, counts.Bytes
	if err := a.plan(ctx, staged); err != nil {
		return err
	}
	// From here on the destination changes.
	if err := a.removeOld(); err != nil {
		return err
	}
	if err := a.merge(staged, a.dest, "."); err != nil {
		return err
	}
	return a.applyDirs()
}

// endMarked counts what a tar.Reader takes from a stream, which tells a
// stream cut short at the end of an entry (tar.Reader takes that for a
// clean end) from one that ends with the end-of-archive marker: an apply
// of part of a layer would remove and write part of what it should.
// tar.Reader reads a stream that cannot seek block by block, never ahead.
type endMarked struct {
	r        io.Reader
	n        int64 // bytes read
	entryEnd int64 // where the last entry's data (padded to a block) ends
}

func (e *endMarked) Read(b []byte) (int, error) {
	k, err := e.r.Read(b)
	e.n += int64(k)
	return k, err
}

// entry notes the header tar.Reader just returned: its data follows.
func (e *endMarked) entry(h *tar.Header) {
	size := h.Size
	switch h.Typeflag {
	case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
		size = 0 // tar.Reader reads no data for these, whatever the size says
	}
	e.entryEnd = e.n + (size+511)/512*512
}

// ended says, once tar.Reader reports the end, whether it read a zero
// block after the last entry: the marker.
func (e *endMarked) ended() bool { return e.n-e.entryEnd >= 512 }

// kernelDir says which of /proc, /sys and /dev p is or lies under ("" for
// none), and whether it is that directory itself.
func kernelDir(p string) (dir string, at bool) {
	for _, k := range [...]string{"/proc", "/sys", "/dev"} {
		if p == k {
			return k, true
		}
		if strings.HasPrefix(p, k+"/") {
			return k, false
		}
	}
	return "", false
}

// full is rel's path in the sandbox.
func (a *applier) full(rel string) string { return path.Join(a.p, rel) }

func join(rel, name string) string {
	if rel == "." {
		return name
	}
	return rel + "/" + name
}

// take sees every entry of the stream before it is staged, with its cleaned
// name: it records whiteouts and refuses what apply does not write. skip
// says the entry is not staged.
func (a *applier) take(name string, h *tar.Header) (skip bool, err error) {
	if h.Typeflag == tar.TypeXGlobalHeader {
		return true, nil
	}
	full := a.full(name)
	if k, at := kernelDir(full); k != "" {
		if at && h.Typeflag == tar.TypeDir {
			return true, nil // the mount point of a kernel file system: nothing of it is the sandbox's
		}
		return false, badArchive("entry %q: %s is in %s, the kernel's: apply does not write or remove there", truncateName(h.Name), full, k)
	}
	dir, base := path.Split(name)
	if strings.HasPrefix(dir, whiteoutPrefix) || strings.Contains(dir, "/"+whiteoutPrefix) {
		return false, badArchive("entry %q: below a whiteout name", truncateName(h.Name))
	}
	gone, ok := strings.CutPrefix(base, whiteoutPrefix)
	if !ok {
		return false, nil
	}
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	switch {
	case base == opaqueMarker:
		a.opaque[dir] = true
	case strings.HasPrefix(gone, whiteoutPrefix):
		return false, badArchive("entry %q: %s names are reserved and not applied", truncateName(h.Name), whiteoutPrefix+whiteoutPrefix)
	case gone == "" || gone == "." || gone == "..":
		return false, badArchive("entry %q: a whiteout of %q", truncateName(h.Name), gone)
	default:
		target := join(dir, gone)
		if k, _ := kernelDir(a.full(target)); k != "" {
			return false, badArchive("entry %q: a whiteout of %s, in %s, the kernel's", truncateName(h.Name), a.full(target), k)
		}
		a.whiteouts[target] = true
	}
	a.res.Whiteouts++
	return true, nil
}

// meta is what apply sets on an entry besides its contents.
type meta struct {
	uid, gid int
	mode     uint32
	mtime    unix.Timespec
	xattrs   map[string]string
}

// metaOf reads an entry's metadata.
func metaOf(h *tar.Header) (meta, error) {
	if h.Uid < 0 || h.Gid < 0 || int64(h.Uid) >= math.MaxUint32 || int64(h.Gid) >= math.MaxUint32 {
		return meta{}, badArchive("entry %q: owner %d:%d is not a valid uid and gid", truncateName(h.Name), h.Uid, h.Gid)
	}
	m := meta{uid: h.Uid, gid: h.Gid, mode: uint32(h.Mode) & 0o7777,
		mtime: unix.Timespec{Sec: h.ModTime.Unix(), Nsec: int64(h.ModTime.Nanosecond())}}
	for k, v := range h.PAXRecords {
		n, ok := strings.CutPrefix(k, xattrRecord)
		if !ok || !strings.HasPrefix(n, "user.") || strings.HasPrefix(n, overlayXattrs) {
			continue
		}
		if m.xattrs == nil {
			m.xattrs = map[string]string{}
		}
		m.xattrs[n] = v
	}
	return m, nil
}

// staged sets a staged entry's metadata (h's): a file once its bytes are
// in, a symlink or a FIFO once made.
func (a *applier) staged(dir int, base string, h *tar.Header) error {
	m, err := metaOf(h)
	if err != nil {
		return err
	}
	return a.set(dir, base, m, "archive entry "+truncateName(h.Name))
}

// notOverDir refuses a second entry of a name the stream made a directory,
// of another type (an archive is a tree: one entry a name, or one
// directory given twice).
func (a *applier) notOverDir(dir int, base string, h *tar.Header) error {
	if h.Typeflag == tar.TypeDir || h.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return badArchive("entry %q: an earlier entry made it a directory", truncateName(h.Name))
	}
	return nil
}

// stagedDir records a directory entry, whose metadata goes on once its
// contents are in place. Its owner and attributes are set on the staged
// directory already, so that a bad one is refused before anything changes;
// its mode stays 0700 meanwhile (the directory must take entries).
func (a *applier) stagedDir(dir int, base, rel string, h *tar.Header) error {
	m, err := metaOf(h)
	if err != nil {
		return err
	}
	a.dirs[rel] = m
	early := m
	early.mode = 0o700
	return a.set(dir, base, early, "archive entry "+truncateName(h.Name))
}

// set applies m to base in dir, without following it: the owner first (a
// change of owner clears setuid and setgid), then the mode, the user.*
// attributes (files and directories only: the kernel takes them on nothing
// else), and the time last. Acting as another user than root, only the mode
// and time are set, as for ExtractArchive. label names base in errors.
func (a *applier) set(dir int, base string, m meta, label string) error {
	fd, err := unix.Openat(dir, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError(label, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return pathError(label, err)
	}
	typ := st.Mode & unix.S_IFMT
	self := "/proc/self/fd/" + itoa(fd)
	if a.owners {
		if err := unix.Fchownat(fd, "", m.uid, m.gid, unix.AT_EMPTY_PATH); err != nil {
			if err == unix.EINVAL {
				return errdefs.New(errdefs.InvalidArgument, "%s: owner %d:%d is not mapped in this sandbox", label, m.uid, m.gid)
			}
			return pathError(label, err)
		}
	}
	if typ != unix.S_IFLNK {
		if err := unix.Fchmodat(unix.AT_FDCWD, self, m.mode, 0); err != nil {
			return pathError(label, err)
		}
	}
	if a.owners && (typ == unix.S_IFREG || typ == unix.S_IFDIR) {
		names := make([]string, 0, len(m.xattrs))
		for n := range m.xattrs {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if err := unix.Setxattr(self, n, []byte(m.xattrs[n]), 0); err != nil {
				switch err {
				case unix.EINVAL, unix.ERANGE, unix.E2BIG, unix.ENOTSUP, unix.EPERM:
					return errdefs.Wrap(errdefs.InvalidArgument, err, "%s: attribute %q cannot be set here", label, truncateName(n))
				}
				return pathError(label, err)
			}
		}
	}
	ts := []unix.Timespec{m.mtime, m.mtime}
	if err := unix.UtimesNanoAt(dir, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathError(label, err)
	}
	return nil
}

// gone says whether the apply removes rel from the destination before
// merging (a whiteout of it, or its directory made opaque).
func (a *applier) gone(rel string) bool {
	return a.whiteouts[rel] || a.opaque[path.Dir(rel)]
}

// reserved says whether name in the destination directory rel is left
// alone by an opaque marker there: the staging directory, and the kernel's.
func (a *applier) reserved(rel, name string) bool {
	if rel != "." {
		return false
	}
	k, _ := kernelDir(a.full(name))
	return name == a.stageName || k != ""
}

// plan checks what the apply would do to the destination, changing nothing:
// it refuses to remove or replace a mount point (or a tree holding one),
// and a directory the tar only implies where the destination has something
// else.
func (a *applier) plan(ctx context.Context, staged int) error {
	for _, rel := range sortedKeys(a.whiteouts) {
		dir, name, ok, err := a.lookup(rel)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		err = a.removable(ctx, dir, name, a.full(rel))
		unix.Close(dir)
		if err != nil {
			return err
		}
	}
	for _, rel := range sortedKeys(a.opaque) {
		if err := a.eachOld(rel, func(dir int, name string) error {
			return a.removable(ctx, dir, name, a.full(join(rel, name)))
		}); err != nil {
			return err
		}
	}
	return a.planMerge(ctx, staged, a.dest, ".")
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// lookup opens the destination directory that holds rel, following no
// symlink; ok is false when there is none (a missing path, or a symlink or
// file where a directory would be: a whiteout there removes nothing).
func (a *applier) lookup(rel string) (dir int, name string, ok bool, err error) {
	parent, name := path.Split(rel)
	parent = strings.TrimSuffix(parent, "/")
	if parent == "" {
		parent = "."
	}
	dir, err = beneath(a.dest, parent, unix.O_PATH|unix.O_DIRECTORY, 0)
	switch err {
	case nil:
		return dir, name, true, nil
	case unix.ENOENT, unix.ENOTDIR, unix.ELOOP:
		return -1, "", false, nil
	}
	return -1, "", false, pathError(a.full(parent), err)
}

// eachOld calls fn for every name the destination directory rel holds
// that an opaque marker there removes.
func (a *applier) eachOld(rel string, fn func(dir int, name string) error) error {
	dir, err := beneath(a.dest, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	switch err {
	case nil:
	case unix.ENOENT, unix.ENOTDIR, unix.ELOOP:
		return nil // nothing there to empty
	default:
		return pathError(a.full(rel), err)
	}
	defer unix.Close(dir)
	names, err := readNames(dir)
	if err != nil {
		return pathError(a.full(rel), err)
	}
	sort.Strings(names)
	for _, n := range names {
		if a.reserved(rel, n) {
			continue
		}
		if err := fn(dir, n); err != nil {
			return err
		}
	}
	return nil
}

// noXDev opens name in dir as beneath does, refusing (EXDEV) to cross into
// another mount, the name itself included.
func noXDev(dir int, name string, flags int) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	return unix.Openat2(dir, name, &how)
}

func mountInTheWay(full string) error {
	return errdefs.New(errdefs.Conflict, "%s: a mount point; apply does not remove or replace mount points", full)
}

// removable checks that name in dir (full in the sandbox) can go: it is no
// mount point and holds none.
func (a *applier) removable(ctx context.Context, dir int, name, full string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fd, err := noXDev(dir, name, unix.O_PATH)
	switch err {
	case nil:
	case unix.ENOENT:
		return nil
	case unix.EXDEV:
		return mountInTheWay(full)
	default:
		return pathError(full, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return pathError(full, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	names, err := readNames(fd)
	if err != nil {
		return pathError(full, err)
	}
	for _, n := range names {
		if err := a.removable(ctx, fd, n, path.Join(full, n)); err != nil {
			return err
		}
	}
	return nil
}

// planMerge walks what is staged beside the destination and checks what
// each entry replaces there.
func (a *applier) planMerge(ctx context.Context, staged, dest int, rel string) error {
	names, err := readNames(staged)
	if err != nil {
		return pathError(a.full(rel), err)
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		r := join(rel, n)
		if a.gone(r) {
			continue // removed first: the entry goes where nothing is
		}
		var src, dst unix.Stat_t
		if err := unix.Fstatat(staged, n, &src, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathError(a.full(r), err)
		}
		if err := unix.Fstatat(dest, n, &dst, unix.AT_SYMLINK_NOFOLLOW); err == unix.ENOENT {
			continue
		} else if err != nil {
			return pathError(a.full(r), err)
		}
		srcDir, dstDir := src.Mode&unix.S_IFMT == unix.S_IFDIR, dst.Mode&unix.S_IFMT == unix.S_IFDIR
		switch {
		case srcDir && dstDir:
			err = a.descend(staged, dest, n, r, func(s, d int) error { return a.planMerge(ctx, s, d, r) })
		case srcDir && !a.explicit(r):
			err = impliedOver(a.full(r), dst.Mode)
		default:
			err = a.removable(ctx, dest, n, a.full(r))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (a *applier) explicit(rel string) bool {
	_, ok := a.dirs[rel]
	return ok
}

func impliedOver(full string, mode uint32) error {
	return errdefs.WithReason(errdefs.New(errdefs.Conflict,
		"%s: the archive puts entries below it without an entry for it, and the destination has a %s there, not a directory "+
			"(an entry for the directory would replace it)", full, fileType(mode)), errdefs.NotDirectory)
}

// descend opens directory name in staged and in dest and calls fn with both.
func (a *applier) descend(staged, dest int, name, rel string, fn func(s, d int) error) error {
	full := a.full(rel)
	s, err := unix.Openat(staged, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError(full, err)
	}
	defer unix.Close(s)
	d, err := unix.Openat(dest, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError(full, err)
	}
	defer unix.Close(d)
	if err := notProc(d, full); err != nil {
		return err
	}
	return fn(s, d)
}

// removeOld applies the whiteouts and opaque markers.
func (a *applier) removeOld() error {
	for _, rel := range sortedKeys(a.whiteouts) {
		dir, name, ok, err := a.lookup(rel)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		err = a.discard(dir, name, a.full(rel))
		unix.Close(dir)
		if err != nil {
			return err
		}
	}
	for _, rel := range sortedKeys(a.opaque) {
		if err := a.eachOld(rel, func(dir int, name string) error {
			return a.discard(dir, name, a.full(join(rel, name)))
		}); err != nil {
			return err
		}
	}
	return nil
}

// discard removes name in dir: it moves into the staging directory (gone
// from the destination in one step, deleted with the staging directory),
// or, on another mount, is removed where it is.
func (a *applier) discard(dir int, name, full string) error {
	a.discarded++
	err := unix.Renameat(dir, name, a.old, strconv.Itoa(a.discarded))
	switch err {
	case nil, unix.ENOENT:
		return nil
	case unix.EXDEV, unix.EACCES, unix.EPERM:
		// Another mount, or a directory this user may not move (its ".."
		// would change) but may empty.
		return removeTree(dir, name, full)
	}
	return pathError(full, err)
}

// merge moves what is staged into dest: a directory into a directory
// merges, everything else replaces what is there.
func (a *applier) merge(staged, dest int, rel string) error {
	names, err := readNames(staged)
	if err != nil {
		return pathError(a.full(rel), err)
	}
	for _, n := range names {
		r := join(rel, n)
		full := a.full(r)
		var src, dst unix.Stat_t
		if err := unix.Fstatat(staged, n, &src, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathError(full, err)
		}
		derr := unix.Fstatat(dest, n, &dst, unix.AT_SYMLINK_NOFOLLOW)
		if derr != nil && derr != unix.ENOENT {
			return pathError(full, derr)
		}
		srcDir, dstDir := src.Mode&unix.S_IFMT == unix.S_IFDIR, derr == nil && dst.Mode&unix.S_IFMT == unix.S_IFDIR
		switch {
		case derr == unix.ENOENT:
			err = a.place(staged, dest, n, full)
		case srcDir && dstDir:
			err = a.descend(staged, dest, n, r, func(s, d int) error { return a.merge(s, d, r) })
		case srcDir && !a.explicit(r):
			err = impliedOver(full, dst.Mode) // changed since the plan
		case !srcDir && !dstDir:
			err = a.place(staged, dest, n, full)
		default:
			err = a.swap(staged, dest, n, full)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// place renames name from staged into dest, over a non-directory there;
// across mounts it copies.
func (a *applier) place(staged, dest int, name, full string) error {
	err := unix.Renameat(staged, name, dest, name)
	if err == unix.EXDEV {
		return a.copyIn(staged, dest, name, full)
	}
	return pathErrorOrNil(full, err)
}

// swap puts a directory where a non-directory is, or the other way round:
// the two trade places in one step, and the old one is deleted with the
// staging directory.
func (a *applier) swap(staged, dest int, name, full string) error {
	err := unix.Renameat2(staged, name, dest, name, unix.RENAME_EXCHANGE)
	switch err {
	case nil:
		return nil
	case unix.EXDEV:
		if err := removeTree(dest, name, full); err != nil {
			return err
		}
		return a.copyIn(staged, dest, name, full)
	case unix.EINVAL: // a file system without exchange
		if err := a.discard(dest, name, full); err != nil {
			return err
		}
		return a.place(staged, dest, name, full)
	}
	return pathError(full, err)
}

// copyIn copies name from staged into dest, on another mount: to a
// temporary name beside it first, then renamed over it.
func (a *applier) copyIn(staged, dest int, name, full string) error {
	tmp := tempName(name)
	err := a.copyNode(staged, name, dest, tmp, full)
	if err == nil {
		err = pathErrorOrNil(full, unix.Renameat(dest, tmp, dest, name))
	}
	if err != nil {
		removeTree(dest, tmp, full)
	}
	return err
}

// copyNode copies a staged file, symlink, FIFO or tree with its metadata.
// Hard links between the copied files are not kept.
func (a *applier) copyNode(from int, name string, to int, toName, full string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(from, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathError(full, err)
	}
	m := meta{uid: int(st.Uid), gid: int(st.Gid), mode: st.Mode & 0o7777, mtime: st.Mtim}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(to, toName, 0o700); err != nil {
			return pathError(full, err)
		}
		src, err := unix.Openat(from, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return pathError(full, err)
		}
		defer unix.Close(src)
		dst, err := unix.Openat(to, toName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return pathError(full, err)
		}
		defer unix.Close(dst)
		names, err := readNames(src)
		if err != nil {
			return pathError(full, err)
		}
		for _, n := range names {
			if err := a.copyNode(src, n, dst, n, path.Join(full, n)); err != nil {
				return err
			}
		}
		if err := a.copyXattrs(src, &m, full); err != nil {
			return err
		}
	case unix.S_IFREG:
		src, err := unix.Openat(from, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return pathError(full, err)
		}
		in := os.NewFile(uintptr(src), full)
		defer in.Close()
		dst, err := unix.Openat(to, toName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return pathError(full, err)
		}
		out := os.NewFile(uintptr(dst), full)
		_, err = copyBuffered(out, in)
		if cerr := out.Close(); err == nil && cerr != nil {
			err = pathError(full, cerr)
		}
		if err != nil {
			return err
		}
		if err := a.copyXattrs(src, &m, full); err != nil {
			return err
		}
	case unix.S_IFLNK:
		buf := make([]byte, guestapi.MaxPathLen)
		k, err := unix.Readlinkat(from, name, buf)
		if err != nil {
			return pathError(full, err)
		}
		if err := unix.Symlinkat(string(buf[:k]), to, toName); err != nil {
			return pathError(full, err)
		}
	case unix.S_IFIFO:
		if err := unix.Mknodat(to, toName, unix.S_IFIFO|0o600, 0); err != nil {
			return pathError(full, err)
		}
	default:
		return nil // the staging directory holds nothing else
	}
	return a.set(to, toName, m, full)
}

func (a *applier) copyXattrs(fd int, m *meta, full string) error {
	if !a.owners {
		return nil // set applies none
	}
	var err error
	m.xattrs, err = userXattrs(fd)
	return pathErrorOrNil(full, err)
}

// userXattrs reads the user.* attributes of fd (overlayfs's own left out).
func userXattrs(fd int) (map[string]string, error) {
	self := "/proc/self/fd/" + itoa(fd)
	buf := make([]byte, 4096)
	for {
		n, err := unix.Listxattr(self, buf)
		if err == unix.ERANGE && len(buf) < 1<<20 {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err == unix.ENOTSUP {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		buf = buf[:n]
		break
	}
	var out map[string]string
	for _, name := range strings.Split(string(buf), "\x00") {
		if !strings.HasPrefix(name, "user.") || strings.HasPrefix(name, overlayXattrs) {
			continue
		}
		val := make([]byte, 4096)
		for {
			n, err := unix.Getxattr(self, name, val)
			if err == unix.ERANGE && len(val) < 1<<20 {
				val = make([]byte, len(val)*4)
				continue
			}
			if err == unix.ENODATA {
				break // gone meanwhile
			}
			if err != nil {
				return nil, err
			}
			if out == nil {
				out = map[string]string{}
			}
			out[name] = string(val[:n])
			break
		}
	}
	return out, nil
}

// applyDirs sets the directory entries' metadata at the destination,
// deepest first: a directory takes its mode once its entries are in, and
// its time once nothing below it changes any more.
func (a *applier) applyDirs() error {
	rels := make([]string, 0, len(a.dirs))
	for r := range a.dirs {
		rels = append(rels, r)
	}
	sort.Slice(rels, func(i, j int) bool {
		if di, dj := strings.Count(rels[i], "/"), strings.Count(rels[j], "/"); di != dj {
			return di > dj
		}
		return rels[i] < rels[j]
	})
	for _, r := range rels {
		dir, name, ok, err := a.lookup(r)
		if err != nil {
			return err
		}
		if !ok {
			return pathError(a.full(r), unix.ENOENT) // moved in, then gone: something else is changing it
		}
		err = a.set(dir, name, a.dirs[r], a.full(r))
		unix.Close(dir)
		if err != nil && !(errdefs.IsPermissionDenied(err) && !a.owners) {
			// Acting as a user, an existing directory of another owner
			// keeps its mode and time, as ExtractArchive's do.
			return err
		}
	}
	return nil
}

// removeTree removes name in dir and everything below it, following no
// symlink and entering no other mount: a mount point met on the way is
// refused (what a mount holds is not the apply's to remove).
func removeTree(dir int, name, full string) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return pathError(full, err)
	}
	fd, oerr := noXDev(dir, name, unix.O_RDONLY|unix.O_DIRECTORY)
	switch oerr {
	case nil:
	case unix.EXDEV:
		return mountInTheWay(full)
	case unix.ENOTDIR:
		return pathError(full, err) // not a directory: the unlink's own refusal
	default:
		return pathError(full, oerr)
	}
	names, rerr := readNames(fd)
	for _, n := range names {
		if err := removeTree(fd, n, path.Join(full, n)); err != nil {
			unix.Close(fd)
			return err
		}
	}
	unix.Close(fd)
	if rerr != nil {
		return pathError(full, rerr)
	}
	return pathErrorOrNil(full, unix.Unlinkat(dir, name, unix.AT_REMOVEDIR))
}
