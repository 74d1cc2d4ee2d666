package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/berthsh/berth/api"
)

// CreateSnapshot captures a sandbox's files as snapshot req.Name; a
// running sandbox keeps running (frozen for an instant).
func (c *Client) CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	var sn api.Snapshot
	err := c.do(ctx, http.MethodPost, sbPath(id, "snapshots"), nil, req, &sn)
	return sn, err
}

// ListSnapshots lists the snapshots whose labels match selector ("" for all).
func (c *Client) ListSnapshots(ctx context.Context, selector string) ([]api.Snapshot, error) {
	var out api.ListSnapshotsResponse
	var q url.Values
	if selector != "" {
		q = url.Values{"selector": {selector}}
	}
	err := c.do(ctx, http.MethodGet, "/v1/snapshots", q, nil, &out)
	return out.Snapshots, err
}

// GetSnapshot returns a snapshot (by name or id) with the sandboxes made from it.
func (c *Client) GetSnapshot(ctx context.Context, name string) (api.Snapshot, error) {
	var sn api.Snapshot
	err := c.do(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(name), nil, nil, &sn)
	return sn, err
}

// DeleteSnapshot removes a snapshot that no sandbox is made from.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(name), nil, nil, nil)
}

// Fork makes req.Count running copies of a sandbox's files.
func (c *Client) Fork(ctx context.Context, id string, req api.ForkRequest) (api.ForkResponse, error) {
	var res api.ForkResponse
	err := c.do(ctx, http.MethodPost, sbPath(id, "fork"), nil, req, &res)
	return res, err
}

// Diff lists what a sandbox changed over its image, or over snapshot
// against when it is not "".
func (c *Client) Diff(ctx context.Context, id, against string) (api.DiffResponse, error) {
	var res api.DiffResponse
	err := c.do(ctx, http.MethodGet, sbPath(id, "diff"), diffQuery(against, api.DiffJSON), nil, &res)
	return res, err
}

// DiffStream returns the changes as format api.DiffTar (a layer tar with
// whiteouts) or api.DiffPatch (a unified text diff).
func (c *Client) DiffStream(ctx context.Context, id, against, format string) (io.ReadCloser, error) {
	return c.getStream(ctx, sbPath(id, "diff"), diffQuery(against, format), false)
}

func diffQuery(against, format string) url.Values {
	q := url.Values{"format": {format}}
	if against != "" {
		q.Set("against", against)
	}
	return q
}

// Apply writes another sandbox's (or a snapshot's) changes onto a sandbox.
// Paths both changed refuse the apply (errdefs.PathsOf lists them) unless
// req.Overwrite.
func (c *Client) Apply(ctx context.Context, id string, req api.ApplyRequest) (api.ApplyResult, error) {
	var res api.ApplyResult
	err := c.do(ctx, http.MethodPost, sbPath(id, "apply"), nil, req, &res)
	return res, err
}

// ApplyTar applies a layer tar (DiffStream's api.DiffTar) onto a running
// sandbox as it comes, whiteouts included.
func (c *Client) ApplyTar(ctx context.Context, id string, tarStream io.Reader) (api.ApplyResult, error) {
	var res api.ApplyResult
	resp, err := c.requestRaw(ctx, http.MethodPost, sbPath(id, "apply"), nil, tarStream, http.Header{"Content-Type": {"application/x-tar"}})
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return res, fmt.Errorf("decode apply: %w", err)
	}
	return res, nil
}

// Pause freezes a running sandbox's processes.
func (c *Client) Pause(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodPost, sbPath(id, "pause"), nil, nil, &sb)
	return sb, err
}

// PauseMemory saves a running sandbox's processes with their memory and
// frees its CPU and memory (a runtime with memory_checkpoint); Resume
// brings them back where they were.
func (c *Client) PauseMemory(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodPost, sbPath(id, "pause"), nil, api.PauseRequest{Memory: true}, &sb)
	return sb, err
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodPost, sbPath(id, "resume"), nil, nil, &sb)
	return sb, err
}
