// Package ports serves the servers that listen inside sandboxes through the
// daemon's one listener: a route group beside the API. A request reaches
// port P of sandbox ID at
//
//	/v1/sandboxes/ID/ports/P/PATH   (the path form), or
//	P-ID.DOMAIN/PATH                (the host form: apps that use absolute
//	                                 paths work unchanged)
//
// The manager authorizes it (the sandbox's access token, unless the port is
// public; the sandbox must run) and the proxy relays it over a connection
// the guest makes inside the sandbox, so ports work in every network mode.
// Anything HTTP/1.1 carries goes through as it comes: any method, bodies of
// any size both ways, streamed answers (SSE, chunked) flushed as they
// arrive, keep-alive, and upgrades (WebSocket) relayed byte for byte.
// GET /v1/sandboxes/ID/tunnel/P upgrades to one raw TCP connection instead
// (berth port-forward).
package ports

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/server"
)

// Manager is what the proxy needs of the sandbox manager.
type Manager interface {
	// AuthorizePort checks a request's token for a port (unless public)
	// and that the sandbox runs; done ends the request's activity.
	AuthorizePort(ctx context.Context, tenant, id string, port int, token string, keyed bool) (done func(), err error)
	// DialPort connects to a port inside a sandbox a request was
	// authorized for.
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// Config tunes the proxy.
type Config struct {
	// Domain is the host form's domain (default api.DefaultDomain).
	Domain string
	// TokenHeaders are more headers that carry the access token, beside
	// berth's own (a compatibility API's: E2B's traffic token).
	TokenHeaders []string
	Log          *slog.Logger
}

// Proxy is the route group.
type Proxy struct {
	m      Manager
	domain string // ".berth.localhost": with the leading dot, lower case
	// headers carry the access token: berth's, then cfg.TokenHeaders.
	headers []string
	log     *slog.Logger
	tr      *http.Transport
	rp      *httputil.ReverseProxy

	// open are the connections to sandboxes' ports, pooled or carrying a
	// request, an upgraded stream or a tunnel; Close ends them all.
	mu     sync.Mutex
	open   map[*trackedConn]struct{}
	closed bool
}

// New returns the proxy; Close ends its idle connections.
func New(cfg Config, m Manager) *Proxy {
	if cfg.Domain == "" {
		cfg.Domain = api.DefaultDomain
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{m: m, domain: "." + strings.Trim(strings.ToLower(cfg.Domain), "."), log: cfg.Log, open: map[*trackedConn]struct{}{},
		headers: append([]string{api.HeaderAccessToken}, cfg.TokenHeaders...)}
	p.tr = &http.Transport{
		// The transport's address is "ID:PORT" (see rewrite): pooled
		// connections are per sandbox and port.
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			id, port, err := splitTarget(addr)
			if err != nil {
				return nil, err
			}
			return p.dial(ctx, id, port)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		// The default 4 KiB buffers, which an idle WebSocket holds: an
		// answer's body bypasses the read buffer (the copy buffer is
		// larger), a request's goes to trackedConn.ReadFrom.
		// A server's answer head is bounded; its body is streamed.
		MaxResponseHeaderBytes: 1 << 20,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.tr,
		FlushInterval:  -1,
		BufferPool:     bufferPool{},
		ErrorHandler:   p.fail,
		ModifyResponse: p.guardAnswer,
		ErrorLog:       slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug),
	}
	return p
}

// Close ends every connection the proxy holds to sandboxes' ports: idle
// ones, and those of requests, WebSockets and tunnels still open (their
// relays end with them).
func (p *Proxy) Close() {
	p.tr.CloseIdleConnections()
	p.mu.Lock()
	p.closed = true
	open := p.open
	p.open = map[*trackedConn]struct{}{}
	p.mu.Unlock()
	for c := range open {
		c.Conn.Close()
	}
}

// dial connects to a port and tracks the connection until it closes.
func (p *Proxy) dial(ctx context.Context, id string, port int) (net.Conn, error) {
	c, err := p.m.DialPort(ctx, id, port)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, p: p}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, errdefs.New(errdefs.Unavailable, "the daemon is shutting down")
	}
	p.open[tc] = struct{}{}
	return tc, nil
}

// trackedConn is a connection to a port that the proxy can end.
type trackedConn struct {
	net.Conn
	p    *Proxy
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.p.mu.Lock()
		delete(c.p.open, c)
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// ReadFrom copies a request body to the port in writes of a pooled 256 KiB
// buffer (the transport's bufio.Writer hands a body to it once its own
// buffer is empty).
func (c *trackedConn) ReadFrom(r io.Reader) (int64, error) {
	buf := buffers.Get().(*[]byte)
	defer buffers.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{c.Conn}, r, *buf)
}

// CloseWrite half-closes the connection.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// Name implements server.Group.
func (p *Proxy) Name() string { return "ports" }

