package files

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Headers for layer tars.
func dirEntry(name string, mode int64) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}
}

func whiteout(name string) *tar.Header { return file(name, "") }

func symlinkEntry(name, target string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}
}

// build makes files (content), directories (a trailing "/") and symlinks
// ("-> target") below root.
func build(t testing.TB, root string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		name, target, link := strings.Cut(p, " -> ")
		full := filepath.Join(root, strings.TrimSuffix(name, "/"))
		os.MkdirAll(filepath.Dir(full), 0o755)
		var err error
		switch {
		case link:
			err = os.Symlink(target, full)
		case strings.HasSuffix(p, "/"):
			err = os.MkdirAll(full, 0o755)
		default:
			err = os.WriteFile(full, []byte("old "+p), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// state describes every path below dir: type, mode, owner, size, content or
// target, user attributes, and a file's mtime in seconds (a directory's
// changes with the staging directory made and removed in it; a tar written
// by WriteArchive keeps seconds).
func state(t testing.TB, dir string) string {
	var b strings.Builder
	filepath.Walk(dir, func(p string, _ fs.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		fmt.Fprintf(&b, "%s %s %o %d:%d", strings.TrimPrefix(p, dir), fileType(st.Mode), st.Mode&0o7777, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " %x %d", sha256.Sum256(data), st.Mtim.Sec)
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			fmt.Fprintf(&b, " -> %s", l)
		}
		if v, err := getUserXattr(p, "user.test"); err == nil {
			fmt.Fprintf(&b, " user.test=%s", v)
		}
		b.WriteByte('\n')
		return nil
	})
	return b.String()
}

func getUserXattr(p, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func readString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func apply(t *testing.T, s *Service, w guestapi.Where, dest string, hs ...*tar.Header) guestapi.ApplyResult {
	t.Helper()
	res, err := s.ApplyArchive(t.Context(), w, dest, bytes.NewReader(tarOf(t, hs...)))
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

// noStaging checks that no staging directory is left in dir.
func noStaging(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".berth-") {
			t.Fatalf("staging left behind in %s: %s", dir, e.Name())
		}
	}
}

func TestApplyWhiteoutsAndReplacements(t *testing.T) {
	s, root := newService(t)
	build(t, root,
		"etc/old.conf", "etc/kept.conf",
		"opt/tree/a/b/c", "opt/tree/x", "opt/other",
		"var/cache/x", "var/cache/y/z", "var/cache/.hidden",
		"srv/f", "srv/d/inner/deep", "srv/merge/keep", "srv/merge/same",
		"srv/link -> /etc", "srv/again/old",
	)
	res := apply(t, s, guestapi.Where{}, "/",
		dirEntry("etc", 0o755), whiteout("etc/.wh.old.conf"), whiteout("etc/.wh.never-there"),
		dirEntry("opt", 0o755), whiteout("opt/.wh.tree"),
		dirEntry("var", 0o755), dirEntry("var/cache", 0o700), whiteout("var/cache/.wh..wh..opq"), file("var/cache/new", "new"),
		dirEntry("srv", 0o755),
		dirEntry("srv/f", 0o750), file("srv/f/inner", "dir over file"),
		file("srv/d", "file over dir"),
		dirEntry("srv/merge", 0o751), file("srv/merge/same", "replaced"), file("srv/merge/added", "added"),
		dirEntry("srv/link", 0o755), file("srv/link/x", "dir over symlink"),
		whiteout("srv/.wh.again"), file("srv/again", "removed, then made again"),
	)
	if res.Whiteouts != 5 || res.Entries != 15 || res.Bytes == 0 {
		t.Errorf("result %+v", res)
	}
	for _, gone := range []string{"etc/old.conf", "opt/tree", "var/cache/x", "var/cache/y", "var/cache/.hidden", "srv/d/inner", "srv/again/old"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); err == nil {
			t.Errorf("%s is still there", gone)
		}
	}
	for p, want := range map[string]string{
		"etc/kept.conf": "old etc/kept.conf", "opt/other": "old opt/other",
		"var/cache/new": "new", "srv/f/inner": "dir over file", "srv/d": "file over dir",
		"srv/merge/keep": "old srv/merge/keep", "srv/merge/same": "replaced", "srv/merge/added": "added",
		"srv/link/x": "dir over symlink", "srv/again": "removed, then made again",
	} {
		if got := readString(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for p, want := range map[string]os.FileMode{"srv/f": 0o750, "srv/merge": 0o751, "var/cache": 0o700, "srv/link": 0o755} {
		if fi, err := os.Lstat(filepath.Join(root, p)); err != nil || !fi.IsDir() || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want a directory of mode %v", p, fi.Mode(), err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/x")); err == nil {
		t.Fatal("the tar wrote through the replaced symlink")
	}
	noStaging(t, root)
}

func TestApplyMetadata(t *testing.T) {
	s, root := newService(t)
	build(t, root, "bin/tool", "data/")
	old, err := os.Open(filepath.Join(root, "bin/tool"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	mtime := time.Date(2021, 3, 4, 5, 6, 7, 800, time.UTC)
	x := func(h *tar.Header, attrs ...string) *tar.Header {
		h.Uid, h.Gid, h.ModTime, h.Format = 1234, 5678, mtime, tar.FormatPAX
		h.PAXRecords = map[string]string{}
		for _, a := range attrs {
			k, v, _ := strings.Cut(a, "=")
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		return h
	}
	tool := x(file("bin/tool", "new tool"), "user.test=tool", "trusted.nope=x", "security.capability=x", "user.overlay.opaque=y")
	tool.Mode = 0o4755
	fifo := x(&tar.Header{Typeflag: tar.TypeFifo, Name: "data/fifo", Mode: 0o620})
	apply(t, s, guestapi.Where{}, "/",
		x(dirEntry("bin", 0o2775), "user.test=bin"), tool,
		x(&tar.Header{Typeflag: tar.TypeLink, Name: "bin/tool-link", Linkname: "bin/tool"}),
		x(dirEntry("data", 0o1777)), x(symlinkEntry("data/link", "../bin/tool")), fifo,
		x(dirEntry("data/sub", 0o555)), x(file("data/sub/f", "in a 0555 directory")),
	)
	for p, want := range map[string]uint32{
		"bin": unix.S_IFDIR | 0o2775, "bin/tool": unix.S_IFREG | 0o4755, "data": unix.S_IFDIR | 0o1777,
		"data/link": unix.S_IFLNK | 0o777, "data/fifo": unix.S_IFIFO | 0o620, "data/sub": unix.S_IFDIR | 0o555,
		"data/sub/f": unix.S_IFREG | 0o644,
	} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode != want || st.Uid != 1234 || st.Gid != 5678 || st.Mtim.Sec != mtime.Unix() {
			t.Errorf("%s: mode %o owner %d:%d mtime %v, want %o 1234:5678 %v", p, st.Mode, st.Uid, st.Gid, time.Unix(st.Mtim.Unix()), want, mtime)
		}
		if want&unix.S_IFMT == unix.S_IFREG && st.Mtim.Nsec != 800 {
			t.Errorf("%s: mtime nanoseconds %d", p, st.Mtim.Nsec)
		}
	}
	for p, want := range map[string]string{"bin": "bin", "bin/tool": "tool"} {
		if v, err := getUserXattr(filepath.Join(root, p), "user.test"); v != want {
			t.Errorf("%s: user.test = %q %v", p, v, err)
		}
	}
	for _, n := range []string{"trusted.nope", "security.capability", "user.overlay.opaque"} {
		if _, err := getUserXattr(filepath.Join(root, "bin/tool"), n); err == nil {
			t.Errorf("%s was applied", n)
		}
	}
	// Replaced by a rename: a reader of the old file still reads it whole.
	if b := make([]byte, 64); true {
		n, _ := old.ReadAt(b, 0)
		if string(b[:n]) != "old bin/tool" {
			t.Errorf("the old file, still open, reads %q", b[:n])
		}
	}
	a, _ := os.Stat(filepath.Join(root, "bin/tool"))
	b, _ := os.Stat(filepath.Join(root, "bin/tool-link"))
	if !os.SameFile(a, b) {
		t.Error("the hard link is a copy")
	}
}

// TestApplyAsUser: acting as a user, entries are the user's and take mode
// and time only, as ExtractArchive's do.
func TestApplyAsUser(t *testing.T) {
	s, root := newService(t)
	build(t, root, "home/user/p/gone", "home/user/p/keep")
	for _, p := range []string{"home/user/p", "home/user/p/gone", "home/user/p/keep"} {
		os.Lchown(filepath.Join(root, p), userUID, userUID)
	}
	h := file("new", "new")
	h.Uid, h.Gid, h.Mode, h.Format = 0, 0, 0o640, tar.FormatPAX
	h.PAXRecords = map[string]string{"SCHILY.xattr.user.test": "x"}
	res := apply(t, s, asUser, "/home/user/p", whiteout(".wh.gone"), h)
	if res.Entries != 1 || res.Whiteouts != 1 {
		t.Errorf("result %+v", res)
	}
	var st unix.Stat_t
	unix.Lstat(filepath.Join(root, "home/user/p/new"), &st)
	if st.Uid != userUID || st.Mode&0o7777 != 0o640 {
		t.Errorf("new: owner %d mode %o", st.Uid, st.Mode&0o7777)
	}
	if _, err := getUserXattr(filepath.Join(root, "home/user/p/new"), "user.test"); err == nil {
		t.Error("a user's apply set an attribute")
	}
	if _, err := os.Lstat(filepath.Join(root, "home/user/p/gone")); err == nil {
		t.Error("the whiteout did not remove gone")
	}
	_, err := s.ApplyArchive(t.Context(), asUser, "/", bytes.NewReader(tarOf(t, file("x", "x"))))
	wantClass(t, err, errdefs.PermissionDenied, "")
}

// TestApplyRefusalsLeaveNothing: every refused stream fails before anything
// at the destination changes, however far it got.
func TestApplyRefusalsLeaveNothing(t *testing.T) {
	s, root := newService(t)
	build(t, root, "etc/passwd", "etc/sub/f", "home/user/x", "lib -> usr/lib", "usr/lib/libc.so", "dev/null", "proc/")
	outside := filepath.Join(filepath.Dir(root), "apply-outside")
	t.Cleanup(func() { os.Remove(outside) })
	// Whiteouts and writes that would be applied come first in each stream.
	prefix := func() []*tar.Header {
		return []*tar.Header{whiteout("etc/.wh.passwd"), whiteout("etc/sub/.wh..wh..opq"), file("home/user/x", "overwritten")}
	}
	cases := map[string]struct {
		entries []*tar.Header
		class   errdefs.Class
		mention string
		cut     int // bytes cut from the end of the stream
	}{
		"dotdot":              {[]*tar.Header{file("../apply-outside", "x")}, errdefs.InvalidArgument, "outside", 0},
		"dotdot-absolute":     {[]*tar.Header{file("/etc/../../apply-outside", "x")}, errdefs.InvalidArgument, "outside", 0},
		"symlink-then-write":  {[]*tar.Header{symlinkEntry("esc", "/"), file("esc/etc/passwd", "x")}, errdefs.InvalidArgument, "symlink", 0},
		"symlink-up":          {[]*tar.Header{symlinkEntry("up", ".."), file("up/apply-outside", "x")}, errdefs.InvalidArgument, "symlink", 0},
		"whiteout-dotdot":     {[]*tar.Header{whiteout("etc/.wh..."), file("a", "a")}, errdefs.InvalidArgument, `".."`, 0},
		"whiteout-dot":        {[]*tar.Header{whiteout(".wh..")}, errdefs.InvalidArgument, `"."`, 0},
		"whiteout-empty":      {[]*tar.Header{whiteout("etc/.wh.")}, errdefs.InvalidArgument, `""`, 0},
		"whiteout-dotdot-dir": {[]*tar.Header{whiteout("etc/.wh../passwd")}, errdefs.InvalidArgument, "whiteout", 0},
		"whiteout-up":         {[]*tar.Header{whiteout("etc/../../.wh.x")}, errdefs.InvalidArgument, "outside", 0},
		"below-whiteout":      {[]*tar.Header{file("etc/.wh.sub/f", "x")}, errdefs.InvalidArgument, "whiteout", 0},
		"reserved-whiteout":   {[]*tar.Header{whiteout("etc/.wh..wh..plnk")}, errdefs.InvalidArgument, "reserved", 0},
		"proc-entry":          {[]*tar.Header{file("proc/sysrq-trigger", "b")}, errdefs.InvalidArgument, "/proc/sysrq-trigger", 0},
		"dev-file":            {[]*tar.Header{file("dev", "x")}, errdefs.InvalidArgument, "/dev", 0},
		"sys-whiteout":        {[]*tar.Header{whiteout(".wh.sys")}, errdefs.InvalidArgument, "/sys", 0},
		"dev-whiteout":        {[]*tar.Header{whiteout("dev/.wh.null")}, errdefs.InvalidArgument, "/dev/.wh.null", 0},
		"dev-opaque":          {[]*tar.Header{whiteout("dev/.wh..wh..opq")}, errdefs.InvalidArgument, "/dev", 0},
		"device":              {[]*tar.Header{{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}}, errdefs.InvalidArgument, "devices", 0},
		"hardlink-out":        {[]*tar.Header{{Typeflag: tar.TypeLink, Name: "h", Linkname: "etc/passwd"}}, errdefs.InvalidArgument, "hard link", 0},
		"negative-owner":      {[]*tar.Header{{Typeflag: tar.TypeDir, Name: "d/", Uid: -5, Mode: 0o755}}, errdefs.InvalidArgument, "owner", 0},
		"implied-over-link":   {[]*tar.Header{file("lib/libnew.so", "x")}, errdefs.Conflict, "/lib", 0},
		"dir-then-file":       {[]*tar.Header{dirEntry("n", 0o755), file("n", "x")}, errdefs.InvalidArgument, "directory", 0},
		"truncated":           {nil, errdefs.InvalidArgument, "truncated", 1500},
		"no-end-marker":       {[]*tar.Header{file("a", "a")}, errdefs.InvalidArgument, "end-of-archive", 1024},
	}
	before := state(t, root)
	for name, c := range cases {
		data := tarOf(t, append(prefix(), c.entries...)...)
		data = data[:len(data)-c.cut]
		_, err := s.ApplyArchive(t.Context(), guestapi.Where{}, "/", bytes.NewReader(data))
		if errdefs.ClassOf(err) != c.class || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%s: %v, want %s mentioning %s", name, err, c.class, c.mention)
		}
		if after := state(t, root); after != before {
			t.Fatalf("%s changed the destination:\n%s\nwant\n%s", name, after, before)
		}
		if _, err := os.Lstat(outside); err == nil {
			t.Fatalf("%s wrote outside the root", name)
		}
	}
	for _, p := range []string{"/proc", "/dev/shm", "/sys/fs"} {
		_, err := s.ApplyArchive(t.Context(), guestapi.Where{}, p, bytes.NewReader(tarOf(t, file("x", "x"))))
		wantClass(t, err, errdefs.PermissionDenied, errdefs.InvalidPath)
	}
	_, err := s.ApplyArchive(t.Context(), guestapi.Where{}, "/nope", bytes.NewReader(tarOf(t, file("x", "x"))))
	wantClass(t, err, errdefs.NotFound, "")
}

// TestApplyKernelDirsAtTheRoot: a layer's own entries for /proc, /sys and
// /dev are skipped, and an opaque root leaves them (and its staging).
func TestApplyKernelDirsAtTheRoot(t *testing.T) {
	s, root := newService(t)
	build(t, root, "proc/1/status", "sys/kernel/x", "dev/null", "etc/passwd", "bin/sh")
	res := apply(t, s, guestapi.Where{}, "/",
		whiteout(".wh..wh..opq"), dirEntry("proc", 0o555), dirEntry("sys", 0o555), dirEntry("dev", 0o755),
		dirEntry("etc", 0o755), file("etc/hostname", "fresh"))
	if res.Entries != 2 || res.Whiteouts != 1 {
		t.Errorf("result %+v", res)
	}
	ents, _ := os.ReadDir(root)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "dev etc proc sys" {
		t.Fatalf("the root holds %v, want dev etc proc sys", names)
	}
	if _, err := os.Stat(filepath.Join(root, "proc/1/status")); err != nil {
		t.Fatal("an opaque root emptied /proc")
	}
	if _, err := os.Stat(filepath.Join(root, "etc/passwd")); err == nil {
		t.Fatal("an opaque root left /etc/passwd")
	}
}

// mountTmpfs mounts a tmpfs at dir (made if missing) until the test ends.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16m,mode=0755"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount a tmpfs: %v, and CI=true turns the skip into a failure", err)
		}
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

// TestApplyAcrossMounts: entries bound for a mounted directory are copied
// there; a mount point is never removed or replaced, nor entered to remove.
func TestApplyAcrossMounts(t *testing.T) {
	s, root := newService(t)
	mountTmpfs(t, filepath.Join(root, "tmp"))
	mountTmpfs(t, filepath.Join(root, "data/vol"))
	build(t, root, "tmp/old", "tmp/gone", "tmp/dir/x", "tmp/d2/y", "data/vol/precious", "data/other")
	res := apply(t, s, guestapi.Where{}, "/",
		dirEntry("tmp", 0o1777), file("tmp/old", "replaced"), whiteout("tmp/.wh.gone"),
		dirEntry("tmp/new", 0o700), file("tmp/new/f", "copied"), symlinkEntry("tmp/new/l", "f"),
		file("tmp/dir", "file over dir"), dirEntry("tmp/d2", 0o755), whiteout("tmp/d2/.wh..wh..opq"), file("tmp/d2/z", "z"),
	)
	if res.Whiteouts != 2 {
		t.Errorf("result %+v", res)
	}
	for p, want := range map[string]string{"tmp/old": "replaced", "tmp/new/f": "copied", "tmp/dir": "file over dir", "tmp/d2/z": "z"} {
		if got := readString(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"tmp/gone", "tmp/d2/y"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s is still there", p)
		}
	}
	if fi, _ := os.Stat(filepath.Join(root, "tmp/new")); fi == nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("tmp/new: %v", fi)
	}
	if fi, _ := os.Stat(filepath.Join(root, "tmp")); fi == nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("the mounted tmp did not take its entry's mode: %v", fi)
	}
	noStaging(t, filepath.Join(root, "tmp"))
	noStaging(t, root)

	before := state(t, root)
	for name, hs := range map[string][]*tar.Header{
		"whiteout of a mount point":             {file("data/new", "x"), whiteout("data/.wh.vol")},
		"whiteout of a tree with a mount point": {whiteout(".wh.data")},
		"opaque over a mount point":             {whiteout("data/.wh..wh..opq")},
		"file over a mount point":               {file("tmp", "x")},
		"file over a tree with a mount point":   {file("data", "x")},
	} {
		_, err := s.ApplyArchive(t.Context(), guestapi.Where{}, "/", bytes.NewReader(tarOf(t, hs...)))
		if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "mount point") {
			t.Errorf("%s: %v, want a conflict naming the mount point", name, err)
		}
		if after := state(t, root); after != before {
			t.Fatalf("%s changed the destination:\n%s\nwant\n%s", name, after, before)
		}
	}
}

