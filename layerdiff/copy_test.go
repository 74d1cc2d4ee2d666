package layerdiff_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/layerdiff"
)

var ids = layerdiff.IDs{Base: base, Size: 65536}

// loopFS mounts a new file system of type fstype ("ext4", "xfs" with
// reflinks) of size bytes, on a loop device, for the test's life.
func loopFS(t *testing.T, fstype string, size int64) string {
	t.Helper()
	testutil.RequireRoot(t)
	mkfs := map[string][]string{"ext4": {"mkfs.ext4", "-q", "-F", "-I", "256"}, "xfs": {"mkfs.xfs", "-q", "-f", "-m", "reflink=1"}}[fstype]
	testutil.RequireProgram(t, mkfs[0])
	testutil.RequireProgram(t, "mount")
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	must(t, os.WriteFile(img, nil, 0o600))
	must(t, os.Truncate(img, size))
	must(t, os.Mkdir(mnt, 0o755))
	run(t, append(mkfs, img)...)
	run(t, "mount", "-o", "loop", img, mnt)
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// node is what a test compares of an entry of a layer.
type node struct {
	kind     uint32
	mode     uint32 // permissions, setuid, setgid, sticky
	uid, gid int
	mtime    int64
	rdev     uint64
	data     string // a file's content (its hash) or a link's target
	xattrs   string // user.* attributes, sorted
	links    string // the other names of its inode, sorted
}

func (n node) String() string {
	return fmt.Sprintf("{type %o mode %04o owner %d:%d mtime %d rdev %d data %q xattrs %q links %q}",
		n.kind>>12, n.mode, n.uid, n.gid, n.mtime, n.rdev, n.data, n.xattrs, n.links)
}

// describe lists every entry beneath root by its path.
func describe(t *testing.T, root string) map[string]node {
	t.Helper()
	out := map[string]node{}
	inodes := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		n := node{kind: st.Mode & unix.S_IFMT, mode: st.Mode & 0o7777, uid: int(st.Uid), gid: int(st.Gid), mtime: st.Mtim.Nano(), rdev: st.Rdev}
		switch n.kind {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if len(b) > 64 {
				sum := sha256.Sum256(b)
				n.data = fmt.Sprintf("%d bytes, sha256 %s", len(b), hex.EncodeToString(sum[:8]))
			} else {
				n.data = string(b)
			}
		case unix.S_IFLNK:
			n.data, _ = os.Readlink(p)
		}
		if n.kind == unix.S_IFREG || n.kind == unix.S_IFDIR {
			n.xattrs = xattrsOf(t, p)
		}
		if n.kind != unix.S_IFDIR {
			inodes[st.Ino] = append(inodes[st.Ino], rel)
		}
		out[rel] = n
		return nil
	})
	must(t, err)
	for _, names := range inodes {
		for _, name := range names {
			n := out[name]
			n.links = strings.Join(slices.DeleteFunc(slices.Sorted(slices.Values(names)), func(s string) bool { return s == name }), " ")
			out[name] = n
		}
	}
	return out
}

func xattrsOf(t *testing.T, p string) string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	must(t, err)
	var attrs []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, v)
		must(t, err)
		attrs = append(attrs, name+"="+string(v[:m]))
	}
	slices.Sort(attrs)
	return strings.Join(attrs, " ")
}

// asCopied is what a copy of a layer described as src should hold: ids as
// the sandbox sees them, overlay's attributes other than the opaque mark
// gone, whiteouts each its own inode, sockets, devices and the paths in
// gone left out.
func asCopied(src map[string]node, gone ...string) map[string]node {
	out := map[string]node{}
	for rel, n := range src {
		device := n.kind == unix.S_IFBLK || n.kind == unix.S_IFCHR && n.rdev != 0
		if n.kind == unix.S_IFSOCK || device || slices.Contains(gone, rel) {
			continue
		}
		n.uid, n.gid = inside(n.uid), inside(n.gid)
		var keep []string
		for _, a := range strings.Fields(n.xattrs) {
			if !strings.HasPrefix(a, "user.overlay.") || a == "user.overlay.opaque=y" {
				keep = append(keep, a)
			}
		}
		n.xattrs = strings.Join(keep, " ")
		if n.kind == unix.S_IFCHR {
			n.links = ""
		}
		var links []string
		for _, l := range strings.Fields(n.links) {
			if !slices.Contains(gone, l) {
				links = append(links, l)
			}
		}
		n.links = strings.Join(links, " ")
		out[rel] = n
	}
	return out
}

