package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testutil"
)

// The ports tests run internal/testapp, a real HTTP and WebSocket server,
// inside real sandboxes (network mode none unless a test says otherwise)
// and reach it through the daemon's listener with a plain HTTP client, a
// WebSocket client and the CLI.

// appEcho is testapp's answer on /echo/ (internal/testapp.Echo).
type appEcho struct {
	Method   string      `json:"method"`
	Path     string      `json:"path"`
	RawQuery string      `json:"raw_query"`
	Host     string      `json:"host"`
	Remote   string      `json:"remote"`
	Header   http.Header `json:"header"`
	BodyLen  int64       `json:"body_len"`
}

// appPattern is the byte at offset i of testapp's /source.
func appPattern(i int64) byte { return byte(i*7 + i>>13) }

// patternReader reads testapp's pattern from offset 0 on.
type patternReader struct{ off int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = appPattern(p.off + int64(i))
	}
	p.off += int64(len(b))
	return len(b), nil
}

// startApp makes a sandbox from req and runs testapp in it, listening on
// addrs (default 127.0.0.1:8000), and waits until the first one listens.
func startApp(t *testing.T, d *daemon, req api.CreateSandboxRequest, addrs ...string) api.Sandbox {
	t.Helper()
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	runApp(t, d, sb.ID, addrs...)
	return sb
}

// runApp copies testapp into sandbox id and starts it as a background
// process listening on addrs.
func runApp(t *testing.T, d *daemon, id string, addrs ...string) {
	t.Helper()
	ctx := t.Context()
	if len(addrs) == 0 {
		addrs = []string{"127.0.0.1:8000"}
	}
	f, err := os.Open(testutil.Program(t, "github.com/berthsh/berth/internal/testapp"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mode := uint32(0o755)
	if _, err := d.client.Upload(ctx, id, "/tmp/testapp", f, client.FileOptions{Mode: &mode}); err != nil {
		t.Fatal(err)
	}
	cmd := []string{"/tmp/testapp"}
	for _, a := range addrs {
		cmd = append(cmd, "-listen", a)
	}
	if _, err := d.client.StartProcess(ctx, id, api.ExecRequest{Cmd: cmd}); err != nil {
		t.Fatal(err)
	}
	_, portText, _ := net.SplitHostPort(addrs[0])
	port, _ := strconv.Atoi(portText)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := d.client.WaitPort(wctx, id, port); err != nil {
		t.Fatal(err)
	}
}

// portClient is an HTTP client to the daemon that resolves every name
// (the host form's {port}-{id}.berth.localhost) to the daemon's listener,
// as browsers and curl do for names under .localhost, and gives up on a
// hang.
func portClient(d *daemon) *http.Client {
	var dialer net.Dialer
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, network, d.listen)
			},
			DisableCompression: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// portPath is the path form's URL of port in sandbox id.
func (d *daemon) portPath(id string, port int) string {
	return fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d", d.url, id, port)
}

// portHost is the host form's URL of port in sandbox id.
func (d *daemon) portHost(id string, port int) string {
	_, p, _ := net.SplitHostPort(d.listen)
	return fmt.Sprintf("http://%d-%s.%s:%s", port, id, api.DefaultDomain, p)
}

// do sends a request and returns the answer with its body read.
func do(t *testing.T, hc *http.Client, method, url, token string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set(api.HeaderAccessToken, token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, url, err)
	}
	return resp, b
}

// apiError reads an error answer's body.
func apiError(t *testing.T, b []byte) api.Error {
	t.Helper()
	var e api.ErrorResponse
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Class == "" {
		t.Fatalf("not an error body: %q", b)
	}
	return e.Error
}

func decodeEcho(t *testing.T, b []byte) appEcho {
	t.Helper()
	var e appEcho
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("echo: %v: %q", err, b)
	}
	return e
}