// TestApplyRoundTrip applies what WriteArchive wrote of one tree onto
// another directory.
func TestApplyRoundTrip(t *testing.T) {
	s, root := newService(t)
	for i := range 200 {
		upload(t, s, guestapi.Where{}, fmt.Sprintf("/src/d%d/f%d", i%7, i), []byte(strings.Repeat("x", i)))
	}
	os.Symlink("d1/f1", filepath.Join(root, "src/link"))
	os.Chmod(filepath.Join(root, "src/d3/f3"), 0o4711)
	os.Chown(filepath.Join(root, "src/d4/f4"), 42, 43)
	var buf bytes.Buffer
	if err := s.WriteArchive(t.Context(), guestapi.Where{}, "/src", &buf); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "dst/src/d0"), 0o755)
	os.WriteFile(filepath.Join(root, "dst/src/d0/f0"), []byte("stale"), 0o600)
	res, err := s.ApplyArchive(t.Context(), guestapi.Where{}, "/dst", &buf)
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != 1+7+200+1 {
		t.Errorf("result %+v", res)
	}
	if a, b := state(t, filepath.Join(root, "src")), state(t, filepath.Join(root, "dst/src")); a != b {
		t.Fatalf("the round trip differs:\n%s\nwant\n%s", b, a)
	}
}
