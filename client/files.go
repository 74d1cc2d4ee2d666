package client

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// FileOptions qualify a transfer. The zero value acts as the sandbox's
// default user, from its working directory.
type FileOptions struct {
	User string
	Cwd  string
	// Mode of an uploaded file (nil: keep an existing file's, else 0644).
	Mode *uint32
	// CreateOnly makes an upload fail with already_exists if the file exists.
	CreateOnly bool
	// Gzip compresses the transfer on the wire (the bytes are the same).
	Gzip bool
}

func (o FileOptions) query(path string) url.Values {
	q := url.Values{"path": {path}}
	if o.User != "" {
		q.Set("user", o.User)
	}
	if o.Cwd != "" {
		q.Set("cwd", o.Cwd)
	}
	if o.Mode != nil {
		q.Set("mode", strconv.FormatUint(uint64(*o.Mode), 8))
	}
	if o.CreateOnly {
		q.Set("create_only", "true")
	}
	return q
}

// Download opens a file of a sandbox for reading; the caller closes it.
func (c *Client) Download(ctx context.Context, id, path string, opts FileOptions) (io.ReadCloser, error) {
	return c.getStream(ctx, sbPath(id, "files"), opts.query(path), opts.Gzip)
}

// ReadFile returns a whole file of a sandbox.
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	rc, err := c.Download(ctx, id, path, FileOptions{})
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "download %s from %s", path, id)
	}
	return b, nil
}

// Upload writes r to a file of a sandbox, making missing parents.
func (c *Client) Upload(ctx context.Context, id, path string, r io.Reader, opts FileOptions) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.putStream(ctx, sbPath(id, "files"), opts.query(path), r, opts.Gzip, &fi)
	return fi, err
}

// DownloadArchive opens a tar stream of a file or tree of a sandbox (the
// tree under its own name, as docker cp does); the caller closes it.
func (c *Client) DownloadArchive(ctx context.Context, id, path string, opts FileOptions) (io.ReadCloser, error) {
	return c.getStream(ctx, sbPath(id, "archive"), opts.query(path), opts.Gzip)
}

// UploadArchive unpacks a tar stream into a directory of a sandbox (made if
// missing). A malformed or truncated stream changes nothing.
func (c *Client) UploadArchive(ctx context.Context, id, dir string, tarStream io.Reader, opts FileOptions) (api.ArchiveResult, error) {
	var res api.ArchiveResult
	err := c.putStream(ctx, sbPath(id, "archive"), opts.query(dir), tarStream, opts.Gzip, &res)
	return res, err
}

func (c *Client) getStream(ctx context.Context, path string, q url.Values, gz bool) (io.ReadCloser, error) {
	var hdr http.Header
	if gz {
		hdr = http.Header{"Accept-Encoding": {"gzip"}}
	}
	resp, err := c.requestRaw(ctx, http.MethodGet, path, q, nil, hdr)
	if err != nil {
		return nil, err
	}
	if resp.Header.Get("Content-Encoding") != "gzip" {
		return resp.Body, nil
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		resp.Body.Close()
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "gzip answer from the daemon")
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, resp.Body}, nil
}

func (c *Client) putStream(ctx context.Context, path string, q url.Values, r io.Reader, gz bool, out any) error {
	hdr := http.Header{"Content-Type": {"application/octet-stream"}}
	body := r
	if gz {
		hdr.Set("Content-Encoding", "gzip")
		pr, pw := io.Pipe()
		go func() {
			zw, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
			_, err := io.Copy(zw, r)
			if err == nil {
				err = zw.Close()
			}
			pw.CloseWithError(err)
		}()
		defer pr.Close() // ends the goroutine if the request stops reading
		body = pr
	}
	resp, err := c.requestRaw(ctx, http.MethodPut, path, q, body, hdr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode PUT %s: %w", path, err)
	}
	return nil
}

// fs runs a file operation.
func (c *Client) fs(ctx context.Context, id, op string, in, out any) error {
	return c.do(ctx, http.MethodPost, sbPath(id, "fs", op), nil, in, out)
}

// Stat describes a path.
func (c *Client) Stat(ctx context.Context, id string, req api.StatRequest) (api.FileInfo, error) {
	var out api.FileInfo
	return out, c.fs(ctx, id, api.OpStat, req, &out)
}

// Exists says whether a path exists.
func (c *Client) Exists(ctx context.Context, id string, req api.StatRequest) (api.ExistsResult, error) {
	var out api.ExistsResult
	return out, c.fs(ctx, id, api.OpExists, req, &out)
}

