package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berthsh/berth/api"
)

// CreateAPIKey makes an API key (an admin key's call); the answer's Key is
// the secret, shown this once.
func (c *Client) CreateAPIKey(ctx context.Context, req api.CreateAPIKeyRequest) (api.APIKey, error) {
	var k api.APIKey
	err := c.do(ctx, http.MethodPost, "/v1/keys", nil, req, &k)
	return k, err
}

// ListAPIKeys lists every key, without secrets.
func (c *Client) ListAPIKeys(ctx context.Context) ([]api.APIKey, error) {
	var r api.ListAPIKeysResponse
	err := c.do(ctx, http.MethodGet, "/v1/keys", nil, nil, &r)
	return r.Keys, err
}

// RevokeAPIKey stops a key from working, at once.
func (c *Client) RevokeAPIKey(ctx context.Context, id string) (api.APIKey, error) {
	var k api.APIKey
	err := c.do(ctx, http.MethodDelete, "/v1/keys/"+url.PathEscape(id), nil, nil, &k)
	return k, err
}

// AuditQuery selects audit records.
type AuditQuery struct {
	// Tenant is one tenant's records (the operator's call; a tenant's key
	// reads only its own).
	Tenant string
	// Sandbox is one sandbox's calls.
	Sandbox string
	// After returns records with a larger seq only.
	After int64
	// Limit is the most records, the newest (default 1000).
	Limit int
}

// Audit reads the audit log: the mutating calls of the key's tenant, or of
// every tenant for the operator.
func (c *Client) Audit(ctx context.Context, q AuditQuery) ([]api.AuditRecord, error) {
	v := url.Values{}
	if q.Tenant != "" {
		v.Set("tenant", q.Tenant)
	}
	if q.Sandbox != "" {
		v.Set("sandbox", q.Sandbox)
	}
	if q.After != 0 {
		v.Set("after", strconv.FormatInt(q.After, 10))
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var r api.ListAuditResponse
	err := c.do(ctx, http.MethodGet, "/v1/audit", v, nil, &r)
	return r.Records, err
}

// SetQuota sets a tenant's quota (an admin key's call; an all-zero quota
// removes it) and returns the tenant's usage.
func (c *Client) SetQuota(ctx context.Context, tenant string, q api.Quota) (api.TenantUsage, error) {
	var u api.TenantUsage
	err := c.do(ctx, http.MethodPut, "/v1/tenants/"+url.PathEscape(tenant)+"/quota", nil, q, &u)
	return u, err
}

// Usage returns the key's tenant's usage; the operator's call returns
// every tenant's, or tenant's when given.
func (c *Client) Usage(ctx context.Context, tenant string) ([]api.TenantUsage, error) {
	var v url.Values
	if tenant != "" {
		v = url.Values{"tenant": {tenant}}
	}
	var r api.UsageResponse
	err := c.do(ctx, http.MethodGet, "/v1/usage", v, nil, &r)
	return r.Tenants, err
}
