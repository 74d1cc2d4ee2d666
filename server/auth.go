package server

import (
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/errdefs"
)

// access is what a route asks of a request's principal.
type access int

const (
	// byMethod: a key; read scope for GET and HEAD that are not WebSocket
	// upgrades, write scope otherwise.
	byMethod access = iota
	// reads: a key of read scope, whatever the method (POST /fs/list).
	reads
	// admin: an admin key.
	admin
	// public: anyone (/healthz, the dashboard's files).
	public
	// ownAccess: anyone, since the route checks the sandbox's own access
	// token (a port, envd); a key, when sent, must be valid and of write
	// scope, and then stands for the token.
	ownAccess
)

// Principal is whom the request acts for, as the edge decided.
func Principal(r *http.Request) auth.Principal { return info(r).principal }

// Keyed says whether the request was authenticated by something that
// stands for a sandbox's access token: an API key or the unix socket.
func Keyed(r *http.Request) bool {
	k := info(r).principal.Kind
	return k == auth.Key || k == auth.Root
}

// readScope is whose records a listing (the audit log, usage) shows: the
// caller's tenant's; the operator's are every tenant's (all), or the one
// tenant ?tenant= names. A tenant's ?tenant= is ignored.
func readScope(r *http.Request) (tenant string, all bool) {
	tenant, all = Tenant(r), Tenant(r) == ""
	if t := r.URL.Query().Get("tenant"); t != "" && all {
		tenant, all = t, false
	}
	return tenant, all
}

// NoteSandbox names the sandbox a request made (a create), for the audit
// log; routes with an {id} are named by it.
func NoteSandbox(r *http.Request, id string) { info(r).sandbox = id }

// Auditor receives one record per mutating API call, after its answer.
type Auditor interface {
	Audit(api.AuditRecord)
}

// RefusalAuditor is an Auditor that keeps the calls refused for want of a
// valid key (no key, a bad one) apart: anyone who can reach the daemon
// can make those, and they must not push the tenants' calls out of a
// bounded table (audit.Log writes them to its log only).
type RefusalAuditor interface {
	Auditor
	AuditRefused(api.AuditRecord)
}

// principalOf is the principal before any route runs: the unix socket's
// root, an unauthenticated daemon's operator, else anonymous until the
// route's guard reads a key.
func (s *Server) principalOf(r *http.Request) auth.Principal {
	if _, unix := r.Context().Value(http.LocalAddrContextKey).(*net.UnixAddr); unix {
		return auth.Operator(auth.Root)
	}
	if s.authn == nil {
		return auth.Operator(auth.Open)
	}
	return auth.Principal{Kind: auth.Anonymous}
}

// guard checks a route's access before h runs, and audits the call after.
func (s *Server) guard(need access, route Route, errw func(http.ResponseWriter, *http.Request, error), h http.Handler) http.Handler {
	if errw == nil {
		errw = func(w http.ResponseWriter, _ *http.Request, err error) { writeError(w, err) }
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := info(r)
		if err := s.authorize(need, r, req); err != nil {
			req.err = err
			errw(w, r, err)
			s.audit(need, route, r, req)
			return
		}
		h.ServeHTTP(w, r)
		s.audit(need, route, r, req)
	})
}

// authorize decides the request's principal from its key, when the
// daemon has keys, and checks it against need.
func (s *Server) authorize(need access, r *http.Request, req *request) error {
	if req.principal.Kind == auth.Anonymous {
		key, ok := takeKey(r, need == ownAccess)
		if ok {
			p, err := s.authn(key)
			if err != nil {
				return err
			}
			req.principal = p
		}
	}
	p := req.principal
	if p.Kind == auth.Anonymous {
		if need == public || need == ownAccess {
			return nil
		}
		return errdefs.New(errdefs.Unauthenticated, "no API key: send Authorization: Bearer <key> (berth key create makes one; the daemon's first admin key is in its state dir, admin.key)")
	}
	scope := api.ScopeWrite
	switch need {
	case public:
		return nil
	case byMethod:
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && !upgrade(r) {
			scope = api.ScopeRead
		}
	case reads:
		scope = api.ScopeRead
	case admin:
		scope = api.ScopeAdmin
	}
	if !p.Allows(scope) {
		return errdefs.New(errdefs.PermissionDenied, "API key %s has scope %s: %s %s needs %s", p.KeyID, p.Scope, r.Method, r.URL.Path, scope)
	}
	return nil
}

