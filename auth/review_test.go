package auth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/errdefs"
)

// TestFarExpiryIsRefused: an expiry the store cannot hold (it keeps
// Unix nanoseconds, which end in 2262) is refused naming the field,
// instead of being stored as some other time that would, after the
// daemon's next start, have the key expired long ago or never.
func TestFarExpiryIsRefused(t *testing.T) {
	k, st, c := newKeyring(t)
	ctx := t.Context()
	for _, exp := range []time.Time{time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(2263, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if _, err := k.Create(ctx, api.CreateAPIKeyRequest{Tenant: "acme", ExpiresAt: &exp}); !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), "expires_at") {
			t.Fatalf("expires_at %s: %v", exp, err)
		}
	}
	// A century is fine, and reads back as itself after a restart.
	exp := c.t.AddDate(100, 0, 0)
	made, err := k.Create(ctx, api.CreateAPIKeyRequest{Tenant: "acme", ExpiresAt: &exp})
	if err != nil {
		t.Fatal(err)
	}
	again, err := auth.NewKeyring(ctx, st, c.now)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Get(made.ID); err != nil || got.ExpiresAt == nil || !got.ExpiresAt.Equal(exp) {
		t.Fatalf("after a restart: %+v %v", got, err)
	}
	if _, err := again.Authenticate(made.Key); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}
