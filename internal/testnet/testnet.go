// Package testnet builds the internet that network tests need, and the only
// one they may reach: a network namespace the test creates (with iproute2's
// ip), holding servers at documentation addresses (203.0.113.0/24) that
// the test process serves from inside the namespace, a DNS server that
// answers the names the test sets, and a test CA for HTTPS. The daemon is
// pointed at it with --egress-netns and --egress-dns.
package testnet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// T is what the package needs of a test: testing.TB has it, and so does
// the bench's stand-in (bench runs the same internet outside go test).
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Net is a test's internet.
type Net struct {
	// Name is the namespace's name; Path is its bind mount (/run/netns/Name).
	Name, Path string
	// CAPEM is the test CA's certificate; CAFile holds it.
	CAPEM  []byte
	CAFile string

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey

	mu      sync.Mutex
	records map[string][]netip.Addr
	queries []string
}

// New makes the namespace (loopback up, and a default route out of a veth
// whose peer goes nowhere, so that a daemon pointed at it finds an egress
// route and a connection to an address no server holds goes unanswered)
// and the test CA; the test's cleanup deletes the namespace.
func New(t T) *Net {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("the network tests need iproute2's ip (make test installs it)")
	}
	var b [4]byte
	rand.Read(b[:])
	// The pid tells a process's namespaces from those of tests running
	// beside it (NamePrefix).
	n := &Net{Name: NamePrefix(os.Getpid()) + fmt.Sprintf("%x", b), records: map[string][]netip.Addr{}}
	n.Path = filepath.Join("/run/netns", n.Name)
	ip(t, "netns", "add", n.Name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.Name).Run() })
	ip(t, "-n", n.Name, "link", "set", "lo", "up")
	ip(t, "-n", n.Name, "link", "add", "egress0", "type", "veth", "peer", "name", "egress1")
	ip(t, "-n", n.Name, "link", "set", "egress0", "up")
	ip(t, "-n", n.Name, "route", "add", "default", "dev", "egress0")
	n.makeCA(t)
	return n
}

// NamePrefix begins the name of every namespace New makes in process pid.
func NamePrefix(pid int) string { return fmt.Sprintf("berth-test-%d-", pid) }

