package cli

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestExtractLocalRefusesHostileStreams: what a sandbox sends to berth cp is
// hostile; no entry may land outside the destination.
func TestExtractLocalRefusesHostileStreams(t *testing.T) {
	outside := t.TempDir()
	mk := func(hs ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hs {
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
				tw.WriteHeader(h)
				tw.Write([]byte("x"))
				continue
			}
			tw.WriteHeader(h)
		}
		tw.Close()
		return buf.Bytes()
	}
	reg := func(n string) *tar.Header { return &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644} }
	cases := map[string][]byte{
		"dotdot":        mk(reg("top/../../x")),
		"absolute-up":   mk(reg("/../x")),
		"symlink-write": mk(&tar.Header{Typeflag: tar.TypeSymlink, Name: "top/l", Linkname: outside}, reg("top/l/x")),
		"symlink-rel":   mk(&tar.Header{Typeflag: tar.TypeSymlink, Name: "top/l", Linkname: "../.."}, reg("top/l/x")),
		"hardlink-out":  mk(&tar.Header{Typeflag: tar.TypeLink, Name: "top/h", Linkname: "../../etc/passwd"}),
	}
	for name, data := range cases {
		dest := t.TempDir()
		err := extractLocal(bytes.NewReader(data), dest, "")
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("%s wrote outside: %v", name, ents)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(dest), "x")); err == nil {
			t.Fatalf("%s wrote beside the destination", name)
		}
	}
	// A well-formed stream with a rename.
	dest := t.TempDir()
	if err := extractLocal(bytes.NewReader(mk(reg("top/a"), &tar.Header{Typeflag: tar.TypeLink, Name: "top/b", Linkname: "top/a"})), dest, "new"); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(dest, "new", "a"))
	b, _ := os.Stat(filepath.Join(dest, "new", "b"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Fatal("rename or hard link lost")
	}
}
