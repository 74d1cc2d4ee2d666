package mcpserver_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/mcpserver"
)

// The tools berth mcp serves; the suite calls every one.
var allTools = []string{
	"get_or_create_sandbox", "create_sandbox", "list_sandboxes", "delete_sandbox", "stop_sandbox", "start_sandbox",
	"execute", "read_file", "write_file", "edit_file", "ls", "glob", "grep", "upload", "download",
}

func newClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "berth-test", Version: "1"}, nil)
}

// stdioSession runs the real `berth mcp` as an MCP host does, over stdio.
func stdioSession(t testing.TB, url string) *mcp.ClientSession {
	t.Helper()
	var stderr testutil.Buffer
	cmd := exec.Command(testutil.Berth(t), "mcp", "--url", url)
	cmd.Env = append(os.Environ(), "BERTH_API_KEY="+keyFor(url))
	cmd.Stderr = &stderr
	s, err := newClient().Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to berth mcp over stdio: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Logf("berth mcp stderr:\n%s", stderr.String())
		}
	})
	return s
}

// httpSession runs `berth mcp --http` on a loopback port and connects to it
// with the SDK's streamable HTTP client.
func httpSession(t testing.TB, url string) *mcp.ClientSession {
	t.Helper()
	addr := testutil.FreeAddr(t)
	var stderr testutil.Buffer
	cmd := exec.Command(testutil.Berth(t), "mcp", "--url", url, "--http", addr)
	token := "mcp-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cmd.Env = append(os.Environ(), "BERTH_API_KEY="+keyFor(url), "BERTH_MCP_TOKEN="+token)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("berth mcp --http after SIGTERM: %v", err)
		}
		if t.Failed() {
			t.Logf("berth mcp stderr:\n%s", stderr.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("berth mcp --http %s did not listen: %v\n%s", addr, err, stderr.String())
		}
	}
	hc := &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}}
	s, err := newClient().Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect over streamable HTTP: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// bearer adds the server's token to every request, as an MCP host's
// config of headers does.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// inMemorySession serves mcpserver.New in-process over the SDK's in-memory
// transport.
func inMemorySession(t testing.TB, url string) *mcp.ClientSession {
	t.Helper()
	c := mustClient(t, url)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := mcpserver.New(c, mcpserver.Options{Version: "test"}).Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := newClient().Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

// TestMCPStdio drives every tool, the resource template and the malformed
// calls through the real `berth mcp` over stdio.
func TestMCPStdio(t *testing.T) {
	d := startDaemon(t)
	runSuite(t, stdioSession(t, d.url), d)
}

// TestMCPHTTP is TestMCPStdio over streamable HTTP on loopback.
func TestMCPHTTP(t *testing.T) {
	d := startDaemon(t)
	runSuite(t, httpSession(t, d.url), d)
}

// TestMCPDaemonDown: with no daemon at the URL the server still starts, and
// a tool call is a tool error that names the URL, over every transport.
func TestMCPDaemonDown(t *testing.T) {
	url := "http://" + testutil.FreeAddr(t)
	for name, connect := range map[string]func(testing.TB, string) *mcp.ClientSession{
		"stdio": stdioSession, "http": httpSession, "memory": inMemorySession,
	} {
		t.Run(name, func(t *testing.T) {
			s := connect(t, url)
			for _, c := range []struct {
				tool string
				args map[string]any
			}{
				{"list_sandboxes", map[string]any{}},
				{"execute", map[string]any{"sandbox_id": "sb-x", "command": "true"}},
				{"get_or_create_sandbox", map[string]any{"labels": map[string]string{"conversation": "c1"}}},
			} {
				msg := toolError(t, s, c.tool, c.args)
				for _, want := range []string{"unavailable", "not reachable at " + url, "berth serve"} {
					if !strings.Contains(msg, want) {
						t.Errorf("%s with the daemon down: %q lacks %q", c.tool, msg, want)
					}
				}
			}
			_, err := s.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: mcpserver.FileURI("sb-x", "/etc/hostname")})
			if err == nil || !strings.Contains(err.Error(), url) {
				t.Errorf("resource read with the daemon down: %v, want an error naming %s", err, url)
			}
		})
	}
}

