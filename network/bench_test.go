package network

// BenchmarkEgress measures what berth's egress path costs a sandbox, each
// case twice: "direct" is the host calling the test internet's server
// from inside that internet's namespace; "policy" is the same request from
// the stand-in sandbox's namespace, through its TUN device, the netstack,
// the policy and the daemon's own connection upstream. The targets:
// a plain HTTP request adds at most 1 ms at p50, a download runs at 1 Gbit/s
// or more, an HTTPS request with a secret injected (TLS terminated by the
// daemon) adds at most 2 ms at p50. Every request is on a new connection.
// Run as root; the downloads are 64 MiB each, so they get fewer rounds:
//
//	go test -run '^$' -bench 'Egress/http' -benchtime 2000x ./network/
//	go test -run '^$' -bench 'Egress/download' -benchtime 16x ./network/

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
)

var (
	bulkAddr = netip.MustParseAddr("203.0.113.12") // bulk.test: downloads
	authAddr = netip.MustParseAddr("203.0.113.13") // auth.test: the secret's host
)

// downloadSize is one download's body.
const downloadSize = 64 << 20

func BenchmarkEgress(b *testing.B) {
	// Allowlist mode throughout, as a sandbox with a secret has: each policy
	// case first resolves its name through the sandbox's DNS at the gateway
	// (the pin the policy checks the address and Host or server name
	// against), outside the timed loop.
	w := newWorld(b, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test", "bulk.test"},
		Secrets: []api.SecretBinding{{Secret: "openai", Host: "auth.test", Header: "Authorization", Format: "Bearer {secret}"}}})
	w.inet.SetRecord("bulk.test", bulkAddr)
	w.inet.SetRecord("auth.test", authAddr)
	w.inet.ServeHTTP(b, netip.AddrPortFrom(bulkAddr, 80), zeros(downloadSize))
	w.inet.ServeHTTPS(b, netip.AddrPortFrom(authAddr, 443), []string{"auth.test"}, requireAuth("Bearer "+canary))

	host := newNSDialer(b, w.inet.Path)
	sandbox := newNSDialer(b, "/run/netns/"+w.ns)
	testCA := x509.NewCertPool()
	testCA.AppendCertsFromPEM(w.inet.CAPEM)
	// The sandbox trusts only its own CA: a request that was not terminated
	// by the daemon fails its handshake.
	sandboxCA := x509.NewCertPool()
	sandboxCA.AppendCertsFromPEM(w.ca.CertPEM())

	web := netip.AddrPortFrom(webAddr, 80)
	b.Run("http/direct", func(b *testing.B) {
		benchRequest(b, client(host, web, nil), "http://web.test/", nil, "web web.test /\n")
	})
	b.Run("http/policy", func(b *testing.B) {
		resolve(b, sandbox, "web.test", webAddr)
		benchRequest(b, client(sandbox, web, nil), "http://web.test/", nil, "web web.test /\n")
	})

	auth := netip.AddrPortFrom(authAddr, 443)
	b.Run("https-injected/direct", func(b *testing.B) {
		h := http.Header{"Authorization": {"Bearer " + canary}}
		benchRequest(b, client(host, auth, testCA), "https://auth.test/", h, "ok\n")
	})
	b.Run("https-injected/policy", func(b *testing.B) {
		resolve(b, sandbox, "auth.test", authAddr)
		benchRequest(b, client(sandbox, auth, sandboxCA), "https://auth.test/", nil, "ok\n")
	})

	bulk := netip.AddrPortFrom(bulkAddr, 80)
	b.Run("download/direct", func(b *testing.B) {
		benchDownload(b, client(host, bulk, nil), "http://bulk.test/")
	})
	b.Run("download/policy", func(b *testing.B) {
		resolve(b, sandbox, "bulk.test", bulkAddr)
		benchDownload(b, client(sandbox, bulk, nil), "http://bulk.test/")
	})
}

