package server

import (
	"context"
	"net/http"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// Keyring is what the keys routes need (auth.Keyring implements it).
type Keyring interface {
	Create(ctx context.Context, req api.CreateAPIKeyRequest) (api.APIKey, error)
	List() []api.APIKey
	Get(id string) (api.APIKey, error)
	Revoke(ctx context.Context, id string) (api.APIKey, error)
}

// AuditLog is what GET /v1/audit reads (audit.Log implements it).
type AuditLog interface {
	// List returns the records of tenant (every tenant's when all), of
	// one sandbox when sandbox is set, after seq after, at most limit.
	List(ctx context.Context, tenant string, all bool, sandbox string, after int64, limit int) ([]api.AuditRecord, error)
}

// keysGroup is the operator's API keys and the audit log.
type keysGroup struct {
	keys  Keyring
	audit AuditLog
}

// KeysAPI is the group of /v1/keys (admin keys only) and /v1/audit.
func KeysAPI(keys Keyring, audit AuditLog) Group { return &keysGroup{keys: keys, audit: audit} }

// Name implements Group.
func (g *keysGroup) Name() string { return "keys" }

// Routes implements Group.
func (g *keysGroup) Routes(r *Router) {
	ad := r.Admin()
	ad.Handle("POST /v1/keys", g.create)
	ad.Handle("GET /v1/keys", g.list)
	ad.Handle("GET /v1/keys/{key}", g.get)
	ad.Handle("DELETE /v1/keys/{key}", g.revoke)
	r.Handle("GET /v1/audit", g.listAudit)
}

func (g *keysGroup) create(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateAPIKeyRequest
	if err := decode(w, r, &req, 1<<16); err != nil {
		return err
	}
	k, err := g.keys.Create(r.Context(), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, k)
}

func (g *keysGroup) list(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.ListAPIKeysResponse{Keys: g.keys.List()})
}

func (g *keysGroup) get(w http.ResponseWriter, r *http.Request) error {
	k, err := g.keys.Get(r.PathValue("key"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, k)
}

func (g *keysGroup) revoke(w http.ResponseWriter, r *http.Request) error {
	k, err := g.keys.Revoke(r.Context(), r.PathValue("key"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, k)
}

// listAudit answers the caller's tenant's records; the operator's, every
// tenant's, or one tenant's with ?tenant=.
func (g *keysGroup) listAudit(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tenant, all := readScope(r)
	after, err := int64Query(r, "after")
	if err != nil {
		return err
	}
	limit, err := int64Query(r, "limit")
	if err != nil {
		return err
	}
	if limit < 0 || limit > 10000 {
		return errdefs.New(errdefs.InvalidArgument, "limit: %d is not in 0..10000", limit)
	}
	recs, err := g.audit.List(r.Context(), tenant, all, q.Get("sandbox"), after, int(limit))
	if err != nil {
		return err
	}
	if recs == nil {
		recs = []api.AuditRecord{}
	}
	return writeJSON(w, http.StatusOK, api.ListAuditResponse{Records: recs})
}
