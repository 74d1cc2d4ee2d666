package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

// resolveOCI prepares stored image ref for a sandbox: its layers, topmost
// first, as stored (for a runtime that idmaps them) or as copies owned by
// the sandbox's range, made once per range and layer. ref is what a
// sandbox's record pins (an id, which its create resolved for its
// tenant), so it is looked up as the operator's.
func (s *Store) resolveOCI(ctx context.Context, ref string, ids runtime.IDMap) (Resolved, error) {
	img, err := s.Lookup(ctx, "", ref)
	if err != nil {
		return Resolved{}, err
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	layers, err := s.layerDirsFor(ctx, img.Layers, ids, "pull the image again")
	if err != nil {
		return Resolved{}, fmt.Errorf("image %s: %w", ref, err)
	}
	if len(layers) == 0 { // an image of no layers: an empty root
		empty, err := s.emptyLayer(ids)
		if err != nil {
			return Resolved{}, err
		}
		layers = append(layers, empty)
	}
	return Resolved{Root: runtime.RootFS{Image: ref, Layers: layers, IDMapped: ids.HostID == Unmapped.HostID}, Image: img}, nil
}

// layerDirsFor returns stored layers (given bottom first) as the
// directories of a root for sandboxes whose ids map as ids, topmost first:
// as stored for a runtime that idmaps them, else copies owned by the
// range. A layer gone from the store is not_found, with remedy. The caller
// holds s.gc.
func (s *Store) layerDirsFor(ctx context.Context, layers []string, ids runtime.IDMap, remedy string) ([]string, error) {
	out := make([]string, 0, len(layers))
	for i := len(layers) - 1; i >= 0; i-- {
		d := layers[i]
		dir := s.layerDir(d)
		if ids.HostID != Unmapped.HostID {
			var err error
			if dir, err = s.shifted(ctx, d, ids); err != nil {
				return nil, err
			}
		} else if _, err := os.Stat(dir); err != nil {
			return nil, errdefs.New(errdefs.NotFound, "layer %s is gone from the store (%s): %v", d, remedy, err)
		}
		out = append(out, dir)
	}
	return out, nil
}

// emptyLayer is a directory owned by the range's root, for an image
// without layers.
func (s *Store) emptyLayer(ids runtime.IDMap) (string, error) {
	dir, err := s.shiftedRoot(ids)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "empty")
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	return p, os.Lchown(p, int(ids.HostID), int(ids.HostID))
}

// shiftedDir is where a range's layer copies are.
func (s *Store) shiftedDir(ids runtime.IDMap) string {
	return filepath.Join(s.dir, "oci", "shifted", strconv.FormatUint(uint64(ids.HostID), 10))
}

// shiftedRoot makes the directory of a range's layer copies: owned by the
// range's root and closed to everyone else (the copies keep setuid bits).
func (s *Store) shiftedRoot(ids runtime.IDMap) (string, error) {
	base := filepath.Join(s.dir, "oci", "shifted")
	if err := os.MkdirAll(base, 0o711); err != nil {
		return "", err
	}
	if err := os.Chmod(base, 0o711); err != nil {
		return "", err
	}
	if err := os.Chmod(filepath.Dir(base), 0o711); err != nil {
		return "", err
	}
	dir := s.shiftedDir(ids)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	return dir, os.Lchown(dir, int(ids.HostID), int(ids.HostID))
}

// shifted returns layer diff copied with every id moved up by ids.HostID:
// the fallback for a runtime that cannot idmap layers. One copy per range
// and layer, made once (concurrent callers share the making).
func (s *Store) shifted(ctx context.Context, diff string, ids runtime.IDMap) (string, error) {
	dst := filepath.Join(s.shiftedDir(ids), hexOf(diff))
	if _, err := os.Stat(dst); err == nil { // every create after the first: no other I/O
		return dst, nil
	}
	if _, err := s.shiftedRoot(ids); err != nil {
		return "", err
	}
	err := s.pulls.do(ctx, "shift "+dst, func(context.Context) error {
		if _, err := os.Stat(dst); err == nil {
			return nil
		}
		tmp := dst + ".tmp"
		if err := removeAll(tmp); err != nil {
			return err
		}
		if err := shiftCopy(s.layerDir(diff), tmp, int(ids.HostID)); err != nil {
			removeAll(tmp)
			return fmt.Errorf("copy layer %s for range %d: %w", diff, ids.HostID, err)
		}
		return os.Rename(tmp, dst)
	})
	return dst, err
}

