package layerdiff

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/layerfs"
)

// SinceMargin is how long before a pass began the next pass's
// CopyOptions.Since should lie. The kernel stamps ctime from a clock that
// is advanced once a tick (up to 10 ms behind the clock a pass reads), so a
// change made just as a pass began can carry a time a little before it.
const SinceMargin = 50 * time.Millisecond

// maxDepth bounds how deep a copy descends: each level holds two
// descriptors open, and a hostile layer could nest directories until the
// daemon had none left.
const maxDepth = 1024

// CopyOptions shape a copy.
type CopyOptions struct {
	// IDs and Skip are as in Options.
	IDs  IDs
	Skip map[string][]byte
	// Since, when set, makes the pass incremental: dst holds what an earlier
	// Copy of the same layer made, a pass that began at Since (less
	// SinceMargin). Entries whose ctime is Since or later (Since rounded
	// down to the second, for file systems that keep whole seconds, unless
	// FineTimes),
	// hard-linked files, and entries missing from dst or of another type
	// there are copied again, entries gone from the layer are removed from
	// dst, and directories' attributes are set again: dst becomes an exact
	// copy after one walk of the layer and what changed. A pass without
	// Since copies everything (over whatever dst held).
	Since time.Time
	// FineTimes says the layer's file system keeps ctimes finer than a
	// second (an earlier pass's CopyStats.FineTimes): Since is then taken
	// as it is, and a file written just before a snapshot is not copied
	// again while the sandbox is frozen.
	FineTimes bool
	// Live says the sandbox may still be running: this pass is a first one,
	// to be followed by one with Since while the sandbox is frozen. An entry
	// that changes while it is copied is then left to that pass (counted in
	// CopyStats.Changed) instead of failing the copy, and each file's
	// pending writes are flushed before it is read, so that a later write
	// through a shared memory mapping updates its ctime (a dirty page
	// mapped writable takes further writes without the kernel noticing).
	Live bool
}

// CopyStats is what a copy holds and what its pass did.
type CopyStats struct {
	Entries int   // entries dst holds (its root aside), whiteouts included; 0 for nothing but skipped files
	Bytes   int64 // bytes of file content dst holds, a hard-linked file's once

	Copied      int   // entries this pass made in dst: all of them, in a first pass
	CopiedBytes int64 // bytes of file content this pass copied or reflinked
	Removed     int   // entries this pass removed from dst, those it made again included
	Changed     int   // entries that changed while they were read, left to the next pass (Live)
	Reflinked   bool  // some content was reflinked (shared with the layer's file), not copied
	// FineTimes says an entry this pass looked at had a ctime with
	// nanoseconds: its file system keeps times finer than a second (on one
	// that keeps whole seconds every ctime's nanoseconds are 0).
	FineTimes bool
}

// Copy copies the layer in directory upper into directory dst, an empty
// one (or a copy an earlier pass made, see CopyOptions.Since) on the same
// file system, for use as an overlay lower layer: regular files, directories,
// symlinks, fifos and whiteouts (0/0 character devices) with their mode,
// owner (as the sandbox sees it), times and user.* attributes, overlay's
// opaque mark kept and its other attributes left out, hard links kept as
// links; dst's own attributes become upper's. Sockets and other devices
// are left out: no layer carries them. Like Write, it leaves out the files
// Skip names and the directories that hold nothing else.
//
// File contents are reflinked where the file system can (XFS, btrfs),
// else copied in the kernel (copy_file_range) or, failing that, read and
// written, holes kept, by a few workers at once. Copy does not sync: the
// caller syncs dst before it relies on it. On error (ENOSPC among them)
// dst holds part of the copy: the caller removes it.
func Copy(dst, upper string, o CopyOptions) (CopyStats, error) {
	src, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return CopyStats{}, fmt.Errorf("open the writable layer: %w", err)
	}
	defer unix.Close(src)
	root, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return CopyStats{}, fmt.Errorf("open the layer copy: %w", err)
	}
	defer unix.Close(root)
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return CopyStats{}, fmt.Errorf("stat the writable layer: %w", err)
	}
	c := &copier{o: o, root: root, links: map[[2]uint64]string{}}
	if !o.Since.IsZero() {
		c.since = o.Since.UnixNano()
		if !o.FineTimes {
			c.since = o.Since.Truncate(time.Second).UnixNano()
		}
	}
	c.start(min(4, runtime.GOMAXPROCS(0)*2))
	_, err = c.dir(src, root, "", &st, false, 0)
	if err != nil {
		c.failed.Store(true) // the files queued are not copied
	}
	if werr := c.finish(); err == nil || errors.Is(err, errStopped) {
		err = werr
	}
	c.stats.Changed += int(c.changed.Load())
	c.stats.Reflinked = c.reflinked.Load()
	c.stats.FineTimes = c.fine.Load()
	return c.stats, err
}

