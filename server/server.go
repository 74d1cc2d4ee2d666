// Package server is berth's HTTP edge: the one handler behind the daemon's
// listeners, assembled from route groups (the /v1 API today; a compatibility
// API and the port proxy beside it) inside middleware that gives every
// request an id, an access-log line, recovery from a panic and an
// authenticated tenant. Handlers return errors; the edge maps their class to
// a status code and a JSON body in one place.
package server

import (
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/errdefs"
)

// Version is the daemon's version string.
const Version = "0.1.0"

// IdleTimeout is how long a connection to one of berth's HTTP listeners
// (the daemon's, `berth mcp --http`) may wait between requests before it is
// closed. Without one, net/http keeps an idle keep-alive connection forever:
// any process that can reach the listener could hold connections open one
// unauthenticated request at a time.
const IdleTimeout = 2 * time.Minute

// Config tunes the edge.
type Config struct {
	// Log gets one line per request.
	Log *slog.Logger
	// Hosts are host names, beyond IP addresses and localhost, that clients
	// may use to reach the daemon over TCP (a reverse proxy's name); any
	// other Host header is refused, which stops DNS rebinding.
	Hosts []string
	// Authenticate returns whom an API key acts for, or an unauthenticated
	// error. Nil: the daemon has no keys (--insecure-no-auth), and every
	// request acts for the operator. Requests over the unix socket act for
	// the operator either way.
	Authenticate func(key string) (auth.Principal, error)
	// Auditor receives every mutating API call (nil: none are kept).
	Auditor Auditor
}

// A Group is a set of routes served on the one listener: the /v1 API, a
// compatibility API, the port proxy. Groups are siblings; none knows the
// others.
type Group interface {
	// Name names the group in the route list and the access log.
	Name() string
	// Routes registers the group's routes.
	Routes(r *Router)
}

// Route is one registered operation.
type Route struct {
	Group   string
	Method  string // "" for any method
	Pattern string // Go 1.22 pattern path, e.g. /v1/sandboxes/{id}
	// Access is who may call it: "" (a key whose scope the method
	// decides), "read", "admin", "public" or "own" (its own access token).
	Access string
}

// Handler serves one route: it writes a success response or returns an
// error, which the edge writes (unless the response has begun) and logs.
type Handler func(w http.ResponseWriter, r *http.Request) error

// Server is the edge.
type Server struct {
	log   *slog.Logger
	mux   *http.ServeMux
	hosts []hostRoute
	// browsers are requests a group serves to web pages of other origins
	// (a sandbox's port): the group checks their access itself.
	browsers []func(*http.Request) bool
	routes   []Route
	handler  http.Handler
	authn    func(key string) (auth.Principal, error)
	auditor  Auditor
}

// hostRoute claims requests by their Host header, before path routing.
type hostRoute struct {
	match func(host string) bool
	h     http.Handler
}

// New assembles the edge from groups.
func New(cfg Config, groups ...Group) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{log: cfg.Log, mux: http.NewServeMux(), authn: cfg.Authenticate, auditor: cfg.Auditor}
	for _, g := range groups {
		g.Routes(&Router{s: s, group: g.Name()})
	}
	s.mux.Handle("/", s.guard(byMethod, Route{Pattern: "/"}, nil, s.adapt(s.noRoute)))
	s.handler = requestIDs(s.principalOf, accessLog(s.log, recoverPanics(s.log,
		guardBrowsers(cfg.Hosts, s.claimedHost, s.forBrowsers, http.HandlerFunc(s.dispatch)))))
	return s
}

// noRoute answers a request no route took: 405 with the methods the path
// has (Allow), else 404.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) error {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		return errdefs.New(errdefs.MethodNotAllowed, "%s %s: the route takes %s", r.Method, r.URL.Path, strings.Join(allow, ", "))
	}
	return errdefs.New(errdefs.NotFound, "no route %s %s", r.Method, r.URL.Path)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Routes lists the operations the groups registered.
func (s *Server) Routes() []Route { return append([]Route(nil), s.routes...) }

