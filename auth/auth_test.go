package auth_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/store"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newKeyring(t testing.TB) (*auth.Keyring, *store.Store, *clock) {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c := &clock{t: time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)}
	k, err := auth.NewKeyring(t.Context(), st, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return k, st, c
}

func TestKeyLifecycle(t *testing.T) {
	k, st, c := newKeyring(t)
	ctx := t.Context()
	exp := c.t.Add(30 * 24 * time.Hour)
	made, err := k.Create(ctx, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead, Name: "ci", ExpiresAt: &exp})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(made.Key, auth.Prefix+made.ID+"_") || made.Tenant != "acme" || made.Scope != api.ScopeRead {
		t.Fatalf("made %+v", made)
	}
	p, err := k.Authenticate(made.Key)
	if err != nil || p.Kind != auth.Key || p.Tenant != "acme" || p.KeyID != made.ID || p.Scope != api.ScopeRead {
		t.Fatalf("authenticate: %+v %v", p, err)
	}
	if !p.Allows(api.ScopeRead) || p.Allows(api.ScopeWrite) {
		t.Fatalf("a read key's scope: %+v", p)
	}
	// Nothing shows the secret again; the store holds only its hash.
	for _, l := range k.List() {
		if l.Key != "" {
			t.Fatalf("listed with its secret: %+v", l)
		}
	}
	stored, err := st.ListAPIKeys(ctx)
	if err != nil || len(stored) != 1 || strings.Contains(string(stored[0].Hash), made.Key[len(made.Key)-64:]) || len(stored[0].Hash) != 32 {
		t.Fatalf("stored: %+v %v", stored, err)
	}
	// A new keyring over the same store knows the key (a daemon restart).
	k2, err := auth.NewKeyring(ctx, st, c.now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k2.Authenticate(made.Key); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	// Expired at its time exactly.
	c.t = exp
	if _, err := k.Authenticate(made.Key); errdefs.ClassOf(err) != errdefs.Unauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired: %v", err)
	}
	c.t = exp.Add(-time.Second)
	if _, err := k.Revoke(ctx, made.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(made.Key); errdefs.ClassOf(err) != errdefs.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked: %v", err)
	}
	if _, err := k2.Revoke(ctx, made.ID); err != nil { // again, from the other keyring: stays revoked
		t.Fatal(err)
	}
	k3, _ := auth.NewKeyring(ctx, st, c.now)
	if got, _ := k3.Get(made.ID); got.RevokedAt == nil {
		t.Fatalf("revocation not stored: %+v", got)
	}
	if _, err := k.Revoke(ctx, "000000000000"); !errdefs.IsNotFound(err) {
		t.Fatalf("revoke an unknown key: %v", err)
	}
}

func TestBadKeysAreRefusedAlike(t *testing.T) {
	k, _, _ := newKeyring(t)
	made, err := k.Create(t.Context(), api.CreateAPIKeyRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if made.Scope != api.ScopeWrite {
		t.Fatalf("default scope %q", made.Scope)
	}
	wrongSecret := made.Key[:len(made.Key)-1] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", made.Key[len(made.Key)-1])+1)%16])
	unknownID := auth.Prefix + "ffffffffffff" + made.Key[len(auth.Prefix)+12:]
	var msgs []string
	for _, key := range []string{wrongSecret, unknownID} {
		_, err := k.Authenticate(key)
		if errdefs.ClassOf(err) != errdefs.Unauthenticated {
			t.Fatalf("%q: %v", key, err)
		}
		msgs = append(msgs, err.Error())
	}
	if msgs[0] != msgs[1] {
		t.Fatalf("a wrong secret and an unknown id must read the same: %q, %q", msgs[0], msgs[1])
	}
	for _, key := range []string{"", "berth_", "tenant-a", made.Key + "0", strings.ToUpper(made.Key), made.Key[:len(made.Key)-1] + "g"} {
		if _, err := k.Authenticate(key); errdefs.ClassOf(err) != errdefs.Unauthenticated {
			t.Fatalf("malformed %q: %v", key, err)
		}
	}
}

func TestCreateRefusesBadInput(t *testing.T) {
	k, _, c := newKeyring(t)
	past := c.t.Add(-time.Minute)
	for _, tc := range []struct {
		req   api.CreateAPIKeyRequest
		field string
	}{
		{api.CreateAPIKeyRequest{Tenant: "acme", Scope: "owner"}, "scope:"},
		{api.CreateAPIKeyRequest{Tenant: "Acme"}, "tenant:"},
		{api.CreateAPIKeyRequest{Tenant: "-acme"}, "tenant:"},
		{api.CreateAPIKeyRequest{Tenant: "a.b"}, "tenant:"},
		{api.CreateAPIKeyRequest{Tenant: strings.Repeat("a", 64)}, "tenant:"},
		{api.CreateAPIKeyRequest{}, "tenant:"},
		{api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeAdmin}, "tenant:"},
		{api.CreateAPIKeyRequest{Tenant: "acme", ExpiresAt: &past}, "expires_at:"},
		{api.CreateAPIKeyRequest{Tenant: "acme", Name: strings.Repeat("n", 201)}, "name:"},
	} {
		_, err := k.Create(t.Context(), tc.req)
		if errdefs.ClassOf(err) != errdefs.InvalidArgument || !strings.HasPrefix(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want invalid_argument naming %s", tc.req, err, tc.field)
		}
	}
	if len(k.List()) != 0 {
		t.Fatalf("a refused create left a key: %+v", k.List())
	}
	if _, err := k.Create(t.Context(), api.CreateAPIKeyRequest{Tenant: strings.Repeat("a", 63)}); err != nil {
		t.Fatal(err)
	}
	adm, err := k.Create(t.Context(), api.CreateAPIKeyRequest{Scope: api.ScopeAdmin})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := k.Authenticate(adm.Key); err != nil || p.Tenant != "" || !p.Allows(api.ScopeAdmin) {
		t.Fatalf("admin key: %+v %v", p, err)
	}
}

// BenchmarkAuthenticate is the cost of checking one request's key.
func BenchmarkAuthenticate(b *testing.B) {
	k, _, _ := newKeyring(b)
	var key string
	for i := range 1000 {
		made, err := k.Create(b.Context(), api.CreateAPIKeyRequest{Tenant: "t" + string(rune('a'+i%26))})
		if err != nil {
			b.Fatal(err)
		}
		key = made.Key
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := k.Authenticate(key); err != nil {
			b.Fatal(err)
		}
	}
}
