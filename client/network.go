package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berthsh/berth/api"
)

// CreateSecret stores a secret; no call ever returns its value.
func (c *Client) CreateSecret(ctx context.Context, name, value string) (api.Secret, error) {
	var s api.Secret
	err := c.do(ctx, http.MethodPost, "/v1/secrets", nil, api.CreateSecretRequest{Name: name, Value: value}, &s)
	return s, err
}

// UpdateSecret replaces a secret's value.
func (c *Client) UpdateSecret(ctx context.Context, name, value string) (api.Secret, error) {
	var s api.Secret
	err := c.do(ctx, http.MethodPut, "/v1/secrets/"+url.PathEscape(name), nil, api.UpdateSecretRequest{Value: value}, &s)
	return s, err
}

// GetSecret describes a secret.
func (c *Client) GetSecret(ctx context.Context, name string) (api.Secret, error) {
	var s api.Secret
	err := c.do(ctx, http.MethodGet, "/v1/secrets/"+url.PathEscape(name), nil, nil, &s)
	return s, err
}

// ListSecrets lists the secrets.
func (c *Client) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	var r api.ListSecretsResponse
	err := c.do(ctx, http.MethodGet, "/v1/secrets", nil, nil, &r)
	return r.Secrets, err
}

// DeleteSecret removes a secret no sandbox binds.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name), nil, nil, nil)
}

// SetNetwork replaces a sandbox's network policy.
func (c *Client) SetNetwork(ctx context.Context, id string, n api.Network) (api.Sandbox, error) {
	return c.UpdateSandbox(ctx, id, api.UpdateSandboxRequest{Network: &n})
}

// EgressQuery selects egress records.
type EgressQuery struct {
	After  int64 // records after this seq
	Limit  int   // at most (1..1000; 0: 1000)
	Denied bool  // refused attempts only
}

func (q EgressQuery) values() url.Values {
	v := url.Values{}
	if q.After > 0 {
		v.Set("after", strconv.FormatInt(q.After, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Denied {
		v.Set("denied", "true")
	}
	return v
}

// Egress returns a sandbox's egress records, oldest first.
func (c *Client) Egress(ctx context.Context, id string, q EgressQuery) ([]api.EgressRecord, error) {
	var r api.ListEgressResponse
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/egress", q.values(), nil, &r)
	return r.Records, err
}

// EgressStream is a followed egress log.
type EgressStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// FollowEgress streams a sandbox's egress records: those after q.After,
// then new ones as they happen, until ctx ends or the sandbox is deleted.
func (c *Client) FollowEgress(ctx context.Context, id string, q EgressQuery) (*EgressStream, error) {
	v := q.values()
	v.Set("follow", "true")
	resp, err := c.request(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/egress", v, nil)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &EgressStream{body: resp.Body, sc: sc}, nil
}

// Next returns the next record; io.EOF when the stream ends.
func (s *EgressStream) Next() (api.EgressRecord, error) {
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil && !errors.Is(err, context.Canceled) {
			return api.EgressRecord{}, err
		}
		return api.EgressRecord{}, io.EOF
	}
	var rec api.EgressRecord
	if err := json.Unmarshal(s.sc.Bytes(), &rec); err != nil {
		return api.EgressRecord{}, err
	}
	return rec, nil
}

// Close ends the stream.
func (s *EgressStream) Close() error { return s.body.Close() }
