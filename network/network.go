// Package network is berth's egress: what a sandbox may reach, decided in Go
// for every connection, DNS query and request. A sandbox with a network has
// one link (a TUN device the runtime makes in its namespace) whose far end
// is a user-space TCP/IP stack in the daemon (netstack); nothing is routed,
// NATed or filtered by the host kernel. For each sandbox the package
//
//   - answers DNS at the gateway, refusing names the policy does not allow
//     and pinning the addresses of those it does (pins.go, dns.go);
//   - checks every TCP connection and UDP flow against the policy (the
//     address, the names pinned to it, the TLS server name or HTTP Host
//     the sandbox sends) and, if allowed, connects it upstream from the
//     egress namespace (tcp.go, udp.go, dialer.go);
//   - terminates TLS, with a CA of the sandbox's own, only to hosts a secret
//     is bound to, adds the secret to their requests and scrubs it from
//     their answers, so that the secret never enters the sandbox (http.go,
//     ca.go, scrub.go);
//   - records every attempt, allowed or not, with the rule that decided.
//
// The policy (policy.go) is the manager's: it compiles a sandbox's
// api.Network and swaps it in at once when the sandbox's policy changes.
package network

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/network/netstack"
	"github.com/berthsh/berth/runtime"
)

// The link's addresses, the same in every sandbox (each has a stack of its
// own): the sandbox is 100.64.0.2, the gateway (the daemon's stack, and the
// sandbox's resolver) 100.64.0.1, in the shared address space no sandbox
// may otherwise reach.
var (
	Gateway = netip.MustParseAddr("100.64.0.1")
	Address = netip.MustParseAddr("100.64.0.2")
)

// MTU is the link's: large, as the packets never leave the host.
const MTU = 65520

// Link is the runtime attachment for a sandbox with a network.
func Link() runtime.Network {
	return runtime.Network{Mode: runtime.NetworkLink, Address: Address, Gateway: Gateway, MTU: MTU}
}

// Config is what the daemon gives the service.
type Config struct {
	// Upstream makes the daemon's side of connections.
	Upstream Upstream
	// Resolvers answer the names the policy allows.
	Resolvers []netip.AddrPort
	// RootCAs returns the roots that verify upstream certificates where
	// the daemon terminates TLS; it is called at each such connection, so
	// a pool made at the first call (sync.OnceValue) costs a daemon
	// nothing at start. nil: the host's roots, which crypto/x509 loads at
	// the first verification.
	RootCAs func() *x509.CertPool
	// DenyAddrs are refused in every mode: the daemon's own listeners.
	DenyAddrs []netip.AddrPort
	// Secret returns the value of a tenant's secret.
	Secret func(ctx context.Context, tenant, name string) (string, error)
	// Record receives every egress record of a sandbox.
	Record func(sandbox string, rec api.EgressRecord)
	// MaxConns bounds each sandbox's open TCP connections (default 1024).
	MaxConns int
	Log      *slog.Logger
}

// Service runs the network of every sandbox of a daemon.
type Service struct {
	cfg Config
}

// NewService checks cfg and returns the service.
func NewService(cfg Config) (*Service, error) {
	if cfg.Upstream == nil {
		return nil, errors.New("network: no upstream")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 1024
	}
	if cfg.Record == nil {
		cfg.Record = func(string, api.EgressRecord) {}
	}
	if cfg.RootCAs == nil {
		cfg.RootCAs = func() *x509.CertPool { return nil } // tls.Config's nil: the host's roots
	}
	return &Service{cfg: cfg}, nil
}

// Available says why sandboxes cannot have a network here, or "": the
// egress namespace needs a default route.
func (s *Service) Available() string {
	ok, err := s.cfg.Upstream.DefaultRoute()
	switch {
	case err != nil:
		return "cannot read the egress namespace's routes: " + err.Error()
	case !ok:
		return "the egress network namespace has no default route"
	}
	return ""
}

// Sandbox is one sandbox's network: its stack, DNS, policy and pins.
type Sandbox struct {
	svc     *Service
	id      string
	tenant  string
	link    *runtime.Link
	stack   *netstack.Stack
	gateway netip.Addr
	pol     atomic.Pointer[Policy]
	pins    *pins
	ca      *CA
	// tlsDown is the base of the TLS servers that terminate the sandbox's
	// connections (its session ticket key, so that clients that resume
	// can); sessions keeps the upstreams' sessions, so that a second
	// connection to a host resumes instead of verifying its chain again.
	tlsDown  *tls.Config
	sessions tls.ClientSessionCache

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	conns    semaphore // open TCP connections
	udpFlows semaphore
	dnsSlots semaphore // queries being answered
	denials  rateLimit // denied attempts recorded per second

	summary struct{ allowed, denied, out, in atomic.Int64 }
	closeMu sync.Mutex
	closed  bool
}