// List lists a directory.
func (c *Client) List(ctx context.Context, id string, req api.ListRequest) (api.ListResult, error) {
	var out api.ListResult
	return out, c.fs(ctx, id, api.OpList, req, &out)
}

// Mkdir makes a directory.
func (c *Client) Mkdir(ctx context.Context, id string, req api.MkdirRequest) (api.FileInfo, error) {
	var out api.FileInfo
	return out, c.fs(ctx, id, api.OpMkdir, req, &out)
}

// Move renames a path.
func (c *Client) Move(ctx context.Context, id string, req api.MoveRequest) (api.FileInfo, error) {
	var out api.FileInfo
	return out, c.fs(ctx, id, api.OpMove, req, &out)
}

// Remove removes a path.
func (c *Client) Remove(ctx context.Context, id string, req api.RemoveRequest) error {
	return c.fs(ctx, id, api.OpRemove, req, nil)
}

// Chmod sets permission bits.
func (c *Client) Chmod(ctx context.Context, id string, req api.ChmodRequest) (api.FileInfo, error) {
	var out api.FileInfo
	return out, c.fs(ctx, id, api.OpChmod, req, &out)
}

// Chown sets the owner.
func (c *Client) Chown(ctx context.Context, id string, req api.ChownRequest) (api.FileInfo, error) {
	var out api.FileInfo
	return out, c.fs(ctx, id, api.OpChown, req, &out)
}

// Read reads a page of a text file's lines.
func (c *Client) Read(ctx context.Context, id string, req api.ReadRequest) (api.ReadResult, error) {
	var out api.ReadResult
	return out, c.fs(ctx, id, api.OpRead, req, &out)
}

// Write writes a text file.
func (c *Client) Write(ctx context.Context, id string, req api.WriteRequest) (api.FileInfo, error) {
	var out api.FileInfo
	return out, c.fs(ctx, id, api.OpWrite, req, &out)
}

// Edit replaces a string in a file.
func (c *Client) Edit(ctx context.Context, id string, req api.EditRequest) (api.EditResult, error) {
	var out api.EditResult
	return out, c.fs(ctx, id, api.OpEdit, req, &out)
}

// Glob finds paths by pattern.
func (c *Client) Glob(ctx context.Context, id string, req api.GlobRequest) (api.GlobResult, error) {
	var out api.GlobResult
	return out, c.fs(ctx, id, api.OpGlob, req, &out)
}

// Grep searches text files.
func (c *Client) Grep(ctx context.Context, id string, req api.GrepRequest) (api.GrepResult, error) {
	var out api.GrepResult
	return out, c.fs(ctx, id, api.OpGrep, req, &out)
}

// UploadFiles writes many files; each has its own result.
func (c *Client) UploadFiles(ctx context.Context, id string, req api.UploadRequest) (api.UploadResult, error) {
	var out api.UploadResult
	return out, c.fs(ctx, id, api.OpUpload, req, &out)
}

// DownloadFiles reads many files; each has its own result.
func (c *Client) DownloadFiles(ctx context.Context, id string, req api.DownloadRequest) (api.DownloadResult, error) {
	var out api.DownloadResult
	return out, c.fs(ctx, id, api.OpDownload, req, &out)
}

// Watcher reads a watch's events.
type Watcher struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Watch watches a directory (recursive: and below); changes after it
// returns are reported.
func (c *Client) Watch(ctx context.Context, id, path string, recursive bool, opts FileOptions) (*Watcher, error) {
	q := opts.query(path)
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.requestRaw(ctx, http.MethodGet, sbPath(id, "fs", "watch"), q, nil, nil)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 16<<10), 1<<20)
	return &Watcher{body: resp.Body, sc: sc}, nil
}

// Next returns the next event; io.EOF once the watch ended.
func (w *Watcher) Next() (api.WatchEvent, error) {
	var ev api.WatchEvent
	if !w.sc.Scan() {
		if err := w.sc.Err(); err != nil {
			return ev, errdefs.Wrap(errdefs.Unavailable, err, "watch stream")
		}
		return ev, io.EOF
	}
	if err := json.Unmarshal(w.sc.Bytes(), &ev); err != nil {
		return ev, errdefs.Wrap(errdefs.Unavailable, err, "bad watch event")
	}
	return ev, nil
}

// Close ends the watch.
func (w *Watcher) Close() error { return w.body.Close() }
