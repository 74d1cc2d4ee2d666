package files

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest/proc"
)

// These tests serve a temporary directory as the root, on the host, as
// root (the guest's identity inside a sandbox). The "user" account is
// uid:gid 1000:1000; lookups are injected because the host's /etc/passwd is
// not the sandbox's. Attacks through /proc run in real sandboxes
// (runtime/native's escape suite).

const userUID = 1000

func newService(t testing.TB) (*Service, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests act as other users and need root")
	}
	root := t.TempDir()
	os.Chmod(root, 0o755)
	s, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	s.lookup = func(spec string) (proc.Account, error) {
		switch spec {
		case "", "root":
			return proc.Account{Name: "root", Home: "/root", Self: true}, nil
		case "user":
			return proc.Account{Name: "user", Home: "/home/user", UID: userUID, GID: userUID, Groups: []uint32{}}, nil
		}
		return proc.Account{}, errdefs.New(errdefs.InvalidArgument, "user: %q not found", spec)
	}
	t.Cleanup(func() { s.Close() })
	for _, d := range []string{"root", "home/user", "tmp"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.Chown(filepath.Join(root, "home/user"), userUID, userUID)
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Chmod(filepath.Join(root, "root"), 0o700)
	return s, root
}

var asUser = guestapi.Where{User: "user"}

func wantClass(t *testing.T, err error, class errdefs.Class, reason errdefs.Reason) {
	t.Helper()
	if errdefs.ClassOf(err) != class || errdefs.ReasonOf(err) != reason {
		t.Fatalf("error %v: class %q reason %q, want %q %q", err, errdefs.ClassOf(err), errdefs.ReasonOf(err), class, reason)
	}
}

func upload(t *testing.T, s *Service, w guestapi.Where, p string, data []byte) guestapi.FileInfo {
	t.Helper()
	fi, err := s.Upload(w, p, WriteOptions{}, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("upload %s: %v", p, err)
	}
	return fi
}

func download(t *testing.T, s *Service, w guestapi.Where, p string) []byte {
	t.Helper()
	f, _, err := s.OpenFile(w, p)
	if err != nil {
		t.Fatalf("download %s: %v", p, err)
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	return b
}

func TestUploadDownloadByteExact(t *testing.T) {
	s, root := newService(t)
	data := make([]byte, 10<<20+7)
	rand.Read(data)
	fi := upload(t, s, asUser, "data/big.bin", data) // relative: from the user's home, parents made
	if fi.Path != "/home/user/data/big.bin" || fi.Size != int64(len(data)) || fi.UID != userUID || fi.Mode != 0o644 {
		t.Fatalf("info %+v", fi)
	}
	if got := download(t, s, asUser, "/home/user/data/big.bin"); sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatal("download differs from upload")
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(root, "home/user/data"), &st)
	if st.Uid != userUID {
		t.Fatalf("made parent owned by %d, want the acting user", st.Uid)
	}
	// Replacing keeps the mode; no temporary file is left.
	os.Chmod(filepath.Join(root, "home/user/data/big.bin"), 0o600)
	fi = upload(t, s, asUser, "/home/user/data/big.bin", []byte("small"))
	if fi.Mode != 0o600 || fi.Size != 5 {
		t.Fatalf("replaced: %+v", fi)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "home/user/data")); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}

// errReader fails after some bytes, as a client that goes away would.
type errReader struct{ n int }

func (r *errReader) Read(b []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	k := min(len(b), r.n)
	r.n -= k
	return k, nil
}

// TestUploadModes: an upload's mode is the file's mode, setuid and setgid
// included (applied once the bytes are in: a write clears them); one the
// kernel will not set for this user is refused and leaves nothing.
func TestUploadModes(t *testing.T) {
	s, root := newService(t)
	for _, m := range []uint32{0o7777, 0o4755, 0o2750, 0o1777, 0o600} {
		mode := m
		p := fmt.Sprintf("/home/user/m%04o", m)
		fi, err := s.Upload(asUser, p, WriteOptions{Mode: &mode}, strings.NewReader("x"))
		if err != nil || fi.Mode != m {
			t.Errorf("mode %04o: got %04o %v", m, fi.Mode, err)
		}
	}
	// A setgid directory of group root makes new files group root, which
	// "user" is not in: the kernel would drop setgid, so the upload is refused.
	sg := filepath.Join(root, "home/user/sg")
	os.Mkdir(sg, 0o777)
	os.Chown(sg, userUID, 0)
	unix.Chmod(sg, 0o2777)
	mode := uint32(0o2755)
	_, err := s.Upload(asUser, "/home/user/sg/f", WriteOptions{Mode: &mode}, strings.NewReader("x"))
	wantClass(t, err, errdefs.InvalidArgument, "")
	if !strings.Contains(err.Error(), "2755") {
		t.Errorf("the refusal does not name the mode: %v", err)
	}
	if entries, _ := os.ReadDir(sg); len(entries) != 0 {
		t.Errorf("a refused upload left %v", entries)
	}
}

