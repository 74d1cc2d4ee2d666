package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// imagePath is the path of a stored image by id or name (names hold
// slashes, which stay path separators).
func imagePath(ref string) string {
	parts := strings.Split(ref, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/v1/images/" + strings.Join(parts, "/")
}

// PullImage pulls ref into the daemon's store. With progress, the daemon
// streams the pull's progress, which progress receives as it comes.
func (c *Client) PullImage(ctx context.Context, ref string, progress func(api.PullEvent)) (api.Image, error) {
	if progress == nil {
		var img api.Image
		err := c.do(ctx, http.MethodPost, "/v1/images/pull", nil, api.PullImageRequest{Ref: ref}, &img)
		return img, err
	}
	b, err := json.Marshal(api.PullImageRequest{Ref: ref})
	if err != nil {
		return api.Image{}, err
	}
	resp, err := c.requestRaw(ctx, http.MethodPost, "/v1/images/pull", nil, bytes.NewReader(b),
		http.Header{"Content-Type": {"application/json"}, "Accept": {"application/x-ndjson"}})
	if err != nil {
		return api.Image{}, err
	}
	defer resp.Body.Close()
	return readPullEvents(resp.Body, progress)
}

// readPullEvents hands a pull stream's events to progress and returns the
// image of its "done" event, or its "error" as a classified error.
func readPullEvents(body io.Reader, progress func(api.PullEvent)) (api.Image, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		var ev api.PullEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return api.Image{}, fmt.Errorf("pull progress: %w", err)
		}
		if progress != nil {
			progress(ev)
		}
		switch ev.Status {
		case api.PullDone:
			if ev.Image == nil {
				return api.Image{}, errdefs.New(errdefs.Internal, "pull progress: done without an image")
			}
			return *ev.Image, nil
		case api.PullError:
			if ev.Error == nil {
				return api.Image{}, errdefs.New(errdefs.Internal, "pull failed")
			}
			return api.Image{}, fromAPIError(*ev.Error)
		}
	}
	if err := sc.Err(); err != nil {
		return api.Image{}, err
	}
	return api.Image{}, errdefs.New(errdefs.Unavailable, "pull progress: the stream ended before the pull did")
}

// ImportImages stores the images of a docker save tarball or an OCI layout
// tar read from r; as names the file's one image (optional). With
// progress, the stream's end names only the last image stored, which is
// all it returns (ListImages lists the others).
func (c *Client) ImportImages(ctx context.Context, r io.Reader, as string, progress func(api.PullEvent)) ([]api.Image, error) {
	q := url.Values{}
	if as != "" {
		q.Set("name", as)
	}
	hdr := http.Header{"Content-Type": {"application/x-tar"}}
	if progress != nil {
		hdr.Set("Accept", "application/x-ndjson")
	}
	resp, err := c.requestRaw(ctx, http.MethodPost, "/v1/images/import", q, r, hdr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if progress != nil {
		last, err := readPullEvents(resp.Body, progress)
		if err != nil {
			return nil, err
		}
		return []api.Image{last}, nil
	}
	var out api.ListImagesResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	return out.Images, nil
}

// ListImages lists the stored images, newest first.
func (c *Client) ListImages(ctx context.Context) ([]api.Image, error) {
	var out api.ListImagesResponse
	err := c.do(ctx, http.MethodGet, "/v1/images", nil, nil, &out)
	return out.Images, err
}

// InspectImage describes a stored image by id or name (the key's
// tenant's name, else the operator's).
func (c *Client) InspectImage(ctx context.Context, ref string) (api.Image, error) {
	return c.InspectImageOf(ctx, "", ref)
}

// InspectImageOf is InspectImage of tenant's names: for the operator (an
// admin key), any tenant's; "" is the key's own.
func (c *Client) InspectImageOf(ctx context.Context, tenant, ref string) (api.Image, error) {
	var img api.Image
	err := c.do(ctx, http.MethodGet, imagePath(ref), tenantQuery(tenant), nil, &img)
	return img, err
}

// RemoveImage removes a name, or an image and its unshared layers.
func (c *Client) RemoveImage(ctx context.Context, ref string) (api.PruneResult, error) {
	return c.RemoveImageOf(ctx, "", ref)
}

// RemoveImageOf is RemoveImage of tenant's names: for the operator (an
// admin key), any tenant's; "" is the key's own.
func (c *Client) RemoveImageOf(ctx context.Context, tenant, ref string) (api.PruneResult, error) {
	var res api.PruneResult
	err := c.do(ctx, http.MethodDelete, imagePath(ref), tenantQuery(tenant), nil, &res)
	return res, err
}

func tenantQuery(tenant string) url.Values {
	if tenant == "" {
		return nil
	}
	return url.Values{"tenant": {tenant}}
}

// PruneImages removes images no sandbox uses (unnamed ones, or all).
func (c *Client) PruneImages(ctx context.Context, all bool) (api.PruneResult, error) {
	var res api.PruneResult
	err := c.do(ctx, http.MethodPost, "/v1/images/prune", nil, api.PruneImagesRequest{All: all}, &res)
	return res, err
}

// Pools lists the warm pools.
func (c *Client) Pools(ctx context.Context) ([]api.Pool, error) {
	var out api.ListPoolsResponse
	err := c.do(ctx, http.MethodGet, "/v1/pools", nil, nil, &out)
	return out.Pools, err
}

// SetPool keeps size sandboxes of image booted; 0 removes the pool.
func (c *Client) SetPool(ctx context.Context, image string, size int) (api.Pool, error) {
	var p api.Pool
	err := c.do(ctx, http.MethodPut, "/v1/pools", nil, api.Pool{Image: image, Size: size}, &p)
	return p, err
}