// errStopped ends a walk whose workers failed; their error is the copy's.
var errStopped = errors.New("stopped")

// Whether the file system reflinks, or copies in the kernel: unknown until
// a file tells. Once it has worked, a failure is taken as the file's own.
const (
	unknown int32 = iota
	works
	fails
)

type copier struct {
	o     CopyOptions
	since int64 // o.Since in ns, 0 for a full pass
	root  int   // dst
	stats CopyStats
	links map[[2]uint64]string // device and inode -> name of its first copy, for hard links

	jobs      chan fileJob
	wg        sync.WaitGroup
	mu        sync.Mutex
	err       error // the first worker's error
	failed    atomic.Bool
	reflink   atomic.Int32 // unknown, works, fails
	kernel    atomic.Int32 // copy_file_range: unknown, works, fails
	reflinked atomic.Bool
	changed   atomic.Int32 // files that shrank while a Live pass read them
	fine      atomic.Bool  // a ctime with nanoseconds was seen
}

// saw notes an entry's times (for CopyStats.FineTimes).
func (c *copier) saw(st *unix.Stat_t) {
	if st.Ctim.Nsec != 0 {
		c.fine.Store(true)
	}
}

// fileJob is a file whose content and attributes a worker copies: in is
// the layer's file, out its copy, both open.
type fileJob struct {
	in, out int
	rel     string
	st      unix.Stat_t
}

func (c *copier) start(workers int) {
	c.jobs = make(chan fileJob, 4*workers)
	for range workers {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			var buf []byte
			for j := range c.jobs {
				if !c.failed.Load() {
					if err := c.copyFile(j, &buf); err != nil {
						c.fail(err)
					}
				}
				unix.Close(j.in)
				unix.Close(j.out)
			}
		}()
	}
}

func (c *copier) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.failed.Store(true)
}

// finish waits for the workers and returns the first one's error.
func (c *copier) finish() error {
	close(c.jobs)
	c.wg.Wait()
	return c.err
}

// changedSince says whether an entry of the layer must be copied again.
func (c *copier) changedSince(st *unix.Stat_t) bool {
	return c.since == 0 || st.Ctim.Nano() >= c.since || st.Nlink > 1 && !isWhiteout(st)
}

func isWhiteout(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 }

// raced handles an entry that changed between two looks at it: an error,
// unless the pass is Live and the next pass will copy it.
func (c *copier) raced(rel string) error {
	if c.o.Live {
		c.stats.Changed++
		return nil
	}
	return fmt.Errorf("%s changed while it was copied (is the sandbox frozen?)", show(rel))
}

// dir brings directory dfd of the copy (rel; "" the root) up to date with
// directory ufd of the layer, whose stat is st; fresh says dfd was just
// made. It reports whether the directory belongs in the copy: it holds
// something, or is new and empty, or opaque (what Write would write).
func (c *copier) dir(ufd, dfd int, rel string, st *unix.Stat_t, fresh bool, depth int) (bool, error) {
	if depth > maxDepth {
		return false, fmt.Errorf("%s: over %d directories deep", show(rel), maxDepth)
	}
	attrs, opaque, err := userXattrs(ufd, rel)
	if err != nil {
		return false, err
	}
	ents, err := readEntries(ufd)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", show(rel), err)
	}
	var have map[string]uint32 // what dfd holds: name -> type
	if !fresh {
		old, err := readEntries(dfd)
		if err != nil {
			return false, fmt.Errorf("read the copy of %s: %w", show(rel), err)
		}
		have = make(map[string]uint32, len(old))
		for _, e := range old {
			have[e.name] = e.kind
		}
	}
	slices.SortFunc(ents, func(a, b dirent) int { return strings.Compare(a.name, b.name) })
	held := 0
	for _, e := range ents {
		if c.failed.Load() {
			return false, errStopped
		}
		had := have[e.name]
		delete(have, e.name)
		kept, err := c.entry(ufd, dfd, rel, e, had, depth)
		if err != nil {
			return false, err
		}
		if kept {
			held++
			c.stats.Entries++
		}
	}
	for name, kind := range have { // gone from the layer
		if err := c.remove(dfd, joinName(rel, name), name, kind); err != nil {
			return false, err
		}
	}
	if rel != "" && held == 0 && len(ents) > 0 && !opaque {
		return false, nil
	}
	// A directory's attributes are set once its entries are made, as
	// making them changes its mtime.
	if fresh || c.since == 0 || st.Ctim.Nano() >= c.since {
		if opaque {
			attrs = append(attrs, layerfs.Xattr{Name: layerfs.Opaque, Value: []byte("y")})
		}
		if err := setXattrs(dfd, rel, attrs, !fresh); err != nil {
			return false, err
		}
		if err := c.owner(dfd, rel, st); err != nil {
			return false, err
		}
	}
	return true, setTimes(dfd, "", rel, st)
}

