package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/store"
)

// An OCI image is stored as rows (store.Image: its manifest digest as id,
// its configuration, its layers) and one directory per layer under
// layers/, named for the digest of the layer's uncompressed tar (its
// "diff id"), so layers that images share are stored once. A layer is
// unpacked into layers/.tmp-*, both its digests are checked, and only then
// is it renamed into place and given its row: a pull that fails or a daemon
// killed mid-pull leaves only .tmp-* directories, which the next start
// removes, and a next pull fetches what is missing. The image's row comes
// last, so an image either is stored whole or is not there.

// Option configures a Store.
type Option func(*Store)

// WithCatalog stores OCI images' rows in db; without it the store has only
// the host image.
func WithCatalog(db *store.Store) Option { return func(s *Store) { s.db = db } }

// WithInsecureRegistries lists registries (host[:port]) spoken to over
// plain HTTP.
func WithInsecureRegistries(hosts []string) Option {
	return func(s *Store) { s.insecure = append(s.insecure, hosts...) }
}

// WithKeychain sets where registry credentials come from (default: the
// daemon's Docker configuration, $DOCKER_CONFIG/config.json, and its
// credential helpers).
func WithKeychain(k authn.Keychain) Option { return func(s *Store) { s.keychain = k } }

// WithLimits bounds what one pull may unpack.
func WithLimits(l Limits) Option { return func(s *Store) { s.limits = l } }

// WithTransport sets the HTTP transport to registries (tests count requests).
func WithTransport(t http.RoundTripper) Option { return func(s *Store) { s.transport = t } }

// Progress receives a pull's progress; it must not block. It may be
// called from another goroutine than the pull's caller.
type Progress = func(api.PullEvent)

func send(p Progress, ev api.PullEvent) {
	if p != nil {
		p(ev)
	}
}

func (s *Store) layersDir() string           { return filepath.Join(s.dir, "oci", "layers") }
func (s *Store) layerDir(diff string) string { return filepath.Join(s.layersDir(), hexOf(diff)) }

// hexOf is a layer's directory name: a pulled or built layer's digest
// without "sha256:", a snapshot layer's name with "-" for ":".
func hexOf(digest string) string {
	if h, ok := strings.CutPrefix(digest, "sha256:"); ok {
		return h
	}
	return strings.ReplaceAll(digest, ":", "-")
}

// openOCI prepares the layer store: the directories, and no leftovers of a
// pull that did not finish (.tmp-* directories, layer directories whose
// row was never written).
func (s *Store) openOCI(ctx context.Context) error {
	if err := os.MkdirAll(s.layersDir(), 0o700); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if err := os.Chmod(filepath.Dir(s.layersDir()), 0o700); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	known, err := s.db.Layers(ctx)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	dirs := make(map[string]bool, len(known))
	for d := range known {
		dirs[hexOf(d)] = true
	}
	for _, e := range ents {
		if dirs[e.Name()] {
			continue
		}
		s.log.Info("removing an unfinished layer", "dir", e.Name())
		if err := removeAll(filepath.Join(s.layersDir(), e.Name())); err != nil {
			return fmt.Errorf("image store: remove unfinished layer: %w", err)
		}
	}
	for digest := range known {
		if _, err := os.Stat(s.layerDir(digest)); errors.Is(err, os.ErrNotExist) {
			s.log.Warn("a stored layer's directory is missing; forgetting it", "layer", digest)
			if err := s.db.DeleteLayer(ctx, digest); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseRef parses an image reference as a registry reference.
func (s *Store) parseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref, name.WithDefaultRegistry("index.docker.io"))
	if err != nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "image %q: not a valid reference: %v", ref, err)
	}
	reg := r.Context().RegistryStr()
	for _, h := range s.insecure {
		if h == reg {
			if r, err = name.ParseReference(ref, name.Insecure); err != nil {
				return nil, errdefs.New(errdefs.InvalidArgument, "image %q: %v", ref, err)
			}
			break
		}
	}
	return r, nil
}