// TestPortsHTTP: every method reaches a server inside a sandbox with no
// network, in the path form and the host form, with the access token as a
// header, a query parameter or the cookie the daemon sets for it; the
// server sees its own path, the request's Host and X-Forwarded headers,
// never the token; the daemon keeps connections alive both ways.
func TestPortsHTTP(t *testing.T) {
	d := startDaemon(t, "")
	sb := startApp(t, d, api.CreateSandboxRequest{}, "127.0.0.1:8000", "[::1]:8001")
	if sb.Network.Mode != api.NetworkNone || sb.AccessToken == "" {
		t.Fatalf("sandbox: network %q, token %q", sb.Network.Mode, sb.AccessToken)
	}
	hc := portClient(d)
	base := d.portPath(sb.ID, 8000)

	for _, method := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "PROPFIND"} {
		var body io.Reader
		if method != "GET" && method != "HEAD" {
			body = strings.NewReader("hello, " + method)
		}
		resp, b := do(t, hc, method, base+"/echo/a%2Fb/c?x=1&y=two", sb.AccessToken, body, "Cookie", "app=kept")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Method") != method {
			t.Fatalf("%s: %s %q", method, resp.Status, b)
		}
		if method == "HEAD" {
			continue
		}
		e := decodeEcho(t, b)
		prefix := "/v1/sandboxes/" + sb.ID + "/ports/8000"
		if e.Method != method || e.Path != "/echo/a/b/c" || e.RawQuery != "x=1&y=two" || e.Host != d.listen ||
			e.Header.Get("X-Forwarded-Prefix") != prefix || e.Header.Get("X-Forwarded-For") != "127.0.0.1" ||
			e.Header.Get("X-Forwarded-Proto") != "http" || e.Header.Get("Cookie") != "app=kept" ||
			e.Header.Get(api.HeaderAccessToken) != "" || e.BodyLen != int64(len("hello, "+method))*btoi(body != nil) {
			t.Fatalf("%s: the server saw %+v", method, e)
		}
	}

	// Keep-alive: the client's connection to the daemon is reused, and so
	// is the daemon's to the server (the server sees the same peer).
	var reused []bool
	var remotes []string
	for range 3 {
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) },
		}), "GET", base+"/echo/", nil)
		req.Header.Set(api.HeaderAccessToken, sb.AccessToken)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		remotes = append(remotes, decodeEcho(t, b).Remote)
	}
	if !reused[1] || !reused[2] || remotes[0] != remotes[1] || remotes[1] != remotes[2] {
		t.Fatalf("keep-alive: client reused %v, server saw peers %v", reused, remotes)
	}

	// No token, a wrong one: 401, before anything reaches the server.
	for _, tok := range []string{"", "not-the-token", sb.AccessToken + "x"} {
		resp, b := do(t, hc, "GET", base+"/echo/", tok, nil)
		e := apiError(t, b)
		if resp.StatusCode != http.StatusUnauthorized || e.Class != string(errdefs.Unauthenticated) ||
			!strings.Contains(e.Message, "port 8000 of sandbox "+sb.ID) {
			t.Fatalf("token %q: %s %+v", tok, resp.Status, e)
		}
	}

	// The token as a query parameter: removed, and a cookie set for the
	// path form's prefix, which then opens the port alone.
	resp, b := do(t, hc, "GET", base+"/echo/q?a=1&"+api.QueryAccessToken+"="+sb.AccessToken+"&b=2", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("query token: %s %q", resp.Status, b)
	}
	if e := decodeEcho(t, b); e.RawQuery != "a=1&b=2" || strings.Contains(string(b), sb.AccessToken) {
		t.Fatalf("query token reached the server: %+v", e)
	}
	cookie := findCookie(resp, api.CookieAccessToken)
	if cookie == nil || cookie.Value != sb.AccessToken || !cookie.HttpOnly || cookie.SameSite != http.SameSiteLaxMode ||
		cookie.Path != "/v1/sandboxes/"+sb.ID+"/ports/8000/" {
		t.Fatalf("cookie: %+v", cookie)
	}
	resp, b = do(t, hc, "GET", base+"/echo/c", "", nil, "Cookie", "app=1; "+api.CookieAccessToken+"="+sb.AccessToken)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("cookie token: %s %q", resp.Status, b)
	}
	if e := decodeEcho(t, b); e.Header.Get("Cookie") != "app=1" {
		t.Fatalf("the token's cookie reached the server: %q", e.Header.Get("Cookie"))
	}

	// The host form: the server sees the whole path and the Host asked for.
	host := d.portHost(sb.ID, 8000)
	// testapp serves /echo/ and a few more: /abs/path is its own 404, not berth's.
	resp, b = do(t, hc, "POST", host+"/abs/path?"+api.QueryAccessToken+"="+sb.AccessToken, "", strings.NewReader("x"))
	if resp.StatusCode != http.StatusNotFound || string(b) != "404 page not found\n" {
		t.Fatalf("host form: %s %q", resp.Status, b)
	}
	_, daemonPort, _ := net.SplitHostPort(d.listen)
	resp, b = do(t, hc, "GET", host+"/echo/abs/path", sb.AccessToken, nil)
	e := decodeEcho(t, b)
	if resp.StatusCode != http.StatusOK || e.Path != "/echo/abs/path" || e.Host != fmt.Sprintf("8000-%s.%s:%s", sb.ID, api.DefaultDomain, daemonPort) ||
		e.Header.Get("X-Forwarded-Prefix") != "" {
		t.Fatalf("host form: %s %+v", resp.Status, e)
	}
	resp, _ = do(t, hc, "GET", host+"/echo/?"+api.QueryAccessToken+"="+sb.AccessToken, "", nil)
	if c := findCookie(resp, api.CookieAccessToken); c == nil || c.Path != "/" {
		t.Fatalf("host form cookie: %+v", c)
	}
	resp, b = do(t, hc, "GET", host+"/echo/", "", nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("host form without a token: %s %q", resp.Status, b)
	}

	// A server on the IPv6 loopback only.
	resp, b = do(t, hc, "GET", d.portPath(sb.ID, 8001)+"/echo/six", sb.AccessToken, nil)
	if resp.StatusCode != http.StatusOK || decodeEcho(t, b).Path != "/echo/six" {
		t.Fatalf("IPv6 server: %s %q", resp.Status, b)
	}

	ports, err := d.client.ListPorts(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []api.Port{{Port: 8000, Address: "127.0.0.1", Proto: "tcp"}, {Port: 8001, Address: "::1", Proto: "tcp6"}}
	if fmt.Sprint(ports) != fmt.Sprint(want) {
		t.Fatalf("ports: %+v, want %+v", ports, want)
	}
}

