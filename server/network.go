package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/store"
)

// Network is the manager's secrets and egress log.
type Network interface {
	CreateSecret(ctx context.Context, tenant string, req api.CreateSecretRequest) (api.Secret, error)
	UpdateSecret(ctx context.Context, tenant, name string, req api.UpdateSecretRequest) (api.Secret, error)
	GetSecret(ctx context.Context, tenant, name string) (api.Secret, error)
	ListSecrets(ctx context.Context, tenant string) ([]api.Secret, error)
	DeleteSecret(ctx context.Context, tenant, name string) error
	Egress(ctx context.Context, tenant, id string, q store.EgressQuery) ([]api.EgressRecord, error)
	FollowEgress(ctx context.Context, tenant, id string, q store.EgressQuery, ready func(), send func(api.EgressRecord) error) error
}

func (a *apiGroup) routeNetwork(r *Router) {
	r.Handle("POST /v1/secrets", a.createSecret)
	r.Handle("GET /v1/secrets", a.listSecrets)
	r.Handle("GET /v1/secrets/{name}", a.getSecret)
	r.Handle("PUT /v1/secrets/{name}", a.updateSecret)
	r.Handle("DELETE /v1/secrets/{name}", a.deleteSecret)
	r.Handle("GET /v1/sandboxes/{id}/egress", a.egress)
}

func (a *apiGroup) createSecret(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSecretRequest
	if err := decode(w, r, &req, smallBody); err != nil {
		return err
	}
	s, err := a.m.CreateSecret(r.Context(), Tenant(r), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, s)
}

func (a *apiGroup) updateSecret(w http.ResponseWriter, r *http.Request) error {
	var req api.UpdateSecretRequest
	if err := decode(w, r, &req, smallBody); err != nil {
		return err
	}
	s, err := a.m.UpdateSecret(r.Context(), Tenant(r), r.PathValue("name"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, s)
}

func (a *apiGroup) getSecret(w http.ResponseWriter, r *http.Request) error {
	s, err := a.m.GetSecret(r.Context(), Tenant(r), r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, s)
}

func (a *apiGroup) listSecrets(w http.ResponseWriter, r *http.Request) error {
	list, err := a.m.ListSecrets(r.Context(), Tenant(r))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ListSecretsResponse{Secrets: list})
}

func (a *apiGroup) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	if err := a.m.DeleteSecret(r.Context(), Tenant(r), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// egress lists a sandbox's egress records (after=SEQ, limit=N, denied=true),
// or with follow=true streams them as NDJSON: the stored ones, then new
// ones as they happen.
func (a *apiGroup) egress(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var eq store.EgressQuery
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errdefs.New(errdefs.InvalidArgument, "after: %q is not a record's seq", v)
		}
		eq.After = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return errdefs.New(errdefs.InvalidArgument, "limit: %q is not 1..1000", v)
		}
		eq.Limit = n
	}
	denied, err := boolQuery(r, "denied")
	if err != nil {
		return err
	}
	eq.DeniedOnly = denied
	follow, err := boolQuery(r, "follow")
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if !follow {
		recs, err := a.m.Egress(r.Context(), Tenant(r), id, eq)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, api.ListEgressResponse{Records: recs})
	}
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	started := false
	ready := func() {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		started = true
		rc.Flush()
	}
	err = a.m.FollowEgress(r.Context(), Tenant(r), id, eq, ready, func(rec api.EgressRecord) error {
		if err := enc.Encode(rec); err != nil {
			return err
		}
		return rc.Flush()
	})
	if !started {
		return err
	}
	return nil // the stream ended: the client went away, or the sandbox was deleted
}
