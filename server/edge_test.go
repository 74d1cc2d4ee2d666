package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/fake"
	"github.com/berthsh/berth/sandbox"
	"github.com/berthsh/berth/server"
	"github.com/berthsh/berth/store"
)

// These tests run the real edge and the real manager over the fake runtime
// (no root): routing, middleware and error mapping, end to end through the
// Go client.

type hostImage struct{}

func (hostImage) Ensure(_ context.Context, _, ref string) (api.Image, error) {
	return api.Image{}, errdefs.New(errdefs.NotFound, "image %q: no such image here", ref)
}

func (hostImage) Resolve(_ context.Context, ref string, _ runtime.IDMap) (image.Resolved, error) {
	if ref != image.Host {
		return image.Resolved{}, errdefs.New(errdefs.InvalidArgument, "image %q: no such image here", ref)
	}
	return image.Resolved{Root: runtime.RootFS{Image: ref, Layers: []string{"/images/host"}}}, nil
}

// logBuffer collects the edge's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type edge struct {
	url  string
	rt   *fake.Runtime
	log  *logBuffer
	http *http.Client
}

// newEdge serves the API group (and extra groups) over a manager on the
// fake runtime, on a loopback listener.
func newEdge(t *testing.T, cfg server.Config, extra ...server.Group) *edge {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Capabilities())
	m, err := sandbox.New(sandbox.Config{DefaultRuntime: fake.Name}, st, map[string]runtime.Runtime{fake.Name: rt}, hostImage{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	logs := &logBuffer{}
	cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
	srv := httptest.NewServer(server.New(cfg, append([]server.Group{server.API(m, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))}, extra...)...))
	t.Cleanup(func() {
		srv.Close()
		m.Close()
		st.Close()
	})
	return &edge{url: srv.URL, rt: rt, log: logs, http: srv.Client()}
}

func (e *edge) client(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(e.url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAPIOverTheFakeRuntime walks the lifecycle through HTTP.
func TestAPIOverTheFakeRuntime(t *testing.T) {
	e := newEdge(t, server.Config{})
	c := e.client(t)
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"thread_id": "t1"}})
	if err != nil || sb.State != api.StateRunning || sb.Runtime != fake.Name {
		t.Fatalf("create: %+v %v", sb, err)
	}
	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hi"}})
	if err != nil || string(res.Stdout) != "hi\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	st, err := c.ExecStream(ctx, sb.ID, api.ExecRequest{Shell: "echo streamed"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if r, err := st.Copy(&out, io.Discard); err != nil || out.String() != "streamed\n" || r.ExitCode != 0 {
		t.Fatalf("stream: %q %+v %v", out.String(), r, err)
	}
	again, created, err := c.GetOrCreate(ctx, api.CreateSandboxRequest{Labels: map[string]string{"thread_id": "t1"}})
	if err != nil || created || again.ID != sb.ID {
		t.Fatalf("get-or-create: %+v created=%v %v", again, created, err)
	}
	if _, err := c.Write(ctx, sb.ID, api.WriteRequest{Path: "notes.txt", Content: "a\nb\n"}); err != nil {
		t.Fatal(err)
	}
	rd, err := c.Read(ctx, sb.ID, api.ReadRequest{Path: "notes.txt"})
	if err != nil || len(rd.Lines) != 2 || rd.Lines[1].Text != "b" || rd.Path != "/home/user/notes.txt" {
		t.Fatalf("read: %+v %v", rd, err)
	}
	if err := c.Remove(ctx, sb.ID, api.RemoveRequest{Path: "notes.txt"}); err != nil {
		t.Fatalf("remove (204): %v", err)
	}
	if _, err := c.Glob(ctx, sb.ID, api.GlobRequest{Pattern: "*"}); !errdefs.IsNotImplemented(err) {
		t.Fatalf("an operation the fake guest lacks: %v", err)
	}
	if _, err := c.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "start it first") {
		t.Fatalf("exec in a stopped sandbox: %v", err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSandbox(ctx, sb.ID); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("get after delete: %v", err)
	}
	rts, err := c.Runtimes(ctx)
	if err != nil || len(rts) != 1 || rts[0].Name != fake.Name || !rts[0].Default || rts[0].Capabilities.Max.CPUs != 4 {
		t.Fatalf("runtimes: %+v %v", rts, err)
	}
}

