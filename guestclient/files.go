package guestclient

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// maxFSAnswer bounds a file operation's answer (a batch download is the largest).
const maxFSAnswer = guestapi.MaxBatchBytes*4/3 + 16<<20

// FS runs a file operation (guestapi.Op*) and decodes its result into out.
func (c *Client) FS(ctx context.Context, op string, in, out any) error {
	resp, err := c.send(ctx, http.MethodPost, guestapi.PathFS+"/"+op, in, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxFSAnswer)).Decode(out); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: bad answer from guest", c.id)
	}
	return nil
}

func fileQuery(w guestapi.Where, path string, extra url.Values) string {
	q := url.Values{"path": {path}}
	if w.User != "" {
		q.Set("user", w.User)
	}
	if w.Cwd != "" {
		q.Set("cwd", w.Cwd)
	}
	for k, v := range extra {
		q[k] = v
	}
	return "?" + q.Encode()
}

// raw sends a request with a raw body (nil for none) and returns the answer.
func (c *Client) raw(ctx context.Context, method, pathQuery string, body io.Reader, size int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://guest"+pathQuery, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = size // -1: unknown, sent chunked
		if size == 0 {
			req.Body = http.NoBody
		}
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errdefs.ClassOf(err) != errdefs.Internal {
			return nil, err // the body's own classified error
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: guest not reachable", c.id)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	var ge guestapi.Error
	json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&ge)
	return nil, guestError(c.id, ge, resp.StatusCode)
}

// Download opens a file's bytes; size is what the guest announced (-1 if
// none). The caller closes the reader.
func (c *Client) Download(ctx context.Context, w guestapi.Where, path string) (io.ReadCloser, int64, error) {
	resp, err := c.raw(ctx, http.MethodGet, guestapi.PathFiles+fileQuery(w, path, nil), nil, 0)
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// Upload writes body (size bytes, or -1 if unknown) to a file.
func (c *Client) Upload(ctx context.Context, w guestapi.Where, path string, mode *uint32, createOnly bool, body io.Reader, size int64) (guestapi.FileInfo, error) {
	extra := url.Values{}
	if mode != nil {
		extra.Set("mode", strconv.FormatUint(uint64(*mode), 8))
	}
	if createOnly {
		extra.Set("create_only", "true")
	}
	var fi guestapi.FileInfo
	resp, err := c.raw(ctx, http.MethodPut, guestapi.PathFiles+fileQuery(w, path, extra), body, size)
	if err != nil {
		return fi, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&fi); err != nil {
		return fi, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: bad answer from guest", c.id)
	}
	return fi, nil
}

// Archive opens a tar stream of a path. The caller closes it.
func (c *Client) Archive(ctx context.Context, w guestapi.Where, path string) (io.ReadCloser, error) {
	resp, err := c.raw(ctx, http.MethodGet, guestapi.PathArchive+fileQuery(w, path, nil), nil, 0)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Extract unpacks a tar stream into a directory.
func (c *Client) Extract(ctx context.Context, w guestapi.Where, path string, body io.Reader, size int64) (guestapi.ArchiveResult, error) {
	var res guestapi.ArchiveResult
	resp, err := c.raw(ctx, http.MethodPut, guestapi.PathArchive+fileQuery(w, path, nil), body, size)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&res); err != nil {
		return res, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: bad answer from guest", c.id)
	}
	return res, nil
}

// Apply applies a layer tar (body, size bytes or -1 if unknown) onto a
// directory of the sandbox, normally "/", with its whiteouts (see
// guestapi.FeatureApply). A guest that does not announce FeatureApply
// answers not_found.
func (c *Client) Apply(ctx context.Context, w guestapi.Where, path string, body io.Reader, size int64) (guestapi.ApplyResult, error) {
	var res guestapi.ApplyResult
	resp, err := c.raw(ctx, http.MethodPut, guestapi.PathApply+fileQuery(w, path, nil), body, size)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&res); err != nil {
		return res, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: bad answer from guest", c.id)
	}
	if res.Entries < 0 || res.Whiteouts < 0 || res.Bytes < 0 {
		return guestapi.ApplyResult{}, errdefs.New(errdefs.Unavailable, "sandbox %s: guest answered an apply with negative counts", c.id)
	}
	return res, nil
}

// WatchStream reads a watch's events.
type WatchStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Watch starts watching a directory; the stream is on once this returns.
func (c *Client) Watch(ctx context.Context, w guestapi.Where, path string, recursive bool) (*WatchStream, error) {
	extra := url.Values{}
	if recursive {
		extra.Set("recursive", "true")
	}
	resp, err := c.raw(ctx, http.MethodGet, guestapi.PathWatch+fileQuery(w, path, extra), nil, 0)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 16<<10), 64<<10)
	return &WatchStream{body: resp.Body, sc: sc}, nil
}

// Next returns the next event, io.EOF when the watch ended.
func (s *WatchStream) Next() (guestapi.WatchEvent, error) {
	var ev guestapi.WatchEvent
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil {
			return ev, errdefs.Wrap(errdefs.Unavailable, err, "watch stream from guest")
		}
		return ev, io.EOF
	}
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return ev, errdefs.Wrap(errdefs.Unavailable, err, "bad watch event from guest")
	}
	switch ev.Type {
	case guestapi.WatchCreate, guestapi.WatchWrite, guestapi.WatchRemove, guestapi.WatchRename, guestapi.WatchChmod, guestapi.WatchOverflow:
	default:
		return ev, errdefs.New(errdefs.Unavailable, "unknown watch event %q from guest", truncate(ev.Type, 32))
	}
	if len(ev.Path) > guestapi.MaxPathLen {
		return ev, errdefs.New(errdefs.Unavailable, "watch event from guest with an overlong path")
	}
	return ev, nil
}

// Close ends the watch.
func (s *WatchStream) Close() error { return s.body.Close() }