func inside(id int) int {
	if id < base || id >= base+65536 {
		return 65534
	}
	return id - base
}

func compareTrees(t *testing.T, got, want map[string]node) {
	t.Helper()
	for _, rel := range slices.Sorted(func(yield func(string) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok && !yield(k) {
				return
			}
		}
	}) {
		g, gok := got[rel]
		w, wok := want[rel]
		switch {
		case !gok:
			t.Errorf("/%s: missing from the copy (want %v)", rel, w)
		case !wok:
			t.Errorf("/%s: in the copy, not wanted (%v)", rel, g)
		case g != w:
			t.Errorf("/%s:\n got %v\nwant %v", rel, g, w)
		}
	}
}

// buildUpper makes an upper layer as a sandbox leaves it, with one of
// every kind of entry, and returns the paths a copy leaves out.
func buildUpper(t *testing.T, up string) []string {
	t.Helper()
	p := func(rel string) string { return filepath.Join(up, rel) }
	must(t, os.MkdirAll(p("usr/local/bin"), 0o755))
	must(t, os.WriteFile(p("usr/local/bin/tool"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Link(p("usr/local/bin/tool"), p("usr/local/bin/tool2")))
	must(t, os.MkdirAll(p("opt/fresh/deep"), 0o750))
	must(t, os.Link(p("usr/local/bin/tool"), p("opt/fresh/deep/tool3"))) // a link across directories
	must(t, os.Symlink("/etc/shadow", p("usr/local/bin/shadow")))
	must(t, os.Symlink("../../..", p("usr/local/bin/up")))
	must(t, unix.Mknod(p("usr/local/gone"), unix.S_IFCHR, 0))
	must(t, os.Link(p("usr/local/gone"), p("usr/gone2"))) // overlay shares one whiteout inode
	must(t, unix.Setxattr(p("opt/fresh"), "user.overlay.opaque", []byte("y"), 0))
	must(t, unix.Setxattr(p("opt/fresh"), "user.overlay.origin", []byte("\x00\xfb"), 0))
	must(t, unix.Setxattr(p("opt/fresh"), "user.note", []byte("dir"), 0))
	must(t, unix.Setxattr(p("usr/local/bin/tool"), "user.mime", []byte("text/x-sh"), 0))
	must(t, unix.Setxattr(p("usr/local/bin/tool"), "user.overlay.origin", []byte("\x00\xfb\x01"), 0))
	must(t, unix.Setxattr(p("usr"), "user.overlay.impure", []byte("y"), 0))
	must(t, os.MkdirAll(p("empty"), 0o700))
	must(t, unix.Mkfifo(p("pipe"), 0o640))
	must(t, os.WriteFile(p("zero"), nil, 0o644))
	big := make([]byte, 3<<20+17)
	rand.Read(big)
	must(t, os.WriteFile(p("opt/blob"), big, 0o644))
	// A sparse file: 1 MiB of data in 64 MiB.
	f, err := os.Create(p("opt/sparse"))
	must(t, err)
	_, err = f.WriteAt(big[:1<<20], 32<<20)
	must(t, err)
	must(t, f.Truncate(64<<20))
	must(t, f.Close())
	must(t, os.MkdirAll(p("tmp"), 0o1777))
	must(t, os.WriteFile(p("tmp/sgid"), []byte("g"), 0o644))
	must(t, unix.Mknod(p("tmp/sock"), unix.S_IFSOCK|0o644, 0))
	must(t, unix.Mknod(p("tmp/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(t, unix.Mknod(p("tmp/disk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	// What berth wrote: left out, and /etc with them.
	must(t, os.MkdirAll(p("etc/ssl/certs"), 0o755))
	must(t, os.WriteFile(p("etc/hostname"), []byte("sb\n"), 0o644))
	must(t, os.WriteFile(p("etc/ssl/certs/ca.crt"), []byte("IMAGE CAS\nSANDBOX CA\n"), 0o644))
	// ...unless the sandbox changed it.
	must(t, os.MkdirAll(p("var"), 0o755))
	must(t, os.WriteFile(p("var/bundle"), []byte("SANDBOX CA\nADDED\n"), 0o644))

	// Owners (the sandbox's range, one file's outside it), then modes a
	// chown would clear, then times, deepest first.
	var all []string
	must(t, filepath.WalkDir(up, func(path string, _ fs.DirEntry, err error) error {
		all = append(all, path)
		return err
	}))
	for _, path := range all {
		must(t, os.Lchown(path, base, base))
	}
	must(t, os.Lchown(p("usr/local/bin/shadow"), base+1000, base+1000))
	must(t, os.Lchown(p("opt/fresh"), 4242, 0))
	must(t, os.Lchown(p("tmp/sgid"), base+1, 12345))
	must(t, unix.Chmod(p("usr/local/bin/tool"), 0o4755))
	must(t, unix.Chmod(p("tmp/sgid"), 0o2644))
	must(t, unix.Chmod(p("tmp"), 0o1777))
	slices.Reverse(all)
	for i, path := range all {
		ts := []unix.Timespec{unix.NsecToTimespec(int64(i) * 1_000_000_007), unix.NsecToTimespec(1e18 + int64(i)*1_000_000_007)}
		must(t, unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW))
	}
	return []string{"etc", "etc/hostname", "etc/ssl", "etc/ssl/certs", "etc/ssl/certs/ca.crt"}
}

var skip = map[string][]byte{"/etc/hostname": nil, "/etc/ssl/certs/ca.crt": []byte("SANDBOX CA\n"), "/var/bundle": []byte("SANDBOX CA\n")}

// A copy of every kind of entry, on a file system that reflinks and on
// one that does not, is exact: what a walk of the layer and of the copy
// sees is the same, but for ids (as the sandbox sees them), overlay's
// attributes and what berth wrote.
func TestCopyKeepsEveryKind(t *testing.T) {
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			mnt := loopFS(t, fstype, 512<<20)
			up, dst := filepath.Join(mnt, "upper"), filepath.Join(mnt, "copy")
			must(t, os.Mkdir(up, 0o755))
			must(t, os.Mkdir(dst, 0o700))
			gone := buildUpper(t, up)
			want := asCopied(describe(t, up), gone...)

			st, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Skip: skip})
			must(t, err)
			got := describe(t, dst)
			compareTrees(t, got, want)
			var root, droot unix.Stat_t
			must(t, unix.Lstat(up, &root))
			must(t, unix.Lstat(dst, &droot))
			if droot.Mode&0o7777 != 0o755 || droot.Uid != 0 || droot.Mtim != root.Mtim {
				t.Errorf("the copy's root: mode %o owner %d mtime %v, want the layer's: 755, 0, %v", droot.Mode&0o7777, droot.Uid, droot.Mtim, root.Mtim)
			}
			var sparse unix.Stat_t
			must(t, unix.Stat(filepath.Join(dst, "opt/sparse"), &sparse))
			if sparse.Blocks*512 > 4<<20 {
				t.Errorf("the sparse file's copy takes %d bytes: its holes were filled", sparse.Blocks*512)
			}
			wantBytes := int64(10 + 3<<20 + 17 + 64<<20 + 1 + len("SANDBOX CA\nADDED\n"))
			if st.Entries != len(want) || st.Copied != len(want) || st.Bytes != wantBytes || st.CopiedBytes != wantBytes || st.Removed != 0 || st.Changed != 0 {
				t.Errorf("stats %+v, want %d entries copied, %d bytes", st, len(want), wantBytes)
			}
			if reflinks := fstype == "xfs"; st.Reflinked != reflinks {
				t.Errorf("stats say reflinked %v on %s", st.Reflinked, fstype)
			}
		})
	}
}

