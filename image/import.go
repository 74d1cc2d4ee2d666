package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// maxImport bounds an imported tarball.
const maxImport = 64 << 30

// Import stores the images of a `docker save` tarball or an OCI image
// layout in a tar, for hosts that reach no registry. Images are named by
// the tags the file carries (RepoTags, or the OCI layout's
// "io.containerd.image.name" annotation) and by as, when given (only for a
// file of one image): tenant's names.
func (s *Store) Import(ctx context.Context, tenant string, r io.Reader, as string, progress Progress) ([]api.Image, error) {
	if s.db == nil {
		return nil, errdefs.New(errdefs.NotImplemented, "image import: this store has only the host image")
	}
	var asName string
	if as != "" {
		ref, err := s.parseRef(as)
		if err != nil {
			return nil, err
		}
		if _, ok := ref.(name.Tag); !ok {
			return nil, errdefs.New(errdefs.InvalidArgument, "name: %q: give a tag, not a digest", as)
		}
		asName = ref.Name()
	}
	spool, err := os.MkdirTemp(filepath.Join(s.dir, "oci"), ".import-")
	if err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	defer removeAll(spool)
	file := filepath.Join(spool, "image.tar")
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	n, err := io.Copy(f, io.LimitReader(r, maxImport+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("image import: read the file: %w", err)
	}
	if n > maxImport {
		return nil, errdefs.New(errdefs.TooLarge, "image import: the file is over %d bytes", int64(maxImport))
	}
	members, err := tarMembers(file)
	if err != nil {
		return nil, err
	}
	type named struct {
		img   v1.Image
		names []string
	}
	var imgs []named
	switch {
	case members["manifest.json"]:
		opener := func() (io.ReadCloser, error) { return os.Open(file) }
		m, err := tarball.LoadManifest(opener)
		if err != nil {
			return nil, errdefs.New(errdefs.InvalidArgument, "image import: manifest.json: %v", err)
		}
		for i, d := range m {
			var tag *name.Tag
			var names []string
			for _, t := range d.RepoTags {
				parsed, err := name.NewTag(t)
				if err != nil {
					return nil, errdefs.New(errdefs.InvalidArgument, "image import: tag %q: %v", t, err)
				}
				tag = &parsed
				names = append(names, parsed.Name())
			}
			if tag == nil && len(m) > 1 {
				return nil, errdefs.New(errdefs.InvalidArgument, "image import: image %d of %d in the file has no tag", i+1, len(m))
			}
			img, err := tarball.Image(opener, tag)
			if err != nil {
				return nil, errdefs.New(errdefs.InvalidArgument, "image import: %v", err)
			}
			imgs = append(imgs, named{img, names})
		}
	case members["index.json"] && members["oci-layout"]:
		dir := filepath.Join(spool, "layout")
		if err := extractPlain(file, dir); err != nil {
			return nil, err
		}
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			return nil, errdefs.New(errdefs.InvalidArgument, "image import: OCI layout: %v", err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, errdefs.New(errdefs.InvalidArgument, "image import: OCI layout: %v", err)
		}
		for _, d := range im.Manifests {
			if !d.MediaType.IsImage() {
				continue // nested indexes: push a single platform's image instead
			}
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, errdefs.New(errdefs.InvalidArgument, "image import: OCI layout: %v", err)
			}
			// org.opencontainers.image.ref.name holds only a tag, no
			// repository: it names nothing by itself.
			var names []string
			if parsed, err := name.NewTag(d.Annotations["io.containerd.image.name"]); err == nil {
				names = append(names, parsed.Name())
			}
			imgs = append(imgs, named{img, names})
		}
	default:
		return nil, errdefs.New(errdefs.InvalidArgument, "image import: neither a docker save tarball (manifest.json) nor an OCI layout (index.json, oci-layout)")
	}
	if len(imgs) == 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "image import: the file holds no image")
	}
	if asName != "" {
		if len(imgs) > 1 {
			return nil, errdefs.New(errdefs.InvalidArgument, "name: the file holds %d images; a name fits one", len(imgs))
		}
		imgs[0].names = append(imgs[0].names, asName)
	}
	out := make([]api.Image, 0, len(imgs))
	for _, im := range imgs {
		stored, err := s.storeImage(ctx, tenant, im.img, im.names, "import", progress)
		if err != nil {
			return nil, err
		}
		out = append(out, stored)
	}
	return out, nil
}

// tarMembers lists the top-level regular files of a tar.
func tarMembers(file string) (map[string]bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, errdefs.New(errdefs.InvalidArgument, "image import: not a tar: %v", err)
		}
		if n, err := entryName(hdr.Name); err == nil {
			out[n] = true
		}
	}
}

// extractPlain extracts the regular files and directories of an OCI
// layout tar (blobs and indexes; nothing else belongs there).
func extractPlain(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "image import: not a tar: %v", err)
		}
		rel, err := entryName(hdr.Name)
		if err != nil {
			return fmt.Errorf("image import: %q: %w", hdr.Name, err)
		}
		if rel == "" {
			continue
		}
		p := filepath.Join(dir, rel)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				return err
			}
			// O_EXCL and O_NOFOLLOW: nothing in the layout is a link, so
			// no entry can write through one.
			out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o600)
			if err != nil {
				if errors.Is(err, os.ErrExist) {
					return errdefs.New(errdefs.InvalidArgument, "image import: %q is in the file twice", hdr.Name)
				}
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return errdefs.New(errdefs.InvalidArgument, "image import: %q: an OCI layout holds only files and directories", hdr.Name)
		}
	}
}

const noFollow = syscall.O_NOFOLLOW
