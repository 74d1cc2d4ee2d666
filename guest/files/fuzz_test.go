package files

import (
	"archive/tar"
	"bytes"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// FuzzEntryName: a cleaned tar entry name is relative and inside, or an error.
func FuzzEntryName(f *testing.F) {
	for _, s := range []string{"a/b", "/abs", "../x", "a/../../x", "./.", "a//b/", "\x00", "..", "a/..", strings.Repeat("a/", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		name, err := entryName(raw)
		if err != nil {
			if errdefs.ClassOf(err) != errdefs.InvalidArgument {
				t.Fatalf("%q: %v is not invalid_argument", raw, err)
			}
			return
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") || strings.Contains(name, "/../") || strings.IndexByte(name, 0) >= 0 {
			t.Fatalf("%q cleaned to %q", raw, name)
		}
	})
}

// FuzzCallerPath: a user's path becomes absolute and clean, or an
// invalid_path error.
func FuzzCallerPath(f *testing.F) {
	for _, s := range []string{"a", "/a/../..", "../../etc/passwd", "", "\x00", "/proc/1/root", strings.Repeat("x", 5000)} {
		f.Add(s)
	}
	c := caller{cwd: "/home/user"}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := c.abs("path", p)
		if err != nil {
			if errdefs.ReasonOf(err) != errdefs.InvalidPath {
				t.Fatalf("%q: %v", p, err)
			}
			return
		}
		if !path.IsAbs(got) || path.Clean(got) != got || strings.Contains(got, "/../") {
			t.Fatalf("%q became %q", p, got)
		}
	})
}

// FuzzExtract feeds arbitrary streams to ExtractArchive: whatever the
// stream, nothing appears outside the destination, and a rejected stream
// leaves the destination as it was.
func FuzzExtract(f *testing.F) {
	seed := func(hs ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hs {
			data := h.Linkname
			if h.Typeflag == tar.TypeReg {
				h.Linkname, h.Size = "", int64(len(data))
			}
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte(data))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	reg := func(n, c string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: n, Linkname: c, Mode: 0o644}
	}
	f.Add(seed(reg("a", "x")))
	f.Add(seed(reg("../a", "x")))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/"}, reg("l/x", "x")))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: ".."}, reg("l/x", "x")))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o500}, reg("d/x", "x")))
	f.Add(seed(reg("a", "x"), &tar.Header{Typeflag: tar.TypeLink, Name: "b", Linkname: "a"}))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeLink, Name: "b", Linkname: "../../outside"}))
	f.Add(seed(reg("a", strings.Repeat("y", 2000)))[:700])
	s, root := newService(f)
	outsideDir := filepath.Dir(root)
	f.Fuzz(func(t *testing.T, data []byte) {
		dest := filepath.Join(root, "home/user/dst")
		os.RemoveAll(dest)
		os.MkdirAll(dest, 0o755)
		os.Chown(dest, userUID, userUID)
		os.WriteFile(filepath.Join(dest, "existing"), []byte("keep"), 0o644)
		beforeOutside, _ := os.ReadDir(outsideDir)
		beforeRoot := strings.Join(listTree(t, root), "\n")
		_, err := s.ExtractArchive(asUser, "/home/user/dst", bytes.NewReader(data))
		if afterOutside, _ := os.ReadDir(outsideDir); len(afterOutside) != len(beforeOutside) {
			t.Fatalf("something appeared beside the root: %v", afterOutside)
		}
		after := listTree(t, root)
		for _, p := range after {
			if !strings.HasPrefix(p, "/home/user/dst") && !strings.Contains(beforeRoot, p) {
				t.Fatalf("extraction wrote %s outside the destination", p)
			}
		}
		if err != nil && strings.Join(after, "\n") != beforeRoot {
			t.Fatalf("rejected stream (%v) left files: %v", err, after)
		}
		if b, _ := os.ReadFile(filepath.Join(dest, "existing")); err != nil && string(b) != "keep" {
			t.Fatal("rejected stream changed an existing file")
		}
	})
}

// FuzzApply feeds arbitrary streams to ApplyArchive, acting as root: whatever
// the stream, nothing outside the destination changes, no staging directory
// is left, and a refused stream leaves the destination as it was.
func FuzzApply(f *testing.F) {
	seed := func(hs ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hs {
			data := h.Linkname
			if h.Typeflag == tar.TypeReg {
				h.Linkname, h.Size = "", int64(len(data))
			}
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte(data))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	reg := func(n, c string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: n, Linkname: c, Mode: 0o644}
	}
	dir := func(n string) *tar.Header { return &tar.Header{Typeflag: tar.TypeDir, Name: n + "/", Mode: 0o755} }
	f.Add(seed(reg("a", "x"), reg(".wh.existing", "")))
	f.Add(seed(dir("d"), reg("d/.wh..wh..opq", ""), reg("d/new", "n")))
	f.Add(seed(reg(".wh.tree", ""), dir("tree"), reg("tree/f", "f")))
	f.Add(seed(reg("tree", "file over a tree"), dir("existing"), reg("existing/x", "dir over a file")))
	f.Add(seed(reg(".wh...", "")))
	f.Add(seed(reg("../.wh.dst", "")))
	f.Add(seed(reg(".wh..wh..opq", ""), reg("a/../../x", "x")))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/"}, reg("l/x", "x")))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeSymlink, Name: "tree", Linkname: ".."}, reg("tree/y", "through the old tree")))
	f.Add(seed(reg("a", "x"), &tar.Header{Typeflag: tar.TypeLink, Name: "b", Linkname: "a"}, reg(".wh.b", "")))
	f.Add(seed(reg(".wh.tree", ""), reg("a", strings.Repeat("y", 2000)))[:1200])
	s, root := newService(f)
	outsideDir := filepath.Dir(root)
	dest := filepath.Join(root, "srv/dst")
	f.Fuzz(func(t *testing.T, data []byte) {
		os.RemoveAll(filepath.Join(root, "srv"))
		build(t, dest, "existing", "tree/a/b", "tree/c", "d/old", "link -> /etc")
		beforeOutside, _ := os.ReadDir(outsideDir)
		// The root's state without what is below the destination.
		outside := func() string {
			var keep []string
			for _, l := range strings.Split(state(t, root), "\n") {
				if !strings.HasPrefix(l, "/srv/dst/") {
					keep = append(keep, l)
				}
			}
			return strings.Join(keep, "\n")
		}
		beforeRoot, beforeDest := outside(), state(t, dest)
		_, err := s.ApplyArchive(t.Context(), guestapi.Where{}, "/srv/dst", bytes.NewReader(data))
		if afterOutside, _ := os.ReadDir(outsideDir); len(afterOutside) != len(beforeOutside) {
			t.Fatalf("something appeared beside the root: %v", afterOutside)
		}
		afterRoot, afterDest := outside(), state(t, dest)
		if afterRoot != beforeRoot {
			t.Fatalf("apply changed something outside the destination:\n%s\nwas\n%s", afterRoot, beforeRoot)
		}
		if err != nil && afterDest != beforeDest {
			t.Fatalf("a refused stream (%v) changed the destination:\n%s\nwas\n%s", err, afterDest, beforeDest)
		}
		if err != nil && errdefs.ClassOf(err) != errdefs.InvalidArgument && errdefs.ClassOf(err) != errdefs.Conflict {
			t.Fatalf("refused with %v, want invalid_argument or conflict", err)
		}
		if ents, _ := os.ReadDir(dest); slices.ContainsFunc(ents, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), ".berth-") }) {
			t.Fatalf("staging left behind: %v", ents)
		}
	})
}
