package image_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/runtime"
)

func owner(t *testing.T, p string) (uid, gid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

// TestHostImageOwners: the host image resolved for a range is a copy owned
// by that range; resolved unmapped (for a runtime that idmaps layers) it is
// one copy owned as sandboxes see it, in a directory only root can enter,
// as its files belong to host uids 0 and 1000.
func TestHostImageOwners(t *testing.T) {
	testutil.RequireRoot(t)
	dir := filepath.Join(testutil.StateDir(t), "images")
	s, err := image.New(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, ids := range []runtime.IDMap{runtime.DefaultIDMap.Range(3), image.Unmapped} {
		img, err := s.Resolve(ctx, image.Host, ids)
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.Resolve(ctx, image.Host, ids)
		if err != nil || again.Root.Layers[0] != img.Root.Layers[0] {
			t.Fatalf("resolved twice: %v %v", again.Root.Layers, err)
		}
		unmapped := ids == image.Unmapped
		if img.Root.IDMapped != unmapped || len(img.Root.Layers) != 1 {
			t.Fatalf("%+v: root %+v", ids, img.Root)
		}
		layer := img.Root.Layers[0]
		for rel, want := range map[string]uint32{"": 0, "etc/passwd": 0, "root": 0, "home/user": 1000} {
			if uid, gid, _ := owner(t, filepath.Join(layer, rel)); uid != ids.HostID+want || gid != ids.HostID+want {
				t.Errorf("%+v: /%s is %d:%d, want %d", ids, rel, uid, gid, ids.HostID+want)
			}
		}
		parent := filepath.Dir(layer)
		_, _, mode := owner(t, parent)
		if unmapped && (parent != filepath.Join(dir, "unmapped") || mode.Perm() != 0o700) {
			t.Errorf("the unmapped image is in %s (%v), want a directory only root enters", parent, mode)
		}
		if !unmapped && mode.Perm()&0o001 == 0 {
			t.Errorf("a range's image is in %s (%v), which its sandboxes cannot reach", parent, mode)
		}
	}
	_, err = s.Resolve(ctx, "python:3.12", image.Unmapped)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), `"python:3.12"`) {
		t.Fatalf("an OCI image in a store without a catalog: %v", err)
	}
}
