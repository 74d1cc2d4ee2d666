// Package snapshot compares and merges sandboxes' file systems: what one
// layer stack changed over another, as a list, a tar of the changes or a
// text diff, and the conflicts of a three-way merge.
//
// A stack is read as overlayfs would merge it, from its layer directories
// in overlay's own form: a whiteout is a 0/0 character device, an opaque
// directory carries user.overlay.opaque="y", and other user.overlay.*
// attributes are overlay's bookkeeping. A sandbox's writable layer is
// hostile and may change while it is read, so every entry is reached from
// its directory's descriptor, no symlink is followed, content is read only
// from regular files opened without following links and checked again by
// fstat, and names go into messages escaped. The caller freezes or stops
// the sandbox for a consistent answer; a walk of a layer that is changing
// sees some mixture of before and after, or fails with a message saying
// what changed.
package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/layerfs"

	"github.com/berthsh/berth/layerdiff"
)

// Layer is one directory of a root file system and how its ids map.
type Layer struct {
	Dir string
	// IDs maps the ids stored in Dir to the sandbox's: a sandbox's
	// writable layer (and a shifted copy of a layer) holds host id Base+i
	// for the sandbox's id i, and host ids outside the range read as
	// 65534. The zero value: ids are stored as the sandbox sees them (an
	// image or snapshot layer as stored).
	IDs layerdiff.IDs
}

// Stack is a root file system: layers topmost first (a sandbox's
// writable layer first).
type Stack []Layer

// Change kinds.
const (
	Added    = "added"
	Modified = "modified"
	Deleted  = "deleted"
)

// Change is one path a stack changed over another.
type Change struct {
	// Path is absolute, as the sandbox sees it: "/etc/hosts".
	Path string `json:"path"`
	// Kind is Added, Modified or Deleted.
	Kind string `json:"kind"`
	// Type is the new entry's, the old one's for Deleted: "file", "dir",
	// "symlink", "fifo", "socket", "char" or "block".
	Type string `json:"type"`
	// Mode is the permission bits with setuid, setgid and sticky (0o7777).
	Mode uint32 `json:"mode"`
	// Size is a regular file's size in bytes.
	Size int64 `json:"size"`
	// UID and GID are the owner as the sandbox sees it.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Link is a symlink's target.
	Link string `json:"link,omitempty"`
	// ModTime is the entry's modification time (which no comparison
	// looks at).
	ModTime time.Time `json:"mod_time"`

	// oldAt and newAt are the layers the old and the new entry were read
	// from (index + 1 in the from and to stack); 0 when not known (a
	// Change made elsewhere): the entry is looked up again.
	oldAt, newAt int
}

// Options shape a comparison.
type Options struct {
	// Skip names files (absolute paths in the sandbox) that berth itself
	// wrote into a sandbox's writable layer: each is left out while its
	// content ends with the given bytes (an empty value: whatever it
	// holds), as in layerdiff.Options. It applies to the files of either
	// stack's layers above those the two share (where berth writes): a
	// deletion of an image's file is listed. A directory that a stack
	// added and that holds only such files is left out with them.
	Skip map[string][]byte
	// MaxTextBytes bounds the files WriteUnified diffs line by line
	// (default 1 MiB); a larger one gets a line saying so.
	MaxTextBytes int64
}

func (o Options) maxText() int64 {
	if o.MaxTextBytes <= 0 {
		return 1 << 20
	}
	return o.MaxTextBytes
}

// maxDepth bounds how deep a walk goes: each level holds a descriptor per
// layer, and a path of PATH_MAX bytes has at most this many levels.
const maxDepth = 2048