// isID says whether ref names an image by its id.
func isID(ref string) bool {
	h, ok := strings.CutPrefix(ref, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// Lookup finds a stored image that tenant may use, by id or by a name
// that was pulled, imported or built: not_found if there is none (it
// never pulls). A name is tenant's own, else the operator's (tenant "");
// an id is found for a tenant only if it or the operator names the image,
// or its sandboxes are made of it: another tenant's image is not_found,
// exactly like a missing one.
func (s *Store) Lookup(ctx context.Context, tenant, ref string) (api.Image, error) {
	rec, _, err := s.lookup(ctx, tenant, ref)
	if err != nil {
		return api.Image{}, err
	}
	return toAPI(rec, tenant)
}

// lookup is Lookup's record, with whose name ref is ("" for the operator's,
// and for an id).
func (s *Store) lookup(ctx context.Context, tenant, ref string) (store.Image, string, error) {
	if s.db == nil {
		return store.Image{}, "", errdefs.New(errdefs.NotFound, "image %q not found: this store has only the host image", ref)
	}
	if isID(ref) {
		ok, err := s.db.ImageVisible(ctx, tenant, ref)
		if err != nil {
			return store.Image{}, "", err
		}
		if !ok {
			return store.Image{}, "", errdefs.New(errdefs.NotFound, "image %q not found (berth image pull %s)", ref, ref)
		}
		rec, err := s.db.GetImage(ctx, ref)
		return rec, "", err
	}
	r, err := s.parseRef(ref)
	if err != nil {
		return store.Image{}, "", err
	}
	rec, owner, err := s.db.ImageByName(ctx, tenant, r.Name())
	if errdefs.IsNotFound(err) {
		err = errdefs.New(errdefs.NotFound, "image %q not found (berth image pull %s)", ref, ref)
	}
	return rec, owner, err
}

// toAPI is rec as tenant sees it: Names are the names tenant resolves
// (its own and the operator's; for the operator, the operator's), and
// TenantNames are the names of tenants, by tenant (a tenant's own; for
// the operator, every tenant's).
func toAPI(rec store.Image, tenant string) (api.Image, error) {
	img := api.Image{ID: rec.ID, Size: rec.Size, Layers: rec.Layers, Source: rec.Source, CreatedAt: rec.CreatedAt,
		Template: strings.HasPrefix(rec.Source, BuiltPrefix)}
	for _, n := range rec.Names {
		switch {
		case n.Grant(rec.ID):
		case n.Tenant == "" || n.Tenant == tenant:
			img.Names = append(img.Names, n.Name)
			if n.Tenant != "" {
				if img.TenantNames == nil {
					img.TenantNames = map[string][]string{}
				}
				img.TenantNames[n.Tenant] = append(img.TenantNames[n.Tenant], n.Name)
			}
		case tenant == "":
			if img.TenantNames == nil {
				img.TenantNames = map[string][]string{}
			}
			img.TenantNames[n.Tenant] = append(img.TenantNames[n.Tenant], n.Name)
		}
	}
	sort.Strings(img.Names)
	var cf v1.ConfigFile
	if err := json.Unmarshal(rec.Config, &cf); err != nil {
		return api.Image{}, fmt.Errorf("image %s: config: %w", rec.ID, err)
	}
	c := cf.Config
	img.Config = api.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint,
		Cmd: c.Cmd, Labels: c.Labels, Architecture: cf.Architecture, OS: cf.OS}
	for p := range c.ExposedPorts {
		img.Config.ExposedPorts = append(img.Config.ExposedPorts, p)
	}
	sort.Strings(img.Config.ExposedPorts)
	return img, nil
}

// Ensure returns the stored image ref names for tenant, pulling it (as
// tenant's) if it is not stored yet: what a create does.
func (s *Store) Ensure(ctx context.Context, tenant, ref string) (api.Image, error) {
	img, err := s.Lookup(ctx, tenant, ref)
	if err == nil || !errdefs.IsNotFound(err) || isID(ref) || s.db == nil {
		return img, err
	}
	return s.Pull(ctx, tenant, ref, nil)
}

// Pull fetches ref from its registry and stores it, named as tenant's.
// Concurrent pulls of one reference by one tenant share one download; the
// others wait for it (and get no progress but the end). Two tenants'
// pulls share the layers' downloads.
func (s *Store) Pull(ctx context.Context, tenant, ref string, progress Progress) (api.Image, error) {
	if s.db == nil {
		return api.Image{}, errdefs.New(errdefs.NotImplemented, "image pull: this store has only the host image")
	}
	if ref == Host {
		return api.Image{}, errdefs.New(errdefs.InvalidArgument, "image %q is built in: nothing to pull", ref)
	}
	r, err := s.parseRef(ref)
	if err != nil {
		return api.Image{}, err
	}
	var img api.Image
	err = s.pulls.do(ctx, "pull "+tenant+"\x00"+r.Name(), func(ctx context.Context) error {
		var err error
		img, err = s.pull(ctx, tenant, ref, r, progress)
		return err
	})
	if err != nil {
		return api.Image{}, err
	}
	if img.ID == "" { // joined another caller's pull
		return s.Lookup(ctx, tenant, ref)
	}
	return img, nil
}

// remoteOptions are a pull's options: the operator's with the daemon's
// credentials and any address; a tenant's anonymous and to public
// addresses or the operator's registries (tenantTransport).
func (s *Store) remoteOptions(ctx context.Context, tenant string) []remote.Option {
	opts := []remote.Option{remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: goarch()})}
	switch {
	case s.transport != nil: // a test's
		opts = append(opts, remote.WithTransport(s.transport), remote.WithAuthFromKeychain(s.keychain))
	case tenant != "":
		opts = append(opts, remote.WithTransport(s.tenantNet()), remote.WithAuth(authn.Anonymous))
	default:
		opts = append(opts, remote.WithAuthFromKeychain(s.keychain))
	}
	return opts
}