// Routes implements server.Group.
func (p *Proxy) Routes(r *server.Router) {
	r.Host(p.ownsHost, p.serveHost)
	// A port takes its sandbox's access token, or a key that stands for it.
	own := r.OwnAccess()
	own.Handle("/v1/sandboxes/{id}/ports/{port}/", p.servePath)
	own.Handle("GET /v1/sandboxes/{id}/tunnel/{port}", p.tunnel)
	r.Browsers(func(r *http.Request) bool {
		rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/")
		if !ok {
			return false
		}
		_, rest, _ = strings.Cut(rest, "/")
		return strings.HasPrefix(rest, "ports/") && strings.Count(rest, "/") >= 2
	})
}

// target is the port a request is for.
type target struct {
	id   string
	port int
	// prefix is the path form's prefix, "/v1/sandboxes/ID/ports/P" ("" for
	// the host form); the server inside sees the path without it.
	prefix string
}

// ownsHost says whether host is P-ID.DOMAIN.
func (p *Proxy) ownsHost(host string) bool {
	_, ok := p.hostTarget(host)
	return ok
}

func (p *Proxy) hostTarget(host string) (target, bool) {
	port, id, ok := api.SplitPortHost(host, p.domain)
	return target{id: id, port: port}, ok
}

func (p *Proxy) serveHost(w http.ResponseWriter, r *http.Request) error {
	t, _ := p.hostTarget(r.Host)
	return p.serve(w, r, t)
}

func (p *Proxy) servePath(w http.ResponseWriter, r *http.Request) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		return errdefs.New(errdefs.InvalidArgument, "port: %q is not a number", r.PathValue("port"))
	}
	id := r.PathValue("id")
	return p.serve(w, r, target{id: id, port: port, prefix: "/v1/sandboxes/" + id + "/ports/" + strconv.Itoa(port)})
}

type targetKey struct{}

// serve authorizes r for t and relays it.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, t target) error {
	token, fromQuery := p.accessToken(r)
	done, err := p.m.AuthorizePort(r.Context(), server.Tenant(r), t.id, t.port, token, server.Keyed(r))
	if err != nil {
		return err
	}
	defer done()
	if fromQuery {
		// A browser opened a link with the token: later requests (its
		// scripts, styles, fetches) carry the cookie instead.
		path := "/"
		if t.prefix != "" {
			path = t.prefix + "/"
		}
		http.SetCookie(w, &http.Cookie{Name: api.CookieAccessToken, Value: token, Path: path,
			HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
	}
	// Full duplex: the server may answer before its request has all
	// arrived, and the request's body goes on flowing. Without it Go's
	// HTTP/1 server drains and closes the body once the answer's head is
	// written, and the transport, reading that body still, closes the
	// connection to the port mid-answer (golang/go#40747). HTTP/2 is full
	// duplex already and says so with an error, which changes nothing.
	http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
	return nil
}

// accessToken finds a request's token: a token header, the query
// parameter (fromQuery) or the cookie.
func (p *Proxy) accessToken(r *http.Request) (token string, fromQuery bool) {
	for _, h := range p.headers {
		if t := r.Header.Get(h); t != "" {
			return t, false
		}
	}
	if t := r.URL.Query().Get(api.QueryAccessToken); t != "" {
		return t, true
	}
	if c, err := r.Cookie(api.CookieAccessToken); err == nil {
		return c.Value, false
	}
	return "", false
}

// rewrite turns the daemon's request into the server's: the target as the
// transport's address, the path form's prefix gone, the token gone from
// the header, the query and the cookies, the original Host kept and the
// X-Forwarded headers set.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(target)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = t.id + ":" + strconv.Itoa(t.port)
	if t.prefix != "" {
		out.URL.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(pr.In.URL.Path, t.prefix), "/")
		if raw := pr.In.URL.RawPath; raw != "" {
			out.URL.RawPath = "/" + strings.TrimPrefix(strings.TrimPrefix(raw, t.prefix), "/")
		}
		out.Header.Set("X-Forwarded-Prefix", t.prefix)
	}
	if q := out.URL.Query(); q.Has(api.QueryAccessToken) {
		q.Del(api.QueryAccessToken)
		out.URL.RawQuery = q.Encode()
	}
	for _, h := range p.headers {
		out.Header.Del(h)
	}
	if cookies := out.Cookies(); len(cookies) > 0 {
		out.Header.Del("Cookie")
		for _, c := range cookies {
			if c.Name != api.CookieAccessToken {
				out.AddCookie(c)
			}
		}
	}
	pr.SetXForwarded()
	out.Host = pr.In.Host
}

