package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// Images is what the image routes need of the image store (image.Store).
// Image names are a tenant's; the operator's ("") are the catalog every
// tenant uses. Content is shared.
type Images interface {
	Pull(ctx context.Context, tenant, ref string, progress func(api.PullEvent)) (api.Image, error)
	Import(ctx context.Context, tenant string, r io.Reader, as string, progress func(api.PullEvent)) ([]api.Image, error)
	List(ctx context.Context, tenant string) ([]api.Image, error)
	Inspect(ctx context.Context, tenant, ref string) (api.Image, error)
	Remove(ctx context.Context, tenant, ref string) (api.PruneResult, error)
	Prune(ctx context.Context, all bool) (api.PruneResult, error)
}

// Pools is what the warm-pool routes need of the manager.
type Pools interface {
	Pools() []api.Pool
	SetPool(ctx context.Context, image string, size int) (api.Pool, error)
}

type imagesGroup struct {
	images Images
	pools  Pools
}

// ImagesAPI is the group of /v1/images and /v1/pools.
func ImagesAPI(images Images, pools Pools) Group { return &imagesGroup{images: images, pools: pools} }

// Name implements Group.
func (g *imagesGroup) Name() string { return "images" }

// Routes implements Group.
func (g *imagesGroup) Routes(r *Router) {
	// A tenant pulls, imports and removes its own images; the operator's
	// are the catalog every tenant uses. Only the operator prunes (every
	// tenant's unused images) and sizes the warm pools.
	r.Handle("GET /v1/images", g.list)
	r.Handle("GET /v1/images/{ref...}", g.inspect)
	r.Handle("POST /v1/images/pull", g.pull)
	r.Handle("POST /v1/images/import", g.importImages)
	r.Handle("DELETE /v1/images/{ref...}", g.remove)
	ad := r.Admin()
	ad.Handle("POST /v1/images/prune", g.prune)
	ad.Handle("GET /v1/pools", g.listPools)
	ad.Handle("PUT /v1/pools", g.setPool)
}

func (g *imagesGroup) list(w http.ResponseWriter, r *http.Request) error {
	imgs, err := g.images.List(r.Context(), Tenant(r))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ListImagesResponse{Images: imgs})
}

// imageTenant is whose names a request about one image acts on: the
// caller's tenant, or, for the operator, the tenant the query names.
func imageTenant(r *http.Request) (string, error) {
	t := Tenant(r)
	q := r.URL.Query().Get("tenant")
	switch {
	case q == "" || q == t:
		return t, nil
	case t != "":
		return "", errdefs.New(errdefs.InvalidArgument, "tenant: %q: only the operator (an admin key) names another tenant", q)
	}
	return q, nil
}

func wantsNDJSON(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
}

// pullStream writes a pull's progress as NDJSON. Progress may come from
// the pull's own goroutine (one that other callers share), so writes are
// serialized and stop when the handler returns.
type pullStream struct {
	mu   sync.Mutex
	nd   *ndjson
	done bool
}

func newPullStream(w http.ResponseWriter) *pullStream { return &pullStream{nd: newNDJSON(w)} }

func (p *pullStream) send(ev api.PullEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		p.nd.write(ev)
	}
}

// finish ends the stream with the result or the error: an error before
// the stream began is the handler's to write.
func (p *pullStream) finish(img *api.Image, err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
	switch {
	case err != nil && !p.nd.started:
	case err != nil:
		p.nd.write(api.PullEvent{Status: api.PullError, Error: apiError(err)})
	default:
		p.nd.write(api.PullEvent{Status: api.PullDone, Image: img})
	}
	return err
}

func (g *imagesGroup) pull(w http.ResponseWriter, r *http.Request) error {
	var req api.PullImageRequest
	if err := decode(w, r, &req, maxBody); err != nil {
		return err
	}
	if req.Ref == "" {
		return errdefs.New(errdefs.InvalidArgument, "ref: required (an image reference such as python:3.12-slim)")
	}
	if !wantsNDJSON(r) {
		img, err := g.images.Pull(r.Context(), Tenant(r), req.Ref, nil)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, img)
	}
	ps := newPullStream(w)
	img, err := g.images.Pull(r.Context(), Tenant(r), req.Ref, ps.send)
	return ps.finish(&img, err)
}

func (g *imagesGroup) importImages(w http.ResponseWriter, r *http.Request) error {
	as := r.URL.Query().Get("name")
	if !wantsNDJSON(r) {
		imgs, err := g.images.Import(r.Context(), Tenant(r), r.Body, as, nil)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, api.ListImagesResponse{Images: imgs})
	}
	ps := newPullStream(w)
	imgs, err := g.images.Import(r.Context(), Tenant(r), r.Body, as, ps.send)
	var last *api.Image
	if len(imgs) > 0 {
		last = &imgs[len(imgs)-1]
	}
	return ps.finish(last, err)
}

func (g *imagesGroup) prune(w http.ResponseWriter, r *http.Request) error {
	var req api.PruneImagesRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req, maxBody); err != nil {
			return err
		}
	}
	res, err := g.images.Prune(r.Context(), req.All)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (g *imagesGroup) inspect(w http.ResponseWriter, r *http.Request) error {
	tenant, err := imageTenant(r)
	if err != nil {
		return err
	}
	img, err := g.images.Inspect(r.Context(), tenant, r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, img)
}

func (g *imagesGroup) remove(w http.ResponseWriter, r *http.Request) error {
	tenant, err := imageTenant(r)
	if err != nil {
		return err
	}
	res, err := g.images.Remove(r.Context(), tenant, r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (g *imagesGroup) listPools(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.ListPoolsResponse{Pools: g.pools.Pools()})
}

func (g *imagesGroup) setPool(w http.ResponseWriter, r *http.Request) error {
	var req api.Pool
	if err := decode(w, r, &req, maxBody); err != nil {
		return err
	}
	p, err := g.pools.SetPool(r.Context(), req.Image, req.Size)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}
