package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Ports: the daemon reaches a server inside a sandbox through the guest,
// which dials it inside the sandbox's own network namespace, so a port
// works in every network mode, none included. The port proxy (package
// ports) asks the manager to authorize each request (the sandbox's access
// token, unless the port is public) and then dials through DialPort.

// newAccessToken returns 32 random characters of base64url (192 bits).
func newAccessToken() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random access token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// checkPort refuses a port outside 1–65535, naming field.
func checkPort(field string, port int) error {
	if port < 1 || port > 65535 {
		return errdefs.New(errdefs.InvalidArgument, "%s: %d is not a TCP port (1–65535)", field, port)
	}
	return nil
}

// normalizePorts checks a list of public ports and returns it sorted,
// without repeats (nil for none).
func normalizePorts(field string, ports []int) ([]int, error) {
	if len(ports) > api.MaxPublicPorts {
		return nil, errdefs.New(errdefs.InvalidArgument, "%s: %d ports, over %d", field, len(ports), api.MaxPublicPorts)
	}
	for i, p := range ports {
		if err := checkPort(fmt.Sprintf("%s[%d]", field, i), p); err != nil {
			return nil, err
		}
	}
	out := slices.Compact(slices.Sorted(slices.Values(ports)))
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// accessToken returns sandbox id's token, from the live sandbox's cache or
// the store (every sandbox has one: made at create, given at daemon start
// to one older than ports). An empty one would match no request.
func (m *Manager) accessToken(ctx context.Context, id string, ls *liveSandbox) (string, error) {
	if ls != nil {
		if t := ls.token.Load(); t != nil {
			return *t, nil
		}
	}
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return "", err
	}
	token := rec.AccessToken
	if ls != nil && token != "" {
		ls.token.Store(&token)
	}
	return token, nil
}