// entry brings e, in directory dfd of the copy and ufd of the layer, up
// to date; had is the type of what dfd holds by that name (0: nothing). It
// reports whether the copy holds the entry.
func (c *copier) entry(ufd, dfd int, parent string, e dirent, had uint32, depth int) (bool, error) {
	name, rel := e.name, joinName(parent, e.name)
	if e.kind == unix.S_IFREG && (c.since == 0 || had != unix.S_IFREG) {
		// A file copied whatever its ctime: stated once open.
		if err := c.remove(dfd, rel, name, had); err != nil {
			return false, err
		}
		return c.file(ufd, dfd, parent, rel, name, e.ino)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(ufd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, c.remove(dfd, rel, name, had)
		}
		return false, fmt.Errorf("stat %s: %w", show(rel), err)
	}
	c.saw(&st)
	kind := st.Mode & unix.S_IFMT
	switch {
	case kind == unix.S_IFDIR:
		return c.subdir(ufd, dfd, rel, name, had, depth)
	case kind == unix.S_IFREG, kind == unix.S_IFLNK, kind == unix.S_IFIFO, isWhiteout(&st):
	default: // sockets, devices: nothing a layer carries
		return false, c.remove(dfd, rel, name, had)
	}
	if had == kind && !c.changedSince(&st) {
		if kind == unix.S_IFREG {
			c.stats.Bytes += st.Size
		}
		return true, nil
	}
	if err := c.remove(dfd, rel, name, had); err != nil {
		return false, err
	}
	if kind == unix.S_IFREG {
		return c.file(ufd, dfd, parent, rel, name, st.Ino)
	}
	// Hard links are kept (a file's by file); overlay's whiteouts share
	// one inode, but are each made anew.
	var key [2]uint64
	linked := st.Nlink > 1 && !isWhiteout(&st)
	if linked {
		key = [2]uint64{st.Dev, st.Ino}
		if first, ok := c.links[key]; ok {
			return c.link(dfd, parent, rel, name, first)
		}
	}
	var kept bool
	var err error
	switch kind {
	case unix.S_IFLNK:
		kept, err = c.symlink(ufd, dfd, rel, name, &st)
	case unix.S_IFIFO:
		kept, err = c.fifo(dfd, rel, name, &st)
	default:
		kept, err = c.whiteout(dfd, rel, name, &st)
	}
	if kept {
		c.stats.Copied++
		if linked {
			c.links[key] = rel
		}
	}
	return kept, err
}

func (c *copier) subdir(ufd, dfd int, rel, name string, had uint32, depth int) (bool, error) {
	fd, err := unix.Openat(ufd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, c.remove(dfd, rel, name, had)
		}
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			if err := c.remove(dfd, rel, name, had); err != nil {
				return false, err
			}
			return false, c.raced(rel)
		}
		return false, fmt.Errorf("open %s: %w", show(rel), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", show(rel), err)
	}
	c.saw(&st)
	fresh := had != unix.S_IFDIR
	if fresh {
		if err := c.remove(dfd, rel, name, had); err != nil {
			return false, err
		}
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return false, fmt.Errorf("make %s: %w", show(rel), err)
		}
	}
	out, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open the copy of %s: %w", show(rel), err)
	}
	defer unix.Close(out)
	kept, err := c.dir(fd, out, rel, &st, fresh, depth+1)
	if err != nil {
		return false, err
	}
	if !kept { // it holds nothing but skipped files
		if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil {
			return false, fmt.Errorf("remove %s: %w", show(rel), err)
		}
		if !fresh {
			c.stats.Removed++
		}
		return false, nil
	}
	if fresh {
		c.stats.Copied++
	}
	return true, nil
}