func btoi(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func findCookie(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// TestPortsLargeBodies: a 1 GiB request body and a 1 GiB answer stream
// through a port intact (checked by CRC-32 on both sides), and a chunked
// upload of unknown length too.
func TestPortsLargeBodies(t *testing.T) {
	d := startDaemon(t, "")
	sb := startApp(t, d, api.CreateSandboxRequest{})
	hc := portClient(d)
	base := d.portPath(sb.ID, 8000)
	const size = 1 << 30

	want := crc32.NewIEEE()
	body := io.TeeReader(io.LimitReader(&patternReader{}, size), want)
	req, _ := http.NewRequestWithContext(t.Context(), "POST", base+"/sink", body)
	req.ContentLength = size
	req.Header.Set(api.HeaderAccessToken, sb.AccessToken)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Bytes int64  `json:"bytes"`
		CRC32 uint32 `json:"crc32"`
	}
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || got.Bytes != size || got.CRC32 != want.Sum32() {
		t.Fatalf("1 GiB up: %s, server got %d bytes crc %08x, sent crc %08x", resp.Status, got.Bytes, got.CRC32, want.Sum32())
	}

	req, _ = http.NewRequestWithContext(t.Context(), "GET", base+"/source?n="+strconv.Itoa(size), nil)
	req.Header.Set(api.HeaderAccessToken, sb.AccessToken)
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	h := crc32.NewIEEE()
	n, err := io.CopyBuffer(h, resp.Body, make([]byte, 256<<10))
	resp.Body.Close()
	if err != nil || n != size || resp.ContentLength != size || h.Sum32() != want.Sum32() {
		t.Fatalf("1 GiB down: %d bytes (length %d) crc %08x, want crc %08x: %v", n, resp.ContentLength, h.Sum32(), want.Sum32(), err)
	}

	// Chunked: no length up front.
	const chunked = 32 << 20
	want.Reset()
	req, _ = http.NewRequestWithContext(t.Context(), "POST", base+"/sink", io.NopCloser(io.TeeReader(io.LimitReader(&patternReader{}, chunked), want)))
	req.ContentLength = -1
	req.Header.Set(api.HeaderAccessToken, sb.AccessToken)
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if got.Bytes != chunked || got.CRC32 != want.Sum32() {
		t.Fatalf("chunked up: server got %d bytes crc %08x, sent crc %08x", got.Bytes, got.CRC32, want.Sum32())
	}
}

// TestPortsSSE: server-sent events arrive one by one. The server sends
// the next event only when the test has read the last one, so a proxy that
// held the answer back (to buffer or to compress it) would hang the test.
func TestPortsSSE(t *testing.T) {
	d := startDaemon(t, "")
	sb := startApp(t, d, api.CreateSandboxRequest{})
	hc := portClient(d)
	base := d.portPath(sb.ID, 8000)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/sse", nil)
	req.Header.Set(api.HeaderAccessToken, sb.AccessToken)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	for i := range 5 {
		line, err := r.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		if blank, _ := r.ReadString('\n'); blank != "\n" {
			t.Fatalf("event %d: no blank line after it: %q", i, blank)
		}
		next, _ := do(t, hc, "POST", base+"/sse/next", sb.AccessToken, nil)
		if next.StatusCode != http.StatusNoContent {
			t.Fatalf("next: %s", next.Status)
		}
	}
}

// TestPortsFullDuplex: a server inside answers while its request is still
// arriving, through the daemon and the guest: each line comes back before
// the next is sent, so a hop that waits for the request's end, or closes
// its body when the answer begins, fails the exchange.
func TestPortsFullDuplex(t *testing.T) {
	d := startDaemon(t, "")
	sb := startApp(t, d, api.CreateSandboxRequest{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	body, send := io.Pipe()
	defer context.AfterFunc(ctx, func() { send.CloseWithError(ctx.Err()) })()
	req, _ := http.NewRequestWithContext(ctx, "POST", d.portPath(sb.ID, 8000)+"/duplex", body)
	req.Header.Set(api.HeaderAccessToken, sb.AccessToken)
	type answered struct {
		resp *http.Response
		err  error
	}
	done := make(chan answered, 1)
	go func() {
		resp, err := portClient(d).Do(req)
		done <- answered{resp, err}
	}()
	var r *bufio.Reader
	for i := range 5 {
		line := fmt.Sprintf("line %d\n", i)
		if _, err := io.WriteString(send, line); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if r == nil {
			var a answered
			select {
			case a = <-done:
			case <-ctx.Done():
				t.Fatal("no answer's head while the request is open")
			}
			if a.err != nil {
				t.Fatal(a.err)
			}
			defer a.resp.Body.Close()
			if a.resp.StatusCode != http.StatusOK {
				t.Fatalf("%s", a.resp.Status)
			}
			r = bufio.NewReader(a.resp.Body)
		}
		if got, err := r.ReadString('\n'); err != nil || got != line {
			t.Fatalf("line %d came back as %q, %v", i, got, err)
		}
	}
	send.Close()
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Fatalf("after the request's end: %q, %v", rest, err)
	}
}

// TestPortsWebSocket: a WebSocket through a port echoes text and binary
// messages both ways, in the path form with the token as a header and in
// the host form with the cookie; deleting the sandbox ends it cleanly.
func TestPortsWebSocket(t *testing.T) {
	d := startDaemon(t, "")
	sb := startApp(t, d, api.CreateSandboxRequest{})
	hc := portClient(d)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	base := d.goroutines(t)

	hdr := http.Header{api.HeaderAccessToken: {sb.AccessToken}}
	ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(d.portPath(sb.ID, 8000), "http")+"/ws",
		&websocket.DialOptions{HTTPClient: hc, HTTPHeader: hdr})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	ws.SetReadLimit(8 << 20)
	big := make([]byte, 4<<20)
	for i := range big {
		big[i] = appPattern(int64(i))
	}
	for i, m := range []struct {
		typ websocket.MessageType
		b   []byte
	}{{websocket.MessageText, []byte("hello")}, {websocket.MessageBinary, big}, {websocket.MessageText, []byte("")}, {websocket.MessageBinary, []byte{0, 1, 2}}} {
		if err := ws.Write(ctx, m.typ, m.b); err != nil {
			t.Fatal(err)
		}
		typ, got, err := ws.Read(ctx)
		if err != nil || typ != m.typ || string(got) != string(m.b) {
			t.Fatalf("message %d: type %v, %d bytes, %v", i, typ, len(got), err)
		}
	}
	for i := range 200 {
		msg := fmt.Sprintf("message %d", i)
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := ws.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("%s: %q %v", msg, got, err)
		}
	}
	if err := ws.Close(websocket.StatusNormalClosure, "done"); err != nil {
		t.Fatalf("close: %v", err)
	}

	// The host form, the token as the cookie a link with it set.
	host := "ws" + strings.TrimPrefix(d.portHost(sb.ID, 8000), "http") + "/ws"
	ws, resp, err = websocket.Dial(ctx, host, &websocket.DialOptions{HTTPClient: hc,
		HTTPHeader: http.Header{"Cookie": {api.CookieAccessToken + "=" + sb.AccessToken}}})
	if err != nil {
		t.Fatalf("host form dial: %v (%v)", err, resp)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte("host")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := ws.Read(ctx); err != nil || string(got) != "host" {
		t.Fatalf("host form: %q %v", got, err)
	}
	// Without a token the upgrade is refused.
	if _, resp, err := websocket.Dial(ctx, host, &websocket.DialOptions{HTTPClient: hc}); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %v %v", err, resp)
	}

	// Deleted meanwhile: the open WebSocket ends, nothing is left behind.
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if _, _, err := ws.Read(rctx); err == nil || rctx.Err() != nil {
		t.Fatalf("a WebSocket to a deleted sandbox: %v (read deadline: %v)", err, rctx.Err())
	}
	ws.CloseNow()
	hc.CloseIdleConnections()
	d.noLeak(t, base)
}

