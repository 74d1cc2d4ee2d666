package ports

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/server"
)

func TestHostTarget(t *testing.T) {
	p := New(Config{Domain: "Ports.Example.COM."}, nil)
	for host, want := range map[string]string{
		"8000-sb-abc.ports.example.com":       "sb-abc:8000",
		"8000-SB-ABC.PORTS.EXAMPLE.COM:7680":  "sb-abc:8000",
		"443-x.ports.example.com.":            "x:443",
		"70000-x.ports.example.com":           "x:70000", // a port the manager refuses by name
		"8000-sb.a.ports.example.com":         "",
		"sb-abc.ports.example.com":            "",
		"8000.ports.example.com":              "",
		"8000-.ports.example.com":             "",
		"abc-sb.ports.example.com":            "",
		"8000-sb.ports.example.com.evil.test": "",
		"ports.example.com":                   "",
		"8000-sbports.example.com":            "",
	} {
		tg, ok := p.hostTarget(host)
		got := ""
		if ok {
			got = tg.id + ":" + strconv.Itoa(tg.port)
		}
		if got != want {
			t.Errorf("%s: %q, want %q", host, got, want)
		}
	}
}

// loopbackManager authorizes token "t" for sandbox "sb" and dials a real
// server on loopback for it.
type loopbackManager struct{ addr string }

func (m loopbackManager) AuthorizePort(_ context.Context, _, id string, port int, token string, _ bool) (func(), error) {
	if id != "sb" {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s not found", id)
	}
	if token != "t" {
		return nil, errdefs.New(errdefs.Unauthenticated, "port %d of sandbox %s is private", port, id)
	}
	return func() {}, nil
}

func (m loopbackManager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port != 8000 {
		return nil, errdefs.WithReason(errdefs.New(errdefs.Unavailable, "nothing listens on port %d in sandbox %s", port, id), errdefs.PortClosed)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", m.addr)
}

// TestRewrite: what the server inside sees of a request through the path
// form, with the token in the query and a cookie of its own.
func TestRewrite(t *testing.T) {
	var seen *http.Request
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r
		io.WriteString(w, "ok")
	}))
	defer app.Close()
	p := New(Config{Log: slog.New(slog.DiscardHandler)}, loopbackManager{addr: app.Listener.Addr().String()})
	defer p.Close()
	srv := httptest.NewServer(server.New(server.Config{Log: slog.New(slog.DiscardHandler)}, p))
	defer srv.Close()

	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/sb/ports/8000/a/b?x=1&"+api.QueryAccessToken+"=t", nil)
	req.Header.Set("Cookie", "a=1; "+api.CookieAccessToken+"=stale")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("%s %q", resp.Status, b)
	}
	if seen.URL.Path != "/a/b" || seen.URL.RawQuery != "x=1" || seen.Header.Get("Cookie") != "a=1" ||
		seen.Header.Get("X-Forwarded-Prefix") != "/v1/sandboxes/sb/ports/8000" || seen.Host != strings.TrimPrefix(srv.URL, "http://") {
		t.Fatalf("the server saw %s %q cookie %q prefix %q host %q", seen.URL.Path, seen.URL.RawQuery,
			seen.Header.Get("Cookie"), seen.Header.Get("X-Forwarded-Prefix"), seen.Host)
	}

	for _, c := range []struct {
		path  string
		token string
		code  int
	}{
		{"/v1/sandboxes/sb/ports/8000/", "", 401},
		{"/v1/sandboxes/nosuch/ports/8000/", "t", 404},
		{"/v1/sandboxes/sb/ports/9/", "t", 502},
		{"/v1/sandboxes/sb/ports/x/", "t", 400},
	} {
		req, _ := http.NewRequest("GET", srv.URL+c.path, nil)
		req.Header.Set(api.HeaderAccessToken, c.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("%s: %s, want %d", c.path, resp.Status, c.code)
		}
	}
}

