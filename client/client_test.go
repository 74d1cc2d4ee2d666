package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// The real server is exercised end to end in e2e; these tests pin the
// client's own behaviour against a scripted HTTP server.

// recorded is what the fake server saw of one request.
type recorded struct {
	method, path, query string
	auth, agent, ctype  string
	body                []byte
}

// fake serves every request with status and reply and records the last one.
func fake(t *testing.T, status int, reply string, opts ...Option) (*Client, *recorded) {
	t.Helper()
	rec := &recorded{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		*rec = recorded{
			method: r.Method, path: r.URL.EscapedPath(), query: r.URL.RawQuery,
			auth: r.Header.Get("Authorization"), agent: r.Header.Get("User-Agent"),
			ctype: r.Header.Get("Content-Type"), body: b,
		}
		if reply != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		io.WriteString(w, reply)
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func TestRequestShapes(t *testing.T) {
	ctx := context.Background()
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sbJSON := `{"id":"sb-1","state":"running","image":"host","runtime":"native","workdir":"/home/user","user":"user",` +
		`"labels":{"a":"1"},"limits":{"memory_bytes":536870912},"timeouts":{},"created_at":"2026-01-02T03:04:05Z"}`
	sb := api.Sandbox{ID: "sb-1", State: "running", Image: "host", Runtime: "native", Workdir: "/home/user", User: "user",
		Labels: map[string]string{"a": "1"}, Limits: api.Limits{MemoryBytes: 512 << 20}, CreatedAt: created}
	procJSON := `{"pid":42,"cmd":["sleep","9"],"running":true,"started_at":"2026-01-02T03:04:05Z"}`
	proc := api.Process{Pid: 42, Cmd: []string{"sleep", "9"}, Running: true, StartedAt: created}
	resJSON := `{"pid":42,"exit_code":3,"timed_out":false,"oom_killed":false,"stdout":"aGk=","stderr":null,"duration_ms":7}`
	res := api.ExecResult{Pid: 42, ExitCode: 3, Stdout: []byte("hi"), DurationMs: 7}
	v := "x"

	for _, tc := range []struct {
		name   string
		status int
		reply  string
		call   func(*Client) (any, error)
		method string
		path   string
		query  string
		body   string // the JSON body sent, "" for none
		want   any
	}{
		{"Health", 200, "ok", func(c *Client) (any, error) { return nil, c.Health(ctx) },
			"GET", "/healthz", "", "", nil},
		{"Version", 200, `{"version":"0.1.0","api":"v1","runtimes":["native"]}`,
			func(c *Client) (any, error) { return c.Version(ctx) },
			"GET", "/v1/version", "", "", api.VersionResponse{Version: "0.1.0", API: "v1", Runtimes: []string{"native"}}},
		{"CreateSandbox", 201, sbJSON, func(c *Client) (any, error) {
			return c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", Labels: map[string]string{"a": "1"},
				Env: map[string]string{"K": "V"}, Limits: api.Limits{MemoryBytes: 512 << 20, CPUs: 0.5, Pids: 64}})
		}, "POST", "/v1/sandboxes", "",
			`{"image":"host","env":{"K":"V"},"labels":{"a":"1"},"limits":{"cpus":0.5,"memory_bytes":536870912,"pids":64}}`, sb},
		{"GetSandbox", 200, sbJSON, func(c *Client) (any, error) { return c.GetSandbox(ctx, "sb-1") },
			"GET", "/v1/sandboxes/sb-1", "", "", sb},
		{"GetSandboxEscapesID", 200, sbJSON, func(c *Client) (any, error) { return c.GetSandbox(ctx, "a/b?c") },
			"GET", "/v1/sandboxes/a%2Fb%3Fc", "", "", sb},
		{"ListSandboxesAll", 200, `{"sandboxes":[]}`, func(c *Client) (any, error) { return c.ListSandboxes(ctx, nil) },
			"GET", "/v1/sandboxes", "", "", []api.Sandbox{}},
		{"ListSandboxesLabels", 200, `{"sandboxes":[` + sbJSON + `]}`, func(c *Client) (any, error) {
			return c.ListSandboxes(ctx, map[string]string{"thread": "t 1", "a": "1"})
		}, "GET", "/v1/sandboxes", "label=a%3D1&label=thread%3Dt+1", "", []api.Sandbox{sb}},
		{"ListSandboxesSelector", 200, `{"sandboxes":[]}`, func(c *Client) (any, error) {
			return c.ListSandboxesSelector(ctx, "a=b,!c")
		}, "GET", "/v1/sandboxes", "selector=a%3Db%2C%21c", "", []api.Sandbox{}},
		{"DeleteSandbox", 204, "", func(c *Client) (any, error) { return nil, c.DeleteSandbox(ctx, "sb-1") },
			"DELETE", "/v1/sandboxes/sb-1", "", "", nil},
		{"UpdateLabels", 200, sbJSON, func(c *Client) (any, error) {
			return c.UpdateLabels(ctx, "sb-1", map[string]*string{"a": &v, "gone": nil})
		}, "PATCH", "/v1/sandboxes/sb-1", "", `{"labels":{"a":"x","gone":null}}`, sb},
		{"Stats", 200, `{"cpu_seconds":1.5,"memory_bytes":10,"memory_peak_bytes":20,"pids":3,"oom_kills":0,"disk_bytes":4}`,
			func(c *Client) (any, error) { return c.Stats(ctx, "sb-1") },
			"GET", "/v1/sandboxes/sb-1/stats", "", "", api.Usage{CPUSeconds: 1.5, MemoryBytes: 10, MemoryPeakBytes: 20, Pids: 3, DiskBytes: 4}},
		{"StopSandbox", 200, sbJSON, func(c *Client) (any, error) { return c.StopSandbox(ctx, "sb-1") },
			"POST", "/v1/sandboxes/sb-1/stop", "", "", sb},
		{"StartSandbox", 200, sbJSON, func(c *Client) (any, error) { return c.StartSandbox(ctx, "sb-1") },
			"POST", "/v1/sandboxes/sb-1/start", "", "", sb},
		{"Keepalive", 204, "", func(c *Client) (any, error) { return nil, c.Keepalive(ctx, "sb-1") },
			"POST", "/v1/sandboxes/sb-1/keepalive", "", "", nil},
		{"Exec", 200, resJSON, func(c *Client) (any, error) {
			return c.Exec(ctx, "sb-1", api.ExecRequest{Cmd: []string{"echo", "hi"}, Stdin: []byte("in"), TimeoutMs: 500,
				Env: map[string]string{"A": "b"}, Cwd: "/tmp", User: "root"})
		}, "POST", "/v1/sandboxes/sb-1/exec", "",
			`{"cmd":["echo","hi"],"env":{"A":"b"},"cwd":"/tmp","user":"root","stdin":"aW4=","timeout_ms":500}`, res},
		{"StartProcess", 201, procJSON, func(c *Client) (any, error) {
			return c.StartProcess(ctx, "sb-1", api.ExecRequest{Shell: "sleep 9"})
		}, "POST", "/v1/sandboxes/sb-1/processes", "", `{"shell":"sleep 9"}`, proc},
		{"ListProcesses", 200, `{"processes":[` + procJSON + `]}`, func(c *Client) (any, error) { return c.ListProcesses(ctx, "sb-1") },
			"GET", "/v1/sandboxes/sb-1/processes", "", "", []api.Process{proc}},
		{"GetProcess", 200, procJSON, func(c *Client) (any, error) { return c.GetProcess(ctx, "sb-1", 42) },
			"GET", "/v1/sandboxes/sb-1/processes/42", "", "", proc},
		{"WaitProcess", 200, resJSON, func(c *Client) (any, error) { return c.WaitProcess(ctx, "sb-1", 42, 1500*time.Millisecond) },
			"POST", "/v1/sandboxes/sb-1/processes/42/wait", "timeout_ms=1500", "", res},
		{"WaitProcessNoTimeout", 200, resJSON, func(c *Client) (any, error) { return c.WaitProcess(ctx, "sb-1", 42, 0) },
			"POST", "/v1/sandboxes/sb-1/processes/42/wait", "", "", res},
		{"SignalProcess", 204, "", func(c *Client) (any, error) { return nil, c.SignalProcess(ctx, "sb-1", 42, "TERM") },
			"POST", "/v1/sandboxes/sb-1/processes/42/signal", "", `{"signal":"TERM"}`, nil},
		{"RemoveProcess", 204, "", func(c *Client) (any, error) { return nil, c.RemoveProcess(ctx, "sb-1", 42) },
			"DELETE", "/v1/sandboxes/sb-1/processes/42", "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, rec := fake(t, tc.status, tc.reply, WithAPIKey("secret"), WithUserAgent("test-agent/1"))
			got, err := tc.call(c)
			if err != nil {
				t.Fatal(err)
			}
			if rec.method != tc.method || rec.path != tc.path || rec.query != tc.query {
				t.Errorf("request %s %s?%s, want %s %s?%s", rec.method, rec.path, rec.query, tc.method, tc.path, tc.query)
			}
			if tc.body == "" && len(rec.body) != 0 {
				t.Errorf("body %s, want none", rec.body)
			}
			if tc.body != "" && (!sameJSON(rec.body, []byte(tc.body)) || rec.ctype != "application/json") {
				t.Errorf("body %s (%s), want %s", rec.body, rec.ctype, tc.body)
			}
			if rec.auth != "Bearer secret" || rec.agent != "test-agent/1" {
				t.Errorf("headers: auth %q agent %q", rec.auth, rec.agent)
			}
			if tc.want != nil && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestGetOrCreateSaysWhichByStatus(t *testing.T) {
	for status, want := range map[int]bool{201: true, 200: false} {
		c, rec := fake(t, status, `{"id":"sb-1"}`)
		sb, created, err := c.GetOrCreate(context.Background(), api.CreateSandboxRequest{Labels: map[string]string{"t": "1"}})
		if err != nil || sb.ID != "sb-1" || created != want {
			t.Errorf("status %d: %+v created=%v %v", status, sb, created, err)
		}
		if rec.method != "POST" || rec.path != "/v1/sandboxes/get-or-create" || !sameJSON(rec.body, []byte(`{"labels":{"t":"1"}}`)) {
			t.Errorf("request %+v", rec)
		}
	}
}

func TestNoAPIKeyNoAuthorization(t *testing.T) {
	c, rec := fake(t, 200, "ok")
	if err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec.auth != "" || rec.agent != "berth-go" {
		t.Fatalf("auth %q agent %q", rec.auth, rec.agent)
	}
}

func TestErrorClassesComeBack(t *testing.T) {
	classes := []errdefs.Class{errdefs.NotFound, errdefs.AlreadyExists, errdefs.InvalidArgument, errdefs.Conflict,
		errdefs.ResourceExhausted, errdefs.PermissionDenied, errdefs.Unauthenticated, errdefs.Unavailable,
		errdefs.DeadlineExceeded, errdefs.NotImplemented, errdefs.Internal}
	for _, class := range classes {
		body, _ := json.Marshal(api.ErrorResponse{Error: api.Error{Class: string(class), Message: `sandbox "sb-x": ` + string(class)}})
		c, _ := fake(t, errdefs.HTTPStatus(class), string(body))
		_, err := c.GetSandbox(context.Background(), "sb-x")
		if errdefs.ClassOf(err) != class || err.Error() != `sandbox "sb-x": `+string(class) {
			t.Errorf("%s: got %v (class %s)", class, err, errdefs.ClassOf(err))
		}
	}
	c, _ := fake(t, 404, `{"error":{"class":"not_found","message":"sandbox \"sb-x\" not found"}}`)
	if _, err := c.GetSandbox(context.Background(), "sb-x"); !errdefs.IsNotFound(err) {
		t.Errorf("IsNotFound(%v) = false", err)
	}
	// A class the client does not know is not believed.
	c, _ = fake(t, 400, `{"error":{"class":"made_up","message":"odd"}}`)
	if err := c.DeleteSandbox(context.Background(), "sb-x"); errdefs.ClassOf(err) != errdefs.Internal || err.Error() != "odd" {
		t.Errorf("unknown class: %v (%s)", err, errdefs.ClassOf(err))
	}
}

func TestErrorsWithoutJSONBody(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		class  errdefs.Class
		msg    string
	}{
		{401, "", errdefs.Unauthenticated, "HTTP 401: Unauthorized"},
		{404, "404 page not found\n", errdefs.NotFound, "HTTP 404: 404 page not found"},
		{429, "", errdefs.ResourceExhausted, "HTTP 429: Too Many Requests"},
		{502, "<html>bad gateway</html>", errdefs.Unavailable, "HTTP 502: <html>bad gateway</html>"},
		{418, "teapot", errdefs.Internal, "HTTP 418: teapot"},
		{500, `{"error":{}}`, errdefs.Internal, `HTTP 500: {"error":{}}`},
	} {
		c, _ := fake(t, tc.status, tc.body)
		err := c.Health(context.Background())
		if errdefs.ClassOf(err) != tc.class || err.Error() != tc.msg {
			t.Errorf("%d %q: got %q (%s), want %q (%s)", tc.status, tc.body, err, errdefs.ClassOf(err), tc.msg, tc.class)
		}
	}
}

// ndjson serves the events as a streamed exec answers, flushing each line.
func ndjson(t *testing.T, events ...api.ExecEvent) (*Client, *recorded) {
	t.Helper()
	rec := &recorded{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		*rec = recorded{method: r.Method, path: r.URL.EscapedPath(), query: r.URL.RawQuery, body: b}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ev := range events {
			enc.Encode(ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

func TestExecStreamEvents(t *testing.T) {
	events := []api.ExecEvent{
		{Type: api.EventStart, Pid: 7},
		{Type: api.EventStdout, Data: []byte("a\x00")},
		{Type: api.EventStderr, Data: []byte("b")},
		{Type: api.EventStdout, Data: []byte("c")},
		{Type: api.EventExit, Result: &api.ExecResult{Pid: 7, ExitCode: 3, DurationMs: 5}},
	}
	c, rec := ndjson(t, events...)
	st, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Cmd: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if rec.method != "POST" || rec.path != "/v1/sandboxes/sb-1/exec" || rec.query != "stream=true" || !sameJSON(rec.body, []byte(`{"cmd":["x"]}`)) {
		t.Fatalf("request %+v", rec)
	}
	for i, want := range events {
		ev, err := st.Next()
		if err != nil || !reflect.DeepEqual(ev, want) {
			t.Fatalf("event %d: %+v %v, want %+v", i, ev, err, want)
		}
	}
	for range 2 {
		if _, err := st.Next(); err != io.EOF {
			t.Fatalf("after exit: %v, want io.EOF", err)
		}
	}
}

func TestExecStreamCopy(t *testing.T) {
	c, _ := ndjson(t,
		api.ExecEvent{Type: api.EventStart, Pid: 7},
		api.ExecEvent{Type: api.EventStdout, Data: []byte("one ")},
		api.ExecEvent{Type: api.EventStderr, Data: []byte("err")},
		api.ExecEvent{Type: api.EventStdout, Data: []byte("two")},
		api.ExecEvent{Type: api.EventExit, Result: &api.ExecResult{Pid: 7, ExitCode: 137, Signal: 9}},
	)
	st, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Shell: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out, errOut bytes.Buffer
	res, err := st.Copy(&out, &errOut)
	if err != nil || res.ExitCode != 137 || res.Signal != 9 || out.String() != "one two" || errOut.String() != "err" {
		t.Fatalf("%+v %v stdout %q stderr %q", res, err, out.String(), errOut.String())
	}
}

func TestExecStreamErrorEventIsClassified(t *testing.T) {
	c, _ := ndjson(t,
		api.ExecEvent{Type: api.EventError, Error: &api.Error{Class: "conflict", Message: "sandbox is stopped"}},
	)
	st, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Cmd: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ev, err := st.Next()
	if !errdefs.IsConflict(err) || err.Error() != "sandbox is stopped" || ev.Type != api.EventError {
		t.Fatalf("%+v %v", ev, err)
	}
	if _, err := st.Next(); err != io.EOF {
		t.Fatalf("after error event: %v", err)
	}
}

func TestExecStreamCopyWithoutExitIsUnavailable(t *testing.T) {
	c, _ := ndjson(t, api.ExecEvent{Type: api.EventStart, Pid: 1}, api.ExecEvent{Type: api.EventStdout, Data: []byte("x")})
	st, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Cmd: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Copy(io.Discard, io.Discard); !errdefs.IsUnavailable(err) {
		t.Fatalf("%v", err)
	}
}

func TestExecStreamNonOKIsAnError(t *testing.T) {
	c, _ := fake(t, 404, `{"error":{"class":"not_found","message":"no sb-x"}}`)
	if _, err := c.ExecStream(context.Background(), "sb-x", api.ExecRequest{Cmd: []string{"x"}}); !errdefs.IsNotFound(err) {
		t.Fatalf("%v", err)
	}
	if _, err := c.ProcessOutput(context.Background(), "sb-x", 1, true); !errdefs.IsNotFound(err) {
		t.Fatalf("%v", err)
	}
}

// TestExecStreamIsLive checks events arrive while the process still runs, and
// that Close hangs up on the daemon (which then kills the process).
func TestExecStreamIsLive(t *testing.T) {
	release := make(chan struct{})
	hungUp := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.ExecEvent{Type: api.EventStart, Pid: 3})
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			close(hungUp)
		}
	}))
	defer srv.Close()
	defer close(release)
	c, _ := New(srv.URL)
	st, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Cmd: []string{"sleep"}})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := st.Next(); err != nil || ev.Type != api.EventStart || ev.Pid != 3 {
		t.Fatalf("%+v %v", ev, err)
	}
	st.Close()
	select {
	case <-hungUp:
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the client hang up")
	}
}