// shiftCopy copies layer src to dst with ids moved up by base: files
// (hard links kept), directories, symlinks, fifos, whiteouts, modes, times
// and user.* extended attributes (the opaque marker among them).
func shiftCopy(src, dst string, base int) error {
	links := map[uint64]string{} // inode -> first copy, for hard links
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		mode := st.Mode & 0o7777
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := os.Mkdir(out, 0o700); err != nil {
				return err
			}
		case unix.S_IFREG:
			if st.Nlink > 1 {
				if first, ok := links[st.Ino]; ok {
					return os.Link(first, out)
				}
				links[st.Ino] = out
			}
			if err := copyFile(p, out); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, out); err != nil {
				return err
			}
		case unix.S_IFCHR, unix.S_IFIFO:
			if err := unix.Mknod(out, st.Mode, int(st.Rdev)); err != nil {
				return err
			}
		default:
			return nil
		}
		if err := unix.Lchown(out, base+int(st.Uid), base+int(st.Gid)); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			if err := unix.Chmod(out, mode); err != nil {
				return err
			}
			if err := copyXattrs(p, out); err != nil {
				return err
			}
		}
		ts := []unix.Timespec{st.Atim, st.Mtim}
		return unix.UtimesNanoAt(unix.AT_FDCWD, out, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// A reflink where the file system has them, else a copy.
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		if _, err := out.ReadFrom(in); err != nil {
			out.Close()
			return err
		}
	}
	return out.Close()
}

func copyXattrs(src, dst string) error {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(src, buf)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return err
	}
	for _, name := range splitNul(buf[:n]) {
		if len(name) < 5 || name[:5] != "user." {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(src, name, v)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, v[:m], 0); err != nil {
			return err
		}
	}
	return nil
}

func splitNul(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == 0 {
			if i > start {
				out = append(out, string(b[start:i]))
			}
			start = i + 1
		}
	}
	return out
}

// List returns the stored images tenant sees, newest first: the
// operator ("") every one; a tenant those that it or the operator names.
func (s *Store) List(ctx context.Context, tenant string) ([]api.Image, error) {
	if s.db == nil {
		return []api.Image{}, nil
	}
	recs, err := s.db.ListImages(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]api.Image, 0, len(recs))
	for _, r := range recs {
		img, err := toAPI(r, tenant)
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	return out, nil
}

// Inspect returns a stored image that tenant may use (see Lookup), with
// tenant's sandboxes made of it (every tenant's for the operator).
func (s *Store) Inspect(ctx context.Context, tenant, ref string) (api.Image, error) {
	img, err := s.Lookup(ctx, tenant, ref)
	if err != nil {
		return api.Image{}, err
	}
	img.InUse, err = s.db.TenantImageUsers(ctx, tenant, img.ID)
	return img, err
}

// Remove removes tenant's name ref, or the image ref with its layers that
// no other image has, as tenant may:
//   - a name that is one of several tags of its tenant's on the image is
//     only untagged;
//   - a tenant's last name of an image (its names by digest go with it),
//     or a tenant's image by id (every name of its own), goes, and the
//     image with it unless other names remain (another tenant's, the
//     operator's) or another tenant's sandboxes are made of it (the image
//     then stays, unnamed, for them: image prune removes it when they are
//     gone); an image the tenant's own sandboxes or snapshots are made of
//     is refused with conflict naming them;
//   - the operator's image by id goes whole, every tenant's names with it,
//     unless a sandbox or snapshot is made of it: conflict naming them.
//
// The operator's names are the catalog: a tenant removing one is
// permission_denied. Another tenant's name or image is not_found.
func (s *Store) Remove(ctx context.Context, tenant, ref string) (api.PruneResult, error) {
	rec, owner, err := s.lookup(ctx, tenant, ref)
	if err != nil {
		return api.PruneResult{}, err
	}
	if tenant == "" && isID(ref) {
		s.gc.Lock()
		defer s.gc.Unlock()
		if err := s.db.DeleteImage(ctx, rec.ID); err != nil {
			return api.PruneResult{}, err
		}
		res := api.PruneResult{Images: []string{rec.ID}}
		err = s.removeUnreferenced(ctx, &res)
		return res, err
	}
	var own, others []store.ImageName // owner's names of the image, and the rest
	if isID(ref) {
		owner = tenant
	}
	for _, n := range rec.Names {
		if n.Tenant == owner {
			own = append(own, n)
		} else if !n.Grant(rec.ID) {
			others = append(others, n)
		}
	}
	if owner != tenant || len(own) == 0 {
		if isID(ref) && tenant != "" && len(others) > 0 && others[0].Tenant == "" {
			return api.PruneResult{}, errdefs.New(errdefs.PermissionDenied, "image %s is in the operator's catalog: only an admin key removes it", ref)
		}
		if !isID(ref) {
			return api.PruneResult{}, errdefs.New(errdefs.PermissionDenied, "image %q is in the operator's catalog: only an admin key removes it", ref)
		}
		return api.PruneResult{}, errdefs.New(errdefs.NotFound, "image %q has no name of yours to remove", ref)
	}
	var target []string
	if !isID(ref) {
		// A tag goes alone while the owner has other tags on the image
		// (names by digest are not tags: they go with the last tag).
		r, _ := s.parseRef(ref)
		tags := 0
		for _, n := range own {
			if n.Name != r.Name() && !strings.Contains(n.Name, "@") && !n.Grant(rec.ID) {
				tags++
			}
		}
		if tags > 0 {
			if err := s.db.Untag(ctx, owner, r.Name()); err != nil {
				return api.PruneResult{}, err
			}
			return api.PruneResult{Images: []string{}}, nil
		}
	}
	for _, n := range own {
		target = append(target, n.Name)
	}
	if len(others) == 0 {
		users, err := s.db.ImageUsedBy(ctx, tenant, rec.ID)
		if err != nil {
			return api.PruneResult{}, err
		}
		if len(users) > 0 {
			if len(users) > 10 {
				users = append(users[:10], "…")
			}
			return api.PruneResult{}, errdefs.New(errdefs.Conflict, "image %s is in use by %s: delete them first", rec.ID, strings.Join(users, ", "))
		}
	}
	s.gc.Lock()
	defer s.gc.Unlock()
	if err := s.db.Untag(ctx, owner, target...); err != nil {
		return api.PruneResult{}, err
	}
	res := api.PruneResult{Images: []string{}}
	if len(others) > 0 {
		return res, nil
	}
	gone, err := s.db.DeleteIntermediate(ctx, rec.ID) // unless another tenant's sandbox is made of it
	if err != nil || !gone {
		return res, err
	}
	res.Images = append(res.Images, rec.ID)
	err = s.removeUnreferenced(ctx, &res)
	return res, err
}