func TestFailedUploadLeavesOldFile(t *testing.T) {
	s, root := newService(t)
	upload(t, s, asUser, "/home/user/keep.txt", []byte("old"))
	_, err := s.Upload(asUser, "/home/user/keep.txt", WriteOptions{}, &errReader{n: 3 << 20})
	wantClass(t, err, errdefs.InvalidArgument, "")
	if got := download(t, s, asUser, "/home/user/keep.txt"); string(got) != "old" {
		t.Fatalf("after a failed upload: %q", got)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "home/user")); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}

func TestErrorClasses(t *testing.T) {
	s, root := newService(t)
	os.WriteFile(filepath.Join(root, "root/secret"), []byte("s"), 0o600)
	os.WriteFile(filepath.Join(root, "file"), []byte("f"), 0o644)
	unix.Mkfifo(filepath.Join(root, "tmp/fifo"), 0o666)
	open := func(p string) error { _, _, err := s.OpenFile(asUser, p); return err }
	wantClass(t, open("/nope"), errdefs.NotFound, "")
	wantClass(t, open("/tmp"), errdefs.InvalidArgument, errdefs.IsDirectory)
	wantClass(t, open("/root/secret"), errdefs.PermissionDenied, "")
	wantClass(t, open("/file/x"), errdefs.InvalidArgument, errdefs.NotDirectory)
	wantClass(t, open("/tmp/\x00x"), errdefs.InvalidArgument, errdefs.InvalidPath)
	wantClass(t, open(""), errdefs.InvalidArgument, errdefs.InvalidPath)
	wantClass(t, open("/"+strings.Repeat("a/", 3000)), errdefs.InvalidArgument, errdefs.InvalidPath)
	wantClass(t, open("/"+strings.Repeat("a", 300)), errdefs.InvalidArgument, errdefs.InvalidPath)
	done := make(chan error, 1)
	go func() { done <- open("/tmp/fifo") }()
	select {
	case err := <-done:
		wantClass(t, err, errdefs.InvalidArgument, errdefs.NotRegularFile)
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO hangs")
	}
	_, err := s.Upload(asUser, "/tmp/fifo", WriteOptions{}, strings.NewReader("x"))
	wantClass(t, err, errdefs.InvalidArgument, errdefs.NotRegularFile)
	_, err = s.Upload(asUser, "/etc-new/x", WriteOptions{}, strings.NewReader("x"))
	wantClass(t, err, errdefs.PermissionDenied, "")
	_, err = s.Upload(asUser, "/tmp", WriteOptions{}, strings.NewReader("x"))
	wantClass(t, err, errdefs.InvalidArgument, errdefs.IsDirectory)
	_, err = s.Upload(guestapi.Where{User: "nobody-here"}, "/tmp/x", WriteOptions{}, strings.NewReader("x"))
	wantClass(t, err, errdefs.InvalidArgument, "")
	// Root may.
	if got := download(t, s, guestapi.Where{}, "/root/secret"); string(got) != "s" {
		t.Fatalf("root read %q", got)
	}
}

// TestStaysInsideRoot resolves hostile paths; none may reach the file
// placed just outside the served root.
func TestStaysInsideRoot(t *testing.T) {
	s, root := newService(t)
	outside := filepath.Join(filepath.Dir(root), "outside-secret")
	os.WriteFile(outside, []byte("HOST SECRET"), 0o644)
	t.Cleanup(func() { os.Remove(outside) })
	os.Symlink("../../../../../../../..", filepath.Join(root, "tmp/up"))
	os.Symlink(outside, filepath.Join(root, "tmp/abs"))
	os.Symlink("/proc/self/root"+outside, filepath.Join(root, "tmp/magic"))
	for _, p := range []string{
		"/../outside-secret", "../../../../outside-secret", "/tmp/up/outside-secret",
		"/tmp/abs", "/tmp/magic", "/tmp/up" + outside,
	} {
		f, _, err := s.OpenFile(guestapi.Where{}, p)
		if err == nil {
			b, _ := io.ReadAll(f)
			f.Close()
			if bytes.Contains(b, []byte("HOST SECRET")) {
				t.Fatalf("%s read the file outside the root", p)
			}
		}
		_, err = s.Upload(guestapi.Where{}, p, WriteOptions{}, strings.NewReader("overwritten"))
		if b, _ := os.ReadFile(outside); string(b) != "HOST SECRET" {
			t.Fatalf("%s wrote outside the root (%v)", p, err)
		}
	}
	// A write through the absolute symlink lands inside the root.
	if _, err := os.Stat(filepath.Join(root, outside)); err != nil {
		t.Fatalf("write through /tmp/abs did not land inside the root: %v", err)
	}
}