// TestMCPHTTPNeedsAToken: berth mcp --http refuses to start without
// BERTH_MCP_TOKEN unless told to serve anyone, and refuses a short token.
func TestMCPHTTPNeedsAToken(t *testing.T) {
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, nil, "BERTH_MCP_TOKEN"},
		{[]string{"BERTH_MCP_TOKEN=short"}, nil, "at least 16"},
		{[]string{"BERTH_MCP_TOKEN=long-enough-token-x"}, []string{"--insecure-no-auth"}, "choose one"},
	} {
		cmd := exec.Command(testutil.Berth(t), append([]string{"mcp", "--url", "http://127.0.0.1:1", "--http", testutil.FreeAddr(t)}, c.args...)...)
		cmd.Env = append(os.Environ(), append([]string{"BERTH_MCP_TOKEN="}, c.env...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("berth mcp --http %v with %v: %v, %q; want a refusal naming %s", c.args, c.env, err, out, c.want)
		}
	}
}

// TestMCPHTTPLoopbackOnly: berth mcp refuses to serve HTTP off loopback.
func TestMCPHTTPLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:7681", "[::]:7681", "192.0.2.1:7681", "example.com:7681", "7681"} {
		out, err := exec.Command(testutil.Berth(t), "mcp", "--url", "http://127.0.0.1:1", "--http", addr).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--http") {
			t.Errorf("berth mcp --http %s: %v, %q; want a refusal naming --http", addr, err, out)
		}
		if strings.Contains(string(out), "not reachable") {
			t.Errorf("berth mcp --http %s: checked the daemon before the address: %q", addr, out)
		}
	}
}

// TestExample runs examples/mcp as CI would: go run, against a daemon.
func TestExample(t *testing.T) {
	d := startDaemon(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "go", "run", "./examples/mcp")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BERTH_URL="+d.url, "BERTH_API_KEY="+keyFor(d.url), "BERTH_BINARY="+testutil.Berth(t))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./examples/mcp: %v\n%s", err, out)
	}
	for _, want := range []string{"hello from a berth sandbox", "[exit code 0]", "Deleted sandbox"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("examples/mcp output lacks %q:\n%s", want, out)
		}
	}
	if list, _ := d.client.ListSandboxes(t.Context(), nil); len(list) != 0 {
		t.Errorf("examples/mcp left %d sandboxes", len(list))
	}
}

// call runs a tool that must succeed and returns its result.
func call(t *testing.T, s *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): protocol error %v", tool, args, err)
	}
	if res.IsError {
		t.Fatalf("%s(%v): tool error %s", tool, args, text(res))
	}
	return res
}

// toolError runs a tool that must end in a tool error (isError) and returns
// its text.
func toolError(t *testing.T, s *mcp.ClientSession, tool string, args any) string {
	t.Helper()
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): protocol error %v, want a tool error", tool, args, err)
	}
	if !res.IsError {
		t.Fatalf("%s(%v): succeeded (%s), want a tool error", tool, args, text(res))
	}
	if res.StructuredContent != nil {
		t.Errorf("%s: tool error with structured content %v", tool, res.StructuredContent)
	}
	return text(res)
}

// protocolError runs a malformed call that must be a JSON-RPC error with
// code and a message containing want.
func protocolError(t *testing.T, s *mcp.ClientSession, tool string, args any, code int64, want string) {
	t.Helper()
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err == nil {
		t.Fatalf("%s(%v): result %v (isError %t), want a protocol error", tool, args, text(res), res.IsError)
	}
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Fatalf("%s(%v): %v, want a JSON-RPC error with code %d", tool, args, err, code)
	}
	if !strings.Contains(we.Message, want) {
		t.Errorf("%s(%v): message %q lacks %q", tool, args, we.Message, want)
	}
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// out decodes a result's structured content.
func out[T any](t *testing.T, res *mcp.CallToolResult) T {
	t.Helper()
	var v T
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return v
}

type sandbox struct {
	ID      string            `json:"id"`
	State   string            `json:"state"`
	Labels  map[string]string `json:"labels"`
	Workdir string            `json:"workdir"`
	Limits  struct {
		MemoryBytes int64 `json:"memory_bytes"`
	} `json:"limits"`
}

type execResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
	OOMKilled       bool   `json:"oom_killed"`
}