// TestPortsRefusals: what cannot be relayed gets a clear answer at once:
// a closed port, a port that is not one, an unknown or stopped sandbox,
// and servers that misbehave; none of them costs the daemon its memory.
func TestPortsRefusals(t *testing.T) {
	d := startDaemon(t, "")
	sb := startApp(t, d, api.CreateSandboxRequest{})
	hc := portClient(d)
	tok := sb.AccessToken

	resp, b := do(t, hc, "GET", d.portPath(sb.ID, 9)+"/x", tok, nil)
	e := apiError(t, b)
	if resp.StatusCode != http.StatusBadGateway || e.Class != string(errdefs.Unavailable) || e.Reason != string(errdefs.PortClosed) ||
		e.Message != "nothing listens on port 9 in sandbox "+sb.ID {
		t.Fatalf("closed port: %s %+v", resp.Status, e)
	}
	for _, p := range []string{"0", "65536", "-1", "abc", "99999999999999999999"} {
		resp, b := do(t, hc, "GET", d.url+"/v1/sandboxes/"+sb.ID+"/ports/"+p+"/", tok, nil)
		e := apiError(t, b)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Message, "port") {
			t.Fatalf("port %s: %s %+v", p, resp.Status, e)
		}
	}
	for _, h := range []string{"0-" + sb.ID, "70000-" + sb.ID} {
		resp, b := do(t, hc, "GET", "http://"+h+"."+api.DefaultDomain+"/", tok, nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(apiError(t, b).Message, "port") {
			t.Fatalf("host %s: %s %q", h, resp.Status, b)
		}
	}
	resp, b = do(t, hc, "GET", d.portPath("sb-nosuchsandbox", 8000)+"/", tok, nil)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(apiError(t, b).Message, "sb-nosuchsandbox") {
		t.Fatalf("unknown sandbox: %s %q", resp.Status, b)
	}

	// Servers that misbehave: no answer head, a head too large, an answer
	// that never ends (read for a while, then left).
	for _, path := range []string{"/malformed", "/hugehead"} {
		resp, b := do(t, hc, "GET", d.portPath(sb.ID, 8000)+path, tok, nil)
		if e := apiError(t, b); resp.StatusCode != http.StatusBadGateway || !strings.Contains(e.Message, "port 8000 of sandbox "+sb.ID) {
			t.Fatalf("%s: %s %+v", path, resp.Status, e)
		}
	}
	rss := d.rssMiB(t)
	req, _ := http.NewRequestWithContext(t.Context(), "GET", d.portPath(sb.ID, 8000)+"/endless", nil)
	req.Header.Set(api.HeaderAccessToken, tok)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := io.CopyN(io.Discard, resp.Body, 512<<20); err != nil || n != 512<<20 {
		t.Fatalf("endless: %d bytes, %v", n, err)
	}
	resp.Body.Close()
	if grew := d.rssMiB(t) - rss; grew > 64 {
		t.Fatalf("relaying 512 MiB of an endless answer grew the daemon by %d MiB", grew)
	}
	// Still serving.
	if resp, b := do(t, hc, "GET", d.portPath(sb.ID, 8000)+"/echo/", tok, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the misbehaving servers: %s %q", resp.Status, b)
	}

	// Stopped: conflict, saying what to do; but the token comes first.
	if _, err := d.client.StopSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	resp, b = do(t, hc, "GET", d.portPath(sb.ID, 8000)+"/echo/", tok, nil)
	if e := apiError(t, b); resp.StatusCode != http.StatusConflict || e.Class != string(errdefs.Conflict) || !strings.Contains(e.Message, sb.ID) {
		t.Fatalf("stopped: %s %+v", resp.Status, e)
	}
	if resp, _ := do(t, hc, "GET", d.portPath(sb.ID, 8000)+"/echo/", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("stopped, no token: %s", resp.Status)
	}
	if _, err := d.client.ListPorts(t.Context(), sb.ID); !errdefs.IsConflict(err) {
		t.Fatalf("ports of a stopped sandbox: %v", err)
	}
}

