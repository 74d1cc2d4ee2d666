package server

import (
	"context"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/labels"
)

// Snapshots is what the snapshot, fork, diff, apply and pause routes need
// of the manager.
type Snapshots interface {
	Snapshot(ctx context.Context, tenant, id string, req api.CreateSnapshotRequest) (api.Snapshot, error)
	GetSnapshot(ctx context.Context, tenant, ref string) (api.Snapshot, error)
	ListSnapshots(ctx context.Context, tenant string, sel labels.Selector) ([]api.Snapshot, error)
	DeleteSnapshot(ctx context.Context, tenant, ref string) error
	Fork(ctx context.Context, tenant, id string, req api.ForkRequest) (api.ForkResponse, error)
	// Diff compares a sandbox with its image or snapshot against: the
	// changes as JSON, or, for format tar or patch, written to what out
	// returns once they are known (so an error comes before any output).
	Diff(ctx context.Context, tenant, id, against, format string, out func() io.Writer) (api.DiffResponse, error)
	Apply(ctx context.Context, tenant, id string, req api.ApplyRequest) (api.ApplyResult, error)
	ApplyTar(ctx context.Context, tenant, id string, tarStream io.Reader, size int64) (api.ApplyResult, error)
	Pause(ctx context.Context, tenant, id string, memory bool) (api.Sandbox, error)
	Resume(ctx context.Context, tenant, id string) (api.Sandbox, error)
}

func (a *apiGroup) routeSnapshots(r *Router) {
	r.Handle("POST /v1/sandboxes/{id}/snapshots", a.createSnapshot)
	r.Handle("GET /v1/snapshots", a.listSnapshots)
	r.Handle("GET /v1/snapshots/{name}", a.getSnapshot)
	r.Handle("DELETE /v1/snapshots/{name}", a.deleteSnapshot)
	r.Handle("POST /v1/sandboxes/{id}/fork", a.fork)
	r.Handle("GET /v1/sandboxes/{id}/diff", a.diff)
	r.Handle("POST /v1/sandboxes/{id}/apply", a.apply)
	r.Handle("POST /v1/sandboxes/{id}/pause", a.pause)
	r.Handle("POST /v1/sandboxes/{id}/resume", a.resume)
}

func (a *apiGroup) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSnapshotRequest
	if err := decode(w, r, &req, smallBody); err != nil {
		return err
	}
	sn, err := a.m.Snapshot(r.Context(), Tenant(r), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, sn)
}

func (a *apiGroup) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	sel, err := selectorOf(r)
	if err != nil {
		return err
	}
	list, err := a.m.ListSnapshots(r.Context(), Tenant(r), sel)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ListSnapshotsResponse{Snapshots: list})
}

func (a *apiGroup) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := a.m.GetSnapshot(r.Context(), Tenant(r), r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sn)
}

func (a *apiGroup) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := a.m.DeleteSnapshot(r.Context(), Tenant(r), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *apiGroup) fork(w http.ResponseWriter, r *http.Request) error {
	var req api.ForkRequest
	if r.ContentLength != 0 { // a fork of one copy needs no body
		if err := decode(w, r, &req, smallBody); err != nil {
			return err
		}
	}
	res, err := a.m.Fork(r.Context(), Tenant(r), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, res)
}

func (a *apiGroup) diff(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	format := q.Get("format")
	started := false
	res, err := a.m.Diff(r.Context(), Tenant(r), r.PathValue("id"), q.Get("against"), format, func() io.Writer {
		started = true
		if format == api.DiffTar {
			w.Header().Set("Content-Type", "application/x-tar")
		} else {
			w.Header().Set("Content-Type", "text/x-diff; charset=utf-8")
		}
		return w
	})
	if started || err != nil {
		return err // an error after the first byte cuts the stream short
	}
	return writeJSON(w, http.StatusOK, res)
}

func (a *apiGroup) apply(w http.ResponseWriter, r *http.Request) error {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/x-tar" {
		body, size, err := requestBody(r)
		if err != nil {
			return err
		}
		res, err := a.m.ApplyTar(r.Context(), Tenant(r), r.PathValue("id"), body, size)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, res)
	}
	var req api.ApplyRequest
	if err := decode(w, r, &req, smallBody); err != nil {
		return err
	}
	res, err := a.m.Apply(r.Context(), Tenant(r), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (a *apiGroup) pause(w http.ResponseWriter, r *http.Request) error {
	var req api.PauseRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req, smallBody); err != nil {
			return err
		}
	}
	sb, err := a.m.Pause(r.Context(), Tenant(r), r.PathValue("id"), req.Memory)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (a *apiGroup) resume(w http.ResponseWriter, r *http.Request) error {
	sb, err := a.m.Resume(r.Context(), Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

// selectorOf reads a label selector from the query: label (repeated) and
// selector, joined.
func selectorOf(r *http.Request) (labels.Selector, error) {
	q := r.URL.Query()
	parts := q["label"]
	if sel := q.Get("selector"); sel != "" {
		parts = append(parts, sel)
	}
	return labels.ParseSelector(strings.Join(parts, ","))
}