// Changes lists what to changed over from, sorted by path.
//
// A path is a change when its entry differs in type, permissions, owner,
// symlink target, size or content (a regular file's bytes are read only
// when the sizes are equal and the two are not the same file); times are
// not compared, so a file copied up by a touch or an open for writing
// that wrote nothing is not a change, and neither is a directory whose
// only news is in its entries. A deleted directory is one change, its
// contents not listed; an entry replaced by one of another type is one
// Modified change (a new directory's entries follow as Added); a rename is
// a deletion and an addition; hard links are files.
//
// Cost: the layers the two stacks share at the bottom (the same Dir and
// IDs) are read only where the layers above them make that necessary, so
// a sandbox compared with its image (to = its writable layer over from)
// costs one walk of the writable layer and a lookup in from of each path
// it holds. Stacks that share no bottom layer are walked whole, both of
// them.
func Changes(ctx context.Context, from, to Stack, o Options) ([]Change, error) {
	w, err := newWalker(ctx, from, to, o)
	if err != nil {
		return nil, err
	}
	defer w.close()
	fv, err := w.from.rootView()
	if err != nil {
		return nil, err
	}
	defer fv.close()
	tv, err := w.to.rootView()
	if err != nil {
		return nil, err
	}
	defer tv.close()
	if _, _, err := w.walk("", fv, tv, 0); err != nil {
		return nil, err
	}
	slices.SortFunc(w.out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return w.out, nil
}

// walker compares two opened stacks directory by directory.
type walker struct {
	ctx      context.Context
	o        Options
	from, to *tree
	shared   int  // layers at the bottom of both stacks that are the same
	expand   bool // list what a deleted directory held, each entry Deleted
	out      []Change
	n        int // entries looked at, for checks of ctx
	dents    []byte
	bufs     [][2][]byte // one pair for each comparer
}

func newWalker(ctx context.Context, from, to Stack, o Options) (*walker, error) {
	w := &walker{ctx: ctx, o: o, shared: sharedBottom(from, to), dents: make([]byte, 32<<10)}
	var err error
	if w.from, err = openStack(from); err != nil {
		return nil, err
	}
	if w.to, err = openStack(to); err != nil {
		w.from.close()
		return nil, err
	}
	return w, nil
}

func (w *walker) close() {
	w.from.close()
	w.to.close()
}

// sharedBottom counts the layers at the bottom of a and b that are the
// same directory read the same way.
func sharedBottom(a, b Stack) int {
	n := 0
	for n < len(a) && n < len(b) {
		x, y := a[len(a)-1-n], b[len(b)-1-n]
		if filepath.Clean(x.Dir) != filepath.Clean(y.Dir) || x.IDs != y.IDs {
			break
		}
		n++
	}
	return n
}

func (w *walker) isShared(t *tree, layer int) bool { return layer >= len(t.stack)-w.shared }

// walk compares the entries of directory dir (its path, "" for the root)
// as fv and tv see it (either may be nil: the directory is absent there).
// It returns how many entries the directory has in to, and how many of
// them it left out because Skip says so.
func (w *walker) walk(dir string, fv, tv view, depth int) (visible, skipped int, err error) {
	if depth >= maxDepth {
		return 0, 0, fmt.Errorf("%s: directories nested over %d deep", show(dir+"/"), maxDepth)
	}
	names, err := w.candidates(fv, tv)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", show(dir+"/"), err)
	}
	var pairs []pair
	for _, name := range names {
		vis, sk, err := w.child(dir+"/"+name, name, fv, tv, depth, &pairs)
		if err != nil {
			return 0, 0, err
		}
		visible += vis
		skipped += sk
	}
	// The files whose bytes decide, while fv and tv hold their directories.
	if err := w.compare(pairs); err != nil {
		return 0, 0, err
	}
	for i := range pairs {
		if !pairs[i].same {
			if err := w.emit(Modified, pairs[i].path, &pairs[i].old, &pairs[i].new); err != nil {
				return 0, 0, err
			}
		}
	}
	return visible, skipped, nil
}

// pair is two regular files alike but perhaps in content.
type pair struct {
	path     string
	old, new entry
	same     bool
}

// compare reads the files of pairs, on several threads when there are
// many: comparing two small files is mostly the system calls that open
// them.
func (w *walker) compare(pairs []pair) error {
	if len(pairs) == 0 {
		return nil
	}
	workers := min(len(pairs)/16+1, runtime.GOMAXPROCS(0), 8)
	for len(w.bufs) < workers {
		w.bufs = append(w.bufs, [2][]byte{})
	}
	var next atomic.Int64
	errs := make([]error, workers)
	run := func(i int) {
		for {
			j := int(next.Add(1) - 1)
			if j >= len(pairs) || w.ctx.Err() != nil {
				return
			}
			p := &pairs[j]
			var err error
			if p.same, err = sameContent(w.ctx, &p.old, &p.new, &w.bufs[i]); err != nil {
				errs[i] = fmt.Errorf("%s: %w", show(p.path), err)
				return
			}
		}
	}
	if workers == 1 {
		run(0)
	} else {
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() { run(i) })
		}
		wg.Wait()
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return w.ctx.Err()
}