// TestSymlinkSwapDuringReads flips a symlink between a directory inside and
// a path that would lead out while reads go through it.
func TestSymlinkSwapDuringReads(t *testing.T) {
	s, root := newService(t)
	outside := filepath.Join(filepath.Dir(root), "swap-secret")
	os.WriteFile(outside, []byte("HOST SECRET"), 0o644)
	t.Cleanup(func() { os.Remove(outside) })
	os.MkdirAll(filepath.Join(root, "tmp/in"), 0o755)
	os.WriteFile(filepath.Join(root, "tmp/in/swap-secret"), []byte("inside"), 0o644)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		link, tmp := filepath.Join(root, "tmp/link"), filepath.Join(root, "tmp/link.new")
		for i := 0; !stop.Load(); i++ {
			target := "in"
			if i%2 == 1 {
				target = filepath.Dir(root) // absolute: outside, if resolved on the host
			}
			os.Remove(tmp)
			os.Symlink(target, tmp)
			os.Rename(tmp, link)
		}
	}()
	for range 2000 {
		f, _, err := s.OpenFile(guestapi.Where{}, "/tmp/link/swap-secret")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(f)
		f.Close()
		if string(b) != "inside" {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("read %q through a swapped symlink", b)
		}
	}
	stop.Store(true)
	wg.Wait()
}