// TestAnswerGuard: a server cannot set the daemon's cookie or one for
// other ports, and a page in the path form is sandboxed; in the host form
// the server's cookies stay host-only and no CSP is added.
func TestAnswerGuard(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", api.CookieAccessToken+"=planted; Path=/")
		w.Header().Add("Set-Cookie", "session=1; Path=/; Domain=localhost; HttpOnly")
		w.Header().Add("Set-Cookie", "pref=2; Path=/app")
		http.Redirect(w, r, "/login", http.StatusFound)
	}))
	defer app.Close()
	p := New(Config{Log: slog.New(slog.DiscardHandler)}, loopbackManager{addr: app.Listener.Addr().String()})
	defer p.Close()
	srv := httptest.NewServer(server.New(server.Config{Log: slog.New(slog.DiscardHandler)}, p))
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	get := func(host, path string) *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Host = host
		req.Header.Set(api.HeaderAccessToken, "t")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	prefix := "/v1/sandboxes/sb/ports/8000"
	resp := get(strings.TrimPrefix(srv.URL, "http://"), prefix+"/x")
	if got := resp.Header.Values("Set-Cookie"); strings.Join(got, "|") != "session=1; Path="+prefix+"/; HttpOnly|pref=2; Path="+prefix+"/app" {
		t.Errorf("path form cookies: %q", got)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "sandbox ") || strings.Contains(csp, "allow-same-origin") {
		t.Errorf("path form CSP: %q", csp)
	}
	if loc := resp.Header.Get("Location"); loc != prefix+"/login" {
		t.Errorf("path form redirect: %q", loc)
	}

	resp = get("8000-sb."+api.DefaultDomain, "/x")
	if got := resp.Header.Values("Set-Cookie"); strings.Join(got, "|") != "session=1; Path=/; HttpOnly|pref=2; Path=/app" {
		t.Errorf("host form cookies: %q", got)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); csp != "" || resp.Header.Get("Location") != "/login" {
		t.Errorf("host form: CSP %q, redirect %q", csp, resp.Header.Get("Location"))
	}
}

// TestAnswerWhileTheRequestArrives: a server may answer before its request
// has all arrived, and the proxy carries both directions at once. Without
// full duplex, Go's HTTP/1 server drains and closes a request's body as soon
// as the answer's head is written; the transport, still reading that body,
// then fails its write and closes the connection to the port, cutting the
// answer it was relaying (the race golang/go#40747 describes, which lost a
// whole answer body in CI). Here the client sends a line only after the
// previous one came back, so a proxy that waits for the request's end, or
// closes its body early, fails the exchange.
func TestAnswerWhileTheRequestArrives(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Error(err)
			return
		}
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				rc.Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	defer app.Close()
	p := New(Config{Log: slog.New(slog.DiscardHandler)}, loopbackManager{addr: app.Listener.Addr().String()})
	defer p.Close()
	srv := httptest.NewServer(server.New(server.Config{Log: slog.New(slog.DiscardHandler)}, p))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, send := io.Pipe()
	// A stalled proxy fails the test at the deadline instead of hanging it.
	defer context.AfterFunc(ctx, func() { send.CloseWithError(ctx.Err()) })()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/sandboxes/sb/ports/8000/stream", body)
	req.Header.Set(api.HeaderAccessToken, "t")
	type answered struct {
		resp *http.Response
		err  error
	}
	done := make(chan answered, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		done <- answered{resp, err}
	}()
	var resp *http.Response
	answer := make([]byte, 64)
	for i, line := range []string{"one\n", "two\n", "three\n"} {
		if _, err := io.WriteString(send, line); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if resp == nil {
			select {
			case a := <-done:
				if a.err != nil {
					t.Fatal(a.err)
				}
				resp = a.resp
			case <-ctx.Done():
				t.Fatal("no answer's head while the request is open")
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s", resp.Status)
			}
		}
		n, err := io.ReadAtLeast(resp.Body, answer, len(line))
		if err != nil || string(answer[:n]) != line {
			t.Fatalf("line %d: the answer read %q, %v; want %q back while the request is still open", i, answer[:n], err, line)
		}
	}
	send.Close()
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after the request's end: %q, %v", rest, err)
	}
}
