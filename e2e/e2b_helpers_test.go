package e2e

import (
	"encoding/base64"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/e2b/envd/filesystem/filesystemconnect"
	"github.com/berthsh/berth/api/e2b/envd/process/processconnect"
)

// envdClient reaches the envd that the daemon serves for one sandbox, as
// E2B's SDKs do in their E2B_SANDBOX_URL mode: the daemon's URL, with the
// sandbox's id and access token in headers.
type envdClient struct {
	proc processconnect.ProcessClient
	fs   filesystemconnect.FilesystemClient
	// headers are the ones every envd request carries (for REST calls).
	headers http.Header
	url     string
}

// headerTransport adds headers to every request.
type headerTransport struct {
	h    http.Header
	next http.RoundTripper
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.h {
		if r.Header.Get(k) == "" {
			r.Header[k] = v
		}
	}
	return t.next.RoundTrip(r)
}

// newEnvdClient returns a Connect client (JSON codec, as the SDKs use) for
// sandbox sb's envd on d.
func newEnvdClient(t *testing.T, d *daemon, sb api.Sandbox, opts ...connect.ClientOption) *envdClient {
	t.Helper()
	h := http.Header{}
	h.Set("E2b-Sandbox-Id", sb.ID)
	h.Set("E2b-Sandbox-Port", "49983")
	h.Set("X-Access-Token", sb.AccessToken)
	hc := &http.Client{Transport: headerTransport{h: h, next: http.DefaultTransport}}
	opts = append([]connect.ClientOption{connect.WithProtoJSON()}, opts...)
	return &envdClient{
		proc:    processconnect.NewProcessClient(hc, d.url, opts...),
		fs:      filesystemconnect.NewFilesystemClient(hc, d.url, opts...),
		headers: h,
		url:     d.url,
	}
}

// asUser wraps msg in a request that acts as user (HTTP Basic, as the
// SDKs send it); "" is the sandbox's default user.
func asUser[T any](msg *T, user string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	if user != "" {
		req.Header().Set("Authorization", "Basic "+basicUser(user))
	}
	return req
}

func basicUser(user string) string { return base64.StdEncoding.EncodeToString([]byte(user + ":")) }