// A layer of nothing but what berth wrote is an empty copy.
func TestCopyOfNoChangeIsEmpty(t *testing.T) {
	testutil.RequireRoot(t)
	up, dst := t.TempDir(), t.TempDir()
	must(t, os.MkdirAll(filepath.Join(up, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(up, "etc/hosts"), []byte("127.0.0.1 localhost\n"), 0o644))
	st, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Skip: map[string][]byte{"/etc/hosts": nil}})
	must(t, err)
	if got := describe(t, dst); st.Entries != 0 || len(got) != 0 {
		t.Fatalf("an unchanged layer gave %d entries: %v", st.Entries, got)
	}
}

// A pass with Since, after the layer changed in every way it can, leaves an
// exact copy, and copies only what changed.
func TestCopySinceMakesExactCopy(t *testing.T) {
	mnt := loopFS(t, "ext4", 256<<20)
	up, dst := filepath.Join(mnt, "upper"), filepath.Join(mnt, "copy")
	must(t, os.Mkdir(up, 0o755))
	must(t, os.Mkdir(dst, 0o755))
	p := func(rel string) string { return filepath.Join(up, rel) }
	gone := buildUpper(t, up)
	for i := range 50 {
		must(t, os.MkdirAll(p(fmt.Sprintf("keep/%d", i%5)), 0o755))
		must(t, os.WriteFile(p(fmt.Sprintf("keep/%d/f%d", i%5, i)), []byte(strings.Repeat("k", i)), 0o644))
	}
	for _, rel := range []string{"tree/a/b", "d2f/sub", "opt/other"} {
		must(t, os.MkdirAll(p(rel), 0o755))
	}
	for _, rel := range []string{"tree/a/b/c", "tree/x", "d2f/sub/y", "f2d", "a-changed", "a-gone", "fifo2file", "opt/other/mode", "opt/other/owner"} {
		must(t, os.WriteFile(p(rel), []byte("before "+rel), 0o644))
	}
	must(t, unix.Mkfifo(p("opt/fifo2file"), 0o600))
	waitPastSince()
	inodes := func() map[string]uint64 {
		out := map[string]uint64{}
		for i := range 50 {
			rel := fmt.Sprintf("keep/%d/f%d", i%5, i)
			var st unix.Stat_t
			must(t, unix.Lstat(filepath.Join(dst, rel), &st))
			out[rel] = st.Ino
		}
		return out
	}

	began := time.Now()
	first, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Skip: skip, Live: true})
	must(t, err)
	before := inodes()

	// Changes of every kind.
	var old unix.Stat_t
	must(t, unix.Lstat(p("a-changed"), &old))
	must(t, os.WriteFile(p("a-changed"), []byte("AFTER a-changed"), 0o644))       // same size,
	must(t, unix.UtimesNano(p("a-changed"), []unix.Timespec{old.Atim, old.Mtim})) // same mtime
	must(t, os.Remove(p("a-gone")))
	must(t, os.RemoveAll(p("tree")))
	must(t, os.Remove(p("f2d")))
	must(t, os.MkdirAll(p("f2d/inner"), 0o711))
	must(t, os.WriteFile(p("f2d/inner/file"), []byte("was a file"), 0o600))
	must(t, os.RemoveAll(p("d2f")))
	must(t, os.WriteFile(p("d2f"), []byte("was a dir"), 0o600))
	must(t, os.Remove(p("fifo2file")))
	must(t, os.WriteFile(p("fifo2file"), []byte("was a fifo"), 0o600))
	must(t, os.Remove(p("opt/fifo2file")))
	must(t, os.Mkdir(p("opt/fifo2file"), 0o700))
	must(t, unix.Chmod(p("opt/other/mode"), 0o4711))
	must(t, unix.Chmod(p("opt/other"), 0o700))
	must(t, os.Lchown(p("opt/other/owner"), base+7, base+8))
	must(t, unix.Setxattr(p("var/bundle"), "user.added", []byte("1"), 0))
	must(t, unix.Removexattr(p("opt/fresh"), "user.note"))
	must(t, unix.Removexattr(p("opt/fresh"), "user.overlay.opaque"))
	must(t, unix.Setxattr(p("usr/local"), "user.overlay.opaque", []byte("y"), 0))
	must(t, os.Remove(p("usr/local/bin/up")))
	must(t, os.Symlink("/elsewhere", p("usr/local/bin/up")))
	must(t, os.Link(p("var/bundle"), p("opt/bundle-link")))
	must(t, os.Remove(p("usr/local/bin/tool2"))) // the link group shrinks
	must(t, unix.Mknod(p("opt/whited"), unix.S_IFCHR, 0))
	must(t, os.MkdirAll(p("new/dir"), 0o755))
	must(t, os.WriteFile(p("new/dir/file"), []byte("new"), 0o644))
	must(t, os.WriteFile(p("etc/hostname"), []byte("changed, still skipped\n"), 0o644))
	must(t, os.WriteFile(p("etc/ssl/certs/ca.crt"), []byte("IMAGE CAS\nSANDBOX CA\nMINE\n"), 0o644)) // no longer berth's
	must(t, os.WriteFile(p("var/bundle"), []byte("ADDED\nSANDBOX CA\n"), 0o644))                     // berth's now
	gone = append(slices.DeleteFunc(gone, func(s string) bool {
		return s == "etc" || s == "etc/ssl" || s == "etc/ssl/certs" || s == "etc/ssl/certs/ca.crt"
	}), "var", "var/bundle")
	want := asCopied(describe(t, up), gone...)

	st, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Skip: skip, Since: began.Add(-layerdiff.SinceMargin)})
	must(t, err)
	compareTrees(t, describe(t, dst), want)
	if st.Entries != len(want) {
		t.Errorf("stats say the copy holds %d entries, it holds %d", st.Entries, len(want))
	}
	after := inodes()
	for rel, ino := range before {
		if after[rel] != ino {
			t.Errorf("/%s, unchanged, was copied again", rel)
		}
	}
	if st.Copied == 0 || st.Copied >= first.Copied/2 || st.Removed == 0 {
		t.Errorf("the second pass copied %d entries (the first %d) and removed %d", st.Copied, first.Copied, st.Removed)
	}
	t.Logf("first pass %+v; second %+v", first, st)
}

