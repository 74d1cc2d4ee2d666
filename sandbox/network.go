package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/network"
	"github.com/berthsh/berth/runtime"
)

// Where a networked sandbox finds its trust: the system bundle (the image's
// with the sandbox's CA appended) and the CA alone.
const (
	trustBundle = "/etc/ssl/certs/ca-certificates.crt"
	caFile      = "/etc/berth/ca.crt"
	resolvConf  = "/etc/resolv.conf"
)

// normalizeNetwork fills a create's (or an update's) network policy and
// checks it: the mode defaults to the daemon's, the policy compiles, every
// bound secret exists, each env binding gets a placeholder (the one old
// had for the same binding, so that processes keep theirs), and a
// networked policy needs a runtime and a daemon that can give one.
func (m *Manager) normalizeNetwork(ctx context.Context, tenant string, t *tier, n *api.Network, old *api.Network) (*network.Policy, error) {
	if n.Mode == "" {
		n.Mode = m.cfg.DefaultNetwork
	}
	if _, err := network.Compile(*n); err != nil {
		return nil, err
	}
	for i := range n.Secrets {
		b := &n.Secrets[i]
		if _, err := m.store.GetSecret(ctx, tenant, b.Secret); err != nil {
			if errdefs.IsNotFound(err) {
				return nil, errdefs.New(errdefs.InvalidArgument, "network.secrets[%d].secret: no secret %q (POST /v1/secrets stores one)", i, b.Secret)
			}
			return nil, err
		}
		b.Placeholder = ""
		if b.Env == "" {
			continue
		}
		if old != nil {
			for _, o := range old.Secrets {
				if o.Secret == b.Secret && o.Host == b.Host && o.Env == b.Env && o.Placeholder != "" {
					b.Placeholder = o.Placeholder
				}
			}
		}
		if b.Placeholder == "" {
			ph, err := placeholder()
			if err != nil {
				return nil, err
			}
			b.Placeholder = ph
		}
	}
	p, err := network.Compile(*n) // again, with the placeholders
	if err != nil {
		return nil, err
	}
	if !p.Networked() {
		return p, nil
	}
	if m.net == nil {
		return nil, errdefs.New(errdefs.Unavailable, "network.mode %s: this daemon gives sandboxes no network: %s", n.Mode, m.cfg.NetworkUnavailable)
	}
	if !slices.Contains(t.caps.NetworkModes, runtime.NetworkLink) {
		why := t.caps.Missing["network_link"]
		if why == "" {
			why = "it cannot attach a network link"
		}
		return nil, errdefs.New(errdefs.NotImplemented, "network.mode %s: runtime %s: %s", n.Mode, t.name, why)
	}
	return p, nil
}

// normalizeRequestNetwork normalizes a create's network policy in place.
func (m *Manager) normalizeRequestNetwork(ctx context.Context, tenant string, req *api.CreateSandboxRequest) error {
	n := api.Network{}
	if req.Network != nil {
		n = *req.Network
	}
	if _, err := m.normalizeNetwork(ctx, tenant, m.tiers[req.Runtime], &n, nil); err != nil {
		return err
	}
	req.Network = &n
	return nil
}

// placeholder is what a sandbox sees instead of a secret it may use.
func placeholder() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("placeholder: %w", err)
	}
	return "berth-ph-" + hex.EncodeToString(b), nil
}

// networkOf is a spec's policy, the daemon's default when it has none (a
// sandbox made before sandboxes had networks).
func networkOf(spec api.CreateSandboxRequest) api.Network {
	if spec.Network == nil {
		return api.Network{Mode: api.NetworkNone}
	}
	return *spec.Network
}

// networkEnv is what a networked sandbox's processes get besides their own
// environment: where the trust bundle is, for programs that do not read
// the system's, and the placeholders of env bindings.
func networkEnv(n api.Network) map[string]string {
	if n.Mode == api.NetworkNone || n.Mode == "" {
		return nil
	}
	env := map[string]string{
		"SSL_CERT_FILE":       trustBundle,
		"REQUESTS_CA_BUNDLE":  trustBundle,
		"CURL_CA_BUNDLE":      trustBundle,
		"NODE_EXTRA_CA_CERTS": caFile,
	}
	for _, b := range n.Secrets {
		if b.Env != "" {
			env[b.Env] = b.Placeholder
		}
	}
	return env
}

// sandboxCA returns sandbox id's CA, making and storing it the first time.
func (m *Manager) sandboxCA(ctx context.Context, id string) (*network.CA, error) {
	cert, key, err := m.store.GetCA(ctx, id)
	if err == nil {
		return network.LoadCA(cert, key)
	}
	if !errdefs.IsNotFound(err) {
		return nil, err
	}
	ca, err := network.NewCA(id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: CA: %w", id, err)
	}
	cert, key, err = ca.Marshal()
	if err != nil {
		return nil, err
	}
	if err := m.store.PutCA(ctx, id, cert, key); err != nil {
		return nil, err
	}
	return ca, nil
}

