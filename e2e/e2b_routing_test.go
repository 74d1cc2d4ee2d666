package e2e

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/e2b/envd/process"
	"github.com/berthsh/berth/api/e2b/envd/process/processconnect"
)

// TestE2BRouting checks how envd requests find their sandbox: by header
// (E2B_SANDBOX_URL) or by the host 49983-ID.DOMAIN, with the access token
// or a signed file URL, and what the SDKs get when they miss.
func TestE2BRouting(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.client.DeleteSandbox(ctx, sb.ID) })
	port := d.listen[strings.LastIndex(d.listen, ":")+1:]
	envdHost := "49983-" + sb.ID + ".berth.localhost:" + port

	do := func(method, path string, h map[string]string, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, d.url+path, strings.NewReader(body))
		for k, v := range h {
			if k == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}

	// The control API's health and envd's, by header and by host.
	if code, _ := do("GET", "/health", nil, ""); code != http.StatusNoContent {
		t.Errorf("control health: %d", code)
	}
	if code, body := do("GET", "/health", map[string]string{"E2b-Sandbox-Id": sb.ID, "X-Access-Token": sb.AccessToken}, ""); code != http.StatusNoContent {
		t.Errorf("envd health by header: %d %s", code, body)
	}
	if code, body := do("GET", "/health", map[string]string{"Host": envdHost, "X-Access-Token": sb.AccessToken}, ""); code != http.StatusNoContent {
		t.Errorf("envd health by host: %d %s", code, body)
	}

	// A Connect call by host: the client's URL names the sandbox.
	hc := &http.Client{Transport: headerTransport{h: http.Header{"X-Access-Token": {sb.AccessToken}}, next: hostTransport{host: envdHost}}}
	pc := processconnect.NewProcessClient(hc, d.url, connect.WithProtoJSON())
	stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/echo", Args: []string{"by host"}}}))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for stream.Receive() {
		if d := stream.Msg().GetEvent().GetData(); d != nil {
			out.Write(d.GetStdout())
		}
	}
	if err := stream.Err(); err != nil || out.String() != "by host\n" {
		t.Fatalf("start by host: %q, %v", out.String(), err)
	}

	// Signed file URLs (the SDK's upload_url and download_url), by host.
	sign := func(path, op, user string, exp int64) string {
		raw := path + ":" + op + ":" + user + ":" + sb.AccessToken
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		sum := sha256.Sum256([]byte(raw))
		q.Set("signature", "v1_"+base64.RawStdEncoding.EncodeToString(sum[:]))
		return "/files?" + q.Encode()
	}
	host := map[string]string{"Host": envdHost, "Content-Type": "application/octet-stream"}
	if code, body := do("POST", sign("/home/user/signed.txt", "write", "", 0), host, "signed upload"); code != http.StatusOK {
		t.Fatalf("signed upload: %d %s", code, body)
	}
	if code, body := do("GET", sign("/home/user/signed.txt", "read", "user", time.Now().Add(time.Minute).Unix()), host, ""); code != http.StatusOK || body != "signed upload" {
		t.Fatalf("signed download: %d %q", code, body)
	}
	for name, path := range map[string]string{
		"expired":       sign("/home/user/signed.txt", "read", "", time.Now().Add(-time.Minute).Unix()),
		"another op":    sign("/home/user/signed.txt", "write", "", 0),
		"another path":  strings.Replace(sign("/home/user/signed.txt", "read", "", 0), "signed.txt", "other.txt", 1),
		"no signature":  "/files?path=/home/user/signed.txt",
		"forged":        "/files?path=/home/user/signed.txt&signature=v1_AAAA",
		"rpc by signed": fmt.Sprintf("/process.Process/List?signature=%s", "v1_x"),
	} {
		code, body := do("GET", path, map[string]string{"Host": envdHost}, "")
		if code != http.StatusUnauthorized || !strings.Contains(body, `"code":401`) {
			t.Errorf("%s: %d %s, want 401 in E2B's shape", name, code, body)
		}
	}

	// Malformed Connect requests and an unknown RPC get Connect's errors,
	// never a 500.
	envd := map[string]string{"E2b-Sandbox-Id": sb.ID, "X-Access-Token": sb.AccessToken}
	with := func(h map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range envd {
			out[k] = v
		}
		for k, v := range h {
			out[k] = v
		}
		return out
	}
	for _, c := range []struct {
		name, path, ctype, body string
		status                  int
		code                    string
	}{
		{"unary, not JSON", "/process.Process/List", "application/json", "{not json", http.StatusBadRequest, "invalid_argument"},
		{"unary, unknown field type", "/filesystem.Filesystem/Stat", "application/json", `{"path": 7}`, http.StatusBadRequest, "invalid_argument"},
		{"unknown RPC", "/process.Process/Nope", "application/json", "{}", http.StatusNotFound, ""},
		{"stream, a truncated envelope", "/process.Process/Start", "application/connect+json", "\x00\x00\x00\x00\x10{}", http.StatusOK, "invalid_argument"},
		{"stream, envelope of garbage", "/process.Process/Start", "application/connect+json", "\x00\x00\x00\x00\x05{nope", http.StatusOK, "invalid_argument"},
	} {
		code, body := do("POST", c.path, with(map[string]string{"Content-Type": c.ctype, "Connect-Protocol-Version": "1"}), c.body)
		if code != c.status || (c.code != "" && !strings.Contains(body, `"code":"`+c.code+`"`)) {
			t.Errorf("%s: %d %s; want %d and %q", c.name, code, body, c.status, c.code)
		}
	}

	// A web page cannot drive the control API through the user's browser
	// (a text/plain POST needs no preflight): the edge refuses other
	// origins before E2B's routes run.
	if code, body := do("POST", "/sandboxes", map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain"}, `{"templateID":"base"}`); code != http.StatusForbidden {
		t.Errorf("cross-origin create: %d %s", code, body)
	}
	if list, err := d.client.ListSandboxes(ctx, nil); err != nil || len(list) != 1 {
		t.Errorf("sandboxes after a refused cross-origin create: %v, %v", list, err)
	}

	// Misses: another port in the header mode, an unknown sandbox.
	if code, body := do("POST", "/process.Process/List", map[string]string{"E2b-Sandbox-Id": sb.ID, "E2b-Sandbox-Port": "8080",
		"X-Access-Token": sb.AccessToken, "Content-Type": "application/json"}, "{}"); code != http.StatusBadRequest {
		t.Errorf("another port by header: %d %s", code, body)
	}
	code, body := do("GET", "/health", map[string]string{"Host": "49983-sb-nonexistent0.berth.localhost:" + port, "X-Access-Token": "x"}, "")
	if code != http.StatusBadGateway || !strings.Contains(body, "The sandbox was not found") {
		t.Errorf("unknown sandbox by host: %d %s", code, body)
	}
	if code, body := do("POST", "/process.Process/List", map[string]string{"Content-Type": "application/json"}, "{}"); code != http.StatusNotFound || !strings.Contains(body, "E2b-Sandbox-Id") {
		t.Errorf("envd route without a sandbox: %d %s", code, body)
	}
}

// hostTransport sends every request with Host set to host (a *.localhost
// name Go's resolver would not find), to the URL's address.
type hostTransport struct{ host string }

func (t hostTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = t.host
	return http.DefaultTransport.RoundTrip(r)
}
