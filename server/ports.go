package server

import (
	"context"
	"net/http"

	"github.com/berthsh/berth/api"
)

// Ports is the manager's view of what listens inside a sandbox and of its
// access token; the proxy itself is a group of its own (package ports).
type Ports interface {
	ListPorts(ctx context.Context, tenant, id string) ([]api.Port, error)
	RotateAccessToken(ctx context.Context, tenant, id string) (string, error)
}

func (a *apiGroup) routePorts(r *Router) {
	r.Handle("GET /v1/sandboxes/{id}/ports", a.listPorts)
	r.Handle("POST /v1/sandboxes/{id}/access-token", a.rotateAccessToken)
}

func (a *apiGroup) listPorts(w http.ResponseWriter, r *http.Request) error {
	ports, err := a.m.ListPorts(r.Context(), Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ListPortsResponse{Ports: ports})
}

func (a *apiGroup) rotateAccessToken(w http.ResponseWriter, r *http.Request) error {
	token, err := a.m.RotateAccessToken(r.Context(), Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.AccessTokenResponse{AccessToken: token})
}