// benchRequest times GETs of url (with header h), each of which must
// answer 200 with want, and reports their p50 and p99.
func benchRequest(b *testing.B, c *http.Client, url string, h http.Header, want string) {
	req, err := http.NewRequestWithContext(b.Context(), http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header = h
	took := make([]time.Duration, 0, 4096)
	for b.Loop() {
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took = append(took, time.Since(start))
		if err != nil {
			b.Fatalf("read the answer: %v", err)
		}
		if resp.StatusCode != http.StatusOK || string(body) != want {
			b.Fatalf("GET %s: %s %q, want 200 %q", url, resp.Status, body, want)
		}
	}
	reportPercentiles(b, took)
}

// benchDownload times GETs of url's downloadSize bytes.
func benchDownload(b *testing.B, c *http.Client, url string) {
	req, err := http.NewRequestWithContext(b.Context(), http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 256<<10)
	b.SetBytes(downloadSize)
	for b.Loop() {
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var n int64
		for err == nil {
			var k int
			k, err = resp.Body.Read(buf)
			n += int64(k)
		}
		resp.Body.Close()
		if err != io.EOF {
			b.Fatalf("read the download after %d bytes: %v", n, err)
		}
		if resp.StatusCode != http.StatusOK || n != downloadSize {
			b.Fatalf("GET %s: %s, %d bytes, want 200 and %d", url, resp.Status, n, downloadSize)
		}
	}
	b.ReportMetric(float64(downloadSize)*8*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gbit/s")
}

// reportPercentiles reports the p50 and p99 of took (nearest rank), in µs.
func reportPercentiles(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	at := func(q float64) float64 {
		i := max(int(float64(len(took))*q+0.999999)-1, 0)
		return float64(took[i]) / float64(time.Microsecond)
	}
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// client makes each request on a new connection from d's namespace to
// target, whatever the URL's host (which still gives the Host header and
// the TLS server name). roots verify an HTTPS server.
func client(d *nsDialer, target netip.AddrPort, roots *x509.CertPool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp4", target.String())
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
}

// resolve asks the sandbox's DNS at the gateway for name, which must
// answer want: in allowlist mode that answer is what lets the sandbox
// connect to want by name.
func resolve(b *testing.B, d *nsDialer, name string, want netip.Addr) {
	b.Helper()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, netip.AddrPortFrom(Gateway, 53).String())
	}}
	// The trailing dot keeps the host's search domains out of the query.
	addrs, err := r.LookupNetIP(b.Context(), "ip4", name+".")
	if err != nil {
		b.Fatalf("resolve %s in the sandbox: %v", name, err)
	}
	if !slices.Contains(addrs, want) {
		b.Fatalf("%s resolved to %v in the sandbox, want %s", name, addrs, want)
	}
}

// nsDialer connects from inside a network namespace: one goroutine, locked
// to a thread moved into the namespace, makes every connection (a socket
// stays in the namespace it was made in). One long-lived thread, not one
// per dial, keeps a thread's start and a setns out of every timed request;
// the direct and policy cases dial the same way, so the cost they do pay
// (handing each dial to that thread) is the same on both sides.
type nsDialer struct {
	reqs chan dialReq
}

type dialReq struct {
	ctx           context.Context
	network, addr string
	reply         chan dialReply
}

type dialReply struct {
	conn net.Conn
	err  error
}

// newNSDialer starts the dialing thread in the namespace at path (a
// /run/netns bind mount); the benchmark's cleanup ends it and waits.
func newNSDialer(tb testing.TB, path string) *nsDialer {
	tb.Helper()
	d := &nsDialer{reqs: make(chan dialReq)}
	ready := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the thread ends with the goroutine, so no other
		// goroutine runs in the namespace.
		runtime.LockOSThread()
		if err := setns(path); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for r := range d.reqs {
			var nd net.Dialer
			c, err := nd.DialContext(r.ctx, r.network, r.addr)
			r.reply <- dialReply{c, err}
		}
	}()
	if err := <-ready; err != nil {
		tb.Fatalf("enter the network namespace %s: %v", path, err)
	}
	tb.Cleanup(func() {
		close(d.reqs)
		<-done
	})
	return d
}

// DialContext connects to addr from the namespace.
func (d *nsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	r := dialReq{ctx: ctx, network: network, addr: addr, reply: make(chan dialReply, 1)}
	select {
	case d.reqs <- r:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rep := <-r.reply
	return rep.conn, rep.err
}

// setns moves the calling thread into the network namespace at path.
func setns(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setns(fd, unix.CLONE_NEWNET)
}

// zeros serves size zero bytes, written from one buffer shared by every
// request (it is only read).
func zeros(size int64) http.Handler {
	buf := make([]byte, 256<<10)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/octet-stream")
		rw.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		for left := size; left > 0; {
			n, err := rw.Write(buf[:min(left, int64(len(buf)))])
			if err != nil {
				return
			}
			left -= int64(n)
		}
	})
}

// requireAuth answers "ok" to requests whose Authorization is want, and
// 401 to the rest: a request the daemon did not add the secret to fails.
func requireAuth(want string) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != want {
			http.Error(rw, "no or wrong Authorization", http.StatusUnauthorized)
			return
		}
		io.WriteString(rw, "ok\n")
	})
}