// trustFiles are the files that make a sandbox trust its CA: the image's
// bundle (the first layer that has one) with the CA appended, and the CA.
func trustFiles(layers []string, ca *network.CA) ([]runtime.File, error) {
	// The image's own file, read as the sandbox would see it: an image's
	// symlink never reaches the host's files.
	bundle, _, err := image.ReadFile(layers, strings.TrimPrefix(trustBundle, "/"), 16<<20)
	if err != nil {
		return nil, fmt.Errorf("read the image's trust bundle: %w", err)
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, ca.CertPEM()...)
	return []runtime.File{
		{Path: trustBundle, Data: bundle, Mode: 0o644},
		{Path: caFile, Data: ca.CertPEM(), Mode: 0o644},
	}, nil
}

// resolvFile points the sandbox's resolver at the gateway: in every
// sandbox, so that a policy changed to a network needs no new file (with
// none, a query fails at once: there is no route).
func resolvFile() runtime.File {
	return runtime.File{Path: resolvConf, Data: []byte("nameserver " + network.Gateway.String() + "\noptions edns0\n"), Mode: 0o644}
}

// attachNetwork starts a running sandbox's network on link under its
// policy. The network takes the link.
func (m *Manager) attachNetwork(ctx context.Context, id, tenant string, link *runtime.Link, n api.Network) (*network.Sandbox, error) {
	ca, err := m.sandboxCA(ctx, id)
	if err != nil {
		link.File.Close()
		return nil, err
	}
	p, err := network.Compile(n)
	if err != nil {
		link.File.Close()
		return nil, err
	}
	nsb, err := m.net.Attach(id, tenant, link, p, ca)
	if err != nil {
		link.File.Close()
		return nil, fmt.Errorf("sandbox %s: network: %w", id, err)
	}
	m.egress.open(ctx, id)
	return nsb, nil
}

// relink gives a running sandbox (re-attached after a restart, or whose
// policy just gained a network) its link and network.
func (m *Manager) relink(ctx context.Context, t *tier, id, tenant string, n api.Network) (*network.Sandbox, error) {
	if m.net == nil {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s: this daemon gives sandboxes no network: %s", id, m.cfg.NetworkUnavailable)
	}
	lk, ok := t.rt.(runtime.Linker)
	if !ok {
		return nil, errdefs.New(errdefs.NotImplemented, "sandbox %s: runtime %s cannot attach a network to a running sandbox", id, t.name)
	}
	link, err := lk.Link(ctx, id, network.Link())
	if err != nil {
		return nil, err
	}
	return m.attachNetwork(ctx, id, tenant, link, n)
}

// networkSpec is the runtime attachment and the files of a sandbox's
// network at create or start.
func (m *Manager) networkSpec(ctx context.Context, id string, n api.Network, layers []string) (runtime.Network, []runtime.File, error) {
	files := []runtime.File{resolvFile()}
	if n.Mode == api.NetworkNone || n.Mode == "" {
		return runtime.Network{Mode: runtime.NetworkNone}, files, nil
	}
	ca, err := m.sandboxCA(ctx, id)
	if err != nil {
		return runtime.Network{}, nil, err
	}
	trust, err := trustFiles(layers, ca)
	if err != nil {
		return runtime.Network{}, nil, err
	}
	return network.Link(), append(files, trust...), nil
}

// writeTrust puts the trust files into a running sandbox whose policy just
// gained a network, through its guest.
func (m *Manager) writeTrust(ctx context.Context, ls *liveSandbox, id string, layers []string) error {
	ca, err := m.sandboxCA(ctx, id)
	if err != nil {
		return err
	}
	files, err := trustFiles(layers, ca)
	if err != nil {
		return err
	}
	for _, f := range files {
		mode := uint32(f.Mode.Perm())
		if _, err := ls.guest.Upload(ctx, guestapi.Where{User: "root"}, f.Path, &mode, false, bytes.NewReader(f.Data), int64(len(f.Data))); err != nil {
			return fmt.Errorf("sandbox %s: write %s: %w", id, f.Path, err)
		}
	}
	return nil
}

// setNetwork puts a running sandbox's network in line with policy n: a
// network it lacked is linked (and its trust written), one it no longer
// has is closed, one it keeps gets the new policy at once. On error the
// sandbox's network is as it was.
func (m *Manager) setNetwork(ctx context.Context, ls *liveSandbox, id, tenant string, n api.Network) error {
	p, err := network.Compile(n)
	if err != nil {
		return err
	}
	m.mu.Lock()
	cur := ls.net
	m.mu.Unlock()
	switch {
	case p.Networked() && cur != nil:
		cur.SetPolicy(p)
	case p.Networked():
		if err := m.writeTrust(ctx, ls, id, ls.layers); err != nil {
			return err
		}
		nsb, err := m.relink(ctx, ls.tier, id, tenant, n)
		if err != nil {
			return err
		}
		m.mu.Lock()
		ls.net = nsb
		m.mu.Unlock()
	case cur != nil:
		m.mu.Lock()
		ls.net = nil
		m.mu.Unlock()
		cur.Close()
	}
	return nil
}