func ip(t T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// AddAddr makes addr one of the namespace's own addresses.
func (n *Net) AddAddr(t T, addr netip.Addr) {
	t.Helper()
	ip(t, "-n", n.Name, "addr", "add", addr.String()+"/32", "dev", "lo")
}

// inside runs fn on a thread moved into the namespace; the thread ends
// with fn (it is never unlocked), so nothing else runs there.
func (n *Net) inside(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(ns)
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Listen opens a listener inside the namespace (its address is added).
func (n *Net) Listen(t T, addr netip.AddrPort) net.Listener {
	t.Helper()
	n.addOnce(t, addr.Addr())
	var ln net.Listener
	if err := n.inside(func() (err error) {
		ln, err = net.Listen("tcp4", addr.String())
		return err
	}); err != nil {
		t.Fatalf("listen on %s in the test net: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// ListenPacket opens a UDP socket inside the namespace.
func (n *Net) ListenPacket(t T, addr netip.AddrPort) net.PacketConn {
	t.Helper()
	n.addOnce(t, addr.Addr())
	var pc net.PacketConn
	if err := n.inside(func() (err error) {
		pc, err = net.ListenPacket("udp4", addr.String())
		return err
	}); err != nil {
		t.Fatalf("listen on udp %s in the test net: %v", addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

// Dial connects from inside the namespace.
func (n *Net) Dial(t T, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.inside(func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, 5*time.Second)
		return err
	})
	return c, err
}

func (n *Net) addOnce(t T, addr netip.Addr) {
	t.Helper()
	out, err := exec.Command("ip", "-n", n.Name, "-o", "addr", "show", "dev", "lo").Output()
	if err != nil {
		t.Fatalf("ip addr show: %v", err)
	}
	if !strings.Contains(string(out), " "+addr.String()+"/") {
		n.AddAddr(t, addr)
	}
}

// ServeHTTP serves h over plain HTTP at addr.
func (n *Net) ServeHTTP(t T, addr netip.AddrPort, h http.Handler) {
	t.Helper()
	ln := n.Listen(t, addr)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// ServeHTTPS serves h over TLS at addr with a certificate of the test CA
// for names.
func (n *Net) ServeHTTPS(t T, addr netip.AddrPort, names []string, h http.Handler) {
	t.Helper()
	cert := n.Cert(t, names...)
	ln := tls.NewListener(n.Listen(t, addr), &tls.Config{Certificates: []tls.Certificate{cert}})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func (n *Net) makeCA(t T) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth test internet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	n.ca, _ = x509.ParseCertificate(der)
	n.caKey = key
	n.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	n.CAFile = filepath.Join(t.TempDir(), "test-ca.pem")
	if err := os.WriteFile(n.CAFile, n.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Cert issues a server certificate of the test CA for names.
func (n *Net) Cert(t T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, n.ca, &key.PublicKey, n.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// SetRecord makes the DNS server answer name's A queries with addrs (none:
// NXDOMAIN).
func (n *Net) SetRecord(name string, addrs ...netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.records[strings.ToLower(strings.TrimSuffix(name, "."))] = addrs
}

// Queries returns the names the DNS server was asked, in order.
func (n *Net) Queries() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.queries...)
}

// ServeDNS answers A queries over UDP and TCP at addr from the records
// (AAAA: no answer; unknown names: NXDOMAIN), with a TTL of 60 s.
func (n *Net) ServeDNS(t T, addr netip.AddrPort) {
	t.Helper()
	pc := n.ListenPacket(t, addr)
	go func() {
		buf := make([]byte, 1500)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := n.answer(buf[:k]); out != nil {
				pc.WriteTo(out, from)
			}
		}
	}()
	ln := n.Listen(t, addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go n.serveDNSConn(c)
		}
	}()
}

func (n *Net) serveDNSConn(c net.Conn) {
	defer c.Close()
	for {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		out := n.answer(q)
		if out == nil {
			return
		}
		c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(out))))
		c.Write(out)
	}
}

func (n *Net) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	n.mu.Lock()
	n.queries = append(n.queries, name)
	addrs, known := n.records[name]
	n.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !known || len(addrs) == 0 {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	if q.Type == dnsmessage.TypeA {
		for _, a := range addrs {
			b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60},
				dnsmessage.AResource{A: a.As4()})
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// Capture is an attacker's server: it records everything sent to it.
type Capture struct {
	mu  sync.Mutex
	got []byte
	n   int
}

// Bytes returns what the attacker received so far.
func (c *Capture) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.got...)
}

// Hits counts connections and datagrams.
func (c *Capture) Hits() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *Capture) add(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if len(c.got) < 1<<20 {
		c.got = append(c.got, b...)
	}
}

// Attacker listens on TCP and UDP at every port of ports on addr and
// records whatever arrives.
func (n *Net) Attacker(t T, addr netip.Addr, ports ...uint16) *Capture {
	t.Helper()
	c := &Capture{}
	for _, port := range ports {
		ln := n.Listen(t, netip.AddrPortFrom(addr, port))
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer conn.Close()
					conn.SetDeadline(time.Now().Add(5 * time.Second))
					b, _ := io.ReadAll(io.LimitReader(conn, 1<<20))
					c.add(b)
				}()
			}
		}()
		pc := n.ListenPacket(t, netip.AddrPortFrom(addr, port))
		go func() {
			buf := make([]byte, 65536)
			for {
				k, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				c.add(buf[:k])
			}
		}()
	}
	return c
}

// WaitFor polls cond for up to d.
func WaitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}