// rssMiB is the daemon's resident memory.
func (d *daemon) rssMiB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return kb >> 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestPortsAccess: a rotated token opens the ports and the old one no
// longer does; public ports open without one, and only those; bad public
// ports are refused by name.
func TestPortsAccess(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb := startApp(t, d, api.CreateSandboxRequest{PublicPorts: []int{8000, 8000}}, "127.0.0.1:8000", "127.0.0.1:8001")
	if fmt.Sprint(sb.PublicPorts) != "[8000]" {
		t.Fatalf("public ports %v", sb.PublicPorts)
	}
	hc := portClient(d)
	if resp, b := do(t, hc, "GET", d.portPath(sb.ID, 8000)+"/echo/", "", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("public port without a token: %s %q", resp.Status, b)
	}
	if resp, _ := do(t, hc, "GET", d.portPath(sb.ID, 8001)+"/echo/", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("private port without a token: %s", resp.Status)
	}
	ports, err := d.client.ListPorts(ctx, sb.ID)
	if err != nil || len(ports) != 2 || !ports[0].Public || ports[1].Public {
		t.Fatalf("ports: %+v %v", ports, err)
	}

	newTok, err := d.client.RotateAccessToken(ctx, sb.ID)
	if err != nil || newTok == "" || newTok == sb.AccessToken {
		t.Fatalf("rotate: %q %v", newTok, err)
	}
	if resp, _ := do(t, hc, "GET", d.portPath(sb.ID, 8001)+"/echo/", sb.AccessToken, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the old token: %s", resp.Status)
	}
	if resp, _ := do(t, hc, "GET", d.portPath(sb.ID, 8001)+"/echo/", newTok, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("the new token: %s", resp.Status)
	}
	if got, err := d.client.GetSandbox(ctx, sb.ID); err != nil || got.AccessToken != newTok {
		t.Fatalf("get after rotate: %q %v", got.AccessToken, err)
	}

	// Kept across a restart of the daemon, as is the list of public ports.
	d.stop()
	d.start()
	if got, err := d.client.GetSandbox(ctx, sb.ID); err != nil || got.AccessToken != newTok || fmt.Sprint(got.PublicPorts) != "[8000]" {
		t.Fatalf("after a restart: %+v %v", got, err)
	}

	sbx, err := d.client.SetPublicPorts(ctx, sb.ID, nil)
	if err != nil || len(sbx.PublicPorts) != 0 {
		t.Fatalf("no public ports: %+v %v", sbx.PublicPorts, err)
	}
	// A public sandbox opens every port without the token, until it is
	// private again.
	public := func(on bool) {
		t.Helper()
		got, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Public: &on})
		if err != nil || got.Public != on {
			t.Fatalf("public %v: %+v %v", on, got.Public, err)
		}
	}
	public(true)
	for _, url := range []string{d.portPath(sb.ID, 8001), d.portHost(sb.ID, 8000)} {
		if resp, b := do(t, hc, "GET", url+"/echo/", "", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s of a public sandbox without a token: %s %q", url, resp.Status, b)
		}
	}
	if ports, err := d.client.ListPorts(ctx, sb.ID); err != nil || len(ports) != 2 || !ports[0].Public || !ports[1].Public {
		t.Fatalf("ports of a public sandbox: %+v %v", ports, err)
	}
	public(false)
	if resp, _ := do(t, hc, "GET", d.portPath(sb.ID, 8001)+"/echo/", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("private again, no token: %s", resp.Status)
	}
	// The CLI's --public, kept across a restart.
	out, errOut, code := d.cli("", "create", "--public")
	pubID := strings.TrimSpace(out)
	if code != 0 {
		t.Fatalf("berth create --public: %q %d", errOut, code)
	}
	d.stop()
	d.start()
	if got, err := d.client.GetSandbox(ctx, pubID); err != nil || !got.Public {
		t.Fatalf("created with --public, after a restart: %+v %v", got, err)
	}
	for _, bad := range [][]int{{0}, {8000, 70000}, make([]int, api.MaxPublicPorts+1)} {
		_, err := d.client.SetPublicPorts(ctx, sb.ID, bad)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "public_ports") {
			t.Fatalf("public ports %v: %v", bad[:min(len(bad), 3)], err)
		}
		_, err = d.client.CreateSandbox(ctx, api.CreateSandboxRequest{PublicPorts: bad})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "public_ports") {
			t.Fatalf("create with public ports %v: %v", bad[:min(len(bad), 3)], err)
		}
	}
	if _, err := d.client.RotateAccessToken(ctx, "sb-nosuchsandbox"); !errdefs.IsNotFound(err) {
		t.Fatalf("rotate an unknown sandbox: %v", err)
	}
	// The CLI prints the token, and rotates it.
	if out, errOut, code := d.cli("", "access-token", sb.ID); code != 0 || out != newTok+"\n" {
		t.Fatalf("berth access-token: %q %q %d", out, errOut, code)
	}
	out, _, code = d.cli("", "access-token", "--rotate", sb.ID)
	if rotated := strings.TrimSpace(out); code != 0 || rotated == newTok || rotated == "" {
		t.Fatalf("berth access-token --rotate: %q %d", out, code)
	}
}

