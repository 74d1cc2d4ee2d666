package e2b

import "net/http"

// routeEnvdREST registers envd's REST routes on its mux.
func (g *Group) routeEnvdREST(mux *http.ServeMux) {}