// file makes name a copy of the layer's regular file, inode ino: opened
// and made here, so a hard link to it can follow at once, and filled by a
// worker.
func (c *copier) file(ufd, dfd int, parent, rel, name string, ino uint64) (bool, error) {
	in, err := unix.Openat(ufd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENXIO) {
			return false, c.raced(rel)
		}
		return false, fmt.Errorf("open %s: %w", show(rel), err)
	}
	j := fileJob{in: in, out: -1, rel: rel}
	defer func() {
		if j.in >= 0 {
			unix.Close(j.in)
		}
	}()
	if err := unix.Fstat(in, &j.st); err != nil || j.st.Mode&unix.S_IFMT != unix.S_IFREG || j.st.Ino != ino {
		return false, c.raced(rel)
	}
	c.saw(&j.st)
	if layerfs.Skipped(c.o.Skip, "/"+rel, in, j.st.Size) {
		return false, nil
	}
	key := [2]uint64{j.st.Dev, j.st.Ino}
	if j.st.Nlink > 1 {
		if first, ok := c.links[key]; ok {
			return c.link(dfd, parent, rel, name, first)
		}
	}
	j.out, err = unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, fmt.Errorf("make %s: %w", show(rel), err)
	}
	if j.st.Nlink > 1 {
		c.links[key] = rel
	}
	c.stats.Copied++
	c.stats.Bytes += j.st.Size
	c.stats.CopiedBytes += j.st.Size
	c.jobs <- j
	j.in = -1 // the worker's now
	return true, nil
}

func (c *copier) symlink(ufd, dfd int, rel, name string, st *unix.Stat_t) (bool, error) {
	target, err := layerfs.ReadLink(ufd, name)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		if errors.Is(err, unix.EINVAL) { // no longer a symlink
			return false, c.raced(rel)
		}
		return false, fmt.Errorf("read link %s: %w", show(rel), err)
	}
	if err := unix.Symlinkat(target, dfd, name); err != nil {
		return false, fmt.Errorf("make %s: %w", show(rel), err)
	}
	if err := unix.Fchownat(dfd, name, c.o.IDs.inside(st.Uid), c.o.IDs.inside(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, fmt.Errorf("chown %s: %w", show(rel), err)
	}
	return true, setTimes(dfd, name, rel, st)
}

func (c *copier) fifo(dfd int, rel, name string, st *unix.Stat_t) (bool, error) {
	if err := unix.Mknodat(dfd, name, unix.S_IFIFO|0o600, 0); err != nil {
		return false, fmt.Errorf("make %s: %w", show(rel), err)
	}
	// Opened (which a fifo allows without a writer when non-blocking) to be
	// changed through its descriptor, not its name.
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open the copy of %s: %w", show(rel), err)
	}
	defer unix.Close(fd)
	if err := c.owner(fd, rel, st); err != nil {
		return false, err
	}
	return true, setTimes(fd, "", rel, st)
}