func TestReadTool(t *testing.T) {
	s, _ := newService(t)
	var text strings.Builder
	for i := 1; i <= 25; i++ {
		fmt.Fprintf(&text, "line %d\r\n", i)
	}
	text.WriteString(strings.Repeat("é", 3000)) // no final newline, long
	upload(t, s, asUser, "/home/user/t.txt", []byte(text.String()))
	r, err := s.Read(guestapi.ReadRequest{Where: asUser, Path: "t.txt", Offset: 10, Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if r.TotalLines != 26 || r.NextOffset != 15 || len(r.Lines) != 5 || r.Lines[0] != (guestapi.Line{Number: 11, Text: "line 11"}) {
		t.Fatalf("page: %+v", r)
	}
	r, _ = s.Read(guestapi.ReadRequest{Where: asUser, Path: "t.txt", Offset: 24})
	last := r.Lines[len(r.Lines)-1]
	if r.NextOffset != 0 || last.Number != 26 || !last.Truncated || len([]rune(last.Text)) != 2000 {
		t.Fatalf("last page: next %d, last line %d truncated %v len %d", r.NextOffset, last.Number, last.Truncated, len([]rune(last.Text)))
	}
	r, err = s.Read(guestapi.ReadRequest{Where: asUser, Path: "t.txt", Offset: 26})
	if err != nil || len(r.Lines) != 0 || r.TotalLines != 26 || r.NextOffset != 0 {
		t.Fatalf("past the end: %+v %v", r, err)
	}
	upload(t, s, asUser, "/home/user/bin", []byte("ELF\x00\x01\x02"))
	if r, _ := s.Read(guestapi.ReadRequest{Where: asUser, Path: "bin"}); !r.Binary || len(r.Lines) != 0 {
		t.Fatalf("binary: %+v", r)
	}
	upload(t, s, asUser, "/home/user/empty", nil)
	if r, err := s.Read(guestapi.ReadRequest{Where: asUser, Path: "empty"}); err != nil || r.TotalLines != 0 || len(r.Lines) != 0 {
		t.Fatalf("empty: %+v %v", r, err)
	}
}

func TestWriteAndEdit(t *testing.T) {
	s, root := newService(t)
	fi, err := s.Write(guestapi.WriteRequest{Where: asUser, Path: "/home/user/src/a.py", Content: "x = 1\nx = 1\ny = 2\n", CreateOnly: true})
	if err != nil || fi.UID != userUID {
		t.Fatalf("write: %+v %v", fi, err)
	}
	_, err = s.Write(guestapi.WriteRequest{Where: asUser, Path: "/home/user/src/a.py", Content: "z", CreateOnly: true})
	wantClass(t, err, errdefs.AlreadyExists, "")
	_, err = s.Edit(guestapi.EditRequest{Where: asUser, Path: "src/a.py", Old: "x = 1", New: "x = 3"})
	if err == nil || !strings.Contains(err.Error(), "appears 2 times") || errdefs.ReasonOf(err) != errdefs.NotUnique {
		t.Fatalf("not unique: %v", err)
	}
	_, err = s.Edit(guestapi.EditRequest{Where: asUser, Path: "src/a.py", Old: "nope", New: ""})
	if err == nil || !strings.Contains(err.Error(), "not found") || errdefs.ClassOf(err) != errdefs.InvalidArgument {
		t.Fatalf("not found: %v", err)
	}
	_, err = s.Edit(guestapi.EditRequest{Where: asUser, Path: "src/missing.py", Old: "a", New: "b"})
	wantClass(t, err, errdefs.NotFound, "")
	os.Chmod(filepath.Join(root, "home/user/src/a.py"), 0o640)
	res, err := s.Edit(guestapi.EditRequest{Where: asUser, Path: "src/a.py", Old: "x = 1", New: "x = 10", ReplaceAll: true})
	if err != nil || res.Occurrences != 2 {
		t.Fatalf("replace all: %+v %v", res, err)
	}
	res, err = s.Edit(guestapi.EditRequest{Where: asUser, Path: "src/a.py", Old: "y = 2\n", New: ""})
	if err != nil || res.Occurrences != 1 {
		t.Fatalf("edit: %+v %v", res, err)
	}
	b, _ := os.ReadFile(filepath.Join(root, "home/user/src/a.py"))
	st, _ := os.Stat(filepath.Join(root, "home/user/src/a.py"))
	if string(b) != "x = 10\nx = 10\n" || st.Mode().Perm() != 0o640 {
		t.Fatalf("after edits: %q %v", b, st.Mode())
	}
	// A CRLF file edited with the LF text read shows keeps its CRLFs.
	upload(t, s, asUser, "/home/user/dos.txt", []byte("one\r\ntwo\r\nthree\r\n"))
	if res, err := s.Edit(guestapi.EditRequest{Where: asUser, Path: "dos.txt", Old: "one\ntwo", New: "1\n2"}); err != nil || res.Occurrences != 1 {
		t.Fatalf("CRLF edit: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "home/user/dos.txt")); string(b) != "1\r\n2\r\nthree\r\n" {
		t.Fatalf("after the CRLF edit: %q", b)
	}
	_, err = s.Edit(guestapi.EditRequest{Where: asUser, Path: "dos.txt", Old: "nope", New: ""})
	wantClass(t, err, errdefs.InvalidArgument, errdefs.NoMatch)
}

func TestFilesystemOps(t *testing.T) {
	s, root := newService(t)
	if _, err := s.Mkdir(guestapi.MkdirRequest{Where: asUser, Path: "a/b/c", Parents: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mkdir(guestapi.MkdirRequest{Where: asUser, Path: "a/b/c", Parents: true}); err != nil {
		t.Fatalf("mkdir -p of an existing directory: %v", err)
	}
	_, err := s.Mkdir(guestapi.MkdirRequest{Where: asUser, Path: "a/b/c"})
	wantClass(t, err, errdefs.AlreadyExists, "")
	upload(t, s, asUser, "a/b/c/f.txt", []byte("hi"))
	upload(t, s, asUser, "a/g.txt", []byte("g"))
	os.Symlink("b/c/f.txt", filepath.Join(root, "home/user/a/link"))

	l, err := s.List(t.Context(), guestapi.ListRequest{Where: asUser, Path: "a"})
	if err != nil || len(l.Entries) != 3 {
		t.Fatalf("list depth 1: %+v %v", l, err)
	}
	if e := l.Entries[2]; e.Name != "link" || e.Type != guestapi.TypeSymlink || e.Target != "b/c/f.txt" {
		t.Fatalf("symlink entry %+v", e)
	}
	l, _ = s.List(t.Context(), guestapi.ListRequest{Where: asUser, Path: "a", Depth: 3})
	if len(l.Entries) != 5 {
		t.Fatalf("list depth 3: %d entries", len(l.Entries))
	}
	fi, err := s.Stat(guestapi.StatRequest{Where: asUser, Path: "a/link"})
	if err != nil || fi.Type != guestapi.TypeFile || fi.Size != 2 {
		t.Fatalf("stat follows: %+v %v", fi, err)
	}
	ex, _ := s.Exists(guestapi.StatRequest{Where: asUser, Path: "a/nope"})
	if ex.Exists {
		t.Fatal("exists: nope")
	}
	_, err = s.Move(guestapi.MoveRequest{Where: asUser, From: "a/g.txt", To: "a/b/c/f.txt"})
	wantClass(t, err, errdefs.AlreadyExists, "")
	if _, err = s.Move(guestapi.MoveRequest{Where: asUser, From: "a/g.txt", To: "a/b/c/f.txt", Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	fi, _ = s.Chmod(guestapi.ChmodRequest{Where: asUser, Path: "a/b/c/f.txt", Mode: 0o600})
	if fi.Mode != 0o600 {
		t.Fatalf("chmod: %+v", fi)
	}
	_, err = s.Chown(t.Context(), guestapi.ChownRequest{Where: asUser, Path: "a", Owner: "0:0"})
	wantClass(t, err, errdefs.PermissionDenied, "")
	err = s.Remove(t.Context(), guestapi.RemoveRequest{Where: asUser, Path: "a"})
	wantClass(t, err, errdefs.Conflict, "")
	if err := s.Remove(t.Context(), guestapi.RemoveRequest{Where: asUser, Path: "a", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	err = s.Remove(t.Context(), guestapi.RemoveRequest{Where: asUser, Path: "a"})
	wantClass(t, err, errdefs.NotFound, "")
	if err := s.Remove(t.Context(), guestapi.RemoveRequest{Where: asUser, Path: "a", Force: true}); err != nil {
		t.Fatal(err)
	}
	err = s.Remove(t.Context(), guestapi.RemoveRequest{Where: asUser, Path: "/"})
	wantClass(t, err, errdefs.InvalidArgument, errdefs.InvalidPath)
	err = s.Remove(t.Context(), guestapi.RemoveRequest{Where: asUser, Path: "/root", Recursive: true})
	wantClass(t, err, errdefs.PermissionDenied, "")
}

func tree(t *testing.T, s *Service, base string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		upload(t, s, asUser, base+"/"+p, []byte(c))
	}
}

func TestGlob(t *testing.T) {
	s, _ := newService(t)
	tree(t, s, "/home/user/p", map[string]string{
		"a.py": "", "b.txt": "", "src/c.py": "", "src/deep/d.py": "", ".hidden.py": "", "src/.git/e.py": "", "x.go": "",
	})
	cases := map[string][]string{
		// Without "/": the name at any depth, dot-directories included.
		"*.py":      {"/home/user/p/a.py", "/home/user/p/src/.git/e.py", "/home/user/p/src/c.py", "/home/user/p/src/deep/d.py"},
		"*.{py,go}": {"/home/user/p/a.py", "/home/user/p/src/.git/e.py", "/home/user/p/src/c.py", "/home/user/p/src/deep/d.py", "/home/user/p/x.go"},
		".*.py":     {"/home/user/p/.hidden.py"},
		// With "/": relative to the root; "**" skips dot-directories.
		"/*.py":        {"/home/user/p/a.py"},
		"**/*.py":      {"/home/user/p/a.py", "/home/user/p/src/c.py", "/home/user/p/src/deep/d.py"},
		"src/**":       {"/home/user/p/src/c.py", "/home/user/p/src/deep/d.py"},
		"src/*/?.py":   {"/home/user/p/src/deep/d.py"},
		"nothing/*.py": {},
	}
	for pat, want := range cases {
		r, err := s.Glob(t.Context(), guestapi.GlobRequest{Where: asUser, Pattern: pat, Path: "/home/user/p"})
		if err != nil {
			t.Fatalf("%s: %v", pat, err)
		}
		var got []string
		for _, m := range r.Matches {
			got = append(got, m.Path)
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("glob %s: %v, want %v", pat, got, want)
		}
	}
	r, _ := s.Glob(t.Context(), guestapi.GlobRequest{Where: asUser, Pattern: "*", Path: "/home/user/p", Limit: 2})
	if !r.Truncated || len(r.Matches) != 2 {
		t.Fatalf("limit: %+v", r)
	}
	_, err := s.Glob(t.Context(), guestapi.GlobRequest{Where: asUser, Pattern: "[", Path: "/home/user/p"})
	wantClass(t, err, errdefs.InvalidArgument, "")
	_, err = s.Glob(t.Context(), guestapi.GlobRequest{Where: asUser, Pattern: "../*", Path: "/home/user/p"})
	wantClass(t, err, errdefs.InvalidArgument, "")
	r, _ = s.Glob(t.Context(), guestapi.GlobRequest{Where: asUser, Pattern: "src/*", Path: "/home/user/p", IncludeDirs: true})
	if len(r.Matches) != 2 || r.Matches[1].Type != guestapi.TypeDir {
		t.Fatalf("include_dirs: %+v", r.Matches)
	}
}

func TestGrep(t *testing.T) {
	s, _ := newService(t)
	tree(t, s, "/home/user/g", map[string]string{
		"a.py":     "import os\nprint('TODO: a')\n\nTODO again\n",
		"b.txt":    "nothing\nTODO in txt",
		"sub/c.py": "x=1\n# todo lower\n",
		"bin.dat":  "TODO\x00binary",
		"sym.py":   "a.b\n",
	})
	r, err := s.Grep(t.Context(), guestapi.GrepRequest{Where: asUser, Pattern: "TODO", Path: "/home/user/g"})
	if err != nil {
		t.Fatal(err)
	}
	want := []guestapi.GrepMatch{
		{Path: "/home/user/g/a.py", Line: 2, Text: "print('TODO: a')"},
		{Path: "/home/user/g/a.py", Line: 4, Text: "TODO again"},
		{Path: "/home/user/g/b.txt", Line: 2, Text: "TODO in txt"},
	}
	if fmt.Sprint(r.Matches) != fmt.Sprint(want) || r.FilesSearched != 5 {
		t.Fatalf("grep: %+v", r)
	}
	r, _ = s.Grep(t.Context(), guestapi.GrepRequest{Where: asUser, Pattern: "todo", Path: "/home/user/g", Glob: "*.py", IgnoreCase: true})
	if len(r.Matches) != 3 || r.Matches[2].Path != "/home/user/g/sub/c.py" || r.Matches[2].Line != 2 {
		t.Fatalf("ignore case + glob: %+v", r.Matches)
	}
	r, _ = s.Grep(t.Context(), guestapi.GrepRequest{Where: asUser, Pattern: "a.b", Path: "/home/user/g"})
	if len(r.Matches) != 1 { // literal: the dot is a dot
		t.Fatalf("literal: %+v", r.Matches)
	}
	r, _ = s.Grep(t.Context(), guestapi.GrepRequest{Where: asUser, Pattern: `^x=\d`, Regex: true, Path: "/home/user/g"})
	if len(r.Matches) != 1 || r.Matches[0].Line != 1 {
		t.Fatalf("regex: %+v", r.Matches)
	}
	r, _ = s.Grep(t.Context(), guestapi.GrepRequest{Where: asUser, Pattern: "TODO", Path: "/home/user/g/a.py", Limit: 1})
	if len(r.Matches) != 1 || !r.Truncated {
		t.Fatalf("single file + limit: %+v", r)
	}
	_, err = s.Grep(t.Context(), guestapi.GrepRequest{Where: asUser, Pattern: "(", Regex: true})
	wantClass(t, err, errdefs.InvalidArgument, "")
}

func tarOf(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg && h.Size == 0 && h.Linkname != "" {
			data := h.Linkname
			h.Linkname, h.Size = "", int64(len(data))
			tw.WriteHeader(h)
			tw.Write([]byte(data))
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	return buf.Bytes()
}

// file makes a tar header for a regular file with content.
func file(name, content string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Linkname: content}
}

func listTree(t testing.TB, dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil {
			out = append(out, strings.TrimPrefix(p, dir))
		}
		return nil
	})
	return out
}

func TestArchiveRoundTrip(t *testing.T) {
	s, root := newService(t)
	want := map[string][32]byte{}
	for i := range 1000 {
		p := fmt.Sprintf("d%d/f%d.bin", i%17, i)
		data := make([]byte, i%300)
		rand.Read(data)
		upload(t, s, asUser, "/home/user/src/"+p, data)
		want[p] = sha256.Sum256(data)
	}
	os.Symlink("d1/f1.bin", filepath.Join(root, "home/user/src/link"))
	os.Link(filepath.Join(root, "home/user/src/d2/f2.bin"), filepath.Join(root, "home/user/src/hard"))
	var buf bytes.Buffer
	if err := s.WriteArchive(t.Context(), asUser, "/home/user/src", &buf); err != nil {
		t.Fatal(err)
	}
	res, err := s.ExtractArchive(asUser, "/home/user/dst", &buf)
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries < 1000 {
		t.Fatalf("extracted %+v", res)
	}
	for p, sum := range want {
		got, err := os.ReadFile(filepath.Join(root, "home/user/dst/src", p))
		if err != nil || sha256.Sum256(got) != sum {
			t.Fatalf("%s differs after the round trip (%v)", p, err)
		}
	}
	if l, _ := os.Readlink(filepath.Join(root, "home/user/dst/src/link")); l != "d1/f1.bin" {
		t.Fatalf("symlink came back as %q", l)
	}
	a, _ := os.Stat(filepath.Join(root, "home/user/dst/src/hard"))
	b, _ := os.Stat(filepath.Join(root, "home/user/dst/src/d2/f2.bin"))
	if !os.SameFile(a, b) {
		t.Fatal("hard link came back as a copy")
	}
	var st unix.Stat_t
	unix.Lstat(filepath.Join(root, "home/user/dst/src/d3/f3.bin"), &st)
	if st.Uid != userUID {
		t.Fatalf("extracted file owned by %d", st.Uid)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "home/user/dst")); len(ents) != 1 {
		t.Fatalf("staging left behind: %v", ents)
	}
}

func TestBadArchivesLeaveNothing(t *testing.T) {
	s, root := newService(t)
	upload(t, s, asUser, "/home/user/dst/existing", []byte("keep"))
	full := tarOf(t, file("a.txt", strings.Repeat("x", 4096)), file("b.txt", "b"))
	outside := filepath.Join(filepath.Dir(root), "tar-outside")
	t.Cleanup(func() { os.Remove(outside) })
	cases := map[string][]byte{
		"truncated":   full[:1000],
		"garbage":     []byte(strings.Repeat("not a tar ", 100)),
		"dotdot":      tarOf(t, file("ok.txt", "ok"), file("../../../../tar-outside", "x")),
		"dotdot-deep": tarOf(t, file("a/../../x", "x")),
		"symlink-then-write": tarOf(t,
			&tar.Header{Typeflag: tar.TypeSymlink, Name: "esc", Linkname: "/home/user"},
			file("esc/owned.txt", "x")),
		"symlink-up": tarOf(t,
			&tar.Header{Typeflag: tar.TypeSymlink, Name: "up", Linkname: "../.."},
			file("up/up/owned.txt", "x")),
		"hardlink-out": tarOf(t, &tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "../existing"}),
		"hardlink-abs": tarOf(t, &tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "/etc/passwd"}),
		"device":       tarOf(t, &tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3, Mode: 0o666}),
		"top-file":     tarOf(t, file(".", "x")),
	}
	before := listTree(t, root)
	for name, data := range cases {
		// Into an existing directory, and into one the upload makes (with
		// its parent): a refused stream leaves neither.
		for _, dst := range []string{"/home/user/dst", "/home/user/made/for/it"} {
			_, err := s.ExtractArchive(asUser, dst, bytes.NewReader(data))
			if errdefs.ClassOf(err) != errdefs.InvalidArgument {
				t.Errorf("%s into %s: %v, want invalid_argument", name, dst, err)
			}
			if after := listTree(t, root); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Fatalf("%s into %s left files behind: %v", name, dst, after)
			}
		}
		if _, err := os.Stat(outside); err == nil {
			t.Fatalf("%s wrote outside the root", name)
		}
	}
	if got := download(t, s, asUser, "/home/user/dst/existing"); string(got) != "keep" {
		t.Fatal("existing file changed")
	}
}

// TestLongWalksStopWithTheRequest: operations that walk a tree stop when
// their request's context ends (the daemon's caller went away) instead of
// running on: nothing is searched, changed or removed after that.
func TestLongWalksStopWithTheRequest(t *testing.T) {
	s, root := newService(t)
	tree := filepath.Join(root, "home/user/big")
	for i := range 300 {
		d := filepath.Join(tree, fmt.Sprintf("d%02d", i%30))
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d.txt", i)), []byte("needle\n"), 0o644)
	}
	exec.Command("chown", "-R", fmt.Sprintf("%d:%d", userUID, userUID), tree).Run()
	entries := len(listTree(t, tree))
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	where := "/home/user/big"
	if r, err := s.Grep(gone, guestapi.GrepRequest{Where: asUser, Pattern: "needle", Path: where}); !errors.Is(err, context.Canceled) || r.FilesSearched != 0 {
		t.Errorf("grep: %v, %d files searched", err, r.FilesSearched)
	}
	if _, err := s.Glob(gone, guestapi.GlobRequest{Where: asUser, Pattern: "**/*.txt", Path: where}); !errors.Is(err, context.Canceled) {
		t.Errorf("glob: %v", err)
	}
	if _, err := s.List(gone, guestapi.ListRequest{Where: asUser, Path: where, Depth: 3}); !errors.Is(err, context.Canceled) {
		t.Errorf("list: %v", err)
	}
	if _, err := s.Chown(gone, guestapi.ChownRequest{Path: where, Owner: "0:0", Recursive: true}); !errors.Is(err, context.Canceled) {
		t.Errorf("chown: %v", err)
	}
	if err := s.Remove(gone, guestapi.RemoveRequest{Where: asUser, Path: where, Recursive: true}); !errors.Is(err, context.Canceled) {
		t.Errorf("remove: %v", err)
	}
	if n := len(listTree(t, tree)); n != entries || n < 330 {
		t.Fatalf("%d entries left of %d: a cancelled remove went on", n, entries)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(tree, "d05/f005.txt"), &st); err != nil || st.Uid != userUID {
		t.Fatalf("a cancelled chown changed an owner: %v %d", err, st.Uid)
	}
	// The same calls with a live context do the work.
	if r, err := s.Grep(t.Context(), guestapi.GrepRequest{Where: asUser, Pattern: "needle", Path: where}); err != nil || len(r.Matches) != 300 {
		t.Fatalf("grep: %d matches, %v", len(r.Matches), err)
	}
}

func TestArchiveMergesAndAbsoluteNames(t *testing.T) {
	s, root := newService(t)
	upload(t, s, asUser, "/home/user/dst/d/old", []byte("old"))
	upload(t, s, asUser, "/home/user/dst/d/same", []byte("before"))
	data := tarOf(t, &tar.Header{Typeflag: tar.TypeDir, Name: "/d/", Mode: 0o555}, file("/d/same", "after"), file("d/new", "new"))
	if _, err := s.ExtractArchive(asUser, "/home/user/dst", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"d/old": "old", "d/same": "after", "d/new": "new"} {
		if b, _ := os.ReadFile(filepath.Join(root, "home/user/dst", p)); string(b) != want {
			t.Errorf("%s = %q, want %q", p, b, want)
		}
	}
}

func TestBatch(t *testing.T) {
	s, _ := newService(t)
	up := s.UploadBatch(guestapi.UploadRequest{Where: asUser, Files: []guestapi.UploadFile{
		{Path: "/home/user/one", Content: []byte("1")},
		{Path: "/root/no", Content: []byte("2")},
		{Path: "/home/user/two", Content: []byte("22")},
	}})
	if up.Results[0].Error != nil || up.Results[1].Error == nil || up.Results[1].Error.Class != "permission_denied" || up.Results[2].Error != nil {
		t.Fatalf("upload batch: %+v", up.Results)
	}
	down := s.DownloadBatch(guestapi.DownloadRequest{Where: asUser, Paths: []string{"/home/user/two", "/home/user/nope", "/home", "/home/user/one"}})
	r := down.Results
	if string(r[0].Content) != "22" || r[1].Error.Class != "not_found" || r[2].Error.Reason != "is_directory" || string(r[3].Content) != "1" {
		t.Fatalf("download batch: %+v", r)
	}
}

func TestWatch(t *testing.T) {
	s, root := newService(t)
	os.MkdirAll(filepath.Join(root, "home/user/w"), 0o755)
	os.Chown(filepath.Join(root, "home/user/w"), userUID, userUID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan guestapi.WatchEvent, 100)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Watch(ctx, asUser, "/home/user/w", true, func() error { close(ready); return nil }, func(ev guestapi.WatchEvent) error {
			events <- ev
			return nil
		})
	}()
	<-ready
	dir := filepath.Join(root, "home/user/w")
	os.WriteFile(filepath.Join(dir, "a"), []byte("1"), 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	time.Sleep(100 * time.Millisecond) // the watch on the new directory is added when its event is read
	os.WriteFile(filepath.Join(dir, "sub/b"), []byte("2"), 0o644)
	os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "c"))
	os.Remove(filepath.Join(dir, "c"))
	want := []string{"create /home/user/w/a", "write /home/user/w/a", "create /home/user/w/sub", "create /home/user/w/sub/b",
		"rename /home/user/w/a", "rename /home/user/w/c", "remove /home/user/w/c"}
	var got []string
	seen := map[string]bool{}
	deadline := time.After(5 * time.Second)
	for missing := len(want); missing > 0; {
		select {
		case ev := <-events:
			e := ev.Type + " " + ev.Path
			got = append(got, e)
			if slices.Contains(want, e) && !seen[e] {
				seen[e] = true
				missing--
			}
		case <-deadline:
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	err := s.Watch(context.Background(), asUser, "/nope", false, func() error { return nil }, nil)
	wantClass(t, err, errdefs.NotFound, "")
}