// waitPastSince waits until what was changed before it is older than the
// Since of a pass that begins after it.
func waitPastSince() {
	changed := time.Now()
	for !time.Now().Add(-layerdiff.SinceMargin).Truncate(time.Second).After(changed) {
		time.Sleep(10 * time.Millisecond)
	}
}

// Between two passes, a directory the first copied becomes a symlink to
// the host's root, and a symlink to a host directory becomes a directory:
// the second pass copies each as it now is, reading nothing through the
// symlink and writing nothing through the symlink it made before.
func TestCopySinceFollowsNoSymlink(t *testing.T) {
	testutil.RequireRoot(t)
	up, dst, outside := t.TempDir(), t.TempDir(), t.TempDir()
	p := func(rel string) string { return filepath.Join(up, rel) }
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600))
	must(t, os.MkdirAll(p("d/sub"), 0o755))
	must(t, os.WriteFile(p("d/secret"), []byte("sandbox's"), 0o644))
	must(t, os.Symlink(outside, p("l")))
	must(t, os.Symlink(outside, p("sub"))) // a symlink, then a directory that holds one
	hostBefore := describe(t, outside)
	var hostDir unix.Stat_t
	must(t, unix.Lstat(outside, &hostDir))

	began := time.Now()
	_, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Live: true})
	must(t, err)
	must(t, os.RemoveAll(p("d")))
	must(t, os.Symlink("/", p("d")))
	must(t, os.Remove(p("l")))
	must(t, os.MkdirAll(p("l"), 0o755))
	must(t, os.WriteFile(p("l/secret"), []byte("overwritten?"), 0o644))
	must(t, os.Remove(p("sub")))
	must(t, os.Mkdir(p("sub"), 0o755))
	must(t, os.Symlink(outside, p("sub/secret")))
	_, err = layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Since: began.Add(-layerdiff.SinceMargin)})
	must(t, err)

	compareTrees(t, describe(t, dst), asCopied(describe(t, up)))
	compareTrees(t, describe(t, outside), hostBefore)
	var hostAfter unix.Stat_t
	must(t, unix.Lstat(outside, &hostAfter))
	if hostAfter.Mtim != hostDir.Mtim || hostAfter.Uid != hostDir.Uid || hostAfter.Mode != hostDir.Mode {
		t.Errorf("the host directory changed: %+v, was %+v", hostAfter, hostDir)
	}
}

