package e2b

import "github.com/berthsh/berth/server"

// routeControl registers E2B's control API.
func (g *Group) routeControl(r *server.Router) {}
