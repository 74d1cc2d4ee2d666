package sandbox

import (
	"context"
	"strings"
	"unicode/utf8"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/network"
	"github.com/berthsh/berth/store"
)

// maxSecret bounds a secret's value.
const maxSecret = 64 << 10

func checkSecret(name, value string) error {
	if !network.ValidSecretName(name) {
		return errdefs.New(errdefs.InvalidArgument, "name: %q: letters, digits, '_', '-' and '.', at most 128", name)
	}
	if value == "" || len(value) > maxSecret {
		return errdefs.New(errdefs.InvalidArgument, "value: 1..%d bytes", maxSecret)
	}
	// It goes into HTTP headers.
	if !utf8.ValidString(value) || strings.ContainsAny(value, "\r\n\x00") {
		return errdefs.New(errdefs.InvalidArgument, "value: a secret is added to HTTP headers: no line breaks or NUL, valid UTF-8")
	}
	return nil
}

func secretToAPI(s store.Secret) api.Secret {
	return api.Secret{Name: s.Name, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

// CreateSecret stores a tenant's secret.
func (m *Manager) CreateSecret(ctx context.Context, tenant string, req api.CreateSecretRequest) (api.Secret, error) {
	if err := checkSecret(req.Name, req.Value); err != nil {
		return api.Secret{}, err
	}
	if err := m.store.CreateSecret(ctx, store.Secret{Tenant: tenant, Name: req.Name, Value: []byte(req.Value)}); err != nil {
		return api.Secret{}, err
	}
	return m.GetSecret(ctx, tenant, req.Name)
}

// UpdateSecret replaces a secret's value: requests after it get the new one.
func (m *Manager) UpdateSecret(ctx context.Context, tenant, name string, req api.UpdateSecretRequest) (api.Secret, error) {
	if err := checkSecret(name, req.Value); err != nil {
		return api.Secret{}, err
	}
	if err := m.store.UpdateSecret(ctx, tenant, name, []byte(req.Value)); err != nil {
		return api.Secret{}, err
	}
	return m.GetSecret(ctx, tenant, name)
}

// GetSecret describes a secret (never its value).
func (m *Manager) GetSecret(ctx context.Context, tenant, name string) (api.Secret, error) {
	s, err := m.store.GetSecret(ctx, tenant, name)
	if err != nil {
		return api.Secret{}, err
	}
	return secretToAPI(s), nil
}

// ListSecrets lists a tenant's secrets (never their values).
func (m *Manager) ListSecrets(ctx context.Context, tenant string) ([]api.Secret, error) {
	list, err := m.store.ListSecrets(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]api.Secret, 0, len(list))
	for _, s := range list {
		out = append(out, secretToAPI(s))
	}
	return out, nil
}

// DeleteSecret removes a secret no sandbox's policy binds: conflict naming
// the sandboxes that do.
func (m *Manager) DeleteSecret(ctx context.Context, tenant, name string) error {
	if _, err := m.store.GetSecret(ctx, tenant, name); err != nil {
		return err
	}
	recs, err := m.store.ListSandboxes(ctx, tenant, labels.Selector{})
	if err != nil {
		return err
	}
	var users []string
	for _, rec := range recs {
		if rec.Tenant != tenant {
			continue
		}
		spec, err := recordSpec(rec)
		if err != nil {
			continue
		}
		for _, b := range networkOf(spec).Secrets {
			if b.Secret == name {
				users = append(users, rec.ID)
				break
			}
		}
	}
	if len(users) > 0 {
		return errdefs.New(errdefs.Conflict, "secret %q is bound by sandboxes %s: change their network policies first", name, strings.Join(users, ", "))
	}
	return m.store.DeleteSecret(ctx, tenant, name)
}

// SecretValue is the network service's view of a secret.
func (m *Manager) SecretValue(ctx context.Context, tenant, name string) (string, error) {
	s, err := m.store.GetSecret(ctx, tenant, name)
	if err != nil {
		return "", err
	}
	return string(s.Value), nil
}
