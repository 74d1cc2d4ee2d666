package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

// tenantsOf makes keys for two tenants (write keys a and b, a read key of
// a) with the daemon's admin key.
func tenantsOf(t *testing.T, d *daemon) (a, b, readA api.APIKey) {
	t.Helper()
	ctx := t.Context()
	var err error
	if a, err = d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if b, err = d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-b", Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if readA, err = d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-a", Scope: api.ScopeRead}); err != nil {
		t.Fatal(err)
	}
	return a, b, readA
}

func (d *daemon) clientWith(t *testing.T, key string) *client.Client {
	t.Helper()
	c, err := client.New(d.url, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// call sends one request with key (none when empty) and returns the
// status and the error class of the answer ("" when it is not an error).
func (d *daemon) call(t *testing.T, key, method, path string, body []byte, hdr http.Header) (int, string, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, d.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var e api.ErrorResponse
	json.Unmarshal(b, &e)
	return resp.StatusCode, string(e.Error.Class), string(b)
}

// TestTenantsSeeOnlyTheirOwn: tenant A's key gets not_found for each of
// tenant B's objects on every route of the OpenAPI document that names
// one, exactly as for an object that does not exist (a route whose
// parameter this table cannot fill fails the test, so a new route must be
// added here), and B's objects are untouched after A tried every route.
// Lists show A none of B's; the operator's routes refuse A's key.
func TestTenantsSeeOnlyTheirOwn(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	keyA, keyB, _ := tenantsOf(t, d)
	a, b := d.clientWith(t, keyA.Key), d.clientWith(t, keyB.Key)

	sbB, err := b.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"owner": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	procB, err := b.StartProcess(ctx, sbB.ID, api.ExecRequest{Shell: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSnapshot(ctx, sbB.ID, api.CreateSnapshotRequest{Name: "snap-b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSecret(ctx, "sec-b", "b's value"); err != nil {
		t.Fatal(err)
	}
	// B's image, imported (tenant-b/image, and b-image for E2B's routes,
	// whose template ids have no slash).
	var imageTar bytes.Buffer
	tag, err := name.NewTag("tenant-b/image:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.Write(tag, tinyImageSaying(t, "from-b"), &imageTar); err != nil {
		t.Fatal(err)
	}
	imgsB, err := b.ImportImages(ctx, &imageTar, "b-image", nil)
	if err != nil || len(imgsB) != 1 {
		t.Fatalf("B imports an image: %+v %v", imgsB, err)
	}
	sbA, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}

	// What each path parameter is, as B's object and as one nobody has.
	objects := map[string][2]string{
		"{id}":   {sbB.ID, "sb-doesnotexist0"},
		"{pid}":  {strconv.Itoa(procB.Pid), "99999"},
		"{port}": {"8000", "8000"},
		"{path}": {"x", "x"},
		"{ref}":  {"tenant-b/image", "tenant-b/none"},
	}
	named := map[string][2]string{ // {name} by the route's collection
		"/v1/secrets/":   {"sec-b", "sec-none"},
		"/v1/snapshots/": {"snap-b", "snap-none"},
	}
	// Bodies that pass validation, so that the answer is about the object.
	bodies := map[string]string{
		"POST /v1/sandboxes/{id}/exec":                   `{"cmd":["true"]}`,
		"POST /v1/sandboxes/{id}/processes":              `{"cmd":["true"]}`,
		"POST /v1/sandboxes/{id}/processes/{pid}/signal": `{"signal":"TERM"}`,
		"POST /v1/sandboxes/{id}/processes/{pid}/stdin":  `{"data":"eA=="}`,
		"POST /v1/sandboxes/{id}/snapshots":              `{"name":"stolen"}`,
		"POST /v1/sandboxes/{id}/fork":                   `{"count":1}`,
		"POST /v1/sandboxes/{id}/apply":                  `{"from":"` + sbA.ID + `"}`,
		"PATCH /v1/sandboxes/{id}":                       `{"labels":{"owner":"a"}}`,
		"PUT /v1/secrets/{name}":                         `{"value":"a's"}`,
		"POST /v1/sandboxes/{id}/fs/stat":                `{"path":"/"}`,
		"POST /v1/sandboxes/{id}/fs/exists":              `{"path":"/"}`,
		"POST /v1/sandboxes/{id}/fs/list":                `{"path":"/"}`,
		"POST /v1/sandboxes/{id}/fs/mkdir":               `{"path":"/tmp/a"}`,
		"POST /v1/sandboxes/{id}/fs/move":                `{"from":"/tmp/a","to":"/tmp/b"}`,
		"POST /v1/sandboxes/{id}/fs/remove":              `{"path":"/tmp/a"}`,
		"POST /v1/sandboxes/{id}/fs/chmod":               `{"path":"/tmp","mode":511}`,
		"POST /v1/sandboxes/{id}/fs/chown":               `{"path":"/tmp","owner":"root"}`,
		"POST /v1/sandboxes/{id}/fs/read":                `{"path":"/etc/hostname"}`,
		"POST /v1/sandboxes/{id}/fs/write":               `{"path":"/tmp/a","content":"x"}`,
		"POST /v1/sandboxes/{id}/fs/edit":                `{"path":"/etc/hostname","old":"a","new":"b"}`,
		"POST /v1/sandboxes/{id}/fs/glob":                `{"pattern":"*"}`,
		"POST /v1/sandboxes/{id}/fs/grep":                `{"pattern":"x"}`,
		"POST /v1/sandboxes/{id}/fs/upload":              `{"files":[{"path":"/tmp/a","content":"eA=="}]}`,
		"POST /v1/sandboxes/{id}/fs/download":            `{"paths":["/etc/hostname"]}`,
	}
	query := map[string]string{
		"GET /v1/sandboxes/{id}/files":    "?path=/etc/hostname",
		"PUT /v1/sandboxes/{id}/files":    "?path=/tmp/a",
		"GET /v1/sandboxes/{id}/archive":  "?path=/tmp",
		"PUT /v1/sandboxes/{id}/archive":  "?path=/tmp",
		"GET /v1/sandboxes/{id}/fs/watch": "?path=/tmp",
	}
	upgrade := map[string]http.Header{
		"GET /v1/sandboxes/{id}/pty":                    wsHandshake(),
		"GET /v1/sandboxes/{id}/processes/{pid}/attach": wsHandshake(),
		"GET /v1/sandboxes/{id}/tunnel/{port}":          {"Connection": {"Upgrade"}, "Upgrade": {api.TunnelProtocol}},
	}
	// The operator's routes: keys and quotas refuse a tenant's key whatever
	// the object.
	operator := map[string]bool{"GET /v1/keys/{key}": true, "DELETE /v1/keys/{key}": true,
		"PUT /v1/tenants/{tenant}/quota": true}

	routes, err := api.Routes()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, r := range routes {
		op := r.Method + " " + r.Path
		if !strings.Contains(r.Path, "{") {
			continue // collections: the lists below
		}
		fill := func(which int) string {
			p := r.Path
			for param, v := range objects {
				p = strings.ReplaceAll(p, param, v[which])
			}
			if strings.Contains(p, "{name}") {
				for prefix, v := range named {
					if strings.HasPrefix(r.Path, prefix) {
						p = strings.ReplaceAll(p, "{name}", v[which])
					}
				}
			}
			p = strings.ReplaceAll(p, "{key}", keyB.ID)
			p = strings.ReplaceAll(p, "{tenant}", "tenant-b")
			if strings.Contains(p, "{") {
				t.Fatalf("%s: the tenant table has no object for a parameter of %s: add one", op, p)
			}
			return p + query[op]
		}
		var body []byte
		if r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch {
			body = []byte("{}")
			if s, ok := bodies[op]; ok {
				body = []byte(s)
			}
		}
		status, class, raw := d.call(t, keyA.Key, r.Method, fill(0), body, upgrade[op])
		if operator[op] {
			if class != string(errdefs.PermissionDenied) {
				t.Errorf("%s with a tenant's key: %d %s, want permission_denied", op, status, raw)
			}
			continue
		}
		nStatus, nClass, nRaw := d.call(t, keyA.Key, r.Method, fill(1), body, upgrade[op])
		if class != string(errdefs.NotFound) || status != http.StatusNotFound {
			t.Errorf("%s on tenant B's object with A's key: %d %s, want not_found", op, status, raw)
		}
		if status != nStatus || class != nClass {
			t.Errorf("%s: B's object answers %d %s, one that does not exist %d %s: A could tell them apart", op, status, raw, nStatus, nRaw)
		}
		checked++
	}
	if checked < 50 {
		t.Fatalf("only %d routes checked", checked)
	}

	// B's objects are as B left them.
	got, err := b.GetSandbox(ctx, sbB.ID)
	if err != nil || got.State != api.StateRunning || got.Labels["owner"] != "b" {
		t.Fatalf("B's sandbox after A's attempts: %+v %v", got, err)
	}
	if p, err := b.GetProcess(ctx, sbB.ID, procB.Pid); err != nil || !p.Running {
		t.Fatalf("B's process after A's attempts: %+v %v", p, err)
	}
	if _, err := b.GetSnapshot(ctx, "snap-b"); err != nil {
		t.Fatalf("B's snapshot: %v", err)
	}
	if _, err := b.GetSecret(ctx, "sec-b"); err != nil {
		t.Fatalf("B's secret: %v", err)
	}
	if _, err := b.GetSnapshot(ctx, "stolen"); !errdefs.IsNotFound(err) {
		t.Fatalf("A snapshotted B's sandbox: %v", err)
	}
	if img, err := b.InspectImage(ctx, "tenant-b/image"); err != nil || img.ID != imgsB[0].ID {
		t.Fatalf("B's image after A's attempts: %+v %v", img, err)
	}

	// Lists: A sees its own only; the operator sees both.
	if list, err := a.ListSandboxes(ctx, nil); err != nil || len(list) != 1 || list[0].ID != sbA.ID {
		t.Fatalf("A's sandboxes: %+v %v", list, err)
	}
	if list, err := a.ListSnapshots(ctx, ""); err != nil || len(list) != 0 {
		t.Fatalf("A's snapshots: %+v %v", list, err)
	}
	if list, err := a.ListSecrets(ctx); err != nil || len(list) != 0 {
		t.Fatalf("A's secrets: %+v %v", list, err)
	}
	for _, list := range []func(context.Context) ([]api.Image, error){a.ListImages, a.ListTemplates} {
		if imgs, err := list(ctx); err != nil || slices.ContainsFunc(imgs, func(img api.Image) bool { return img.ID == imgsB[0].ID }) {
			t.Fatalf("A's images or templates: %+v %v", imgs, err)
		}
	}
	if imgs, err := d.client.ListImages(ctx); err != nil || !slices.ContainsFunc(imgs, func(img api.Image) bool { return img.ID == imgsB[0].ID }) {
		t.Fatalf("the operator's images: %+v %v", imgs, err)
	}
	if list, err := d.client.ListSandboxes(ctx, nil); err != nil || len(list) != 2 {
		t.Fatalf("the operator's sandboxes: %+v %v", list, err)
	}
	// A's audit log holds A's calls only; B's holds B's creates.
	recs, err := a.Audit(ctx, client.AuditQuery{Limit: 10000})
	if err != nil || len(recs) == 0 {
		t.Fatalf("A's audit: %d %v", len(recs), err)
	}
	for _, rec := range recs {
		if rec.Tenant != "tenant-a" || rec.KeyID != keyA.ID {
			t.Fatalf("A's audit log holds %+v", rec)
		}
	}
	recs, err = b.Audit(ctx, client.AuditQuery{Sandbox: sbB.ID})
	if err != nil || len(recs) < 3 || recs[0].Method != http.MethodPost || recs[0].Route != "/v1/sandboxes" || recs[0].Status != http.StatusCreated {
		t.Fatalf("B's audit of its sandbox: %+v %v", recs, err)
	}
	// The operator's: every tenant's, and one tenant's.
	if recs, err := d.client.Audit(ctx, client.AuditQuery{Tenant: "tenant-b"}); err != nil || len(recs) < 4 {
		t.Fatalf("the operator's audit of tenant-b: %d %v", len(recs), err)
	}
	// The operator's routes refuse a tenant's write key.
	if list, err := a.Usage(ctx, "tenant-b"); err != nil || len(list) != 1 || list[0].Tenant != "tenant-a" {
		t.Fatalf("A asked for B's usage: %+v %v", list, err)
	}
	for _, op := range [][2]string{{"GET", "/metrics"}, {"GET", "/v1/keys"}, {"POST", "/v1/keys"}, {"PUT", "/v1/pools"}, {"POST", "/v1/images/prune"}} {
		if _, class, raw := d.call(t, keyA.Key, op[0], op[1], []byte("{}"), nil); class != string(errdefs.PermissionDenied) {
			t.Errorf("%s %s with a tenant's key: %s", op[0], op[1], raw)
		}
	}
	// E2B's control API is tenant-scoped the same way.
	for _, op := range [][2]string{{"GET", "/sandboxes/" + sbB.ID}, {"DELETE", "/sandboxes/" + sbB.ID}, {"POST", "/sandboxes/" + sbB.ID + "/pause"},
		{"GET", "/templates/b-image"}, {"DELETE", "/templates/b-image"}, {"GET", "/templates/aliases/b-image"}} {
		status, _, raw := d.call(t, "", op[0], op[1], nil, http.Header{api.HeaderAPIKey: {keyA.Key}})
		if status != http.StatusNotFound {
			t.Errorf("E2B %s %s with A's key: %d %s", op[0], op[1], status, raw)
		}
	}
}

func wsHandshake() http.Header {
	return http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
		"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
}

// TestKeysAreChecked: missing, malformed, unknown, expired and revoked
// keys are unauthenticated with one answer whether or not a sandbox
// exists; scopes hold; the unix socket needs no key; no key's secret is
// in the daemon's log or in any answer after its creation.
func TestKeysAreChecked(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	keyA, _, readA := tenantsOf(t, d)
	a, r := d.clientWith(t, keyA.Key), d.clientWith(t, readA.Key)
	sb, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	soon := time.Now().Add(1500 * time.Millisecond)
	expiring, err := d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-a", ExpiresAt: &soon})
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.clientWith(t, revoked.Key).GetSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("before its revocation: %v", err)
	}
	if _, err := d.client.RevokeAPIKey(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.clientWith(t, expiring.Key).GetSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("before its expiry: %v", err)
	}
	time.Sleep(time.Until(soon) + 100*time.Millisecond)

	unknown := "berth_000000000000_" + strings.Repeat("0", 64)
	for name, key := range map[string]string{"missing": "", "malformed": "not-a-key", "unknown": unknown,
		"expired": expiring.Key, "revoked": revoked.Key} {
		var answers []string
		for _, id := range []string{sb.ID, "sb-doesnotexist0"} {
			for _, route := range [][2]string{{"GET", "/v1/sandboxes/" + id}, {"POST", "/v1/sandboxes/" + id + "/exec"}, {"DELETE", "/v1/sandboxes/" + id}} {
				status, class, raw := d.call(t, key, route[0], route[1], []byte(`{"cmd":["true"]}`), nil)
				if status != http.StatusUnauthorized || class != string(errdefs.Unauthenticated) {
					t.Errorf("%s key, %s %s: %d %s", name, route[0], route[1], status, raw)
				}
				answers = append(answers, raw)
			}
		}
		for i := range 3 {
			if answers[i] != answers[i+3] {
				t.Errorf("%s key: an existing sandbox answers %s, a missing one %s", name, answers[i], answers[i+3])
			}
		}
	}
	if got, err := a.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("the sandbox after refused deletes: %+v %v", got, err)
	}

	// Scopes: a read key reads, and does nothing else.
	if _, err := r.GetSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("read key, get: %v", err)
	}
	if _, err := r.List(ctx, sb.ID, api.ListRequest{Path: "/"}); err != nil {
		t.Fatalf("read key, fs/list: %v", err)
	}
	if _, err := r.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("read key, exec: %v", err)
	}
	if _, err := r.CreateSandbox(ctx, api.CreateSandboxRequest{}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("read key, create: %v", err)
	}
	if _, err := r.OpenTerminal(ctx, sb.ID, client.TerminalOptions{}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("read key, terminal: %v", err)
	}
	if _, err := r.Write(ctx, sb.ID, api.WriteRequest{Path: "/tmp/x", Content: "x"}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("read key, fs/write: %v", err)
	}
	if _, err := a.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-a", Scope: api.ScopeAdmin}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("a write key made a key: %v", err)
	}
	// Bad key requests name the field.
	for _, req := range []api.CreateAPIKeyRequest{{Tenant: "Not_A_Label"}, {Tenant: "t", Scope: "root"}} {
		if _, err := d.client.CreateAPIKey(ctx, req); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("create %+v: %v", req, err)
		}
	}

	// The unix socket is the operator's, without a key.
	sock, err := client.New("unix://" + d.state + "/berth.sock")
	if err != nil {
		t.Fatal(err)
	}
	if list, err := sock.ListSandboxes(ctx, nil); err != nil || len(list) != 1 {
		t.Fatalf("over the unix socket: %+v %v", list, err)
	}
	// The CLI sends BERTH_API_KEY.
	if out, errOut, code := d.cli("", "key", "ls"); code != 0 || !strings.Contains(out, revoked.ID) || !strings.Contains(out, "revoked") {
		t.Fatalf("berth key ls: %d %s %s", code, out, errOut)
	}

	// No secret anywhere after its creation: not in lists, not in the log.
	keys, err := d.client.ListAPIKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed, _ := json.Marshal(keys)
	logs := d.log.String()
	for _, k := range []api.APIKey{keyA, readA, expiring, revoked, {ID: "admin", Key: d.key}} {
		secret := k.Key[len(k.Key)-64:]
		if strings.Contains(string(listed), secret) || strings.Contains(logs, secret) {
			t.Errorf("key %s's secret is in the key list or the daemon's log", k.ID)
		}
	}
}