// pathFormCSP sandboxes a page served in the path form: on the daemon's
// own origin, its scripts would otherwise be same-origin with the API (and
// with every other sandbox's ports) and could drive it with the user's
// browser. A sandboxed page has an opaque origin: its requests carry
// "Origin: null", which the API refuses. Apps that need an origin of
// their own (cookies, storage, service workers) use the host form.
const pathFormCSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads allow-pointer-lock allow-presentation"

// guardAnswer keeps a server's answer from reaching beyond its port: it may
// not set the daemon's token cookie, nor a cookie for a wider domain (the
// host form: every sandbox shares the parent domain) or for a path outside
// its prefix (the path form: every sandbox shares the daemon's origin); a
// path-form page is sandboxed by pathFormCSP, and its redirects to an
// absolute path of the server stay under the prefix.
func (p *Proxy) guardAnswer(resp *http.Response) error {
	t, _ := resp.Request.Context().Value(targetKey{}).(target)
	if t.prefix != "" {
		resp.Header.Add("Content-Security-Policy", pathFormCSP)
		// A redirect to the server's own absolute path stays under the prefix.
		if loc := resp.Header.Get("Location"); strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") &&
			loc != t.prefix && !strings.HasPrefix(loc, t.prefix+"/") {
			resp.Header.Set("Location", t.prefix+loc)
		}
	}
	set := resp.Header.Values("Set-Cookie")
	if len(set) == 0 {
		return nil
	}
	resp.Header.Del("Set-Cookie")
	for _, line := range set {
		c, err := http.ParseSetCookie(line)
		if err != nil || c.Name == api.CookieAccessToken {
			continue
		}
		c.Domain = ""
		if t.prefix != "" && c.Path != t.prefix && !strings.HasPrefix(c.Path, t.prefix+"/") {
			c.Path = t.prefix + "/" + strings.TrimPrefix(c.Path, "/")
		}
		if v := c.String(); v != "" {
			resp.Header.Add("Set-Cookie", v)
		}
	}
	return nil
}

// fail answers a request the proxy could not relay: nothing listening is
// 502 with the reason, a sandbox that stopped meanwhile is the manager's
// error, anything else a 502 saying what broke.
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(targetKey{}).(target)
	switch cls := errdefs.ClassOf(err); {
	case errors.Is(err, context.Canceled):
		// The caller went away: nobody reads an answer.
	case errdefs.ReasonOf(err) == errdefs.PortClosed:
		server.Error(w, r, http.StatusBadGateway, err)
	case cls == errdefs.Conflict || cls == errdefs.NotFound:
		server.Error(w, r, 0, err)
	default:
		p.log.Debug("port relay failed", "sandbox", t.id, "port", t.port, "err", err)
		server.Error(w, r, http.StatusBadGateway, errdefs.New(errdefs.Unavailable,
			"port %d of sandbox %s: the server's answer broke off or never came: %v", t.port, t.id, err))
	}
}

// tunnel upgrades a request to one raw TCP connection to the port.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		return errdefs.New(errdefs.InvalidArgument, "port: %q is not a number", r.PathValue("port"))
	}
	id := r.PathValue("id")
	if !strings.EqualFold(r.Header.Get("Upgrade"), api.TunnelProtocol) {
		return errdefs.New(errdefs.InvalidArgument, "a tunnel needs Connection: Upgrade and Upgrade: %s", api.TunnelProtocol)
	}
	token, _ := p.accessToken(r)
	done, err := p.m.AuthorizePort(r.Context(), server.Tenant(r), id, port, token, server.Keyed(r))
	if err != nil {
		return err
	}
	defer done()
	up, err := p.dial(r.Context(), id, port)
	if err != nil {
		if errdefs.ReasonOf(err) == errdefs.PortClosed {
			server.Error(w, r, http.StatusBadGateway, err)
			return nil
		}
		return err
	}
	defer up.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+api.TunnelProtocol+"\r\n\r\n"); err != nil {
		return nil
	}
	var down io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		ahead, _ := brw.Reader.Peek(n)
		down = io.MultiReader(strings.NewReader(string(ahead)), conn)
	}
	relay(conn, down, up)
	return nil
}

// relay copies both ways until both directions end, half-closing each
// side's write as the other's read ends.
func relay(down net.Conn, downR io.Reader, up net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 256<<10)
		io.CopyBuffer(struct{ io.Writer }{up}, downR, buf)
		closeWrite(up)
	})
	buf := make([]byte, 256<<10)
	io.CopyBuffer(struct{ io.Writer }{down}, struct{ io.Reader }{up}, buf)
	closeWrite(down)
	wg.Wait()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		return
	}
	c.Close()
}

// splitTarget reads the transport's "ID:PORT".
func splitTarget(addr string) (string, int, error) {
	id, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("proxy target %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return "", 0, fmt.Errorf("proxy target %q: %w", addr, err)
	}
	return id, port, nil
}

// bufferPool lends the proxy's copy buffers: 256 KiB, so that a large body
// moves in few system calls.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
