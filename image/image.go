// Package image resolves an image reference into what a sandbox's root is
// made of: read-only layers on the host, owned as the sandbox's user mapping
// wants them, and directories to bind in. The manager puts the result into
// the runtime.Spec; runtimes never resolve images themselves. There is the
// built-in "host" image and OCI images pulled from registries or imported
// from files into a content-addressed layer store.
package image

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/internal/hostpath"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/store"
)

// Store holds the images of one daemon under its directory.
type Store struct {
	dir string
	log *slog.Logger

	db        *store.Store // OCI images' rows; nil: the host image only
	insecure  []string
	keychain  authn.Keychain
	limits    Limits
	transport http.RoundTripper
	// tenantTr is the transport of tenants' pulls (tenantNet).
	tenantTr   http.RoundTripper
	tenantOnce sync.Once

	pulls flights // one pull per reference, one download per layer
	// gc is held shared by pulls and resolves, exclusively by removes and
	// prunes: no layer goes while something counts on it.
	gc sync.RWMutex

	mu    sync.Mutex
	hosts map[runtime.IDMap]hostImage // the host image, built once per mapping
}

// New opens the store in dir, making it if needed. Sandboxes' inits open
// layers by path as unprivileged host uids, so dir and its parents must be
// searchable by others.
func New(dir string, log *slog.Logger, opts ...Option) (*Store, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if err := hostpath.CheckSearchable(dir); err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	s := &Store{dir: dir, log: log, hosts: map[runtime.IDMap]hostImage{}, keychain: authn.DefaultKeychain}
	for _, o := range opts {
		o(s)
	}
	if s.db != nil {
		if err := s.openOCI(context.Background()); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func goarch() string { return goruntime.GOARCH }

// Resolved is an image made ready for one sandbox's user mapping.
type Resolved struct {
	Root   runtime.RootFS
	Mounts []runtime.Mount
	// Image is the stored image (zero for the host image).
	Image api.Image
}

// Resolve returns image ref prepared for sandboxes whose ids map as ids.
// With Unmapped as ids the layers' files are owned as sandboxes see them
// (for a runtime that idmaps layers): one copy serves every sandbox, and it
// is kept where only root can reach it, as the runtime opens it, never a
// sandbox. An unknown reference is invalid_argument naming it.
func (s *Store) Resolve(ctx context.Context, ref string, ids runtime.IDMap) (Resolved, error) {
	if ref != Host {
		return s.resolveOCI(ctx, ref, ids)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.hosts[ids]
	if !ok {
		dir := s.dir
		if ids.HostID == Unmapped.HostID {
			// Files owned by host uids 0 and 1000: no host user may reach them.
			dir = filepath.Join(s.dir, "unmapped")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return Resolved{}, fmt.Errorf("image store: %w", err)
			}
			if err := os.Chmod(dir, 0o700); err != nil {
				return Resolved{}, fmt.Errorf("image store: %w", err)
			}
		}
		var err error
		if img, err = buildHostImage(dir, ids); err != nil {
			return Resolved{}, fmt.Errorf("host image: %w", err)
		}
		s.hosts[ids] = img
		s.log.Info("host image ready", "dir", img.dir, "id_base", ids.HostID)
	}
	return Resolved{
		Root:   runtime.RootFS{Image: ref, Layers: []string{img.dir}, IDMapped: ids.HostID == Unmapped.HostID},
		Mounts: append([]runtime.Mount(nil), img.mounts...),
	}, nil
}

// Unmapped is the mapping to resolve an image with for a runtime that
// idmaps its layers: ids on disk are the ids inside.
var Unmapped = runtime.IDMap{HostID: 0, Size: 65536}