// whiteout makes a whiteout as overlay does: a character device 0/0 with
// no permissions.
func (c *copier) whiteout(dfd int, rel, name string, st *unix.Stat_t) (bool, error) {
	if err := unix.Mknodat(dfd, name, unix.S_IFCHR, 0); err != nil {
		return false, fmt.Errorf("make %s: %w", show(rel), err)
	}
	if err := unix.Fchownat(dfd, name, c.o.IDs.inside(st.Uid), c.o.IDs.inside(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, fmt.Errorf("chown %s: %w", show(rel), err)
	}
	return true, setTimes(dfd, name, rel, st)
}

// link makes name in dfd (parent's copy) a hard link to first, an entry
// this pass copied.
func (c *copier) link(dfd int, parent, rel, name, first string) (bool, error) {
	dir, base := path.Split(first)
	dir = strings.TrimSuffix(dir, "/")
	fd := dfd
	if dir != parent {
		fd = c.root
		if dir != "" {
			how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
			var err error
			if fd, err = unix.Openat2(c.root, dir, how); err != nil {
				return false, fmt.Errorf("open the copy of %s: %w", show(dir), err)
			}
			defer unix.Close(fd)
		}
	}
	if err := unix.Linkat(fd, base, dfd, name, 0); err != nil {
		return false, fmt.Errorf("link %s to %s: %w", show(rel), show(first), err)
	}
	c.stats.Copied++
	return true, nil
}

// remove removes name, of type kind (0: nothing), from directory dfd of
// the copy, a directory with all it holds.
func (c *copier) remove(dfd int, rel, name string, kind uint32) error {
	if kind == 0 {
		return nil
	}
	flags := 0
	if kind == unix.S_IFDIR {
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open the copy of %s: %w", show(rel), err)
		}
		ents, err := readEntries(fd)
		for _, e := range ents {
			if err == nil {
				err = c.remove(fd, rel+"/"+e.name, e.name, e.kind)
			}
		}
		unix.Close(fd)
		if err != nil {
			return err
		}
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(dfd, name, flags); err != nil {
		return fmt.Errorf("remove the copy of %s: %w", show(rel), err)
	}
	c.stats.Removed++
	return nil
}

// copyFile fills a copied file and gives it the layer's file's attributes.
// Its size is the one the walk saw; a file that has grown since is
// copied as far as that (a Live pass leaves the rest to the next).
func (c *copier) copyFile(j fileJob, buf *[]byte) error {
	reflinked, err := c.content(j.out, j.in, &j.st, buf)
	if errors.Is(err, errShrank) && c.o.Live {
		c.changed.Add(1)
	} else if errors.Is(err, errShrank) {
		return fmt.Errorf("%s shrank while it was copied (is the sandbox frozen?)", show(j.rel))
	} else if err != nil {
		return fmt.Errorf("copy %s: %w", show(j.rel), err)
	}
	if reflinked {
		c.reflinked.Store(true)
	}
	attrs, _, err := userXattrs(j.in, j.rel)
	if err != nil {
		return err
	}
	if err := setXattrs(j.out, j.rel, attrs, false); err != nil {
		return err
	}
	if err := c.owner(j.out, j.rel, &j.st); err != nil {
		return err
	}
	return setTimes(j.out, "", j.rel, &j.st)
}

var errShrank = errors.New("shrank")

// content copies st.Size bytes of in to out: a reflink if the file system
// can, else in the kernel or through buf, holes kept.
func (c *copier) content(out, in int, st *unix.Stat_t, buf *[]byte) (reflinked bool, err error) {
	if st.Size == 0 {
		return false, nil
	}
	if c.reflink.Load() != fails {
		err := unix.IoctlFileClone(out, in)
		if err == nil {
			c.reflink.Store(works)
			return true, nil
		}
		if !cannot(err) {
			return false, fmt.Errorf("reflink: %w", err)
		}
		c.reflink.CompareAndSwap(unknown, fails)
	}
	if c.o.Live { // a reflink has flushed already
		const all = unix.SYNC_FILE_RANGE_WAIT_BEFORE | unix.SYNC_FILE_RANGE_WRITE | unix.SYNC_FILE_RANGE_WAIT_AFTER
		if err := unix.SyncFileRange(in, 0, 0, all); err != nil {
			return false, fmt.Errorf("flush: %w", err)
		}
	}
	if st.Blocks*512 >= st.Size { // no holes, as far as its blocks tell
		return false, c.copyRange(out, in, 0, st.Size, buf)
	}
	var end int64
	for end < st.Size {
		data, err := unix.Seek(in, end, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || err == nil && data >= st.Size {
			break
		}
		if err != nil {
			return false, fmt.Errorf("seek: %w", err)
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return false, fmt.Errorf("seek: %w", err)
		}
		hole = min(hole, st.Size)
		if err := c.copyRange(out, in, data, hole-data, buf); err != nil {
			return false, err
		}
		end = hole
	}
	if err := unix.Ftruncate(out, st.Size); err != nil { // a hole at the end
		return false, fmt.Errorf("truncate: %w", err)
	}
	return false, nil
}

// copyRange copies n bytes at off of in to the same place in out.
func (c *copier) copyRange(out, in int, off, n int64, buf *[]byte) error {
	for n > 0 {
		if c.kernel.Load() != fails {
			roff, woff := off, off
			k, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(n, 1<<30)), 0)
			switch {
			case err == nil && k == 0:
				return errShrank
			case err == nil:
				c.kernel.CompareAndSwap(unknown, works)
				off, n = off+int64(k), n-int64(k)
				continue
			case errors.Is(err, unix.EINTR):
				continue
			case !cannot(err):
				return err
			}
			c.kernel.CompareAndSwap(unknown, fails)
		}
		if *buf == nil {
			*buf = make([]byte, 1<<20)
		}
		k, err := unix.Pread(in, (*buf)[:min(n, int64(len(*buf)))], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if k == 0 {
			return errShrank
		}
		for w := 0; w < k; {
			m, err := unix.Pwrite(out, (*buf)[w:k], off+int64(w))
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			w += m
		}
		off, n = off+int64(k), n-int64(k)
	}
	return nil
}

// cannot says whether err is a file system's "not here" to a reflink or
// an in-kernel copy, rather than a failure (ENOSPC, EIO).
func cannot(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.ENOSYS)
}

