package snapshot_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/layerdiff"
	"github.com/berthsh/berth/snapshot"
)

// hostBase is where a test sandbox's ids begin on the host.
const hostBase = 100_000

// layerDir builds a layer directory in overlay's form. Ids are given as
// the sandbox sees them and stored shifted by base (0: an image layer).
type layerDir struct {
	t    testing.TB
	dir  string
	base uint32
}

func newLayer(t testing.TB, base uint32) *layerDir {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &layerDir{t: t, dir: dir, base: base}
}

func (l *layerDir) layer() snapshot.Layer {
	if l.base == 0 {
		return snapshot.Layer{Dir: l.dir}
	}
	return snapshot.Layer{Dir: l.dir, IDs: layerdiff.IDs{Base: l.base, Size: 65536}}
}

func (l *layerDir) path(rel string) string { return filepath.Join(l.dir, rel) }

func (l *layerDir) check(err error) {
	l.t.Helper()
	if err != nil {
		l.t.Fatal(err)
	}
}

// owner sets rel's owner: ids[0], ids[1] as the sandbox sees them (root's
// when not given), or a raw host uid when ids[0] < 0 (-uid).
func (l *layerDir) owner(rel string, ids []int) {
	l.t.Helper()
	uid, gid := 0, 0
	if len(ids) > 0 {
		uid, gid = ids[0], ids[0]
	}
	if len(ids) > 1 {
		gid = ids[1]
	}
	hu, hg := uid+int(l.base), gid+int(l.base)
	if uid < 0 {
		hu, hg = -uid, -gid
	}
	l.check(os.Lchown(l.path(rel), hu, hg))
}

// parents makes rel's directories that are missing, 0755, root's.
func (l *layerDir) parents(rel string) {
	l.t.Helper()
	dir := filepath.Dir(rel)
	if dir == "." {
		return
	}
	if _, err := os.Lstat(l.path(dir)); err == nil {
		return
	}
	l.parents(dir)
	l.mkdir(dir, 0o755)
}

func (l *layerDir) mkdir(rel string, mode os.FileMode, ids ...int) *layerDir {
	l.t.Helper()
	l.parents(rel)
	if err := os.Mkdir(l.path(rel), mode); err != nil && !os.IsExist(err) {
		l.t.Fatal(err)
	}
	l.check(os.Chmod(l.path(rel), mode))
	l.owner(rel, ids)
	return l
}

func (l *layerDir) file(rel, content string, mode os.FileMode, ids ...int) *layerDir {
	l.t.Helper()
	l.parents(rel)
	l.check(os.WriteFile(l.path(rel), []byte(content), mode))
	l.owner(rel, ids)
	l.check(os.Chmod(l.path(rel), mode)) // after chown, which clears setuid
	return l
}

func (l *layerDir) symlink(rel, target string) *layerDir {
	l.t.Helper()
	l.parents(rel)
	l.check(os.Symlink(target, l.path(rel)))
	l.owner(rel, nil)
	return l
}

func (l *layerDir) fifo(rel string) *layerDir {
	l.t.Helper()
	l.parents(rel)
	l.check(unix.Mkfifo(l.path(rel), 0o644))
	l.check(os.Chmod(l.path(rel), 0o644))
	l.owner(rel, nil)
	return l
}

func (l *layerDir) whiteout(rel string) *layerDir {
	l.t.Helper()
	l.parents(rel)
	l.check(unix.Mknod(l.path(rel), unix.S_IFCHR, 0))
	return l
}

func (l *layerDir) opaque(rel string) *layerDir {
	l.t.Helper()
	l.check(unix.Setxattr(l.path(rel), "user.overlay.opaque", []byte("y"), 0))
	return l
}

func (l *layerDir) link(rel, existing string) *layerDir {
	l.t.Helper()
	l.parents(rel)
	l.check(os.Link(l.path(existing), l.path(rel)))
	return l
}

// stack makes a stack of layers, topmost first.
func stack(layers ...*layerDir) snapshot.Stack {
	s := make(snapshot.Stack, len(layers))
	for i, l := range layers {
		s[i] = l.layer()
	}
	return s
}

// brief writes a change as a test compares it: no times.
func brief(c snapshot.Change) string {
	s := fmt.Sprintf("%s %s %s %04o %d:%d", c.Kind, c.Path, c.Type, c.Mode, c.UID, c.GID)
	if c.Type == "file" {
		s += fmt.Sprintf(" %dB", c.Size)
	}
	if c.Link != "" {
		s += " -> " + c.Link
	}
	return s
}

func briefs(cs []snapshot.Change) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = brief(c)
	}
	return out
}

func sameList(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\ngot:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