// tenantNet is the transport of tenants' pulls, made once.
func (s *Store) tenantNet() http.RoundTripper {
	s.tenantOnce.Do(func() {
		s.tenantTr = tenantTransport(remote.DefaultTransport.(*http.Transport), s.insecure)
	})
	return s.tenantTr
}

func (s *Store) pull(ctx context.Context, tenant, ref string, r name.Reference, progress Progress) (api.Image, error) {
	desc, err := remote.Get(r, s.remoteOptions(ctx, tenant)...)
	if err != nil {
		return api.Image{}, registryError(ref, tenant, err)
	}
	img, err := desc.Image() // an index resolves to this host's platform
	if err != nil {
		return api.Image{}, registryError(ref, tenant, err)
	}
	names := []string{r.Name()}
	if _, ok := r.(name.Digest); !ok {
		names = append(names, r.Context().Digest(desc.Digest.String()).Name())
	}
	return s.storeImage(ctx, tenant, img, names, ref, progress)
}

// registryError classifies what a registry (or the way to it) answered.
// A tenant's error carries the status and the registry's error codes, not
// the body of the answer: a tenant does not read what the daemon fetched.
func registryError(ref, tenant string, err error) error {
	if pe := errdefs.ClassOf(err); pe == errdefs.PermissionDenied {
		return err // a tenant's pull refused an address
	}
	var te *transport.Error
	if errors.As(err, &te) && tenant != "" {
		codes := make([]string, 0, len(te.Errors))
		for _, d := range te.Errors {
			codes = append(codes, string(d.Code))
		}
		err = fmt.Errorf("the registry answered %d %v", te.StatusCode, codes)
		te = &transport.Error{StatusCode: te.StatusCode, Errors: te.Errors}
	}
	if te != nil {
		switch {
		case te.StatusCode == http.StatusNotFound:
			return errdefs.New(errdefs.NotFound, "image %q not found in its registry: %v", ref, err)
		case te.StatusCode == http.StatusUnauthorized:
			return errdefs.New(errdefs.PermissionDenied, "image %q: the registry wants credentials (give them to the daemon in $DOCKER_CONFIG/config.json): %v", ref, err)
		case te.StatusCode == http.StatusForbidden:
			return errdefs.New(errdefs.PermissionDenied, "image %q: the registry refused: %v", ref, err)
		case te.StatusCode >= 500 || te.StatusCode == http.StatusTooManyRequests:
			return errdefs.New(errdefs.Unavailable, "image %q: the registry failed: %v", ref, err)
		}
		for _, d := range te.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
				return errdefs.New(errdefs.NotFound, "image %q not found in its registry: %v", ref, err)
			}
		}
		return errdefs.New(errdefs.InvalidArgument, "image %q: the registry answered %d: %v", ref, te.StatusCode, err)
	}
	var (
		ne net.Error
		ue *url.Error
	)
	if errors.As(err, &ne) || errors.As(err, &ue) || errors.Is(err, syscall.ECONNREFUSED) {
		return errdefs.New(errdefs.Unavailable, "image %q: the registry is unreachable: %v", ref, err)
	}
	if errdefs.ClassOf(err) != "" && errdefs.ClassOf(err) != errdefs.Internal {
		return err
	}
	return errdefs.New(errdefs.InvalidArgument, "image %q: %v", ref, err)
}