// owner gives fd the layer entry's owner (as the sandbox sees it) and
// mode, in that order: a chown clears setuid.
func (c *copier) owner(fd int, rel string, st *unix.Stat_t) error {
	if err := unix.Fchown(fd, c.o.IDs.inside(st.Uid), c.o.IDs.inside(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", show(rel), err)
	}
	if err := unix.Fchmod(fd, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", show(rel), err)
	}
	return nil
}

// setTimes gives name in dirfd ("": dirfd itself) st's access and
// modification times, following no symlink.
func setTimes(dirfd int, name, rel string, st *unix.Stat_t) error {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags = unix.AT_EMPTY_PATH
	}
	if err := unix.UtimesNanoAt(dirfd, name, []unix.Timespec{st.Atim, st.Mtim}, flags); err != nil {
		return fmt.Errorf("set the times of %s: %w", show(rel), err)
	}
	return nil
}

// setXattrs sets attrs on fd and, if clear, removes its other user.* ones.
func setXattrs(fd int, rel string, attrs []layerfs.Xattr, clear bool) error {
	if clear {
		names, err := layerfs.XattrNames(fd)
		if err != nil {
			return fmt.Errorf("attributes of the copy of %s: %w", show(rel), err)
		}
		for _, n := range names {
			if !strings.HasPrefix(n, "user.") || slices.ContainsFunc(attrs, func(a layerfs.Xattr) bool { return a.Name == n }) {
				continue
			}
			if err := unix.Fremovexattr(fd, n); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("remove attribute %s of %s: %w", n, show(rel), err)
			}
		}
	}
	for _, a := range attrs {
		if err := unix.Fsetxattr(fd, a.Name, a.Value, 0); err != nil {
			return fmt.Errorf("set attribute %s of %s: %w", a.Name, show(rel), err)
		}
	}
	return nil
}

type dirent struct {
	name string
	ino  uint64
	kind uint32 // S_IFDIR, S_IFREG...
}

// readEntries reads directory fd's entries and their types (from the
// directory, or, where it does not say, an lstat relative to fd).
func readEntries(fd int) ([]dirent, error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, err
	}
	var out []dirent
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return out, nil
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return nil, errors.New("a malformed directory entry")
			}
			ino, typ, name := binary.NativeEndian.Uint64(b[:8]), b[18], b[19:reclen]
			if i := slices.Index(name, 0); i >= 0 {
				name = name[:i]
			}
			b = b[reclen:]
			if s := string(name); s != "." && s != ".." {
				e := dirent{name: s, ino: ino, kind: dtKinds[typ]}
				if e.kind == 0 {
					var st unix.Stat_t
					if err := unix.Fstatat(fd, s, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
						if errors.Is(err, unix.ENOENT) {
							continue
						}
						return nil, err
					}
					e.kind = st.Mode & unix.S_IFMT
				}
				out = append(out, e)
			}
		}
	}
}

var dtKinds = [...]uint32{unix.DT_DIR: unix.S_IFDIR, unix.DT_REG: unix.S_IFREG, unix.DT_LNK: unix.S_IFLNK,
	unix.DT_FIFO: unix.S_IFIFO, unix.DT_CHR: unix.S_IFCHR, unix.DT_BLK: unix.S_IFBLK, unix.DT_SOCK: unix.S_IFSOCK, 255: 0}