// AuthorizePort checks a request for port of sandbox id: the token (a
// wrong or missing one is unauthenticated) unless the port or the whole
// sandbox is public or the caller is keyed (its API key, or the unix
// socket, already stands for the token for tenant's sandboxes), and then that the sandbox runs (conflict, saying
// what to do, otherwise). The token is checked first, so that a caller
// without it learns nothing of the sandbox's state. done ends the
// request's activity: while it is open the sandbox is active for its idle
// timeout.
func (m *Manager) AuthorizePort(ctx context.Context, tenant, id string, port int, token string, keyed bool) (done func(), err error) {
	if err := checkPort("port", port); err != nil {
		return nil, err
	}
	st, err := m.store.GetStatus(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := visible(tenant, st); err != nil {
		return nil, err
	}
	m.mu.Lock()
	ls := m.live[id]
	var public, autoResume bool
	if ls != nil {
		public = ls.spec.Public || slices.Contains(ls.spec.PublicPorts, port)
	}
	m.mu.Unlock()
	if ls == nil {
		// Not running: the public ports and auto-resume are in the spec.
		rec, err := m.store.GetSandbox(ctx, id)
		if err != nil {
			return nil, err
		}
		spec, err := recordSpec(rec)
		if err != nil {
			return nil, err
		}
		public = spec.Public || slices.Contains(spec.PublicPorts, port)
		autoResume = spec.Timeouts.AutoResume
	}
	if !public && !keyed {
		want, err := m.accessToken(ctx, id, ls)
		if err != nil {
			return nil, err
		}
		if token == "" {
			return nil, errdefs.New(errdefs.Unauthenticated, "port %d of sandbox %s is private: send its access token (%s header, %s query parameter or cookie)",
				port, id, api.HeaderAccessToken, api.QueryAccessToken)
		}
		if subtle.ConstantTimeCompare([]byte(token), []byte(want)) != 1 {
			return nil, errdefs.New(errdefs.Unauthenticated, "port %d of sandbox %s: the access token is not this sandbox's", port, id)
		}
	}
	// Auto-resume wakes a sandbox its idle timeout stopped, not one a
	// caller stopped on purpose.
	if ls == nil && autoResume && st.State == api.StateStopped && strings.HasPrefix(st.Error, idleStop) {
		if ls, err = m.resume(ctx, tenant, id, port); err != nil {
			return nil, err
		}
		st.State = api.StateRunning
	}
	if ls == nil || st.State != api.StateRunning {
		return nil, notRunning(st)
	}
	ls.lastActive.Store(m.cfg.Now().UnixNano())
	return m.streaming(ls), nil
}

// resumeWait bounds how long a request that resumed a sandbox waits for
// its port to listen (the start_cmd's server coming up).
const resumeWait = 30 * time.Second

// resume starts a stopped sandbox for a request to port (auto-resume) and
// waits until something listens there, or resumeWait passes (the request
// then gets what the port answers: port_closed). Requests that arrive
// together start it once: the operation lock makes the later ones find it
// running.
func (m *Manager) resume(ctx context.Context, tenant, id string, port int) (*liveSandbox, error) {
	unlock := m.ops.lock(id)
	st, err := m.store.GetStatus(ctx, id)
	if err == nil && st.State == api.StateStopped {
		m.log.Info("auto-resume", "sandbox", id, "port", port)
		err = m.startLocked(ctx, tenant, id)
	}
	unlock()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	ls := m.live[id]
	m.mu.Unlock()
	if ls == nil {
		st, err := m.store.GetStatus(ctx, id)
		if err != nil {
			return nil, err
		}
		return nil, notRunning(st)
	}
	deadline := time.Now().Add(resumeWait)
	for delay := 10 * time.Millisecond; time.Now().Before(deadline); delay = min(2*delay, 250*time.Millisecond) {
		ports, err := ls.guest.Ports(ctx)
		if err != nil {
			return nil, m.gone(id, err)
		}
		if slices.ContainsFunc(ports, func(p guestapi.ListeningPort) bool { return p.Port == port }) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
	return ls, nil
}

// DialPort connects to port inside sandbox id, which a request was
// authorized for: nothing listening there is unavailable with reason
// port_closed. The connection counts as activity while bytes flow.
func (m *Manager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if err := checkPort("port", port); err != nil {
		return nil, err
	}
	m.mu.Lock()
	ls := m.live[id]
	m.mu.Unlock()
	if ls == nil {
		st, err := m.store.GetStatus(ctx, id)
		if err != nil {
			return nil, err
		}
		return nil, notRunning(st)
	}
	c, err := ls.guest.DialPort(ctx, port)
	if errdefs.ReasonOf(err) == errdefs.PortClosed {
		// The daemon's own words: the guest's are not to be believed.
		return nil, errdefs.WithReason(errdefs.New(errdefs.Unavailable, "nothing listens on port %d in sandbox %s", port, id), errdefs.PortClosed)
	}
	if err != nil {
		return nil, m.gone(id, err)
	}
	return &activeConn{Conn: c, touch: func() { ls.lastActive.Store(m.cfg.Now().UnixNano()) }}, nil
}

// activeConn records activity at most once a second while it moves bytes.
type activeConn struct {
	net.Conn
	touch func()
	mu    sync.Mutex
	last  time.Time
}

func (c *activeConn) active() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.last) >= time.Second {
		c.last = now
		c.touch()
	}
}

func (c *activeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.active()
	}
	return n, err
}

func (c *activeConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.active()
	}
	return n, err
}

// CloseWrite half-closes the stream to the port.
func (c *activeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errdefs.New(errdefs.Internal, "the port's stream cannot half-close")
}

// ListPorts lists the TCP ports processes inside sandbox id listen on.
func (m *Manager) ListPorts(ctx context.Context, tenant, id string) ([]api.Port, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	got, err := ls.guest.Ports(ctx)
	if err != nil {
		return nil, m.gone(id, err)
	}
	m.mu.Lock()
	public, all := ls.spec.PublicPorts, ls.spec.Public
	m.mu.Unlock()
	out := make([]api.Port, 0, len(got))
	for _, p := range got {
		out = append(out, api.Port{Port: p.Port, Address: p.Address, Proto: p.Proto, Public: all || slices.Contains(public, p.Port)})
	}
	return out, nil
}

// RotateAccessToken gives sandbox id a new access token; the old one opens
// nothing from now on.
func (m *Manager) RotateAccessToken(ctx context.Context, tenant, id string) (string, error) {
	unlock := m.ops.lock(id)
	defer unlock()
	if _, err := m.record(ctx, tenant, id); err != nil {
		return "", err
	}
	token, err := newAccessToken()
	if err != nil {
		return "", err
	}
	if err := m.store.SetAccessToken(ctx, id, token); err != nil {
		return "", err
	}
	m.mu.Lock()
	ls := m.live[id]
	m.mu.Unlock()
	if ls != nil {
		ls.token.Store(&token)
	}
	return token, nil
}
