package server

import (
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/berthsh/berth/errdefs"
)

// guardBrowsers refuses, before any route runs, the requests a web page in
// a browser on the host could make the browser send:
//
//   - a Host header the daemon does not serve: a page of evil.example whose
//     name now resolves to 127.0.0.1 (DNS rebinding) sends Host: evil.example
//     and could otherwise read the answers;
//   - a cross-origin request: an Origin header other than the daemon's own
//     origin, or a Sec-Fetch-Site other than same-origin or none (a form or
//     a fetch from another site, or from another port of localhost).
//
// A Host is served when it is an IP address (a rebinding needs a name),
// localhost or a name under .localhost, or one of hosts. Requests over the
// unix socket (root's, by its mode) are not checked, nor are those a host
// route claims (claimed: a sandbox's port at {port}-{id}.{domain}, which
// checks its own access); those for browsers (a port on a path route)
// have their Host checked and not their origin.
func guardBrowsers(hosts []string, claimed func(host string) bool, browsers func(*http.Request) bool, next http.Handler) http.Handler {
	allowed := map[string]bool{}
	for _, h := range hosts {
		allowed[normalHost(h)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, unix := r.Context().Value(http.LocalAddrContextKey).(*net.UnixAddr); unix {
			next.ServeHTTP(w, r)
			return
		}
		if claimed(r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		if err := checkBrowser(r, allowed, browsers(r)); err != nil {
			info(r).err = err
			writeError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func checkBrowser(r *http.Request, allowed map[string]bool, anyOrigin bool) error {
	host := normalHost(r.Host)
	if !servedHost(host, allowed) {
		return errdefs.New(errdefs.PermissionDenied,
			"Host %q is not a name this daemon serves: use an IP address or localhost, or start the daemon with --allowed-host", r.Host)
	}
	if anyOrigin {
		return nil
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || origin == "null" || !strings.EqualFold(u.Host, r.Host) || (u.Scheme != "http" && u.Scheme != "https") {
			return errdefs.New(errdefs.PermissionDenied, "cross-origin request from %q refused: the API takes no requests from web pages of other origins", origin)
		}
	}
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
	default:
		return errdefs.New(errdefs.PermissionDenied, "a %s request from a browser refused: the API takes no requests from web pages of other origins", site)
	}
	return nil
}

// normalHost is a Host header's name without the port, in lower case,
// without a final dot.
func normalHost(h string) string {
	if name, _, err := net.SplitHostPort(h); err == nil {
		h = name
	}
	return strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
}

func servedHost(host string, allowed map[string]bool) bool {
	if host == "" {
		return false
	}
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	return allowed[host]
}
