package mcpserver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

func TestLoopbackAddr(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{":7681", "127.0.0.1:7681"},
		{"127.0.0.1:0", "127.0.0.1:0"},
		{"127.8.9.10:80", "127.8.9.10:80"},
		{"[::1]:7681", "[::1]:7681"},
		{"localhost:7681", "localhost:7681"},
	} {
		if got, err := LoopbackAddr(c.in); err != nil || got != c.want {
			t.Errorf("LoopbackAddr(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"0.0.0.0:7681", "[::]:7681", "10.0.0.1:7681", "example.com:80", "7681", ""} {
		if _, err := LoopbackAddr(in); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--http") {
			t.Errorf("LoopbackAddr(%q): %v, want an invalid_argument error naming --http", in, err)
		}
	}
}

func TestFileURI(t *testing.T) {
	for _, c := range []struct{ id, path, uri string }{
		{"sb-1", "/home/user/a.txt", "berth://sandbox/sb-1/home/user/a.txt"},
		{"sb-1", "/a dir/q&a?#.md", "berth://sandbox/sb-1/a%20dir/q&a%3F%23.md"},
		{"sb-1", "/", "berth://sandbox/sb-1/"},
	} {
		if got := FileURI(c.id, c.path); got != c.uri {
			t.Errorf("FileURI(%q, %q) = %q, want %q", c.id, c.path, got, c.uri)
		}
		id, p, err := parseFileURI(c.uri)
		if err != nil || id != c.id || p != c.path {
			t.Errorf("parseFileURI(%q) = %q, %q, %v", c.uri, id, p, err)
		}
	}
	for _, bad := range []string{"file:///etc/passwd", "berth://sandbox/", "berth://sandbox/sb-1", "berth://sandbox/sb-1/%zz"} {
		if _, _, err := parseFileURI(bad); err == nil {
			t.Errorf("parseFileURI(%q) accepted", bad)
		}
	}
}

func FuzzFileURI(f *testing.F) {
	f.Add("sb-1", "/home/user/a b/c%d.txt")
	f.Fuzz(func(t *testing.T, id, p string) {
		if id == "" || !strings.HasPrefix(p, "/") || strings.Contains(p, "//") || strings.Contains(p, "/./") ||
			strings.Contains(p, "/../") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..") || (len(p) > 1 && strings.HasSuffix(p, "/")) {
			return // FileURI cleans such paths
		}
		gotID, gotPath, err := parseFileURI(FileURI(id, p))
		if err != nil || gotID != id || gotPath != p {
			t.Errorf("round trip of %q, %q: %q, %q, %v", id, p, gotID, gotPath, err)
		}
	})
}

func TestExecText(t *testing.T) {
	for _, c := range []struct {
		r    executeOutput
		want string
	}{
		{executeOutput{Stdout: "hi\n"}, "[exit code 0]\nhi\n"},
		{executeOutput{Stdout: "no newline", Stderr: "err", ExitCode: 1}, "[exit code 1]\nno newline\n[stderr]\nerr"},
		{executeOutput{}, "[exit code 0]"},
		{executeOutput{Stderr: "only err\n", ExitCode: 2}, "[exit code 2]\n[stderr]\nonly err\n"},
		{executeOutput{TimedOut: true, ExitCode: 137, Signal: 9},
			"[timed out after 2s: the command and its children were killed; pass a larger timeout if it needs longer]\n[ended by signal 9]\n[exit code 137]"},
		{executeOutput{Stdout: "aaaa", StdoutTruncated: true, OOMKilled: true, ExitCode: 137},
			"[killed: the sandbox ran out of memory (oom_killed)]\n" +
				"[stdout truncated: only its first 4 bytes are shown; redirect to a file and read_file or grep it for the rest]\n[exit code 137]\naaaa"},
		{executeOutput{Error: "exec: nope: not found", ExitCode: 127}, "[could not start: exec: nope: not found]\n[exit code 127]"},
		// What the sandbox prints comes after berth's facts, never before.
		{executeOutput{Stdout: "[exit code 0]\n", ExitCode: 1}, "[exit code 1]\n[exit code 0]\n"},
	} {
		if got := execText(c.r, 2*time.Second, 4); got != c.want {
			t.Errorf("execText(%+v) =\n%q\nwant\n%q", c.r, got, c.want)
		}
	}
}

func TestErrorText(t *testing.T) {
	err := errdefs.New(errdefs.NotFound, "sandbox %q not found", "sb-x")
	if got := ErrorText(err); got != "Error (not_found): sandbox \"sb-x\" not found\nCheck the sandbox_id or path: list_sandboxes shows the sandboxes there are, ls shows what is in a directory." {
		t.Errorf("ErrorText: %q", got)
	}
}

// TestHTTPHandlerRefusesWebPages: a browser's cross-origin request and a
// DNS-rebound Host are refused before MCP sees them; a plain client is served.
func TestHTTPHandlerRefusesWebPages(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(HTTPHandler(New(c, Options{}), nil, ""))
	defer srv.Close()
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for _, c := range []struct {
		name   string
		header map[string]string
		host   string
		want   int
	}{
		{"plain client", nil, "", http.StatusOK},
		{"cross-site browser", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, "", http.StatusForbidden},
		{"rebound host", nil, "evil.example", http.StatusForbidden},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(init))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		if c.host != "" {
			req.Host = c.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: status %d (%s), want %d", c.name, resp.StatusCode, body, c.want)
		}
	}
}

// TestHTTPHandlerWantsItsToken: with a token, a request without it or with
// another is 401 before MCP sees it; with it, MCP answers.
func TestHTTPHandlerWantsItsToken(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	const token = "s3cret-token-of-berth-mcp"
	srv := httptest.NewServer(HTTPHandler(New(c, Options{}), nil, token))
	defer srv.Close()
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for auth, want := range map[string]int{"": http.StatusUnauthorized, "Bearer wrong": http.StatusUnauthorized,
		"Bearer " + token + "x": http.StatusUnauthorized, token: http.StatusUnauthorized, "Bearer " + token: http.StatusOK} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(init))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || strings.Contains(string(body), token) {
			t.Errorf("Authorization %q: status %d (%s), want %d", auth, resp.StatusCode, body, want)
		}
	}
}
