package guest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMountPointStaysInRoot plants symlinks in a root that point out of it
// (absolute, up through "..", a magic link) and one that points inside: a
// mount target resolved through them lands inside the root or fails, and
// nothing is made outside. With symlinks refused (the kernel file systems'
// mount points) a symlinked target fails.
func TestMountPointStaysInRoot(t *testing.T) {
	outside := t.TempDir()
	root := t.TempDir()
	for name, target := range map[string]string{
		"usr": outside,                           // absolute: the host's view
		"lib": "../../../../../../../" + outside, // up and out
		"opt": "/proc/self/root" + outside,       // a magic link
		"bin": "/usr2",                           // inside
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := os.Mkdir(filepath.Join(root, "usr2"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		target string
		ok     bool
	}{{"/usr", false}, {"/usr/share", false}, {"lib/x", false}, {"/../../usr", false}, {"/opt", false},
		{"/bin", true}, {"/bin/share", true}, {"/srv/data", true}, {"/../../srv", true}} {
		got, err := mountPoint(fd, tc.target, 0)
		if (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want ok=%v", tc.target, err, tc.ok)
		}
		if err != nil {
			continue
		}
		where, err := os.Readlink(fdPath(got))
		unix.Close(got)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(where, root+"/") {
			t.Errorf("mount target %s resolved to %s, outside the root %s", tc.target, where, root)
		}
	}
	for _, target := range []string{"/usr", "/lib/x", "/bin"} {
		if got, err := mountPoint(fd, target, unix.RESOLVE_NO_SYMLINKS); err == nil {
			unix.Close(got)
			t.Errorf("%s: a symlinked mount point was accepted with symlinks refused", target)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("directories were made outside the root: %v", entries)
	}
	if _, err := mountPoint(fd, "/", 0); err == nil {
		t.Error("the root itself accepted as a mount target")
	}
}
