package e2e

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthsh/berth/internal/testutil"
)

// TestBrowserCannotDriveTheAPI plays a web page in a browser on the host:
// a text/plain post from another origin (a form needs no preflight), and a
// DNS-rebound name; both are refused and create nothing. The unix socket
// (root's) answers whatever Host it is sent.
func TestBrowserCannotDriveTheAPI(t *testing.T) {
	d := startDaemon(t, "")
	post := func(host string, hdr map[string]string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, d.url+"/v1/sandboxes", strings.NewReader("{}"))
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for name, code := range map[string]int{
		"evil page, text/plain": post(d.listen, map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain"}),
		"evil page, json":       post(d.listen, map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json"}),
		"rebound name":          post("evil.example:"+strings.Split(d.listen, ":")[1], map[string]string{"Content-Type": "application/json"}),
		"plain text post":       post(d.listen, map[string]string{"Content-Type": "text/plain"}),
	} {
		if code != http.StatusForbidden && code != http.StatusBadRequest {
			t.Errorf("%s: answered %d", name, code)
		}
	}
	if list, err := d.client.ListSandboxes(t.Context(), nil); err != nil || len(list) != 0 {
		t.Fatalf("a refused request made a sandbox: %+v %v", list, err)
	}
	sock := filepath.Join(d.state, "berth.sock")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", sock)
	}}}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://evil.example/v1/sandboxes", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("over the unix socket: %d", resp.StatusCode)
	}
}

// TestRemoteListenNeedsTheFlag: the daemon refuses to serve its API, which
// has no keys yet, on an address other than loopback unless told to.
func TestRemoteListenNeedsTheFlag(t *testing.T) {
	testutil.RequireRoot(t)
	out, err := exec.Command(testutil.Berth(t), "serve", "--state-dir", testutil.StateDir(t), "--listen", "0.0.0.0:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--insecure-remote-api") || !strings.Contains(string(out), "not a loopback address") {
		t.Fatalf("serve on 0.0.0.0: %v\n%s", err, out)
	}
}