// candidates returns the names a directory's entries might differ at: all
// that its layers hold, except those only in shared layers that both
// views reach alike, which resolve the same on both sides.
func (w *walker) candidates(fv, tv view) ([]string, error) {
	skipShared := w.sameShared(fv, tv)
	var names []string
	var err error
	for _, side := range [2]struct {
		v view
		t *tree
	}{{fv, w.from}, {tv, w.to}} {
		for _, d := range side.v {
			if skipShared && w.isShared(side.t, d.layer) {
				continue
			}
			if names, err = readDirNames(d.fd, w.dents, names); err != nil {
				return nil, err
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// sameShared reports whether fv and tv reach the same shared layers. They
// either do or one of them reaches none: lookups that get that far in
// both stacks go on alike.
func (w *walker) sameShared(fv, tv view) bool {
	var a, b []int
	for _, d := range fv {
		if w.isShared(w.from, d.layer) {
			a = append(a, len(w.from.stack)-d.layer)
		}
	}
	for _, d := range tv {
		if w.isShared(w.to, d.layer) {
			b = append(b, len(w.to.stack)-d.layer)
		}
	}
	return len(a) > 0 && slices.Equal(a, b)
}

// child compares entry name of a directory, at path p.
//
// Two regular files that differ in nothing but perhaps their bytes are
// appended to pairs instead, for walk to compare.
func (w *walker) child(p, name string, fv, tv view, depth int, pairs *[]pair) (visible, skipped int, err error) {
	if w.n++; w.n%256 == 0 {
		if err := w.ctx.Err(); err != nil {
			return 0, 0, err
		}
	}
	fail := func(err error) (int, int, error) { return 0, 0, fmt.Errorf("%s: %w", show(p), err) }
	fe, err := lookup(fv, name)
	if err != nil {
		return fail(err)
	}
	te, err := lookup(tv, name)
	if err != nil {
		return fail(err)
	}
	if te.ok() {
		visible = 1
	}
	if !fe.ok() && !te.ok() { // a whiteout over nothing
		return 0, 0, nil
	}
	if skip, err := w.skip(p, &fe, &te); err != nil {
		return fail(err)
	} else if skip {
		return visible, 1, nil
	}
	switch {
	case !fe.ok():
		if !te.isDir() {
			return visible, 0, w.emit(Added, p, &fe, &te)
		}
		cv, err := descend(tv, &te)
		if err != nil {
			return fail(err)
		}
		before := len(w.out)
		vis, sk, err := w.walk(p, nil, cv, depth+1)
		cv.close()
		if err != nil {
			return 0, 0, err
		}
		if vis > 0 && sk > 0 && len(w.out) == before {
			return visible, 1, nil // it holds only what berth wrote
		}
		return visible, 0, w.emit(Added, p, &fe, &te)
	case !te.ok():
		if err := w.emit(Deleted, p, &fe, &te); err != nil || !w.expand || !fe.isDir() {
			return 0, 0, err
		}
		return 0, 0, w.under(p, fv, &fe, nil, nil, depth)
	case fe.isDir() && te.isDir():
		return visible, 0, w.under(p, fv, &fe, tv, &te, depth)
	case !fe.isDir() && !te.isDir():
		same, content, err := w.same(&fe, &te)
		if err != nil {
			return fail(err)
		}
		if content {
			*pairs = append(*pairs, pair{path: p, old: fe, new: te})
			return visible, 0, nil
		}
		if same {
			return visible, 0, nil
		}
		return visible, 0, w.emit(Modified, p, &fe, &te)
	case te.isDir(): // a directory replaced something else
		return visible, 0, w.under(p, nil, &fe, tv, &te, depth)
	default: // something replaced a directory
		if err := w.emit(Modified, p, &fe, &te); err != nil || !w.expand {
			return visible, 0, err
		}
		return visible, 0, w.under(p, fv, &fe, nil, nil, depth)
	}
}

// under compares what directories fe (in from, when it is one) and te
// (in to, when not nil) hold, and records te as Modified when it replaced
// fe or took other permissions or another owner.
func (w *walker) under(p string, fv view, fe *entry, tv view, te *entry, depth int) error {
	var cf, ct view
	var err error
	if fv != nil && fe.isDir() {
		if cf, err = descend(fv, fe); err != nil {
			return fmt.Errorf("%s: %w", show(p), err)
		}
		defer cf.close()
	}
	if te != nil {
		if ct, err = descend(tv, te); err != nil {
			return fmt.Errorf("%s: %w", show(p), err)
		}
		defer ct.close()
		// te's attributes are the open directory's now.
		if !fe.isDir() || fe.perm() != te.perm() || w.from.id(fe.layer, fe.st.Uid) != w.to.id(te.layer, te.st.Uid) ||
			w.from.id(fe.layer, fe.st.Gid) != w.to.id(te.layer, te.st.Gid) {
			if err := w.emit(Modified, p, fe, te); err != nil {
				return err
			}
		}
	}
	_, _, err = w.walk(p, cf, ct, depth+1)
	return err
}

// emit records a change at p from old entry fe to new entry te (te is
// not read for a deletion).
func (w *walker) emit(kind, p string, fe, te *entry) error {
	t, e := w.to, te
	if kind == Deleted {
		t, e = w.from, fe
	}
	c := Change{Path: p, Kind: kind, Type: typeName(e.st.Mode), Mode: e.perm(),
		UID: t.id(e.layer, e.st.Uid), GID: t.id(e.layer, e.st.Gid),
		ModTime: time.Unix(e.st.Mtim.Unix()).UTC(), oldAt: fe.layer + 1, newAt: te.layer + 1}
	switch e.ftype() {
	case unix.S_IFREG:
		c.Size = e.st.Size
	case unix.S_IFLNK:
		target, err := layerfs.ReadLink(e.dirfd, e.name)
		if err != nil {
			return fmt.Errorf("read link %s: %w", show(p), err)
		}
		c.Link = target
	}
	w.out = append(w.out, c)
	return nil
}

// skip reports whether p is a file berth wrote that Options.Skip leaves
// out, on either side, in a layer of that side's own (berth writes into
// writable layers, which stacks do not share).
func (w *walker) skip(p string, fe, te *entry) (bool, error) {
	if _, ok := w.o.Skip[p]; !ok {
		return false, nil
	}
	for i, e := range [2]*entry{te, fe} {
		if !e.isReg() || w.isShared([2]*tree{w.to, w.from}[i], e.layer) {
			continue
		}
		fd, err := openFile(e)
		if err != nil {
			return false, err
		}
		skipped := layerfs.Skipped(w.o.Skip, p, fd, e.st.Size)
		unix.Close(fd)
		if skipped {
			return true, nil
		}
	}
	return false, nil
}

// same reports whether non-directories fe (in from) and te (in to) are
// alike: type, permissions, owner, and link target or device number.
// Regular files alike so far whose bytes must be compared are reported
// by content instead.
func (w *walker) same(fe, te *entry) (same, content bool, err error) {
	if fe.st.Mode != te.st.Mode || w.from.id(fe.layer, fe.st.Uid) != w.to.id(te.layer, te.st.Uid) ||
		w.from.id(fe.layer, fe.st.Gid) != w.to.id(te.layer, te.st.Gid) {
		return false, false, nil
	}
	switch fe.ftype() {
	case unix.S_IFLNK:
		a, err := layerfs.ReadLink(fe.dirfd, fe.name)
		if err != nil {
			return false, false, err
		}
		b, err := layerfs.ReadLink(te.dirfd, te.name)
		return a == b, false, err
	case unix.S_IFREG:
		if fe.st.Size != te.st.Size {
			return false, false, nil
		}
		if fe.st.Dev == te.st.Dev && fe.st.Ino == te.st.Ino {
			return true, false, nil
		}
		return false, true, nil
	case unix.S_IFCHR, unix.S_IFBLK:
		return fe.st.Rdev == te.st.Rdev, false, nil
	}
	return true, false, nil
}

// sameContent reports whether regular files a and b hold the same bytes.
// The same file (one inode) is not read.
func sameContent(ctx context.Context, a, b *entry, bufs *[2][]byte) (bool, error) {
	if a.st.Size != b.st.Size {
		return false, nil
	}
	if a.st.Dev == b.st.Dev && a.st.Ino == b.st.Ino {
		return true, nil
	}
	fa, err := openFile(a)
	if err != nil {
		return false, err
	}
	defer unix.Close(fa)
	fb, err := openFile(b)
	if err != nil {
		return false, err
	}
	defer unix.Close(fb)
	if a.st.Size != b.st.Size {
		return false, nil
	}
	if bufs[0] == nil {
		bufs[0], bufs[1] = make([]byte, 64<<10), make([]byte, 64<<10)
	}
	for off := int64(0); off < a.st.Size; {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		chunk := int(min(a.st.Size-off, int64(len(bufs[0]))))
		n, err := layerfs.ReadAt(fa, bufs[0][:chunk], off)
		if err != nil {
			return false, err
		}
		m, err := layerfs.ReadAt(fb, bufs[1][:chunk], off)
		if err != nil {
			return false, err
		}
		if n != chunk || m != chunk {
			return false, nil // one shrank as it was read: not alike
		}
		if !bytes.Equal(bufs[0][:n], bufs[1][:m]) {
			return false, nil
		}
		off += int64(n)
	}
	return true, nil
}
