package server_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/audit"
	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/server"
	"github.com/berthsh/berth/store"
)

// These tests are attacks on the edge's keys: each sends what an attacker
// (or a careless client) would, through the real edge, a real keyring and
// a real audit log over a store.

// echoPort stands for a sandbox's port: a route that checks its own
// access (as the port proxy's do) and answers with every header it got,
// which is what the server in the sandbox would see.
type echoPort struct{}

func (echoPort) Name() string { return "echo" }
func (echoPort) Routes(r *server.Router) {
	r.OwnAccess().HandleHTTP("/echo/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(r.Header)
	}))
}

type keyedEdge struct {
	url   string
	log   *logBuffer
	keys  *auth.Keyring
	audit *audit.Log
	admin api.APIKey
	write api.APIKey
}

func newKeyedEdge(t *testing.T, groups ...server.Group) *keyedEdge {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewKeyring(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &keyedEdge{log: &logBuffer{}, keys: keys}
	log := slog.New(slog.NewTextHandler(e.log, nil))
	e.audit = audit.New(st, log, 0)
	if e.admin, err = keys.Create(t.Context(), api.CreateAPIKeyRequest{Scope: api.ScopeAdmin}); err != nil {
		t.Fatal(err)
	}
	if e.write, err = keys.Create(t.Context(), api.CreateAPIKeyRequest{Tenant: "tenant-a"}); err != nil {
		t.Fatal(err)
	}
	groups = append(groups, server.KeysAPI(keys, e.audit))
	srv := httptest.NewServer(server.New(server.Config{Log: log, Authenticate: keys.Authenticate, Auditor: e.audit}, groups...))
	t.Cleanup(func() {
		srv.Close()
		e.audit.Close()
		st.Close()
	})
	e.url = srv.URL
	return e
}

func (e *keyedEdge) do(t *testing.T, method, path string, hdr http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, e.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func secretOf(k api.APIKey) string { return k.Key[len(k.Key)-64:] }

// TestKeyIsNeverRelayed: however a client sends its key to a route that
// relays the request into a sandbox (a port), in two places at once, with
// odd spacing or as a second value of a header, the server in the sandbox
// never sees a berth key.
func TestKeyIsNeverRelayed(t *testing.T) {
	e := newKeyedEdge(t, echoPort{})
	key, other := e.write.Key, e.admin.Key
	ws := func(h http.Header) http.Header {
		h.Set("Connection", "Upgrade")
		h.Set("Upgrade", "websocket")
		return h
	}
	for name, hdr := range map[string]http.Header{
		"bearer and X-Api-Key":          {"Authorization": {"Bearer " + key}, "X-Api-Key": {key}},
		"bearer and subprotocol":        ws(http.Header{"Authorization": {"Bearer " + key}, "Sec-Websocket-Protocol": {"chat, berth.key." + other}}),
		"X-Api-Key and subprotocol":     ws(http.Header{"X-Api-Key": {key}, "Sec-Websocket-Protocol": {"berth.key." + other + ", chat"}}),
		"two subprotocol keys":          ws(http.Header{"Sec-Websocket-Protocol": {"berth.key." + key, "berth.key." + other}}),
		"a bearer with two spaces":      {"Authorization": {"Bearer  " + key}},
		"X-Api-Key as a second value":   {"X-Api-Key": {"the-servers-own", key}},
		"Authorization as second value": {"Authorization": {"Basic dXNlcjpwdw==", "Bearer " + key}},
	} {
		status, body := e.do(t, http.MethodGet, "/echo/x", hdr)
		if strings.Contains(body, secretOf(e.write)) || strings.Contains(body, secretOf(e.admin)) {
			t.Errorf("%s: the port got a berth key: %d %s", name, status, body)
		}
	}
	// What is the server's own still reaches it.
	status, body := e.do(t, http.MethodGet, "/echo/x", http.Header{"Authorization": {"Bearer " + key}, "X-Api-Key": {"the-servers-own"},
		"Sec-Websocket-Protocol": {"chat"}, "Connection": {"Upgrade"}, "Upgrade": {"websocket"}})
	if status != http.StatusOK || !strings.Contains(body, "the-servers-own") || !strings.Contains(body, `"chat"`) {
		t.Fatalf("the server's own headers: %d %s", status, body)
	}
}

// missingSandboxes answers an exec as the manager does for a sandbox that
// does not exist: the error names the id it was given.
type missingSandboxes struct{}

func (missingSandboxes) Name() string { return "api" }
func (missingSandboxes) Routes(r *server.Router) {
	r.Handle("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) error {
		return errdefs.New(errdefs.NotFound, "sandbox %q not found", r.PathValue("id"))
	})
}

// TestKeyInAPathStaysSecret: a key pasted where an id belongs (berth key
// revoke <the key>, a sandbox id) is not written to the access log or the
// audit table; the keys routes take a whole key as its id.
func TestKeyInAPathStaysSecret(t *testing.T) {
	e := newKeyedEdge(t, missingSandboxes{})
	admin := http.Header{"Authorization": {"Bearer " + e.admin.Key}}
	if status, body := e.do(t, http.MethodGet, "/v1/keys/"+e.write.Key, admin); status != http.StatusOK || !strings.Contains(body, e.write.ID) || strings.Contains(body, secretOf(e.write)) {
		t.Errorf("get by the whole key: %d %s", status, body)
	}
	if status, body := e.do(t, http.MethodDelete, "/v1/keys/"+e.write.Key, admin); status != http.StatusOK || !strings.Contains(body, `"revoked_at"`) {
		t.Errorf("revoke by the whole key: %d %s", status, body)
	}
	if _, err := e.keys.Authenticate(e.write.Key); err == nil {
		t.Errorf("the key revoked by its whole self still works")
	}
	e.do(t, http.MethodPost, "/v1/sandboxes/"+e.write.Key+"/exec", admin)
	e.do(t, http.MethodPost, "/v1/"+e.write.Key, admin)
	recs, err := e.audit.List(t.Context(), "", true, "", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	listed, _ := json.Marshal(recs)
	if len(recs) != 2 {
		t.Fatalf("the calls are not audited: %s", listed)
	}
	if strings.Contains(string(listed), secretOf(e.write)) {
		t.Errorf("a secret is in the audit table: %s", listed)
	}
	if logs := e.log.String(); strings.Contains(logs, secretOf(e.write)) {
		t.Errorf("a secret is in the log:\n%s", logs)
	}
}

// TestRefusalsDoNotFillTheAuditTable: calls refused for want of a valid
// key (which anyone who reaches the daemon can make) are audit lines in
// the log, not rows of the bounded table that would push the tenants'
// calls out of it.
func TestRefusalsDoNotFillTheAuditTable(t *testing.T) {
	e := newKeyedEdge(t, missingSandboxes{})
	admin := http.Header{"Authorization": {"Bearer " + e.admin.Key}}
	e.do(t, http.MethodPost, "/v1/sandboxes/sb-mine/exec", admin)
	for _, hdr := range []http.Header{nil, {"Authorization": {"Bearer berth_000000000000_" + strings.Repeat("0", 64)}}, {"X-Api-Key": {"junk"}}} {
		if status, body := e.do(t, http.MethodPost, "/v1/sandboxes/sb-x/exec", hdr); status != http.StatusUnauthorized {
			t.Fatalf("a call without a valid key: %d %s", status, body)
		}
	}
	recs, err := e.audit.List(t.Context(), "", true, "", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].SandboxID != "sb-mine" {
		t.Fatalf("the table holds refusals: %+v", recs)
	}
	if n := strings.Count(e.log.String(), "msg=audit"); n != 4 {
		t.Fatalf("%d audit lines in the log, want 4:\n%s", n, e.log.String())
	}
}
