package snapshot_test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/snapshot"
)

type tarEntry struct {
	typ      byte
	mode     int64
	uid, gid int
	link     string
	data     string
	xattrs   map[string]string
}

func readTar(t *testing.T, b []byte) ([]string, map[string]tarEntry) {
	t.Helper()
	var names []string
	out := map[string]tarEntry{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		e := tarEntry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, link: h.Linkname, data: string(data)}
		for k, v := range h.PAXRecords {
			if n, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if e.xattrs == nil {
					e.xattrs = map[string]string{}
				}
				e.xattrs[n] = v
			}
		}
		if _, dup := out[h.Name]; dup {
			t.Errorf("%s twice in the tar", h.Name)
		}
		names = append(names, h.Name)
		out[h.Name] = e
	}
}

// applyTar unpacks an OCI layer tar into dir in overlay's form, as the
// image store does (this one trusts the tar: the test wrote it).
func applyTar(t *testing.T, b []byte, dir string) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		base := path.Base(h.Name)
		if name, ok := strings.CutPrefix(base, ".wh."); ok {
			if name == ".wh..opq" {
				err = unix.Setxattr(filepath.Dir(p), "user.overlay.opaque", []byte("y"), 0)
			} else {
				err = unix.Mknod(filepath.Join(filepath.Dir(p), name), unix.S_IFCHR, 0)
			}
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.Mkdir(p, 0o700)
		case tar.TypeReg:
			var data []byte
			if data, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, data, 0o600)
			}
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeFifo:
			err = unix.Mkfifo(p, 0o600)
		default:
			t.Fatalf("%s: type %q", h.Name, h.Typeflag)
		}
		if err == nil {
			err = os.Lchown(p, h.Uid, h.Gid)
		}
		if err == nil && h.Typeflag != tar.TypeSymlink {
			err = os.Chmod(p, os.FileMode(h.Mode&0o777)|modeBits(h.Mode))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func modeBits(m int64) os.FileMode {
	var out os.FileMode
	if m&0o4000 != 0 {
		out |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	return out
}

func TestWriteTar(t *testing.T) {
	img := imageLayer(t)
	up := sandboxUpper(t)
	if err := unix.Setxattr(up.path("etc/new.conf"), "user.mime", []byte("text/plain"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(up.path("etc/new.conf"), "user.overlay.origin", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	from, to := stack(img), stack(up, img)
	o := snapshot.Options{Skip: skip}
	changes, err := snapshot.Changes(t.Context(), from, to, o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := snapshot.WriteTar(t.Context(), &b, changes, to); err != nil {
		t.Fatal(err)
	}
	names, entries := readTar(t, b.Bytes())
	// Every entry's directory comes before it.
	seen := map[string]bool{}
	for _, n := range names {
		if d := path.Dir(strings.TrimSuffix(n, "/")); d != "." && !seen[d+"/"] {
			t.Errorf("%s before its directory", n)
		}
		seen[n] = true
	}
	want := []string{
		"bin/", "bin/h1", "bin/h2",
		"etc/", "etc/foreign", "etc/hosts", "etc/motd", "etc/new.conf", "etc/shadow", "etc/ssl/", "etc/ssl/ca.crt",
		"home/", "home/u/", "home/u/notes.txt",
		"newdir/", "newdir/sub/", "newdir/sub/f.txt",
		"opt/", "opt/app/", "opt/app/.wh.data", "opt/app/new.txt",
		"rename/", "rename/dst.txt", "rename/.wh.src.txt",
		"root-link",
		"srv/", "srv/file/", "srv/file/inner", "srv/old",
		"tmp/", "tmp/pipe",
		"usr/", "usr/bin/", "usr/bin/.wh.tool", "usr/share/", "usr/share/.wh.doc",
		"var/", "var/log",
	}
	sameList(t, "tar", names, want)
	for name, want := range map[string]tarEntry{
		"etc/hosts":        {typ: tar.TypeReg, mode: 0o644, data: "127.0.0.1 localhost\n10.0.0.2 db\n"},
		"etc/shadow":       {typ: tar.TypeReg, mode: 0o600, gid: 42, data: "root:*:1::::::\n"},
		"etc/foreign":      {typ: tar.TypeReg, mode: 0o644, uid: 65534, gid: 65534, data: "x\n"},
		"etc/new.conf":     {typ: tar.TypeReg, mode: 0o644, data: "new=1\n", xattrs: map[string]string{"user.mime": "text/plain"}},
		"home/u/":          {typ: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1000},
		"home/u/notes.txt": {typ: tar.TypeReg, mode: 0o600, uid: 1001, gid: 1001, data: "notes\n"},
		"bin/h2":           {typ: tar.TypeReg, mode: 0o755, data: "linked\n"},
		"root-link":        {typ: tar.TypeSymlink, mode: 0o777, link: "/"},
		"var/log":          {typ: tar.TypeSymlink, mode: 0o777, link: "/"},
		"tmp/pipe":         {typ: tar.TypeFifo, mode: 0o644},
		"usr/bin/.wh.tool": {typ: tar.TypeReg},
	} {
		if got := entries[name]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: got %+v, want %+v", name, got, want)
		}
	}
	// Applied over the image, the tar makes the sandbox's changes again.
	applied := newLayer(t, 0)
	applyTar(t, b.Bytes(), applied.dir)
	again, err := snapshot.Changes(t.Context(), from, stack(applied, img), o)
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes of the applied tar", briefs(again), briefs(changes))
	// And nothing differs between the sandbox and the applied layer.
	diff, err := snapshot.Changes(t.Context(), stack(applied, img), to, o)
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "sandbox over the applied tar", briefs(diff), nil)
}

func TestWriteTarOfNothing(t *testing.T) {
	var b bytes.Buffer
	if err := snapshot.WriteTar(t.Context(), &b, nil, nil); err != nil {
		t.Fatal(err)
	}
	if names, _ := readTar(t, b.Bytes()); len(names) != 0 {
		t.Fatalf("entries %v", names)
	}
}

func TestWriteTarRefusesBadPaths(t *testing.T) {
	for _, p := range []string{"", "/", "etc", "/a/../b", "/a/", "/a//b"} {
		err := snapshot.WriteTar(t.Context(), io.Discard, []snapshot.Change{{Path: p, Kind: snapshot.Added, Type: "file"}}, nil)
		if err == nil {
			t.Errorf("%q: no error", p)
		}
	}
}