func TestExecStreamCancelIsNotUnavailable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.ExecEvent{Type: api.EventStart, Pid: 3})
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	c, _ := New(srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.ExecStream(ctx, "sb-1", api.ExecRequest{Cmd: []string{"sleep"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.Next()
	cancel()
	_, err = st.Next()
	if !errors.Is(err, context.Canceled) || errdefs.IsUnavailable(err) {
		t.Fatalf("%v", err)
	}
}

func TestProcessOutputFollow(t *testing.T) {
	c, rec := ndjson(t,
		api.ExecEvent{Type: api.EventStdout, Data: []byte("kept")},
		api.ExecEvent{Type: api.EventExit, Result: &api.ExecResult{Pid: 42}},
	)
	for follow, query := range map[bool]string{true: "follow=true", false: ""} {
		st, err := c.ProcessOutput(context.Background(), "sb-1", 42, follow)
		if err != nil {
			t.Fatal(err)
		}
		if rec.method != "GET" || rec.path != "/v1/sandboxes/sb-1/processes/42/output" || rec.query != query {
			t.Errorf("follow=%v: request %+v", follow, rec)
		}
		var out bytes.Buffer
		if res, err := st.Copy(&out, io.Discard); err != nil || res.Pid != 42 || out.String() != "kept" {
			t.Errorf("%+v %v %q", res, err, out.String())
		}
		st.Close()
	}
	// Unfollowed output of a running process ends without an exit event.
	c, _ = ndjson(t, api.ExecEvent{Type: api.EventStdout, Data: []byte("so far")})
	st, _ := c.ProcessOutput(context.Background(), "sb-1", 42, false)
	defer st.Close()
	st.Next()
	if _, err := st.Next(); err != io.EOF {
		t.Fatalf("clean end: %v", err)
	}
}

func TestUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "b.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var got api.ExecRequest
	var path string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.String()
		json.NewDecoder(r.Body).Decode(&got)
		json.NewEncoder(w).Encode(api.ExecResult{ExitCode: 3, Stdout: []byte{0, 1}})
	})}
	go srv.Serve(l)
	defer srv.Close()
	for _, opts := range [][]Option{nil, {WithHTTPClient(&http.Client{Timeout: 10 * time.Second})}} {
		c, err := New("unix://"+sock, opts...)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(context.Background(), "sb-1", api.ExecRequest{Cmd: []string{"x"}, Stdin: []byte("in")})
		if err != nil || res.ExitCode != 3 || string(res.Stdout) != "\x00\x01" {
			t.Fatalf("%+v %v", res, err)
		}
		if path != "/v1/sandboxes/sb-1/exec" || string(got.Stdin) != "in" || got.Cmd[0] != "x" {
			t.Fatalf("request %s %+v", path, got)
		}
	}
}