// TestPortForward: berth port-forward relays local connections to a port
// inside, and client.DialPort opens one raw connection, half-closes
// included.
func TestPortForward(t *testing.T) {
	d := startDaemon(t, "")
	sb := startApp(t, d, api.CreateSandboxRequest{})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	conn, err := d.client.DialPort(ctx, sb.ID, 8000, sb.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "GET /echo/raw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	conn.Close()
	if resp.StatusCode != http.StatusOK || decodeEcho(t, b).Path != "/echo/raw" {
		t.Fatalf("tunnel: %s %q", resp.Status, b)
	}
	// Without an API key the token is what opens the port; with one (the
	// sandbox's tenant's), the key stands for the token.
	anon, err := client.New(d.url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.DialPort(ctx, sb.ID, 8000, "wrong"); errdefs.ClassOf(err) != errdefs.Unauthenticated {
		t.Fatalf("tunnel with a wrong token: %v", err)
	}
	if conn, err := anon.DialPort(ctx, sb.ID, 8000, sb.AccessToken); err != nil {
		t.Fatalf("tunnel with the token and no key: %v", err)
	} else {
		conn.Close()
	}
	if conn, err := d.client.DialPort(ctx, sb.ID, 8000, ""); err != nil {
		t.Fatalf("tunnel with the key and no token: %v", err)
	} else {
		conn.Close()
	}
	if _, err := d.client.DialPort(ctx, sb.ID, 9, sb.AccessToken); errdefs.ReasonOf(err) != errdefs.PortClosed {
		t.Fatalf("tunnel to a closed port: %v", err)
	}

	// The CLI, on a port the system picks.
	cmd := exec.Command(d.bin, "--url", d.url, "port-forward", sb.ID, "0:8000")
	cmd.Env = append(os.Environ(), "BERTH_API_KEY="+d.key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("port-forward printed %q: %v", line, err)
	}
	// "Forwarding from 127.0.0.1:PORT -> ID:8000"
	f := strings.Fields(line)
	if len(f) != 5 || f[4] != sb.ID+":8000" {
		t.Fatalf("port-forward printed %q", line)
	}
	plain := &http.Client{Timeout: 30 * time.Second}
	for i := range 3 {
		resp, err := plain.Post("http://"+f[2]+"/sink", "application/octet-stream", io.LimitReader(&patternReader{}, 8<<20))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"bytes":8388608`) {
			t.Fatalf("request %d through port-forward: %s %q", i, resp.Status, b)
		}
	}
}

// TestPortsIsolation: a sandbox cannot reach another sandbox's ports,
// through the daemon it runs under or directly. The daemon listens on the
// host's address (a sandbox's 127.0.0.1 is its own) and its egress leaves
// from its own namespace, where that listener is; the attacker's policy
// opens the host's network and every private range, and it holds the
// victim's token: the daemon's listener stays closed to it all the same.
func TestPortsIsolation(t *testing.T) {
	hostIP := hostAddr(t)
	d := startDaemonOn(t, net.JoinHostPort(hostIP.String(), strconv.Itoa(freePort(t))), "", "--insecure-remote-api")
	open := api.Network{Mode: api.NetworkOpen}
	victim := startApp(t, d, api.CreateSandboxRequest{Network: &open}, "0.0.0.0:8000")
	// A server on the host's address beside the daemon: the control that
	// shows the attacker reaches the host.
	ctl, err := net.Listen("tcp", net.JoinHostPort(hostIP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	ctlSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "control reached\n") })}
	go ctlSrv.Serve(ctl)
	defer ctlSrv.Close()

	attackerNet := api.Network{Mode: api.NetworkOpen, Allow: []string{hostIP.String() + "/32", "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"}}
	attacker, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{Network: &attackerNet,
		Env: map[string]string{"TOK": victim.AccessToken}}) // as if the token had leaked into it
	if err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, d, attacker.ID, "curl -sS -m 5 http://"+ctl.Addr().String()+"/"); code != 0 || out != "control reached\n" {
		t.Fatalf("control: exit %d: %q", code, out)
	}
	victimAddr, code := sh(t, d, victim.ID, "ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -1")
	victimAddr = strings.TrimSpace(victimAddr)
	if code != 0 || victimAddr == "" {
		t.Fatalf("victim's address: %q", victimAddr)
	}
	_, daemonPort, _ := net.SplitHostPort(d.listen)
	hostForm := fmt.Sprintf("8000-%s.%s", victim.ID, api.DefaultDomain)
	token := `-H "X-Berth-Access-Token: $TOK" `
	for _, attempt := range []struct{ name, cmd string }{
		{"the path form", "curl -sS -m 5 " + token + "http://" + d.listen + "/v1/sandboxes/" + victim.ID + "/ports/8000/echo/"},
		{"the host form by Host header", "curl -sS -m 5 " + token + `-H "Host: ` + hostForm + `" http://` + d.listen + "/echo/"},
		{"the host form by name", "curl -sS -m 5 " + token + "http://" + hostForm + ":" + daemonPort + "/echo/"},
		{"the tunnel", "curl -sS -m 5 " + token + `-H "Connection: Upgrade" -H "Upgrade: berth-tcp/1" http://` + d.listen + "/v1/sandboxes/" + victim.ID + "/tunnel/8000"},
		{"the daemon's port on loopback", "curl -sS -m 5 " + token + "http://127.0.0.1:" + daemonPort + "/v1/sandboxes/" + victim.ID + "/ports/8000/echo/"},
		{"the victim's address", "curl -sS -m 5 http://" + victimAddr + ":8000/echo/"},
	} {
		out, code := sh(t, d, attacker.ID, attempt.cmd)
		if code == 0 || strings.Contains(out, `"method"`) {
			t.Errorf("%s: reached (exit %d): %q", attempt.name, code, out)
		}
	}
	recs, err := d.client.Egress(t.Context(), attacker.ID, client.EgressQuery{Denied: true})
	if err != nil || !slicesAny(recs, func(r api.EgressRecord) bool { return strings.Contains(r.Rule, "daemon's own listener") }) {
		t.Fatalf("no refusal names the daemon's listener: %+v %v", recs, err)
	}
	// The same request from outside goes through: the token was good.
	resp, b := do(t, portClient(d), "GET", d.portPath(victim.ID, 8000)+"/echo/", victim.AccessToken, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("from outside: %s %q", resp.Status, b)
	}
}

// hostAddr is the host's first global IPv4 address.
func hostAddr(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && p.Addr().IsGlobalUnicast() {
			return p.Addr()
		}
	}
	t.Fatal("this host has no global IPv4 address for the daemon to listen on")
	return netip.Addr{}
}

func freePort(t *testing.T) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(testutil.FreeAddr(t))
	n, _ := strconv.Atoi(p)
	return n
}

