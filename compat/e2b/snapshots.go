package e2b

// E2B's snapshots and forks on berth's. What E2B has and berth names
// otherwise:
//
//   - an E2B snapshot is a berth snapshot, and its snapshotID is the
//     template that makes sandboxes of it: "snapshot:NAME". An unnamed
//     one gets a generated name (e2b- and random hex). berth keeps files,
//     not memory: a sandbox made from a snapshot starts afresh on those
//     files, without the source's processes;
//   - berth's snapshots have no tags and no team namespace: a name is
//     taken once (a second snapshot of that name is a conflict, where
//     E2B adds a build to the template), and a list's name filter
//     ignores a ":tag";
//   - a fork is berth's fork: count new running sandboxes on a copy of
//     the source's files, made all or none; each gets the source's
//     template, E2B's kill at the end and the request's timeout.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/server"
)

// Bounds and defaults of E2B's snapshots and forks.
const (
	// maxForkCount is the most copies one fork asks for (berth's own
	// limit may be lower: its error says so).
	maxForkCount = 100
	// defaultForkTimeout is the forks' timeout when the request gives
	// none.
	defaultForkTimeout = 15
	// generatedSnapshotPrefix begins the berth name of a snapshot E2B's
	// request did not name.
	generatedSnapshotPrefix = "e2b-"
)

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// forkResult is E2B's SandboxForkResult: one of the two is set.
type forkResult struct {
	Sandbox *sandboxRef `json:"sandbox,omitempty"`
	Error   *apiError   `json:"error,omitempty"`
}

// routeSnapshots registers the snapshot and fork routes.
func (g *Group) routeSnapshots(handle func(string, func(http.ResponseWriter, *http.Request) error)) {
	handle("POST /sandboxes/{id}/snapshots", g.createSnapshot)
	handle("GET /snapshots", g.listSnapshots)
	handle("POST /sandboxes/{id}/fork", g.forkSandbox)
}

// snapshotOf is the E2B snapshot of berth snapshot sn.
func snapshotOf(sn api.Snapshot) snapshotInfo {
	id := api.SnapshotPrefix + sn.Name
	return snapshotInfo{SnapshotID: id, Names: []string{id}}
}

// createSnapshot is POST /sandboxes/{id}/snapshots: a berth snapshot of
// the sandbox's files, named as asked or with a generated name.
func (g *Group) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name string `json:"name"`
		// Memory asks for the processes to be kept too (E2B's default):
		// berth's snapshots keep files only, so only an explicit true is
		// refused.
		Memory *bool `json:"memory"`
	}
	if err := decodeControl(r, &body, true); err != nil {
		return err
	}
	if body.Memory != nil && *body.Memory {
		return errdefs.New(errdefs.NotImplemented, "memory: berth's snapshots keep a sandbox's files, not its memory or processes; leave memory out (or mode \"filesystem\")")
	}
	ctx, tenant, id := r.Context(), server.Tenant(r), r.PathValue("id")
	if body.Name != "" {
		sn, err := g.m.Snapshot(ctx, tenant, id, api.CreateSnapshotRequest{Name: body.Name})
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusCreated, snapshotOf(sn))
	}
	// A generated name that is taken already (unlikely) is drawn again.
	for range 3 {
		name, err := generatedSnapshotName()
		if err != nil {
			return err
		}
		sn, err := g.m.Snapshot(ctx, tenant, id, api.CreateSnapshotRequest{Name: name})
		if errdefs.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusCreated, snapshotOf(sn))
	}
	return errdefs.New(errdefs.Internal, "snapshot of %s: no free generated name", id)
}

// generatedSnapshotName is a berth snapshot name for an unnamed E2B
// snapshot.
func generatedSnapshotName() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return generatedSnapshotPrefix + hex.EncodeToString(b), nil
}

// snapshotFilterName is the berth snapshot name an E2B name filter asks
// for: without "snapshot:" and without a ":tag" (berth has no tags).
func snapshotFilterName(s string) string {
	s = strings.TrimPrefix(s, api.SnapshotPrefix)
	name, _, _ := strings.Cut(s, ":")
	return name
}