// takeKey finds a request's API key: Authorization: Bearer, E2B's
// X-Api-Key, or, on a WebSocket handshake (browsers cannot set headers
// there), an offered subprotocol berth.key.<key>; the first of those
// places that has one gives it. It removes what it took, and every other
// key the request carries in any of those places (a client that sends its
// key twice, as a second value of a header, or with odd spacing), so that
// no key ever travels on (to a sandbox's port above all). For a route
// that checks its own access (lenient), only values that look like berth
// keys are taken: an Authorization or X-Api-Key meant for the server in
// the sandbox passes through untouched.
func takeKey(r *http.Request, lenient bool) (string, bool) {
	var key string
	found := false
	take := func(k string) {
		if !found {
			key, found = k, true
		}
	}
	ours := func(k string) bool { return !lenient || strings.HasPrefix(k, auth.Prefix) }
	h := r.Header
	var keep []string
	for _, v := range h.Values("Authorization") {
		scheme, k, _ := strings.Cut(strings.TrimSpace(v), " ")
		if k = strings.TrimSpace(k); strings.EqualFold(scheme, "Bearer") && ours(k) {
			take(k)
			continue
		}
		keep = append(keep, v)
	}
	setValues(h, "Authorization", keep)
	keep = nil
	for _, v := range h.Values(api.HeaderAPIKey) {
		if k := strings.TrimSpace(v); k != "" && ours(k) {
			take(k)
			continue
		}
		keep = append(keep, v)
	}
	setValues(h, api.HeaderAPIKey, keep)
	keep = nil
	offered := h.Values("Sec-WebSocket-Protocol")
	for _, v := range offered {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			if k, ok := strings.CutPrefix(p, api.WebSocketKeyPrefix); ok {
				if upgrade(r) && k != "" {
					take(k)
				}
				continue
			}
			if p != "" {
				keep = append(keep, p)
			}
		}
	}
	if len(offered) > 0 {
		h.Del("Sec-WebSocket-Protocol")
		if len(keep) > 0 {
			h.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
		}
	}
	return key, found
}

// setValues makes vals the values of header name (none: the header goes).
func setValues(h http.Header, name string, vals []string) {
	if len(vals) == 0 {
		h.Del(name)
		return
	}
	h[http.CanonicalHeaderKey(name)] = vals
}

// upgrade says whether r asks to switch protocols (a WebSocket, a tunnel).
func upgrade(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" && headerHas(r.Header, "Connection", "upgrade")
}

// audit records a mutating call of the API (not the traffic of a
// sandbox's ports or of envd, which its access token authorizes).
func (s *Server) audit(need access, route Route, r *http.Request, req *request) {
	if s.auditor == nil || need == public || need == ownAccess || route.Pattern == "/" {
		return
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions {
		return
	}
	rec := api.AuditRecord{At: time.Now().UTC(), Tenant: req.principal.Tenant, KeyID: req.principal.KeyID,
		Method: r.Method, Route: route.Pattern, Path: auth.Redact(r.URL.Path), SandboxID: req.sandbox, RequestID: req.id}
	if rec.SandboxID == "" {
		rec.SandboxID = auth.Redact(r.PathValue("id"))
	}
	if req.sw != nil {
		rec.Status = req.sw.status
	}
	if req.err != nil {
		c := errdefs.ClassOf(req.err)
		rec.Error = string(c)
		if rec.Status == 0 {
			rec.Status = errdefs.HTTPStatus(c)
		}
	}
	if ra, ok := s.auditor.(RefusalAuditor); ok && req.principal.Kind == auth.Anonymous {
		ra.AuditRefused(rec)
		return
	}
	s.auditor.Audit(rec)
}