// claimedHost says whether a host route claims host.
func (s *Server) claimedHost(host string) bool {
	for _, hr := range s.hosts {
		if hr.match(host) {
			return true
		}
	}
	return false
}

// forBrowsers says whether a group serves r to web pages of other origins.
func (s *Server) forBrowsers(r *http.Request) bool {
	for _, f := range s.browsers {
		if f(r) {
			return true
		}
	}
	return false
}

// dispatch hands a request to the first host route that claims it, else to
// the path routes.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	for _, hr := range s.hosts {
		if hr.match(r.Host) {
			hr.h.ServeHTTP(w, r)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// adapt turns a Handler into an http.Handler: the error is written once,
// as berth's error body, and noted for the access log.
func (s *Server) adapt(h Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		req := info(r)
		req.err = err
		if req.sw != nil && req.sw.status != 0 {
			// Headers are gone (a stream was under way): the stream carried the error.
			return
		}
		writeError(w, err)
	})
}

// Router registers one group's routes.
type Router struct {
	s      *Server
	group  string
	access access
	// errw writes the edge's refusals of the routes (a missing key) in
	// the group's own shape; nil: berth's.
	errw func(http.ResponseWriter, *http.Request, error)
}

// Errors returns a router whose routes' refusals by the edge (a missing,
// bad or short key) are written by fn, in the shape the group's clients
// know (E2B's SDKs read E2B's error body).
func (r *Router) Errors(fn func(http.ResponseWriter, *http.Request, error)) *Router {
	c := *r
	c.errw = fn
	return &c
}

// Admin returns a router whose routes need an admin key (the operator's:
// keys, images, pools, metrics).
func (r *Router) Admin() *Router { return r.with(admin) }

// Reads returns a router whose routes a read key may call whatever their
// method (a POST that only reads: fs/list, fs/read).
func (r *Router) Reads() *Router { return r.with(reads) }

// Public returns a router whose routes need no key (/healthz, static
// files).
func (r *Router) Public() *Router { return r.with(public) }

// OwnAccess returns a router whose routes check a sandbox's access token
// themselves: they take requests without a key, and a key, when sent,
// stands for the token (Keyed).
func (r *Router) OwnAccess() *Router { return r.with(ownAccess) }

func (r *Router) with(a access) *Router {
	c := *r
	c.access = a
	return &c
}

// accessNames name the access kinds in Route.Access.
var accessNames = map[access]string{byMethod: "", reads: "read", admin: "admin", public: "public", ownAccess: "own"}

// Handle serves pattern ("METHOD /path", a Go 1.22 pattern) with h.
func (r *Router) Handle(pattern string, h Handler) {
	r.HandleHTTP(pattern, r.s.adapt(h))
}

// HandleHTTP serves pattern with a plain http.Handler (a proxy, a
// WebSocket), still inside the edge's middleware.
func (r *Router) HandleHTTP(pattern string, h http.Handler) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok { // any method
		method, path = "", pattern
	}
	route := Route{Group: r.group, Method: method, Pattern: path, Access: accessNames[r.access]}
	r.s.routes = append(r.s.routes, route)
	r.s.mux.Handle(pattern, r.s.guard(r.access, route, r.errw, h))
}

// Browsers declares requests that match serves to web pages of any
// origin (a sandbox's port, on a path route): the edge still checks their
// Host, not their Origin, and the group checks their access itself.
func (r *Router) Browsers(match func(*http.Request) bool) {
	r.s.browsers = append(r.s.browsers, match)
}

// Host claims every request whose Host header match accepts, whatever its
// path: the form {port}-{id}.{domain} of the port proxy. Host routes are
// tried in the order they were registered, before any path route. Their
// requests are the group's to check: the edge's guard against browsers
// does not apply (match is what decides that the Host is served).
// They check their own access (a sandbox's token), as OwnAccess routes do.
func (r *Router) Host(match func(host string) bool, h Handler) {
	route := Route{Group: r.group, Pattern: "{host}", Access: accessNames[ownAccess]}
	r.s.hosts = append(r.s.hosts, hostRoute{match: match, h: r.s.guard(ownAccess, route, r.errw, r.s.adapt(h))})
}