// listSnapshots is GET /snapshots: the tenant's named snapshots, newest
// first, filtered by source sandbox and name, limit at a time (the next
// page's token in X-Next-Token).
func (g *Group) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit := maxListLimit
	if v := q.Get("limit"); v != "" {
		var err error
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxListLimit {
			return errdefs.New(errdefs.InvalidArgument, "limit: %q is outside 1..%d", v, maxListLimit)
		}
	}
	all, err := g.m.ListSnapshots(r.Context(), server.Tenant(r), labels.Selector{})
	if err != nil {
		return err
	}
	sandbox, name := q.Get("sandboxID"), snapshotFilterName(q.Get("name"))
	sns := all[:0]
	for _, sn := range all {
		if (sandbox == "" || sn.Sandbox == sandbox) && (name == "" || sn.Name == name) {
			sns = append(sns, sn)
		}
	}
	// Newest first, as GET /v2/sandboxes: the page token is a position in
	// this order.
	slices.SortFunc(sns, func(a, b api.Snapshot) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	if tok := q.Get("nextToken"); tok != "" {
		after, id, err := parsePageToken(tok)
		if err != nil {
			return err
		}
		i := 0
		for i < len(sns) {
			c := sns[i].CreatedAt.Compare(after)
			if c == 0 {
				c = strings.Compare(sns[i].ID, id)
			}
			if c < 0 {
				break
			}
			i++
		}
		sns = sns[i:]
	}
	if len(sns) > limit {
		last := sns[limit-1]
		w.Header().Set("X-Next-Token", pageToken(last.CreatedAt, last.ID))
		sns = sns[:limit]
	}
	out := make([]snapshotInfo, 0, len(sns))
	for _, sn := range sns {
		out = append(out, snapshotOf(sn))
	}
	return writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot is DELETE /templates/snapshot:NAME: berth's snapshot
// delete (one a sandbox is made from stays, 409).
func (g *Group) deleteSnapshot(w http.ResponseWriter, r *http.Request, ref string) error {
	if err := g.m.DeleteSnapshot(r.Context(), server.Tenant(r), ref); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkSandbox is POST /sandboxes/{id}/fork: berth's fork of the sandbox
// (running, paused or stopped), then each copy's E2B settings: the
// source's template, killed at its timeout. A copy whose settings cannot
// be set is deleted and reported as that fork's error.
func (g *Group) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeControl(r, &body, true); err != nil {
		return err
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > maxForkCount {
		return errdefs.New(errdefs.InvalidArgument, "count: %d is outside 1..%d", count, maxForkCount)
	}
	timeout := int64(defaultForkTimeout)
	if body.Timeout != nil {
		timeout = *body.Timeout
	}
	if err := checkTimeout("timeout", timeout, maxTimeoutSeconds); err != nil {
		return err
	}
	ctx, tenant, id := r.Context(), server.Tenant(r), r.PathValue("id")
	src, err := g.m.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	tmpl, _ := templateOf(src)
	lbl := map[string]string{labelTemplate: tmpl, labelOnTimeout: onTimeoutKill}
	req := api.ForkRequest{Count: count, Labels: make([]map[string]string, count)}
	for i := range req.Labels {
		req.Labels[i] = lbl
	}
	res, err := g.m.Fork(ctx, tenant, id, req)
	if err != nil {
		return err
	}
	// berth's fork gives the copies the source's timeouts: the request's
	// replace them, as create sets them.
	life, idle, del := max(timeout, 1), int64(0), int64(1)
	timeouts := api.Timeouts{MaxLifetimeSeconds: &life, IdleSeconds: &idle, DeleteAfterSeconds: &del}
	out := make([]forkResult, 0, len(res.Sandboxes))
	for _, made := range res.Sandboxes {
		sb, err := g.m.Update(ctx, tenant, made.ID, api.UpdateSandboxRequest{Timeouts: &timeouts})
		if err != nil {
			if derr := g.m.Delete(context.WithoutCancel(ctx), tenant, made.ID); derr != nil && !errdefs.IsNotFound(derr) {
				g.log.Error("fork: delete a copy whose timeout could not be set", "sandbox", made.ID, "err", derr)
			}
			server.NoteError(r, err)
			status := errdefs.HTTPStatus(errdefs.ClassOf(err))
			out = append(out, forkResult{Error: &apiError{Code: status, Message: errdefs.Message(err)}})
			continue
		}
		ref := g.sandboxRef(sb)
		out = append(out, forkResult{Sandbox: &ref})
	}
	return writeJSON(w, http.StatusCreated, out)
}