// storeImage stores img's layers that are missing and then its row, named
// names of tenant's. The gc lock is held shared throughout, so a remove or prune
// cannot take a layer this pull counts on.
func (s *Store) storeImage(ctx context.Context, tenant string, img v1.Image, names []string, source string, progress Progress) (api.Image, error) {
	s.gc.RLock()
	defer s.gc.RUnlock()
	digest, err := img.Digest()
	if err != nil {
		return api.Image{}, errdefs.New(errdefs.InvalidArgument, "image %s: manifest: %v", source, err)
	}
	id := digest.String()
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return api.Image{}, registryError(source, tenant, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawConfig))
	if err != nil {
		return api.Image{}, errdefs.New(errdefs.InvalidArgument, "image %s: config: %v", source, err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return api.Image{}, errdefs.New(errdefs.InvalidArgument, "image %s is for %s/%s, not linux", source, cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		return api.Image{}, registryError(source, tenant, err)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return api.Image{}, errdefs.New(errdefs.InvalidArgument, "image %s: %d layers but %d diff ids in its config", source, len(layers), len(cf.RootFS.DiffIDs))
	}
	if len(layers) > maxLayers {
		return api.Image{}, errdefs.New(errdefs.InvalidArgument, "image %s has %d layers, over the %d a sandbox's root can stack", source, len(layers), maxLayers)
	}
	known, err := s.db.Layers(ctx)
	if err != nil {
		return api.Image{}, err
	}
	var total int64
	for i, l := range layers {
		if _, ok := known[cf.RootFS.DiffIDs[i].String()]; ok {
			continue
		}
		if n, err := l.Size(); err == nil {
			total += n
		}
	}
	send(progress, api.PullEvent{Status: api.PullResolved, Total: total})
	b := &budget{lim: s.limits.withDefaults(), dir: s.layersDir()}
	rec := store.Image{ID: id, Config: rawConfig, Source: source, CreatedAt: time.Now().UTC()}
	for i := range layers {
		if d := cf.RootFS.DiffIDs[i]; d.Hex == "" || d.Algorithm != "sha256" {
			return api.Image{}, errdefs.New(errdefs.InvalidArgument, "image %s: layer %d has no sha256 diff id", source, i)
		}
	}
	// The missing layers download and unpack side by side (each into its
	// own directory): one layer's download waits on the network while
	// another's unpacking takes a core.
	sizes := make([]int64, len(layers))
	notes := make([][]string, len(layers))
	progress = serialized(progress)
	// A layer that fails lets the others in flight finish (they are kept,
	// and the next pull skips them); layers not begun are not begun.
	var g errgroup.Group
	var failed atomic.Bool
	g.SetLimit(parallelLayers)
	for i, l := range layers {
		diff := cf.RootFS.DiffIDs[i].String()
		if size, ok := known[diff]; ok {
			send(progress, api.PullEvent{Status: api.PullLayerExists, Layer: diff})
			b.add(size)
			sizes[i] = size
			continue
		}
		g.Go(func() error {
			if failed.Load() {
				return nil
			}
			var u unpacked
			err := s.pulls.do(ctx, "layer "+diff, func(ctx context.Context) error {
				var err error
				u, err = s.fetchLayer(ctx, l, diff, b, progress)
				return err
			})
			if err != nil {
				failed.Store(true)
				return fmt.Errorf("image %s: layer %d (%s): %w", source, i, diff, err)
			}
			size, err := s.db.LayerSize(ctx, diff)
			if err != nil {
				return err
			}
			sizes[i], notes[i] = size, u.notes
			send(progress, api.PullEvent{Status: api.PullUnpacked, Layer: diff, Total: size})
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		if ctx.Err() != nil {
			return api.Image{}, ctx.Err()
		}
		return api.Image{}, err
	}
	var allNotes []string
	for i := range layers {
		rec.Layers = append(rec.Layers, cf.RootFS.DiffIDs[i].String())
		rec.Size += sizes[i]
		allNotes = append(allNotes, notes[i]...)
	}
	if err := s.db.PutImage(ctx, tenant, rec, names); err != nil {
		return api.Image{}, err
	}
	for _, n := range allNotes {
		s.log.Info("image unpacked with a note", "image", id, "note", n)
	}
	out, err := s.db.GetImage(ctx, id)
	if err != nil {
		return api.Image{}, err
	}
	a, err := toAPI(out, tenant)
	a.Notes = allNotes
	return a, err
}

// serialized returns p called by one goroutine at a time.
func serialized(p Progress) Progress {
	if p == nil {
		return nil
	}
	var mu sync.Mutex
	return func(ev api.PullEvent) {
		mu.Lock()
		defer mu.Unlock()
		p(ev)
	}
}

// parallelLayers is how many of a pull's layers download and unpack at
// once.
const parallelLayers = 3

// maxLayers is the most layers an image may have: the overlay of a
// sandbox's root takes a bounded list of lower layers.
const maxLayers = 120

// fetchLayer downloads, verifies and unpacks one layer into the store.
func (s *Store) fetchLayer(ctx context.Context, l v1.Layer, diff string, b *budget, progress Progress) (unpacked, error) {
	if size, err := s.db.LayerSize(ctx, diff); err == nil { // another pull stored it meanwhile
		b.add(size)
		return unpacked{}, nil
	}
	want, err := l.Digest()
	if err != nil {
		return unpacked{}, err
	}
	total, _ := l.Size()
	rc, err := l.Compressed()
	if err != nil {
		return unpacked{}, registryError(diff, "", err)
	}
	defer rc.Close()
	tmp, err := s.newLayerDir()
	if err != nil {
		return unpacked{}, err
	}
	defer func() {
		if tmp != "" {
			removeAll(tmp)
		}
	}()
	compressed := sha256.New()
	counter := &progressReader{ctx: ctx, r: io.TeeReader(rc, compressed), layer: diff, total: total, progress: progress}
	uncompressed := sha256.New()
	dec, err := decompress(bufferedReader(counter))
	if err != nil {
		return unpacked{}, err
	}
	defer dec.Close()
	u, err := unpackLayer(tmp, io.TeeReader(dec, uncompressed), b)
	if err != nil {
		if ctx.Err() != nil {
			return unpacked{}, ctx.Err()
		}
		if counter.err != nil && counter.err != io.EOF {
			return unpacked{}, registryError(diff, "", counter.err) // the download failed, not the layer
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return unpacked{}, errdefs.New(errdefs.InvalidArgument, "layer %s is truncated: %v", diff, err)
		}
		return unpacked{}, err
	}
	// Read the tar's padding and the compressed stream's end too: the
	// digests cover every byte.
	if _, err := io.Copy(uncompressed, dec); err != nil {
		return unpacked{}, errdefs.New(errdefs.InvalidArgument, "layer %s: %v", diff, err)
	}
	if _, err := io.Copy(io.Discard, counter); err != nil {
		return unpacked{}, registryError(diff, "", err)
	}
	if got := digestOf(compressed); got != want.String() {
		return unpacked{}, errdefs.New(errdefs.InvalidArgument, "layer %s: the blob's digest is %s, not %s (corrupt or tampered)", diff, got, want)
	}
	if got := digestOf(uncompressed); got != diff {
		return unpacked{}, errdefs.New(errdefs.InvalidArgument, "layer %s: its tar's digest is %s (the image's config says otherwise: corrupt or tampered)", diff, got)
	}
	err = s.placeLayer(ctx, tmp, diff, u.bytes)
	tmp = "" // placed, or removed by placeLayer
	if err != nil {
		return unpacked{}, err
	}
	return u, nil
}

// newLayerDir makes a directory for a layer to unpack into: ".tmp-*", which
// a start removes should the daemon die before the layer is placed.
func (s *Store) newLayerDir() (string, error) {
	tmp, err := os.MkdirTemp(s.layersDir(), ".tmp-")
	if err != nil {
		return "", fmt.Errorf("image store: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		removeAll(tmp)
		return "", err
	}
	return tmp, nil
}

// placeLayer makes layer diff, unpacked and verified in tmp, part of the
// store: synced, renamed into place, then given its row. On error nothing
// of it is left, tmp included.
func (s *Store) placeLayer(ctx context.Context, tmp, diff string, size int64) error {
	if err := syncDir(tmp); err != nil {
		removeAll(tmp)
		return err
	}
	if err := os.Rename(tmp, s.layerDir(diff)); err != nil {
		removeAll(tmp)
		return fmt.Errorf("image store: commit layer: %w", err)
	}
	if err := s.db.PutLayer(ctx, diff, size); err != nil {
		removeAll(s.layerDir(diff))
		return err
	}
	return nil
}

func digestOf(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// decompress reads a layer blob as gzip, zstd or a plain tar, by its magic.
func decompress(r interface {
	io.Reader
	Peek(int) ([]byte, error)
}) (io.ReadCloser, error) {
	magic, _ := r.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, errdefs.New(errdefs.InvalidArgument, "layer: bad gzip: %v", err)
		}
		return z, nil
	case len(magic) == 4 && bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, errdefs.New(errdefs.InvalidArgument, "layer: bad zstd: %v", err)
		}
		return z.IOReadCloser(), nil
	}
	return io.NopCloser(r), nil
}

// progressReader reports a layer's download as it is read, at most every
// 100 ms, and ends it when the layer's context ends.
type progressReader struct {
	ctx      context.Context // the layer's: a download stops when it ends
	r        io.Reader
	layer    string
	total, n int64
	last     time.Time
	progress Progress
	err      error // the first error the download returned (io.EOF at its end)
}

func (p *progressReader) Read(b []byte) (int, error) {
	if err := p.ctx.Err(); err != nil {
		if p.err == nil {
			p.err = err
		}
		return 0, err
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	if err != nil && p.err == nil {
		p.err = err
	}
	if p.progress != nil && (err != nil || time.Since(p.last) > 100*time.Millisecond) {
		p.last = time.Now()
		p.progress(api.PullEvent{Status: api.PullDownloading, Layer: p.layer, Current: p.n, Total: p.total})
	}
	return n, err
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// removeAll removes a directory tree the daemon made, whatever its modes
// (an image may hold directories without write permission).
func removeAll(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