// Attach starts sandbox id's network on its link under policy p; the
// sandbox takes the link and closes it with Close. ca is the sandbox's CA
// (for hosts secrets are bound to).
func (s *Service) Attach(id, tenant string, link *runtime.Link, p *Policy, ca *CA) (*Sandbox, error) {
	ctx, cancel := context.WithCancel(context.Background())
	sb := &Sandbox{svc: s, id: id, tenant: tenant, link: link, gateway: Gateway, pins: newPins(time.Now), ca: ca,
		ctx: ctx, cancel: cancel,
		conns: newSemaphore(s.cfg.MaxConns), udpFlows: newSemaphore(256), dnsSlots: newSemaphore(64),
		denials: rateLimit{per: 100}}
	sb.tlsDown = &tls.Config{NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
	if _, err := rand.Read(sb.tlsDown.SessionTicketKey[:]); err != nil {
		cancel()
		return nil, err
	}
	sb.sessions = tls.NewLRUClientSessionCache(64)
	sb.pol.Store(p)
	st, err := netstack.New(int(link.File.Fd()), uint32(link.MTU), Gateway, netstack.Handlers{TCP: sb.onTCP, UDP: sb.onUDP})
	if err != nil {
		cancel()
		return nil, err
	}
	sb.stack = st
	udp, err := st.ListenUDP(53)
	if err != nil {
		sb.Close()
		return nil, fmt.Errorf("network: DNS: %w", err)
	}
	tcp, err := st.Listen(53)
	if err != nil {
		udp.Close()
		sb.Close()
		return nil, fmt.Errorf("network: DNS: %w", err)
	}
	context.AfterFunc(ctx, func() { udp.Close(); tcp.Close() })
	sb.serveDNS(udp, tcp)
	st.Start()
	return sb, nil
}

// SetPolicy puts p in force for new connections, queries and requests.
func (sb *Sandbox) SetPolicy(p *Policy) { sb.pol.Store(p) }

func (sb *Sandbox) policy() *Policy { return sb.pol.Load() }

// Summary counts the sandbox's egress since this network was attached.
func (sb *Sandbox) Summary() api.EgressSummary {
	return api.EgressSummary{Allowed: sb.summary.allowed.Load(), Denied: sb.summary.denied.Load(),
		BytesOut: sb.summary.out.Load(), BytesIn: sb.summary.in.Load()}
}

// Close ends every connection, stops the stack and closes the link: the
// sandbox is left with loopback only. It waits for every goroutine of the
// sandbox's network.
func (sb *Sandbox) Close() {
	sb.closeMu.Lock()
	defer sb.closeMu.Unlock()
	if sb.closed {
		return
	}
	sb.closed = true
	sb.cancel()
	if sb.stack != nil {
		sb.stack.Close()
	}
	sb.wg.Wait()
	sb.link.File.Close()
}

// record stamps rec with its start and duration and hands it on. Denied
// attempts past the rate limit are counted but not recorded one by one.
func (sb *Sandbox) record(rec api.EgressRecord, start time.Time) {
	rec.Time = start.UTC()
	rec.DurationMs = time.Since(start).Milliseconds()
	if rec.Allowed {
		sb.summary.allowed.Add(1)
	} else {
		sb.summary.denied.Add(1)
		if !sb.denials.allow(time.Now()) {
			return
		}
	}
	sb.summary.out.Add(rec.BytesOut)
	sb.summary.in.Add(rec.BytesIn)
	sb.svc.cfg.Record(sb.id, rec)
}

// deniedByDaemon says whether dst is one of the daemon's own listeners.
func (s *Service) deniedByDaemon(dst netip.AddrPort) bool {
	return slices.ContainsFunc(s.cfg.DenyAddrs, func(a netip.AddrPort) bool {
		return a.Port() == dst.Port() && (a.Addr().IsUnspecified() || a.Addr().Unmap() == dst.Addr().Unmap())
	})
}

// semaphore bounds a count without blocking.
type semaphore chan struct{}

func newSemaphore(n int) semaphore { return make(semaphore, n) }

func (s semaphore) TryAcquire() bool {
	select {
	case s <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s semaphore) Release() { <-s }

// rateLimit allows per events a second.
type rateLimit struct {
	mu     sync.Mutex
	per    int
	second int64
	n      int
}

func (r *rateLimit) allow(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := now.Unix(); s != r.second {
		r.second, r.n = s, 0
	}
	r.n++
	return r.n <= r.per
}

func afterFunc(sb *Sandbox, f func()) func() bool { return context.AfterFunc(sb.ctx, f) }
