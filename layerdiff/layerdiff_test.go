package layerdiff_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/layerdiff"
)

const base = 1_000_000_000

type entry struct {
	typ      byte
	uid, gid int
	mode     int64
	link     string
	data     string
	xattrs   map[string]string
}

func readTar(t *testing.T, b []byte) ([]string, map[string]entry) {
	t.Helper()
	var names []string
	out := map[string]entry{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		e := entry{typ: h.Typeflag, uid: h.Uid, gid: h.Gid, mode: h.Mode, link: h.Linkname, data: string(data), xattrs: map[string]string{}}
		for k, v := range h.PAXRecords {
			if n, ok := bytes.CutPrefix([]byte(k), []byte("SCHILY.xattr.")); ok {
				e.xattrs[string(n)] = v
			}
		}
		names = append(names, h.Name)
		out[h.Name] = e
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An upper layer as a sandbox leaves it: files owned by its range, a
// whiteout, an opaque directory, a hard link, a symlink to a host file,
// files berth wrote, and one owned by a host id outside the range.
func TestWriteTranslatesOverlayToOCI(t *testing.T) {
	up := t.TempDir()
	p := func(rel string) string { return filepath.Join(up, rel) }
	must(t, os.MkdirAll(p("usr/local/bin"), 0o755))
	must(t, os.WriteFile(p("usr/local/bin/tool"), []byte("#!/bin/sh\n"), 0o4755))
	must(t, os.Link(p("usr/local/bin/tool"), p("usr/local/bin/tool2")))
	must(t, os.Symlink("/etc/shadow", p("usr/local/bin/shadow")))
	must(t, unix.Mknod(p("usr/local/gone"), unix.S_IFCHR, 0))
	must(t, os.MkdirAll(p("opt/fresh"), 0o750))
	must(t, unix.Setxattr(p("opt/fresh"), "user.overlay.opaque", []byte("y"), 0))
	must(t, unix.Setxattr(p("usr/local/bin/tool"), "user.mime", []byte("text/x-sh"), 0))
	must(t, os.MkdirAll(p("empty"), 0o700))
	must(t, unix.Mkfifo(p("empty2"), 0o600))
	// What berth wrote: left out, and /etc with them.
	must(t, os.MkdirAll(p("etc/ssl/certs"), 0o755))
	must(t, os.WriteFile(p("etc/hostname"), []byte("sb\n"), 0o644))
	must(t, os.WriteFile(p("etc/ssl/certs/ca.crt"), []byte("IMAGE CAS\nSANDBOX CA\n"), 0o644))
	// ...unless the sandbox changed it.
	must(t, os.MkdirAll(p("var"), 0o755))
	must(t, os.WriteFile(p("var/bundle"), []byte("SANDBOX CA\nADDED\n"), 0o644))
	for _, rel := range []string{"usr", "usr/local", "usr/local/bin", "usr/local/bin/tool", "usr/local/gone", "opt", "opt/fresh", "empty", "empty2", "etc", "etc/ssl", "etc/ssl/certs", "etc/hostname", "etc/ssl/certs/ca.crt", "var", "var/bundle"} {
		must(t, os.Lchown(p(rel), base, base))
	}
	must(t, os.Lchown(p("usr/local/bin/shadow"), base+1000, base+1000))
	must(t, os.Lchown(p("opt/fresh"), 4242, 0))          // a host id outside the range
	must(t, unix.Chmod(p("usr/local/bin/tool"), 0o4755)) // after the chown, which clears it

	var buf bytes.Buffer
	st, err := layerdiff.Write(&buf, up, layerdiff.Options{IDs: layerdiff.IDs{Base: base, Size: 65536},
		Skip: map[string][]byte{"/etc/hostname": nil, "/etc/ssl/certs/ca.crt": []byte("SANDBOX CA\n"), "/var/bundle": []byte("SANDBOX CA\n")}})
	must(t, err)
	names, got := readTar(t, buf.Bytes())
	want := []string{"empty/", "empty2", "opt/", "opt/fresh/", "opt/fresh/.wh..wh..opq", "usr/", "usr/local/", "usr/local/bin/",
		"usr/local/bin/shadow", "usr/local/bin/tool", "usr/local/bin/tool2", "usr/local/.wh.gone", "var/", "var/bundle"}
	if !equal(names, want) {
		t.Fatalf("entries\n got %q\nwant %q", names, want)
	}
	if st.Entries != len(want) {
		t.Errorf("stats say %d entries, the tar has %d", st.Entries, len(want))
	}
	tool := got["usr/local/bin/tool"]
	if tool.typ != tar.TypeReg || tool.uid != 0 || tool.mode != 0o4755 || tool.data != "#!/bin/sh\n" || tool.xattrs["user.mime"] != "text/x-sh" {
		t.Errorf("tool: %+v", tool)
	}
	if l := got["usr/local/bin/tool2"]; l.typ != tar.TypeLink || l.link != "usr/local/bin/tool" {
		t.Errorf("hard link: %+v", l)
	}
	if s := got["usr/local/bin/shadow"]; s.typ != tar.TypeSymlink || s.link != "/etc/shadow" || s.uid != 1000 || s.data != "" {
		t.Errorf("symlink (never followed): %+v", s)
	}
	if d := got["opt/fresh/"]; d.typ != tar.TypeDir || d.uid != 65534 || d.gid != 65534 || d.mode != 0o750 || len(d.xattrs) != 0 {
		t.Errorf("opaque dir: %+v (overlay's attribute must not be in the tar; a foreign owner is 65534)", d)
	}
	if f := got["empty2"]; f.typ != tar.TypeFifo {
		t.Errorf("fifo: %+v", f)
	}
}

// A sandbox that wrote nothing but berth's own files changed nothing.
func TestWriteOfNoChangeIsEmpty(t *testing.T) {
	up := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(up, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(up, "etc/hosts"), []byte("127.0.0.1 localhost\n"), 0o644))
	var buf bytes.Buffer
	st, err := layerdiff.Write(&buf, up, layerdiff.Options{IDs: layerdiff.IDs{Base: 0, Size: 65536}, Skip: map[string][]byte{"/etc/hosts": nil}})
	must(t, err)
	if names, _ := readTar(t, buf.Bytes()); st.Entries != 0 || len(names) != 0 {
		t.Fatalf("an unchanged layer gave %d entries: %q", st.Entries, names)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A hard link to a file berth wrote is the sandbox's own file: the link is
// written as the file, and berth's name for it left out, whichever comes
// first.
func TestWriteSkipsBerthsNameOfALink(t *testing.T) {
	up := t.TempDir()
	p := func(rel string) string { return filepath.Join(up, rel) }
	for _, d := range []string{"a", "b", "etc"} {
		must(t, os.MkdirAll(p(d), 0o755))
	}
	must(t, os.WriteFile(p("etc/hosts"), []byte("127.0.0.1 localhost\n"), 0o644))
	must(t, os.Link(p("etc/hosts"), p("a/hosts"))) // before berth's name
	must(t, os.Link(p("etc/hosts"), p("z")))       // after it
	var buf bytes.Buffer
	_, err := layerdiff.Write(&buf, up, layerdiff.Options{IDs: layerdiff.IDs{Base: 0, Size: 65536}, Skip: map[string][]byte{"/etc/hosts": nil, "/a/hosts": []byte("elsewhere\n")}})
	must(t, err)
	names, got := readTar(t, buf.Bytes())
	if want := []string{"a/", "a/hosts", "b/", "z"}; !equal(names, want) {
		t.Fatalf("entries\n got %q\nwant %q", names, want)
	}
	if f := got["a/hosts"]; f.typ != tar.TypeReg || f.data != "127.0.0.1 localhost\n" {
		t.Errorf("a/hosts: %+v", f)
	}
	if l := got["z"]; l.typ != tar.TypeLink || l.link != "a/hosts" {
		t.Errorf("z: %+v", l)
	}
}