// While a Live pass runs, the sandbox swaps a directory with a symlink to
// a host directory, again and again: no pass fails, reads the host's file
// or writes beside it, and a frozen pass after them makes an exact copy.
func TestCopyLiveRaceStaysInside(t *testing.T) {
	testutil.RequireRoot(t)
	up, outside := t.TempDir(), t.TempDir()
	p := func(rel string) string { return filepath.Join(up, rel) }
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600))
	must(t, os.MkdirAll(p("a/b"), 0o755))
	for i := range 20 {
		must(t, os.WriteFile(p(fmt.Sprintf("a/b/f%d", i)), []byte("sandbox"), 0o644))
		must(t, os.WriteFile(p(fmt.Sprintf("a/f%d", i)), []byte("sandbox"), 0o644))
	}
	must(t, os.Symlink(outside, p("x")))
	must(t, os.Symlink(outside, p("a/y")))
	hostBefore := describe(t, outside)
	upfd, err := unix.Open(up, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(upfd)
	afd, err := unix.Open(p("a"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(afd)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	swaps := 0
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// By descriptors: a path would lead through the symlinks.
			if err := unix.Renameat2(upfd, "a", upfd, "x", unix.RENAME_EXCHANGE); err != nil {
				t.Error(err)
				return
			}
			if err := unix.Renameat2(afd, "b", afd, "y", unix.RENAME_EXCHANGE); err != nil {
				t.Error(err)
				return
			}
			swaps++
		}
	}()
	var dst string
	var began time.Time
	changed := 0
	for range 50 {
		dst = t.TempDir()
		began = time.Now()
		st, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Live: true})
		must(t, err)
		changed += st.Changed
		if err := filepath.WalkDir(dst, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, _ := os.ReadFile(path); string(b) == "host secret" {
					t.Errorf("%s holds the host's file", path)
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	_, err = layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Since: began.Add(-layerdiff.SinceMargin)})
	must(t, err)
	compareTrees(t, describe(t, dst), asCopied(describe(t, up)))
	compareTrees(t, describe(t, outside), hostBefore)
	t.Logf("%d swaps; %d entries changed while read", swaps, changed)
}