// TestPortsTrafficIsActivity: requests through a port and an open
// WebSocket keep a sandbox with a 2 s idle timeout running past it; once
// they end, it stops for idleness. The server runs detached, so that no
// process started through the API keeps the sandbox busy.
func TestPortsTrafficIsActivity(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Timeouts: api.Timeouts{IdleSeconds: secs(2)}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(testutil.Program(t, "github.com/berthsh/berth/internal/testapp"))
	if err != nil {
		t.Fatal(err)
	}
	mode := uint32(0o755)
	_, err = d.client.Upload(ctx, sb.ID, "/tmp/testapp", f, client.FileOptions{Mode: &mode})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "setsid -f /tmp/testapp -listen 127.0.0.1:8000 >/dev/null 2>&1 </dev/null"}); err != nil || r.ExitCode != 0 {
		t.Fatalf("start the server: %+v %v", r, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := d.client.WaitPort(wctx, sb.ID, 8000); err != nil {
		t.Fatal(err)
	}
	hc := portClient(d)
	running := func() bool {
		got, err := d.client.GetSandbox(ctx, sb.ID) // reads the store: not activity
		if err != nil {
			t.Fatal(err)
		}
		return got.State == api.StateRunning
	}

	// Requests every 300 ms for 5 s.
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(300 * time.Millisecond) {
		if resp, b := do(t, hc, "GET", d.portPath(sb.ID, 8000)+"/echo/", sb.AccessToken, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("request: %s %q", resp.Status, b)
		}
	}
	if !running() {
		t.Fatal("stopped for idleness while requests came through a port")
	}
	// A quiet WebSocket for 4 s.
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(d.portPath(sb.ID, 8000), "http")+"/ws",
		&websocket.DialOptions{HTTPClient: hc, HTTPHeader: http.Header{api.HeaderAccessToken: {sb.AccessToken}}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	if !running() {
		t.Fatal("stopped for idleness with a WebSocket open")
	}
	ws.Close(websocket.StatusNormalClosure, "")
	waitFor(t, 10*time.Second, func() bool { return !running() })
}

// TestPortsAutoResume: a sandbox with a start_cmd server and auto_resume
// stops for idleness although its server runs, starts again on the next
// request to its port, which waits for the server and goes through; one
// stopped on purpose stays stopped, and a request without the token wakes
// nothing.
func TestPortsAutoResume(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{
		StartCmd: "mkdir -p /tmp/www && echo served > /tmp/www/index.txt && exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/www",
		Timeouts: api.Timeouts{IdleSeconds: secs(2), AutoResume: true}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.StartCmd == "" || !sb.Timeouts.AutoResume {
		t.Fatalf("sandbox: %+v", sb)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := d.client.WaitPort(wctx, sb.ID, 8000); err != nil {
		t.Fatal(err)
	}
	hc := portClient(d)
	url := d.portPath(sb.ID, 8000) + "/index.txt"
	if resp, b := do(t, hc, "GET", url, sb.AccessToken, nil); resp.StatusCode != http.StatusOK || string(b) != "served\n" {
		t.Fatalf("first request: %s %q", resp.Status, b)
	}
	state := func() api.Sandbox {
		got, err := d.client.GetSandbox(ctx, sb.ID) // reads the store: not activity
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// The server runs, but that is no activity: the sandbox idles out.
	waitFor(t, 15*time.Second, func() bool { return state().State == api.StateStopped })
	if got := state(); !strings.Contains(got.Error, "idle") {
		t.Fatalf("stopped for %q", got.Error)
	}
	// Without the token: refused, and nothing wakes.
	if resp, _ := do(t, hc, "GET", url, "", nil); resp.StatusCode != http.StatusUnauthorized || state().State != api.StateStopped {
		t.Fatalf("no token: %s, state %s", resp.Status, state().State)
	}
	// With it: started again, the server back, the request answered.
	if resp, b := do(t, hc, "GET", url, sb.AccessToken, nil); resp.StatusCode != http.StatusOK || string(b) != "served\n" {
		t.Fatalf("request to an idle-stopped sandbox: %s %q", resp.Status, b)
	}
	if st := state().State; st != api.StateRunning {
		t.Fatalf("after the resume: %s", st)
	}
	// Stopped on purpose: it stays so.
	if _, err := d.client.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if resp, b := do(t, hc, "GET", url, sb.AccessToken, nil); resp.StatusCode != http.StatusConflict {
		t.Fatalf("request to a sandbox stopped on purpose: %s %q", resp.Status, b)
	}
	// A start_cmd that cannot run is a process that ended, not a failed create.
	bad, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{StartCmd: "/nonexistent/server"})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := d.client.ListProcesses(ctx, bad.ID)
	if err != nil || len(ps) != 1 {
		t.Fatalf("processes: %+v %v", ps, err)
	}
	if _, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{StartCmd: "a\x00b"}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "start_cmd") {
		t.Fatalf("start_cmd with a NUL: %v", err)
	}
}