func runSuite(t *testing.T, s *mcp.ClientSession, d *daemon) {
	ctx := t.Context()
	conv := "conv-" + strings.ToLower(t.Name())

	// Discovery: every tool, each with a described, object input schema
	// and an output schema.
	tools, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		schema, _ := json.Marshal(tool.InputSchema)
		if tool.Description == "" || !bytes.Contains(schema, []byte(`"type":"object"`)) || tool.OutputSchema == nil {
			t.Errorf("tool %s: description %q, input schema %s, output schema %v", tool.Name, tool.Description, schema, tool.OutputSchema)
		}
		if bytes.Contains(schema, []byte(`"sandbox_id"`)) && !bytes.Contains(schema, []byte("as get_or_create_sandbox")) {
			t.Errorf("tool %s: sandbox_id has no description: %s", tool.Name, schema)
		}
	}
	slices.Sort(names)
	want := slices.Clone(allTools)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	// One sandbox per conversation.
	res := call(t, s, "get_or_create_sandbox", map[string]any{"labels": map[string]string{"conversation": conv}})
	first := out[struct {
		Sandbox sandbox `json:"sandbox"`
		Created bool    `json:"created"`
	}](t, res)
	if !first.Created || first.Sandbox.ID == "" || first.Sandbox.State != "running" || !strings.Contains(text(res), first.Sandbox.ID) {
		t.Fatalf("get_or_create_sandbox: %+v, %q", first, text(res))
	}
	id := first.Sandbox.ID
	again := out[struct {
		Sandbox sandbox `json:"sandbox"`
		Created bool    `json:"created"`
	}](t, call(t, s, "get_or_create_sandbox", map[string]any{"labels": map[string]string{"conversation": conv}}))
	if again.Created || again.Sandbox.ID != id {
		t.Fatalf("second get_or_create_sandbox: %+v, want sandbox %s found", again, id)
	}

	// create_sandbox with a memory limit; list_sandboxes by label.
	small := out[sandbox](t, call(t, s, "create_sandbox", map[string]any{"labels": map[string]string{"role": "small"}, "memory_mb": 64, "network": "none"}))
	if small.ID == "" || small.ID == id || small.Limits.MemoryBytes != 64<<20 {
		t.Fatalf("create_sandbox: %+v", small)
	}
	listed := out[struct {
		Sandboxes []sandbox `json:"sandboxes"`
	}](t, call(t, s, "list_sandboxes", map[string]any{"labels": map[string]string{"role": "small"}}))
	if len(listed.Sandboxes) != 1 || listed.Sandboxes[0].ID != small.ID {
		t.Errorf("list_sandboxes role=small: %+v, want only %s", listed, small.ID)
	}
	all := call(t, s, "list_sandboxes", map[string]any{})
	if n := len(out[struct {
		Sandboxes []sandbox `json:"sandboxes"`
	}](t, all).Sandboxes); n != 2 || !strings.Contains(text(all), id) || !strings.Contains(text(all), small.ID) {
		t.Errorf("list_sandboxes: %d sandboxes, %q", n, text(all))
	}
	if msg := toolError(t, s, "create_sandbox", map[string]any{"network": "allowlist", "allow": []string{"not a domain!"}}); !strings.Contains(msg, "invalid_argument") {
		t.Errorf("create_sandbox with a bad allow entry: %q", msg)
	}
	// 2^44 MiB would wrap to 0 bytes (the daemon's default: no limit) once
	// shifted: refused, naming the argument.
	if msg := toolError(t, s, "create_sandbox", map[string]any{"memory_mb": int64(1) << 44}); !strings.Contains(msg, "memory_mb") {
		t.Errorf("create_sandbox with a wrapping memory_mb: %q", msg)
	}

	t.Run("execute", func(t *testing.T) {
		res := call(t, s, "execute", map[string]any{"sandbox_id": id, "command": "echo hello; echo oops >&2; exit 3"})
		r := out[execResult](t, res)
		if r.ExitCode != 3 || r.Stdout != "hello\n" || r.Stderr != "oops\n" || r.TimedOut || r.OOMKilled {
			t.Errorf("execute: %+v", r)
		}
		if want := "[exit code 3]\nhello\n[stderr]\noops\n"; text(res) != want {
			t.Errorf("execute text %q, want %q", text(res), want)
		}
		r = out[execResult](t, call(t, s, "execute", map[string]any{"sandbox_id": id, "command": "pwd; echo $FOO; cat",
			"cwd": "/tmp", "env": map[string]string{"FOO": "bar"}, "stdin": "from stdin"}))
		if r.Stdout != "/tmp\nbar\nfrom stdin" || r.ExitCode != 0 {
			t.Errorf("execute with cwd, env and stdin: %+v", r)
		}
		res = call(t, s, "execute", map[string]any{"sandbox_id": id, "command": "sleep 30", "timeout": 1})
		if r := out[execResult](t, res); !r.TimedOut || !strings.Contains(text(res), "timed out after 1s") {
			t.Errorf("execute past its timeout: %+v, %q", r, text(res))
		}
		res = call(t, s, "execute", map[string]any{"sandbox_id": id, "command": "head -c 5000 /dev/zero | tr '\\0' a", "max_output_bytes": 1000})
		if r := out[execResult](t, res); !r.StdoutTruncated || len(r.Stdout) != 1000 || !strings.Contains(text(res), "[stdout truncated") {
			t.Errorf("execute over max_output_bytes: truncated=%t, %d bytes, %q", r.StdoutTruncated, len(r.Stdout), text(res)[1000:])
		}
		// The shell survives its child's OOM kill and exits 137: still oom_killed.
		for _, cmd := range []string{"python3 -c 'b = bytearray(1 << 30)'", "python3 -c 'b = bytearray(1 << 30)'; exit $?", "exec python3 -c 'b = bytearray(1 << 30)'"} {
			res = call(t, s, "execute", map[string]any{"sandbox_id": small.ID, "command": cmd, "timeout": 60})
			if r := out[execResult](t, res); !r.OOMKilled || r.ExitCode != 137 || !strings.Contains(text(res), "out of memory") {
				t.Errorf("execute %q over the memory limit: %+v, %q", cmd, r, text(res))
			}
		}
		// A plain kill -9 is not an OOM kill.
		res = call(t, s, "execute", map[string]any{"sandbox_id": small.ID, "command": "sh -c 'kill -9 $$'; exit $?"})
		if r := out[execResult](t, res); r.OOMKilled || r.ExitCode != 137 {
			t.Errorf("execute of a kill -9: %+v", r)
		}
	})

	t.Run("files", func(t *testing.T) {
		res := call(t, s, "write_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt", "content": "one\ntwo\nthree\ntwo\n"})
		if w := out[struct {
			Path  string `json:"path"`
			Bytes int    `json:"bytes"`
		}](t, res); w.Path != "/home/user/notes/a.txt" || w.Bytes != 18 {
			t.Errorf("write_file: %+v", w)
		}
		res = call(t, s, "read_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt"})
		if want := "     1\tone\n     2\ttwo\n     3\tthree\n     4\ttwo"; text(res) != want {
			t.Errorf("read_file: %q, want %q", text(res), want)
		}
		res = call(t, s, "read_file", map[string]any{"sandbox_id": id, "path": "/home/user/notes/a.txt", "offset": 1, "limit": 2})
		page := out[struct {
			TotalLines int    `json:"total_lines"`
			NextOffset int    `json:"next_offset"`
			Content    string `json:"content"`
		}](t, res)
		if page.TotalLines != 4 || page.NextOffset != 3 || page.Content != "     2\ttwo\n     3\tthree" || !strings.Contains(text(res), "offset=3") {
			t.Errorf("read_file page: %+v, %q", page, text(res))
		}
		if msg := toolError(t, s, "read_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt", "offset": 10}); !strings.Contains(msg, "past the end") {
			t.Errorf("read_file past the end: %q", msg)
		}
		msg := toolError(t, s, "read_file", map[string]any{"sandbox_id": id, "path": "/no/such/file"})
		if !strings.Contains(msg, "Error (not_found)") || !strings.Contains(msg, "/no/such/file") {
			t.Errorf("read_file of a missing file: %q", msg)
		}

		// edit_file: one occurrence, all of them, and the daemon's refusals.
		if msg := toolError(t, s, "edit_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt", "old_string": "two", "new_string": "2"}); !strings.Contains(msg, "invalid_argument") {
			t.Errorf("edit_file of an ambiguous string: %q", msg)
		}
		res = call(t, s, "edit_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt", "old_string": "three", "new_string": "THREE"})
		if e := out[struct{ Occurrences int }](t, res); e.Occurrences != 1 {
			t.Errorf("edit_file: %+v", e)
		}
		res = call(t, s, "edit_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt", "old_string": "two", "new_string": "TWO", "replace_all": true})
		if e := out[struct{ Occurrences int }](t, res); e.Occurrences != 2 || !strings.Contains(text(res), "2 occurrence") {
			t.Errorf("edit_file replace_all: %+v, %q", e, text(res))
		}
		if msg := toolError(t, s, "edit_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt", "old_string": "absent", "new_string": "x"}); !strings.Contains(msg, "Error (") {
			t.Errorf("edit_file of an absent string: %q", msg)
		}

		// ls, glob, grep.
		call(t, s, "write_file", map[string]any{"sandbox_id": id, "path": "notes/sub/b.md", "content": "TWO words\n"})
		res = call(t, s, "ls", map[string]any{"sandbox_id": id, "path": "notes"})
		if want := "/home/user/notes/a.txt (18 bytes)\n/home/user/notes/sub/"; text(res) != want {
			t.Errorf("ls: %q, want %q", text(res), want)
		}
		if l := out[struct{ Entries []struct{ Path, Type string } }](t, res); len(l.Entries) != 2 || l.Entries[1].Type != "dir" {
			t.Errorf("ls entries: %+v", l)
		}
		if res = call(t, s, "ls", map[string]any{"sandbox_id": id}); !strings.Contains(text(res), "/home/user/notes/") {
			t.Errorf("ls of the workdir: %q", text(res))
		}
		if msg := toolError(t, s, "ls", map[string]any{"sandbox_id": id, "path": "/nope"}); !strings.Contains(msg, "not_found") {
			t.Errorf("ls of a missing directory: %q", msg)
		}
		res = call(t, s, "glob", map[string]any{"sandbox_id": id, "pattern": "*.md"})
		if text(res) != "/home/user/notes/sub/b.md" {
			t.Errorf("glob *.md: %q", text(res))
		}
		if res = call(t, s, "glob", map[string]any{"sandbox_id": id, "pattern": "*.none"}); !strings.Contains(text(res), "No files match") {
			t.Errorf("glob without matches: %q", text(res))
		}
		res = call(t, s, "grep", map[string]any{"sandbox_id": id, "pattern": "two", "path": "notes", "ignore_case": true})
		if want := "/home/user/notes/a.txt:2:TWO\n/home/user/notes/a.txt:4:TWO\n/home/user/notes/sub/b.md:1:TWO words"; text(res) != want {
			t.Errorf("grep: %q, want %q", text(res), want)
		}
		res = call(t, s, "grep", map[string]any{"sandbox_id": id, "pattern": "^T.O$", "regex": true, "glob": "*.txt", "path": "notes"})
		if g := out[struct {
			Matches []struct{ Line int }
		}](t, res); len(g.Matches) != 2 {
			t.Errorf("grep regex with glob: %q", text(res))
		}
		if msg := toolError(t, s, "grep", map[string]any{"sandbox_id": id, "pattern": "(", "regex": true}); !strings.Contains(msg, "invalid_argument") {
			t.Errorf("grep with a bad regex: %q", msg)
		}

		// upload and download, text and binary.
		bin := make([]byte, 256)
		for i := range bin {
			bin[i] = byte(i)
		}
		res = call(t, s, "upload", map[string]any{"sandbox_id": id, "path": "/home/user/bin/data.bin", "base64": base64.StdEncoding.EncodeToString(bin)})
		if u := out[struct {
			Path string
			Size int64
		}](t, res); u.Size != 256 || u.Path != "/home/user/bin/data.bin" {
			t.Errorf("upload base64: %+v", u)
		}
		call(t, s, "upload", map[string]any{"sandbox_id": id, "path": "bin/hi.sh", "text": "#!/bin/sh\necho hi from a script\n", "mode": "755"})
		if r := out[execResult](t, call(t, s, "execute", map[string]any{"sandbox_id": id, "command": "bin/hi.sh && od -An -tu1 -N4 bin/data.bin"})); r.Stdout != "hi from a script\n   0   1   2   3\n" || r.ExitCode != 0 {
			t.Errorf("uploaded files: %+v", r)
		}
		if msg := toolError(t, s, "upload", map[string]any{"sandbox_id": id, "path": "x", "text": "a", "base64": "YQ=="}); !strings.Contains(msg, "only one") {
			t.Errorf("upload with text and base64: %q", msg)
		}
		if msg := toolError(t, s, "upload", map[string]any{"sandbox_id": id, "path": "x"}); !strings.Contains(msg, "text, base64") {
			t.Errorf("upload without content: %q", msg)
		}
		if msg := toolError(t, s, "upload", map[string]any{"sandbox_id": id, "path": "x", "base64": "%%%"}); !strings.Contains(msg, "base64") {
			t.Errorf("upload of bad base64: %q", msg)
		}
		if msg := toolError(t, s, "upload", map[string]any{"sandbox_id": id, "path": "x", "text": "a", "mode": "9"}); !strings.Contains(msg, "mode") {
			t.Errorf("upload with a bad mode: %q", msg)
		}

		res = call(t, s, "download", map[string]any{"sandbox_id": id, "path": "notes/sub/b.md"})
		if text(res) != "TWO words\n" || out[struct{ Encoding string }](t, res).Encoding != "text" {
			t.Errorf("download of text: %q", text(res))
		}
		res = call(t, s, "download", map[string]any{"sandbox_id": id, "path": "bin/data.bin"})
		dl := out[struct {
			URI, Encoding, Content string
			MIMEType               string `json:"mime_type"`
		}](t, res)
		if dl.Encoding != "base64" || dl.Content != base64.StdEncoding.EncodeToString(bin) || dl.URI != mcpserver.FileURI(id, "/home/user/bin/data.bin") {
			t.Errorf("download of binary: %+v", dl)
		}
		var embedded *mcp.EmbeddedResource
		for _, c := range res.Content {
			if e, ok := c.(*mcp.EmbeddedResource); ok {
				embedded = e
			}
		}
		if embedded == nil || !bytes.Equal(embedded.Resource.Blob, bin) || embedded.Resource.MIMEType != "application/octet-stream" {
			t.Errorf("download of binary: embedded resource %+v", embedded)
		}
		res = call(t, s, "download", map[string]any{"sandbox_id": id, "path": "notes/sub/b.md", "encoding": "base64"})
		if out[struct{ Content string }](t, res).Content != base64.StdEncoding.EncodeToString([]byte("TWO words\n")) {
			t.Errorf("download as base64: %q", text(res))
		}
		if msg := toolError(t, s, "download", map[string]any{"sandbox_id": id, "path": "bin/data.bin", "encoding": "text"}); !strings.Contains(msg, "not UTF-8 text") {
			t.Errorf("download of binary as text: %q", msg)
		}
		if msg := toolError(t, s, "download", map[string]any{"sandbox_id": id, "path": "notes"}); !strings.Contains(msg, "not a regular file") {
			t.Errorf("download of a directory: %q", msg)
		}
	})

	t.Run("resources", func(t *testing.T) {
		tmpl, err := s.ListResourceTemplates(ctx, nil)
		if err != nil || len(tmpl.ResourceTemplates) != 1 || tmpl.ResourceTemplates[0].URITemplate != "berth://sandbox/{sandbox_id}/{+path}" {
			t.Fatalf("resource templates: %+v, %v", tmpl, err)
		}
		call(t, s, "write_file", map[string]any{"sandbox_id": id, "path": "dir with space/q&a.json", "content": `{"a": 1}`})
		r, err := s.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.FileURI(id, "/home/user/dir with space/q&a.json")})
		if err != nil || len(r.Contents) != 1 || r.Contents[0].Text != `{"a": 1}` || r.Contents[0].MIMEType != "application/json" {
			t.Errorf("read a text resource: %+v, %v", r, err)
		}
		r, err = s.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.FileURI(id, "/home/user/bin/data.bin")})
		if err != nil || len(r.Contents) != 1 || len(r.Contents[0].Blob) != 256 || r.Contents[0].Text != "" {
			t.Errorf("read a binary resource: %+v, %v", r, err)
		}
		_, err = s.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.FileURI(id, "/no/such/file")})
		var we *jsonrpc.Error
		if !errors.As(err, &we) || we.Code != mcp.CodeResourceNotFound {
			t.Errorf("read a missing resource: %v, want code %d", err, mcp.CodeResourceNotFound)
		}
		_, err = s.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.FileURI("sb-nope", "/etc/hostname")})
		if !errors.As(err, &we) || we.Code != mcp.CodeResourceNotFound {
			t.Errorf("read a resource of a missing sandbox: %v", err)
		}
	})

	t.Run("malformed", func(t *testing.T) {
		protocolError(t, s, "no_such_tool", map[string]any{}, jsonrpc.CodeInvalidParams, "unknown tool")
		protocolError(t, s, "execute", map[string]any{"sandbox_id": id}, jsonrpc.CodeInvalidParams, "command")
		protocolError(t, s, "execute", nil, jsonrpc.CodeInvalidParams, "missing properties")
		protocolError(t, s, "execute", []int{1, 2}, jsonrpc.CodeInvalidParams, "JSON object")
		protocolError(t, s, "execute", map[string]any{"command": "true"}, jsonrpc.CodeInvalidParams, "sandbox_id")
		protocolError(t, s, "execute", map[string]any{"sandbox_id": id, "command": "true", "timeout": "soon"}, jsonrpc.CodeInvalidParams, "timeout")
		protocolError(t, s, "execute", map[string]any{"sandbox_id": id, "command": "true", "timeout": -1}, jsonrpc.CodeInvalidParams, "timeout")
		// A timeout that would wrap to 290 ms once made a duration.
		protocolError(t, s, "execute", map[string]any{"sandbox_id": id, "command": "true", "timeout": int64(18446744074)}, jsonrpc.CodeInvalidParams, "timeout")
		protocolError(t, s, "execute", map[string]any{"sandbox_id": id, "command": "true", "bogus": 1}, jsonrpc.CodeInvalidParams, "bogus")
		protocolError(t, s, "execute", map[string]any{"sandbox_id": "", "command": "true"}, jsonrpc.CodeInvalidParams, "sandbox_id")
		protocolError(t, s, "read_file", map[string]any{"sandbox_id": id, "path": 7}, jsonrpc.CodeInvalidParams, "path")
		protocolError(t, s, "get_or_create_sandbox", map[string]any{}, jsonrpc.CodeInvalidParams, "labels")
		protocolError(t, s, "get_or_create_sandbox", map[string]any{"labels": map[string]string{}}, jsonrpc.CodeInvalidParams, "labels")
		protocolError(t, s, "create_sandbox", map[string]any{"network": "everywhere"}, jsonrpc.CodeInvalidParams, "network")
		protocolError(t, s, "download", map[string]any{"sandbox_id": id, "path": "x", "encoding": "hex"}, jsonrpc.CodeInvalidParams, "encoding")
		protocolError(t, s, "edit_file", map[string]any{"sandbox_id": id, "path": "x", "old_string": "a", "new_string": []string{"b"}}, jsonrpc.CodeInvalidParams, "new_string")
		// The session is still good.
		if err := s.Ping(ctx, nil); err != nil {
			t.Fatalf("ping after malformed calls: %v", err)
		}
	})

	t.Run("lifecycle", func(t *testing.T) {
		if v := out[sandbox](t, call(t, s, "stop_sandbox", map[string]any{"sandbox_id": id})); v.State != "stopped" {
			t.Errorf("stop_sandbox: %+v", v)
		}
		if msg := toolError(t, s, "execute", map[string]any{"sandbox_id": id, "command": "true"}); !strings.Contains(msg, "Error (") {
			t.Errorf("execute in a stopped sandbox: %q", msg)
		}
		if v := out[sandbox](t, call(t, s, "start_sandbox", map[string]any{"sandbox_id": id})); v.State != "running" {
			t.Errorf("start_sandbox: %+v", v)
		}
		if r := out[execResult](t, call(t, s, "execute", map[string]any{"sandbox_id": id, "command": "cat notes/sub/b.md"})); r.Stdout != "TWO words\n" {
			t.Errorf("files after stop and start: %+v", r)
		}
		for _, sb := range []string{small.ID, id} {
			if res := call(t, s, "delete_sandbox", map[string]any{"sandbox_id": sb}); !strings.Contains(text(res), sb) {
				t.Errorf("delete_sandbox: %q", text(res))
			}
		}
		msg := toolError(t, s, "execute", map[string]any{"sandbox_id": id, "command": "true"})
		if !strings.Contains(msg, "Error (not_found)") || !strings.Contains(msg, id) || !strings.Contains(msg, "list_sandboxes") {
			t.Errorf("execute in a deleted sandbox: %q", msg)
		}
		if msg := toolError(t, s, "delete_sandbox", map[string]any{"sandbox_id": id}); !strings.Contains(msg, "not_found") {
			t.Errorf("delete_sandbox twice: %q", msg)
		}
		if list, err := d.client.ListSandboxes(ctx, nil); err != nil || len(list) != 0 {
			t.Errorf("sandboxes left: %v, %v", list, err)
		}
	})
}