// On XFS, file contents are reflinked: the copy shares the layer's blocks.
func TestCopyReflinks(t *testing.T) {
	mnt := loopFS(t, "xfs", 512<<20)
	up, dst := filepath.Join(mnt, "upper"), filepath.Join(mnt, "copy")
	must(t, os.Mkdir(up, 0o755))
	must(t, os.Mkdir(dst, 0o755))
	big := make([]byte, 128<<20)
	rand.Read(big)
	must(t, os.WriteFile(filepath.Join(up, "big"), big, 0o644))
	must(t, os.WriteFile(filepath.Join(up, "small"), []byte("small"), 0o644))
	used := func() int64 {
		var s unix.Statfs_t
		fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		defer unix.Close(fd)
		must(t, unix.Syncfs(fd))
		must(t, unix.Fstatfs(fd, &s))
		return int64(s.Blocks-s.Bfree) * s.Bsize
	}
	before := used()
	st, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids})
	must(t, err)
	if grew := used() - before; grew > 8<<20 {
		t.Errorf("a copy of 128 MiB took %d MiB more on XFS: not reflinked", grew>>20)
	}
	if !st.Reflinked || st.CopiedBytes != 128<<20+5 {
		t.Errorf("stats %+v", st)
	}
	b, err := os.ReadFile(filepath.Join(dst, "big"))
	must(t, err)
	if !bytes.Equal(b, big) {
		t.Error("the reflinked copy's content differs")
	}
	// Writing the layer's file leaves the copy as it was.
	f, err := os.OpenFile(filepath.Join(up, "big"), os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt([]byte("changed"), 1<<20)
	must(t, err)
	must(t, f.Close())
	if b, err = os.ReadFile(filepath.Join(dst, "big")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("the copy changed with the layer's file (%v)", err)
	}
}

// Where the copy is on another file system than the layer, neither a
// reflink nor an in-kernel copy can be had: contents are read and written,
// holes kept.
func TestCopyAcrossFileSystemsReadsAndWrites(t *testing.T) {
	up, dst := loopFS(t, "ext4", 128<<20), loopFS(t, "ext4", 128<<20)
	data := make([]byte, 5<<20+3)
	rand.Read(data)
	must(t, os.WriteFile(filepath.Join(up, "data"), data, 0o644))
	f, err := os.Create(filepath.Join(up, "sparse"))
	must(t, err)
	_, err = f.WriteAt(data[:4096], 8<<20)
	must(t, err)
	must(t, f.Truncate(40<<20))
	must(t, f.Close())
	must(t, os.Remove(filepath.Join(up, "lost+found")))
	must(t, os.Remove(filepath.Join(dst, "lost+found")))
	st, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: layerdiff.IDs{Base: 0, Size: 65536}})
	must(t, err)
	compareTrees(t, describe(t, dst), describe(t, up))
	var sparse unix.Stat_t
	must(t, unix.Stat(filepath.Join(dst, "sparse"), &sparse))
	if sparse.Size != 40<<20 || sparse.Blocks*512 > 1<<20 {
		t.Errorf("the sparse file's copy: %d bytes, %d allocated", sparse.Size, sparse.Blocks*512)
	}
	if st.Reflinked || st.CopiedBytes != int64(len(data))+40<<20 {
		t.Errorf("stats %+v", st)
	}
}

