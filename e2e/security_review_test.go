package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/berthsh/berth/api"
)

// Attacks from the security review of keys and tenants (issue #20), each
// against a real daemon and real sandboxes.

// TestReviewNoKeyReachesAPort: a tenant's client that sends its key in two
// places (Authorization and X-Api-Key, as some SDKs do), as a second
// header value or with odd spacing, to a port of its sandbox: the server
// in the sandbox (code the tenant may not trust) sees no berth key, in
// the path form and in the host form.
func TestReviewNoKeyReachesAPort(t *testing.T) {
	d := startDaemon(t, "")
	keyA, _, _ := tenantsOf(t, d)
	sb := startApp(t, d, api.CreateSandboxRequest{})
	// The app's sandbox is the operator's: give it to no tenant, reach it
	// with the admin key and tenant a's own sandbox with a's key.
	sbA, err := d.clientWith(t, keyA.Key).CreateSandbox(t.Context(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	runApp(t, d, sbA.ID)
	secret := func(k string) string { return k[len(k)-64:] }
	pc := portClient(d)
	for _, c := range []struct {
		id, key, token string
	}{{sb.ID, d.key, sb.AccessToken}, {sbA.ID, keyA.Key, sbA.AccessToken}} {
		for name, hdr := range map[string]http.Header{
			"bearer and X-Api-Key":   {"Authorization": {"Bearer " + c.key}, "X-Api-Key": {c.key}},
			"bearer with two spaces": {"Authorization": {"Bearer  " + c.key}},
			"second X-Api-Key":       {"X-Api-Key": {"the-apps-own", c.key}},
		} {
			for _, url := range []string{d.portPath(c.id, 8000) + "/echo/x", d.portHost(c.id, 8000) + "/echo/x"} {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
				if err != nil {
					t.Fatal(err)
				}
				for k, v := range hdr {
					req.Header[k] = v
				}
				// The token too: a request the edge does not take as keyed
				// still reaches the app.
				req.Header.Set(api.HeaderAccessToken, c.token)
				resp, err := pc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				var echo appEcho
				err = json.NewDecoder(resp.Body).Decode(&echo)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || err != nil {
					t.Fatalf("%s, %s: %d %v", name, url, resp.StatusCode, err)
				}
				got, _ := json.Marshal(echo.Header)
				if strings.Contains(string(got), secret(c.key)) {
					t.Errorf("%s, %s: the app got the key: %s", name, url, got)
				}
			}
		}
	}
}