func get(t *testing.T, e *edge, path string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, e.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestRequestIDsAndAccessLog: every answer carries a request id (the
// caller's when usable) and every request, routed or not, gets a log line.
func TestRequestIDsAndAccessLog(t *testing.T) {
	e := newEdge(t, server.Config{})
	resp, _ := get(t, e, "/healthz", nil)
	if id := resp.Header.Get(server.HeaderRequestID); len(id) != 16 {
		t.Fatalf("generated request id %q", id)
	}
	resp, _ = get(t, e, "/healthz", map[string]string{server.HeaderRequestID: "caller-42"})
	if id := resp.Header.Get(server.HeaderRequestID); id != "caller-42" {
		t.Fatalf("the caller's request id came back as %q", id)
	}
	resp, _ = get(t, e, "/healthz", map[string]string{server.HeaderRequestID: "bad id\twith spaces"})
	if id := resp.Header.Get(server.HeaderRequestID); id == "" || strings.ContainsAny(id, " \t") {
		t.Fatalf("an unusable request id was kept: %q", id)
	}
	resp, body := get(t, e, "/no/such/route", map[string]string{server.HeaderRequestID: "unrouted-1"})
	var er api.ErrorResponse
	if resp.StatusCode != http.StatusNotFound || json.Unmarshal([]byte(body), &er) != nil || er.Error.Class != "not_found" {
		t.Fatalf("unrouted: %d %s", resp.StatusCode, body)
	}
	logs := e.log.String()
	if !strings.Contains(logs, "path=/no/such/route status=404") || !strings.Contains(logs, "id=unrouted-1") {
		t.Fatalf("no access-log line for an unrouted request:\n%s", logs)
	}
}

// panicky is a group whose one route panics.
type panicky struct{}

func (panicky) Name() string { return "panicky" }
func (panicky) Routes(r *server.Router) {
	r.Handle("GET /panic", func(w http.ResponseWriter, r *http.Request) error { panic("a bug") })
}

// TestPanicsAreRecovered: a handler's panic is an internal error with no
// internals in the body, a stack in the log, and the daemon serves on.
func TestPanicsAreRecovered(t *testing.T) {
	e := newEdge(t, server.Config{}, panicky{})
	resp, body := get(t, e, "/panic", nil)
	var er api.ErrorResponse
	if resp.StatusCode != http.StatusInternalServerError || json.Unmarshal([]byte(body), &er) != nil ||
		er.Error.Class != "internal" || strings.Contains(body, "a bug") {
		t.Fatalf("panic answered %d %s", resp.StatusCode, body)
	}
	if logs := e.log.String(); !strings.Contains(logs, "handler panicked") || !strings.Contains(logs, "a bug") {
		t.Fatalf("the panic is not in the log:\n%s", logs)
	}
	if resp, _ := get(t, e, "/healthz", nil); resp.StatusCode != http.StatusOK {
		t.Fatal("the daemon stopped serving after a panic")
	}
}

// portsLike claims requests by host, as the port proxy's host form will.
type portsLike struct{}

func (portsLike) Name() string { return "ports" }
func (portsLike) Routes(r *server.Router) {
	r.Host(func(host string) bool { return strings.HasSuffix(host, ".berth.localhost") }, func(w http.ResponseWriter, r *http.Request) error {
		_, err := io.WriteString(w, "port of "+r.Host+" "+r.URL.Path)
		return err
	})
}

// TestHostRoutesComeFirst: a sibling group that claims hosts gets their
// requests whatever the path; other hosts reach the API.
func TestHostRoutesComeFirst(t *testing.T) {
	e := newEdge(t, server.Config{}, portsLike{})
	resp, body := get(t, e, "/v1/sandboxes", map[string]string{"Host": "8000-sb-abc.berth.localhost"})
	if resp.StatusCode != http.StatusOK || body != "port of 8000-sb-abc.berth.localhost /v1/sandboxes" {
		t.Fatalf("host route: %d %q", resp.StatusCode, body)
	}
	if resp, body := get(t, e, "/v1/sandboxes", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"sandboxes"`) {
		t.Fatalf("API beside the host route: %d %q", resp.StatusCode, body)
	}
}

// TestAuthenticationSeam: the edge's authentication decides the tenant
// before any route runs, and tenants see only their own sandboxes.
func TestAuthenticationSeam(t *testing.T) {
	e := newEdge(t, server.Config{Authenticate: func(key string) (auth.Principal, error) {
		tenant, ok := strings.CutPrefix(key, "tenant-")
		if !ok {
			return auth.Principal{}, errdefs.New(errdefs.Unauthenticated, "no key")
		}
		return auth.Principal{Kind: auth.Key, Tenant: tenant, KeyID: "k-" + tenant, Scope: api.ScopeWrite}, nil
	}})
	ctx := t.Context()
	if _, err := e.client(t).ListSandboxes(ctx, nil); errdefs.ClassOf(err) != errdefs.Unauthenticated {
		t.Fatalf("no key: %v", err)
	}
	a, b := e.client(t, client.WithAPIKey("tenant-a")), e.client(t, client.WithAPIKey("tenant-b"))
	sb, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSandbox(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant's sandbox: %v", err)
	}
	if list, err := b.ListSandboxes(ctx, nil); err != nil || len(list) != 0 {
		t.Fatalf("another tenant's list: %+v %v", list, err)
	}
	if list, err := a.ListSandboxes(ctx, nil); err != nil || len(list) != 1 {
		t.Fatalf("own list: %+v %v", list, err)
	}
	if logs := e.log.String(); !strings.Contains(logs, "tenant=a") {
		t.Fatalf("the access log does not name the tenant:\n%s", logs)
	}
}

// TestMetricsFromTheManager: /metrics is the Prometheus text format with the
// manager's sandboxes and their usage.
func TestMetricsFromTheManager(t *testing.T) {
	e := newEdge(t, server.Config{})
	sb, err := e.client(t).CreateSandbox(t.Context(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.rt.SetUsage(sb.ID, runtime.Usage{MemoryBytes: 12345, CPUSeconds: 1.5}, runtime.LimitHits{})
	resp, body := get(t, e, "/metrics", nil)
	for _, want := range []string{`berth_sandboxes{state="running"} 1`, `berth_sandboxes{state="stopped"} 0`,
		`berth_sandbox_memory_bytes{sandbox="` + sb.ID + `"} 12345`, `berth_sandbox_cpu_seconds_total{sandbox="` + sb.ID + `"} 1.5`,
		"# TYPE berth_sandbox_cpu_seconds_total counter"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q (status %d):\n%s", want, resp.StatusCode, body)
		}
	}
}

func do(t *testing.T, e *edge, method, path string, body string, hdr map[string]string) (*http.Response, api.ErrorResponse) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var er api.ErrorResponse
	json.NewDecoder(resp.Body).Decode(&er)
	return resp, er
}

// TestBrowsersAreRefused: what a web page could make a browser on the host
// send is refused before any route runs: a DNS-rebound Host, a
// cross-origin request, a form or text/plain post. Nothing is created.
func TestBrowsersAreRefused(t *testing.T) {
	e := newEdge(t, server.Config{Hosts: []string{"berth.internal"}})
	json := map[string]string{"Content-Type": "application/json"}
	with := func(extra map[string]string) map[string]string {
		h := map[string]string{"Content-Type": "application/json"}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	for _, tc := range []struct {
		name  string
		hdr   map[string]string
		class string
	}{
		{"rebound host", with(map[string]string{"Host": "evil.example:7680"}), "permission_denied"},
		{"rebound host, no port", with(map[string]string{"Host": "evil.example"}), "permission_denied"},
		{"cross origin", with(map[string]string{"Origin": "http://evil.example"}), "permission_denied"},
		{"another localhost port", with(map[string]string{"Origin": "http://localhost:3000"}), "permission_denied"},
		{"null origin", with(map[string]string{"Origin": "null"}), "permission_denied"},
		{"cross-site fetch", with(map[string]string{"Sec-Fetch-Site": "cross-site"}), "permission_denied"},
		{"text/plain post", map[string]string{"Content-Type": "text/plain"}, "invalid_argument"},
		{"form post", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, "invalid_argument"},
	} {
		resp, er := do(t, e, http.MethodPost, "/v1/sandboxes", "{}", tc.hdr)
		if er.Error.Class != tc.class {
			t.Errorf("%s: %d %+v, want %s", tc.name, resp.StatusCode, er, tc.class)
		}
	}
	if n := len(e.rt.Calls()); n != 0 {
		t.Fatalf("a refused request reached the runtime: %+v", e.rt.Calls())
	}
	// What a client or the daemon's own page sends goes through.
	for _, hdr := range []map[string]string{json, with(map[string]string{"Host": "localhost:7680"}),
		with(map[string]string{"Host": "127.0.0.1:9", "Origin": "http://127.0.0.1:9", "Sec-Fetch-Site": "same-origin"}),
		with(map[string]string{"Host": "berth.internal:7680"}), with(map[string]string{"Host": "8000-sb-x.berth.localhost"})} {
		if resp, er := do(t, e, http.MethodPost, "/v1/sandboxes", "{}", hdr); resp.StatusCode != http.StatusCreated {
			t.Errorf("%v: %d %+v", hdr, resp.StatusCode, er)
		}
	}
	if logs := e.log.String(); !strings.Contains(logs, "status=403") {
		t.Fatalf("refusals are not in the access log:\n%s", logs)
	}
}

// TestMethodsAndBodyBounds: a wrong method is 405 with Allow; a body over
// its route's bound is 413 naming the bound.
func TestMethodsAndBodyBounds(t *testing.T) {
	e := newEdge(t, server.Config{})
	resp, er := do(t, e, http.MethodDelete, "/v1/runtimes", "", nil)
	if resp.StatusCode != http.StatusMethodNotAllowed || er.Error.Class != "method_not_allowed" || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Fatalf("DELETE /v1/runtimes: %d %q %+v", resp.StatusCode, resp.Header.Get("Allow"), er)
	}
	resp, er = do(t, e, http.MethodPut, "/v1/sandboxes/sb-x/exec", "", nil)
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("PUT exec: %d %q %+v", resp.StatusCode, resp.Header.Get("Allow"), er)
	}
	if resp, _ := do(t, e, http.MethodGet, "/v1/nothing", "", nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown path: %d", resp.StatusCode)
	}
	big := `{"labels":{"a":"` + strings.Repeat("x", 5<<20) + `"}}`
	resp, er = do(t, e, http.MethodPost, "/v1/sandboxes", big, map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusRequestEntityTooLarge || er.Error.Class != "too_large" || !strings.Contains(er.Error.Message, "4194304") {
		t.Fatalf("a 5 MiB create: %d %+v", resp.StatusCode, er)
	}
	// 25 MiB of stdin is 33 MiB of JSON, over the exec route's 32 MiB.
	if _, err := e.client(t).Exec(t.Context(), "sb-x", api.ExecRequest{Cmd: []string{"x"}, Stdin: make([]byte, 25<<20)}); errdefs.ClassOf(err) != errdefs.TooLarge {
		t.Fatalf("a 25 MiB stdin: %v", err)
	}
}