// A file system that fills up fails the copy, naming the file.
func TestCopyNoSpaceFails(t *testing.T) {
	mnt := loopFS(t, "ext4", 32<<20)
	up, dst := filepath.Join(mnt, "upper"), filepath.Join(mnt, "copy")
	must(t, os.Mkdir(up, 0o755))
	must(t, os.Mkdir(dst, 0o755))
	data := make([]byte, 20<<20)
	rand.Read(data)
	must(t, os.WriteFile(filepath.Join(up, "big"), data, 0o644))
	_, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids})
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "/big") {
		t.Fatalf("a copy that does not fit: %v, want ENOSPC naming /big", err)
	}
}

// A write through a shared mapping, after a Live pass read the file whose
// page it dirtied before the pass began, is in the frozen pass's copy:
// nothing in the write itself would tell the kernel to update the ctime.
func TestCopySinceSeesWritesThroughMappings(t *testing.T) {
	mnt := loopFS(t, "ext4", 64<<20)
	up, dst := filepath.Join(mnt, "upper"), filepath.Join(mnt, "copy")
	must(t, os.Mkdir(up, 0o755))
	must(t, os.Mkdir(dst, 0o755))
	f, err := os.Create(filepath.Join(up, "db"))
	must(t, err)
	must(t, f.Truncate(1<<16))
	m, err := unix.Mmap(int(f.Fd()), 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	must(t, err)
	defer unix.Munmap(m)
	f.Close()
	copy(m, "first") // dirties the page (and sets the ctime), long before the pass
	waitPastSince()
	began := time.Now()
	_, err = layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Live: true})
	must(t, err)
	copy(m, "later")
	_, err = layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids, Since: began.Add(-layerdiff.SinceMargin)})
	must(t, err)
	b, err := os.ReadFile(filepath.Join(dst, "db"))
	must(t, err)
	if !bytes.HasPrefix(b, []byte("later")) {
		t.Fatalf("the copy holds %q, not the write made through the mapping after the first pass", b[:5])
	}
}

// A hostile layer nested deeper than a copy descends fails it instead of
// exhausting descriptors.
func TestCopyRefusesDeepNesting(t *testing.T) {
	testutil.RequireRoot(t)
	up, dst := t.TempDir(), t.TempDir()
	fd, err := unix.Open(up, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	for range 1100 {
		must(t, unix.Mkdirat(fd, "d", 0o755))
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
	}
	unix.Close(fd)
	_, err = layerdiff.Copy(dst, up, layerdiff.CopyOptions{IDs: ids})
	if err == nil || !strings.Contains(err.Error(), "directories deep") {
		t.Fatalf("a layer 1100 directories deep: %v", err)
	}
}

// On a file system that keeps nanoseconds, a pass says so, and an
// incremental pass told FineTimes does not copy again a file written
// just before the pass it follows (without it, anything of that second
// is copied again: whole-second file systems need that).
func TestCopyFineTimes(t *testing.T) {
	mnt := loopFS(t, "ext4", 64<<20)
	up, dst := filepath.Join(mnt, "upper"), filepath.Join(mnt, "copy")
	must(t, os.Mkdir(up, 0o755))
	must(t, os.Mkdir(dst, 0o755))
	must(t, os.WriteFile(filepath.Join(up, "fresh"), []byte("just written"), 0o644))
	time.Sleep(2 * layerdiff.SinceMargin) // past the margin, within the second most of the time
	began := time.Now()
	st, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{Live: true})
	if err != nil {
		t.Fatal(err)
	}
	if !st.FineTimes {
		t.Fatal("ext4 with 256-byte inodes keeps nanoseconds, but the pass did not say so")
	}
	again, err := layerdiff.Copy(dst, up, layerdiff.CopyOptions{Since: began.Add(-layerdiff.SinceMargin), FineTimes: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.Copied != 0 || again.Entries != 1 {
		t.Fatalf("the incremental pass with FineTimes: %+v, want nothing copied again", again)
	}
	must(t, os.WriteFile(filepath.Join(up, "fresh"), []byte("written again"), 0o644))
	again, err = layerdiff.Copy(dst, up, layerdiff.CopyOptions{Since: began.Add(-layerdiff.SinceMargin), FineTimes: true})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "fresh")); again.Copied != 1 || string(b) != "written again" {
		t.Fatalf("after a write: %+v, %q", again, b)
	}
}