func TestUnreachableNamesTheURL(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	for _, u := range []string{"http://" + addr, "unix://" + filepath.Join(t.TempDir(), "none.sock")} {
		c, err := New(u)
		if err != nil {
			t.Fatal(err)
		}
		err = c.Health(context.Background())
		prefix := "berth daemon not reachable at " + u + ": "
		if !errdefs.IsUnavailable(err) || !strings.HasPrefix(err.Error(), prefix) || strings.Contains(err.Error(), "http://berth") {
			t.Errorf("%s: %v", u, err)
		}
	}
}

func TestCancelledContextIsNotUnavailable(t *testing.T) {
	c, _ := fake(t, 200, "ok")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Health(ctx); !errors.Is(err, context.Canceled) || errdefs.IsUnavailable(err) {
		t.Fatalf("%v", err)
	}
}

func TestURLs(t *testing.T) {
	for _, bad := range []string{"ftp://x", "unix://", "http://[::1", "http://"} {
		if _, err := New(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("New(%q): %v", bad, err)
		}
	}
	for in, base := range map[string]string{
		"":                       "http://127.0.0.1:7680",
		"localhost:9000":         "http://localhost:9000",
		"https://b.example/":     "https://b.example",
		"http://h:1/api/berth/":  "http://h:1/api/berth",
		"unix:///run/berth.sock": "http://berth",
	} {
		c, err := New(in)
		if err != nil || c.base != base {
			t.Errorf("New(%q): base %q %v, want %q", in, c.base, err, base)
		}
	}
	if c, _ := New(""); c.URL() != DefaultURL {
		t.Errorf("URL() = %q", c.URL())
	}
	// A path prefix (a reverse proxy) is kept before every route.
	var path string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		fmt.Fprint(w, `{"version":"x"}`)
	}))
	defer srv.Close()
	c, _ := New(srv.URL + "/berth/")
	if _, err := c.Version(context.Background()); err != nil || path != "/berth/v1/version" {
		t.Fatalf("path %q %v", path, err)
	}
}
