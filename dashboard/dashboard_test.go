package dashboard_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/berthsh/berth/dashboard"
	"github.com/berthsh/berth/server"
)

func serve(t *testing.T) (*httptest.Server, *dashboard.Group) {
	t.Helper()
	g := dashboard.New()
	srv := httptest.NewServer(server.New(server.Config{Log: slog.New(slog.DiscardHandler)}, g))
	t.Cleanup(srv.Close)
	return srv, g
}

func get(t *testing.T, url string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	// No transparent gzip: the test reads what was sent.
	res, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

// TestDashboardFiles: the page at /, its files under /ui/, each with its type, the
// policy that keeps the page to its own origin, and caching by ETag.
func TestDashboardFiles(t *testing.T) {
	srv, _ := serve(t)
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		path, ctype, contains string
	}{
		{"/", "text/html; charset=utf-8", `<script type="module" src="/ui/app.js">`},
		{"/ui/app.js", "text/javascript; charset=utf-8", "import "},
		{"/ui/terminal.js", "text/javascript; charset=utf-8", "berth.key."},
		{"/ui/style.css", "text/css; charset=utf-8", ":root"},
	} {
		res, body := get(t, srv.URL+tc.path, nil)
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d %s", tc.path, res.StatusCode, body)
			continue
		}
		h := res.Header
		if got := h.Get("Content-Type"); got != tc.ctype {
			t.Errorf("GET %s: Content-Type %q, want %q", tc.path, got, tc.ctype)
		}
		if !bytes.Contains(body, []byte(tc.contains)) {
			t.Errorf("GET %s: the body lacks %q", tc.path, tc.contains)
		}
		csp := h.Get("Content-Security-Policy")
		for _, want := range []string{
			"default-src 'self'", "script-src 'self';", "connect-src 'self' ws://" + host + " wss://" + host + ";",
			"frame-ancestors 'none'", "object-src 'none'", "base-uri 'none'",
		} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %q", tc.path, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-eval") || regexp.MustCompile(`script-src[^;]*unsafe-inline`).MatchString(csp) {
			t.Errorf("GET %s: Content-Security-Policy %q lets scripts run inline or from strings", tc.path, csp)
		}
		for k, want := range map[string]string{
			"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache", "X-Frame-Options": "DENY",
		} {
			if got := h.Get(k); got != want {
				t.Errorf("GET %s: %s %q, want %q", tc.path, k, got, want)
			}
		}
		etag := h.Get("ETag")
		if etag == "" {
			t.Errorf("GET %s: no ETag", tc.path)
			continue
		}
		res, body = get(t, srv.URL+tc.path, map[string]string{"If-None-Match": etag})
		if res.StatusCode != http.StatusNotModified || len(body) != 0 {
			t.Errorf("GET %s with its ETag: %d with %d bytes, want 304 and none", tc.path, res.StatusCode, len(body))
		}
	}
}

// TestDashboardGzip: a client that takes gzip gets the files compressed, with the
// same bytes inside.
func TestDashboardGzip(t *testing.T) {
	srv, _ := serve(t)
	_, plain := get(t, srv.URL+"/ui/app.js", nil)
	res, zipped := get(t, srv.URL+"/ui/app.js", map[string]string{"Accept-Encoding": "gzip, deflate"})
	if res.Header.Get("Content-Encoding") != "gzip" || res.Header.Get("Vary") != "Accept-Encoding" {
		t.Fatalf("Content-Encoding %q, Vary %q", res.Header.Get("Content-Encoding"), res.Header.Get("Vary"))
	}
	zr, err := gzip.NewReader(bytes.NewReader(zipped))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, plain) || len(zipped) >= len(plain) {
		t.Errorf("gzip: %d bytes that unpack to %d, want fewer that unpack to the %d of the file", len(zipped), len(got), len(plain))
	}
	res, _ = get(t, srv.URL+"/ui/app.js", map[string]string{"Accept-Encoding": "gzip;q=0"})
	if res.Header.Get("Content-Encoding") != "" {
		t.Errorf("gzip;q=0 got Content-Encoding %q", res.Header.Get("Content-Encoding"))
	}
}

// TestDashboardNotFound: a file the dashboard does not have is berth's not_found,
// and so are paths that try to leave the embedded directory.
func TestDashboardNotFound(t *testing.T) {
	srv, _ := serve(t)
	for _, p := range []string{"/ui/nope.js", "/ui/index.html", "/ui/../dashboard.go", "/ui/%2e%2e/dashboard.go", "/ui/vendor/xterm/LICENSE", "/ui/"} {
		res, body := get(t, srv.URL+p, nil)
		if res.StatusCode == http.StatusOK {
			t.Errorf("GET %s: 200 %q", p, body)
			continue
		}
		if res.StatusCode == http.StatusNotFound {
			var e struct {
				Error struct{ Class string } `json:"error"`
			}
			if json.Unmarshal(body, &e) != nil || e.Error.Class != "not_found" {
				t.Errorf("GET %s: 404 body %s, want berth's not_found", p, body)
			}
		}
	}
	res, _ := get(t, srv.URL+"/index.html", nil)
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /index.html: %d, want 404 (the page is at /)", res.StatusCode)
	}
}

// TestDashboardHostInPolicy: a Host header that could end the policy's directive is
// left out of it rather than copied.
func TestDashboardHostInPolicy(t *testing.T) {
	g := dashboard.New()
	h := server.New(server.Config{}, g)
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Host = "127.0.0.1:1; script-src *"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if csp := w.Header().Get("Content-Security-Policy"); strings.Contains(csp, "script-src *") {
		t.Errorf("Host %q made it into the policy: %q", req.Host, csp)
	}
}

// TestDashboardTerminalLibrary: the binary carries xterm.js when make
// dashboard-assets put it in assets/vendor before the build, and serves it
// as a module.
func TestDashboardTerminalLibrary(t *testing.T) {
	srv, g := serve(t)
	_, err := os.Stat("assets/vendor/xterm/xterm.mjs")
	if err != nil {
		if g.HasTerminal() {
			t.Fatal("HasTerminal without assets/vendor/xterm/xterm.mjs")
		}
		if os.Getenv("CI") == "true" {
			t.Fatal("assets/vendor/xterm is missing (make dashboard-assets), and CI=true turns the skip into a failure")
		}
		t.Skip("built without make dashboard-assets: the dashboard's terminal says it is unavailable")
	}
	if !g.HasTerminal() {
		t.Fatal("assets/vendor/xterm/xterm.mjs exists but the group has no terminal library")
	}
	for path, ctype := range map[string]string{
		"/ui/vendor/xterm/xterm.mjs": "text/javascript; charset=utf-8", "/ui/vendor/xterm/addon-fit.mjs": "text/javascript; charset=utf-8",
		"/ui/vendor/xterm/xterm.css": "text/css; charset=utf-8",
	} {
		res, body := get(t, srv.URL+path, nil)
		if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != ctype {
			t.Errorf("GET %s: %d %q", path, res.StatusCode, res.Header.Get("Content-Type"))
		}
		if bytes.Contains(body, []byte("sourceMappingURL")) {
			t.Errorf("GET %s names a source map the dashboard does not serve", path)
		}
	}
}
