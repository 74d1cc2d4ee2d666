package auth

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/store"
)

// Store is what the keyring keeps its keys in (store.Store implements it).
type Store interface {
	CreateAPIKey(ctx context.Context, k store.APIKey) error
	ListAPIKeys(ctx context.Context) ([]store.APIKey, error)
	RevokeAPIKey(ctx context.Context, id string, at time.Time) error
}

// Keyring is every API key, in memory, over its store.
type Keyring struct {
	st  Store
	now func() time.Time
	mu  sync.RWMutex
	// keys holds every key by id, revoked ones too (authentication refuses
	// them; listing shows them).
	keys map[string]store.APIKey
}

// NewKeyring loads the keys of st. now is the clock (time.Now when nil).
func NewKeyring(ctx context.Context, st Store, now func() time.Time) (*Keyring, error) {
	if now == nil {
		now = time.Now
	}
	list, err := st.ListAPIKeys(ctx)
	if err != nil {
		return nil, err
	}
	k := &Keyring{st: st, now: now, keys: make(map[string]store.APIKey, len(list))}
	for _, key := range list {
		k.keys[key.ID] = key
	}
	return k, nil
}

// Authenticate returns the principal of key, or an unauthenticated error
// for a malformed, unknown, wrong, expired or revoked one. The error says
// that the key expired or was revoked only to the holder of its secret.
func (k *Keyring) Authenticate(key string) (Principal, error) {
	id, secret, ok := split(key)
	if !ok {
		return Principal{}, unauthenticated("the API key is malformed")
	}
	k.mu.RLock()
	rec, found := k.keys[id]
	k.mu.RUnlock()
	if !found || !matches(secret, rec.Hash) {
		return Principal{}, unauthenticated("the API key is not valid")
	}
	if !rec.RevokedAt.IsZero() {
		return Principal{}, unauthenticated(fmt.Sprintf("API key %s was revoked", id))
	}
	if expired(rec.ExpiresAt, k.now()) {
		return Principal{}, unauthenticated(fmt.Sprintf("API key %s expired at %s", id, rec.ExpiresAt.Format(time.RFC3339)))
	}
	return Principal{Kind: Key, Tenant: rec.Tenant, KeyID: id, Scope: rec.Scope}, nil
}

// lastExpiry bounds a key's expiry: the store keeps Unix nanoseconds,
// which end in 2262; a later time would be stored as one in the past.
var lastExpiry = time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC)

// maxName bounds a key's name.
const maxName = 200

// Create makes a key: the answer holds its secret, which is never shown
// again.
func (k *Keyring) Create(ctx context.Context, req api.CreateAPIKeyRequest) (api.APIKey, error) {
	if req.Scope == "" {
		req.Scope = api.ScopeWrite
	}
	switch req.Scope {
	case api.ScopeRead, api.ScopeWrite:
		if err := CheckTenant("tenant", req.Tenant); err != nil {
			return api.APIKey{}, err
		}
	case api.ScopeAdmin:
		if req.Tenant != "" {
			return api.APIKey{}, errdefs.New(errdefs.InvalidArgument, "tenant: an admin key acts for every tenant; give no tenant (or scope read or write for tenant %q)", req.Tenant)
		}
	default:
		return api.APIKey{}, errdefs.New(errdefs.InvalidArgument, "scope: %q is not a scope: read, write or admin", req.Scope)
	}
	if len(req.Name) > maxName || !utf8.ValidString(req.Name) {
		return api.APIKey{}, errdefs.New(errdefs.InvalidArgument, "name: at most %d bytes of UTF-8", maxName)
	}
	now := k.now().UTC()
	rec := store.APIKey{Tenant: req.Tenant, Scope: req.Scope, Name: req.Name, CreatedAt: now}
	if req.ExpiresAt != nil {
		if !req.ExpiresAt.After(now) {
			return api.APIKey{}, errdefs.New(errdefs.InvalidArgument, "expires_at: %s is not in the future", req.ExpiresAt.Format(time.RFC3339))
		}
		if !req.ExpiresAt.Before(lastExpiry) {
			return api.APIKey{}, errdefs.New(errdefs.InvalidArgument, "expires_at: %s is too far: give a time before %s, or none (until revoked)",
				req.ExpiresAt.Format(time.RFC3339), lastExpiry.Format(time.RFC3339))
		}
		rec.ExpiresAt = req.ExpiresAt.UTC()
	}
	var key string
	rec.ID, key, rec.Hash = newKey()
	if err := k.st.CreateAPIKey(ctx, rec); err != nil {
		return api.APIKey{}, err
	}
	k.mu.Lock()
	k.keys[rec.ID] = rec
	k.mu.Unlock()
	out := view(rec)
	out.Key = key
	return out, nil
}

// List returns every key, oldest first, without secrets.
func (k *Keyring) List() []api.APIKey {
	k.mu.RLock()
	out := make([]api.APIKey, 0, len(k.keys))
	for _, rec := range k.keys {
		out = append(out, view(rec))
	}
	k.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Get returns one key: not_found if there is no such id. A whole key
// names its id.
func (k *Keyring) Get(id string) (api.APIKey, error) {
	id = idOf(id)
	k.mu.RLock()
	rec, ok := k.keys[id]
	k.mu.RUnlock()
	if !ok {
		return api.APIKey{}, errdefs.New(errdefs.NotFound, "API key %q not found", id)
	}
	return view(rec), nil
}

// Revoke stops a key from working at once: not_found if there is no such
// id (a whole key names its id). It stays listed, with the time it was
// revoked.
func (k *Keyring) Revoke(ctx context.Context, id string) (api.APIKey, error) {
	id = idOf(id)
	if _, err := k.Get(id); err != nil {
		return api.APIKey{}, err
	}
	now := k.now().UTC()
	if err := k.st.RevokeAPIKey(ctx, id, now); err != nil {
		return api.APIKey{}, err
	}
	k.mu.Lock()
	rec := k.keys[id]
	if rec.RevokedAt.IsZero() {
		rec.RevokedAt = now
		k.keys[id] = rec
	}
	k.mu.Unlock()
	return view(rec), nil
}

// view is a stored key as the API shows it, without any secret.
func view(rec store.APIKey) api.APIKey {
	out := api.APIKey{ID: rec.ID, Tenant: rec.Tenant, Scope: rec.Scope, Name: rec.Name, CreatedAt: rec.CreatedAt}
	if !rec.ExpiresAt.IsZero() {
		t := rec.ExpiresAt
		out.ExpiresAt = &t
	}
	if !rec.RevokedAt.IsZero() {
		t := rec.RevokedAt
		out.RevokedAt = &t
	}
	return out
}
