package api

import "time"

// Scopes of an API key, each allowing what the one before it does.
const (
	// ScopeRead reads a tenant's objects: GET and HEAD requests that are
	// not WebSocket upgrades and reach no sandbox's port.
	ScopeRead = "read"
	// ScopeWrite does everything to a tenant's objects.
	ScopeWrite = "write"
	// ScopeAdmin acts for the operator: every tenant's objects, the keys,
	// images, templates, warm pools, quotas and metrics.
	ScopeAdmin = "admin"
)

// HeaderAPIKey is E2B's header for an API key, which berth takes as it
// takes Authorization: Bearer.
const HeaderAPIKey = "X-Api-Key"

// WebSocketProtocol is the subprotocol berth's WebSockets select. A
// browser, which cannot set headers on a WebSocket, sends its key as a
// second offered subprotocol, WebSocketKeyPrefix followed by the key.
const (
	WebSocketProtocol  = "berth"
	WebSocketKeyPrefix = "berth.key."
)

// APIKey is an API key as the API shows it: its secret only in the answer
// to its creation.
type APIKey struct {
	ID string `json:"id"`
	// Tenant owns what the key creates and is all it sees; empty for an
	// admin key, which acts for the operator.
	Tenant    string     `json:"tenant,omitempty"`
	Scope     string     `json:"scope"`
	Name      string     `json:"name,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// Key is the secret, sent in Authorization: Bearer; set only when the
	// key is created (it is stored hashed and cannot be shown again).
	Key string `json:"key,omitempty"`
}

// CreateAPIKeyRequest is the body of POST /v1/keys.
type CreateAPIKeyRequest struct {
	// Tenant is a DNS label (lower-case letters, digits and '-', at most
	// 63); required for read and write keys, refused for admin keys.
	Tenant string `json:"tenant,omitempty"`
	// Scope is read, write (the default) or admin.
	Scope string `json:"scope,omitempty"`
	// Name is a note for people (at most 200 bytes).
	Name string `json:"name,omitempty"`
	// ExpiresAt, when set, is when the key stops working; it must be in
	// the future.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// AuditRecord is one mutating API call in the audit log
// (GET /v1/audit).
type AuditRecord struct {
	Seq       int64     `json:"seq"`
	At        time.Time `json:"at"`
	Tenant    string    `json:"tenant,omitempty"`
	KeyID     string    `json:"key_id,omitempty"`
	Method    string    `json:"method"`
	Route     string    `json:"route"`
	Path      string    `json:"path"`
	SandboxID string    `json:"sandbox_id,omitempty"`
	Status    int       `json:"status"`
	Error     string    `json:"error,omitempty"` // the error's class
	RequestID string    `json:"request_id"`
}

// ListAPIKeysResponse is the body of GET /v1/keys.
type ListAPIKeysResponse struct {
	Keys []APIKey `json:"keys"`
}

// ListAuditResponse is the body of GET /v1/audit.
type ListAuditResponse struct {
	Records []AuditRecord `json:"records"`
}
