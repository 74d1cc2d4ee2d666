package server

import (
	"context"
	"net/http"

	"github.com/berthsh/berth/api"
)

// Tenancy is what the quota and usage routes need (sandbox.Manager
// implements it).
type Tenancy interface {
	SetQuota(ctx context.Context, tenant string, q api.Quota) (api.TenantUsage, error)
	Usage(ctx context.Context, tenant string, all bool) ([]api.TenantUsage, error)
}

type tenantsGroup struct{ t Tenancy }

// TenantsAPI is the group of PUT /v1/tenants/{tenant}/quota (admin keys)
// and GET /v1/usage.
func TenantsAPI(t Tenancy) Group { return &tenantsGroup{t: t} }

// Name implements Group.
func (g *tenantsGroup) Name() string { return "tenants" }

// Routes implements Group.
func (g *tenantsGroup) Routes(r *Router) {
	r.Admin().Handle("PUT /v1/tenants/{tenant}/quota", g.setQuota)
	r.Handle("GET /v1/usage", g.usage)
}

func (g *tenantsGroup) setQuota(w http.ResponseWriter, r *http.Request) error {
	var q api.Quota
	if err := decode(w, r, &q, 1<<12); err != nil {
		return err
	}
	u, err := g.t.SetQuota(r.Context(), r.PathValue("tenant"), q)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, u)
}

// usage answers the caller's tenant's usage; the operator's is every
// tenant's, or one's with ?tenant=.
func (g *tenantsGroup) usage(w http.ResponseWriter, r *http.Request) error {
	tenant, all := readScope(r)
	list, err := g.t.Usage(r.Context(), tenant, all)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.UsageResponse{Tenants: list})
}