// Prune removes the images no sandbox is made of (with all, named ones
// too, and the template build cache; else only unnamed ones) and the
// layers no image or cached build step has left.
func (s *Store) Prune(ctx context.Context, all bool) (api.PruneResult, error) {
	res := api.PruneResult{Images: []string{}}
	if s.db == nil {
		return res, nil
	}
	s.gc.Lock()
	defer s.gc.Unlock()
	recs, err := s.db.ListImages(ctx, "")
	if err != nil {
		return res, err
	}
	if all {
		if res.CacheEntries, err = s.db.ClearBuildCache(ctx); err != nil {
			return res, err
		}
	}
	for _, r := range recs {
		if named(r) && !all {
			continue
		}
		if err := s.db.DeleteImage(ctx, r.ID); err != nil {
			if errdefs.IsConflict(err) {
				continue // in use
			}
			return res, err
		}
		res.Images = append(res.Images, r.ID)
	}
	err = s.removeUnreferenced(ctx, &res)
	return res, err
}

// named says whether an image has a name (a grant is none: a build's step
// image that a killed daemon left is dangling).
func named(rec store.Image) bool {
	for _, n := range rec.Names {
		if !n.Grant(rec.ID) {
			return true
		}
	}
	return false
}

// removeUnreferenced removes the layers (and their range copies) that no
// stored image has: the row first, so that a crash in between leaves a
// directory without a row, which the next start removes.
func (s *Store) removeUnreferenced(ctx context.Context, res *api.PruneResult) error {
	recs, err := s.db.ListImages(ctx, "")
	if err != nil {
		return err
	}
	used, err := s.db.CachedLayers(ctx) // a template build's cache keeps its layers
	if err != nil {
		return err
	}
	snaps, err := s.db.SnapshotLayers(ctx)
	if err != nil {
		return err
	}
	for l := range snaps {
		used[l] = true
	}
	for _, r := range recs {
		for _, l := range r.Layers {
			used[l] = true
		}
	}
	layers, err := s.db.Layers(ctx)
	if err != nil {
		return err
	}
	copies, _ := filepath.Glob(filepath.Join(s.dir, "oci", "shifted", "*"))
	for d, size := range layers {
		if used[d] {
			continue
		}
		if err := s.db.DeleteLayer(ctx, d); err != nil {
			return err
		}
		if err := removeAll(s.layerDir(d)); err != nil {
			return fmt.Errorf("remove layer %s: %w", d, err)
		}
		for _, c := range copies {
			if err := removeAll(filepath.Join(c, hexOf(d))); err != nil && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("remove layer copy %s: %w", d, err)
			}
		}
		res.Layers++
		res.FreedBytes += size
	}
	return nil
}

// ReadFile reads file rel (a path inside the image) from a resolved
// image's layers, topmost first, as a sandbox would see it: symlinks
// resolve inside the layer that holds them (RESOLVE_IN_ROOT), never on the
// host, so an image's symlink to /etc/shadow reads the image's own
// /etc/shadow, if anything. A whiteout or any file that is not regular
// ends the search. found is false when no layer has the file.
func ReadFile(layers []string, rel string, max int64) (data []byte, found bool, err error) {
	for _, l := range layers {
		root, err := unix.Open(l, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, false, fmt.Errorf("open layer: %w", err)
		}
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
		unix.Close(root)
		if err == unix.ENOENT || err == unix.ENOTDIR {
			continue
		}
		if err != nil {
			return nil, false, nil // a whiteout (a device), or what the daemon will not read
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			return nil, false, nil
		}
		b, err := io.ReadAll(io.LimitReader(f, max+1))
		if err != nil {
			return nil, false, err
		}
		if int64(len(b)) > max {
			return nil, false, errdefs.New(errdefs.InvalidArgument, "image file /%s is over %d bytes", rel, max)
		}
		return b, true, nil
	}
	return nil, false, nil
}
