package daemon

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/network"
	"github.com/berthsh/berth/store"
)

// NetworkConfig is the daemon's egress.
type NetworkConfig struct {
	// Default is the network mode of sandboxes whose create names none.
	Default string
	// Netns is a network namespace to make upstream connections in (a path
	// like /run/netns/NAME); empty: the daemon's own.
	Netns string
	// DNS are the upstream resolvers (ip or ip:port); empty: the
	// nameservers of /etc/resolv.conf.
	DNS []string
	// CAFile adds certificates (PEM) to the host's roots, to verify the
	// upstreams of hosts whose TLS the daemon terminates.
	CAFile string
}

// startNetwork builds the egress service, or says why sandboxes get no
// network here (the daemon still starts: creates that ask for a network
// fail with that reason). record receives every egress record.
func startNetwork(cfg NetworkConfig, listen string, st *store.Store, record func(string, api.EgressRecord), log *slog.Logger) (*network.Service, func() error, string, error) {
	var up network.Upstream = network.HostUpstream{}
	if cfg.Netns != "" {
		ns, err := network.NewNamespaceUpstream(cfg.Netns)
		if err != nil {
			return nil, nil, "", fmt.Errorf("--egress-netns: %w", err)
		}
		up = ns
	}
	resolvers, err := resolvers(cfg.DNS)
	if err != nil {
		up.Close()
		return nil, nil, "", err
	}
	// The host's roots take some 17 ms of CPU to parse: with no CA of the
	// user's, crypto/x509 loads them at the first upstream handshake; with
	// one, the pool of both is made then too (the file is checked now).
	var roots func() *x509.CertPool
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			up.Close()
			return nil, nil, "", fmt.Errorf("--egress-ca: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			up.Close()
			return nil, nil, "", fmt.Errorf("--egress-ca %s: no PEM certificate in it", cfg.CAFile)
		}
		roots = sync.OnceValue(func() *x509.CertPool {
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			pool.AppendCertsFromPEM(pem)
			return pool
		})
	}
	var deny []netip.AddrPort
	if listen != "" {
		if ap, err := netip.ParseAddrPort(listen); err == nil {
			deny = append(deny, ap)
		}
	}
	svc, err := network.NewService(network.Config{
		Upstream: up, Resolvers: resolvers, RootCAs: roots, DenyAddrs: deny, Record: record, Log: log,
		Secret: func(ctx context.Context, tenant, name string) (string, error) {
			s, err := st.GetSecret(ctx, tenant, name)
			if err != nil {
				return "", err
			}
			return string(s.Value), nil
		},
	})
	if err != nil {
		up.Close()
		return nil, nil, "", err
	}
	why := svc.Available()
	if why == "" && len(resolvers) == 0 {
		why = "no upstream resolver (give --egress-dns, or nameservers in /etc/resolv.conf)"
	}
	if why != "" {
		up.Close()
		return nil, nil, why, nil
	}
	return svc, up.Close, "", nil
}

// resolvers parses --egress-dns, or reads /etc/resolv.conf.
func resolvers(flags []string) ([]netip.AddrPort, error) {
	if len(flags) == 0 {
		return systemResolvers("/etc/resolv.conf"), nil
	}
	var out []netip.AddrPort
	for _, s := range flags {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("--egress-dns %q: want an address or address:port", s)
			}
			ap = netip.AddrPortFrom(a, 53)
		}
		if !ap.Addr().Unmap().Is4() {
			return nil, fmt.Errorf("--egress-dns %q: an IPv4 resolver", s)
		}
		out = append(out, ap)
	}
	return out, nil
}

func systemResolvers(path string) []netip.AddrPort {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil && a.Unmap().Is4() {
				out = append(out, netip.AddrPortFrom(a.Unmap(), 53))
			}
		}
	}
	return out
}
