package network

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/network/netstack"
)

const (
	dialTimeout = 10 * time.Second
	// sniffTimeout bounds the wait for the first bytes of a connection to
	// port 80 or 443 (HTTP and TLS clients speak first).
	sniffTimeout = 10 * time.Second
	// maxSniff bounds what is read to find a TLS server name or an HTTP Host.
	maxSniff = 64 << 10
)

// onTCP runs on the stack's goroutine: it hands the connection to a
// goroutine of its own, or refuses it when the sandbox has too many.
func (sb *Sandbox) onTCP(req *netstack.TCPRequest) {
	if !sb.conns.TryAcquire() {
		req.Refuse()
		sb.record(api.EgressRecord{Proto: api.EgressTCP, Addr: req.Dst.Addr().String(), Port: int(req.Dst.Port()),
			Rule: fmt.Sprintf("over %d open connections", cap(sb.conns))}, time.Now())
		return
	}
	sb.wg.Add(1)
	go func() {
		defer sb.wg.Done()
		defer sb.conns.Release()
		sb.handleTCP(req)
	}()
}

// handleTCP decides on a connection by its address (and the names pinned to
// it), connects it upstream, and then either relays it or, on ports 80 and
// 443, reads its first bytes to check the TLS server name or HTTP Host.
func (sb *Sandbox) handleTCP(req *netstack.TCPRequest) {
	start := time.Now()
	dst := req.Dst
	p := sb.policy()
	rec := api.EgressRecord{Proto: api.EgressTCP, Addr: dst.Addr().String(), Port: int(dst.Port())}
	names := sb.pins.names(dst.Addr())
	if len(names) > 0 {
		rec.Name = names[0]
	}
	d := p.CheckAddr(dst.Addr(), dst.Port(), names)
	if sb.svc.deniedByDaemon(dst) {
		d = deny("the daemon's own listener")
	}
	if !d.Allowed {
		req.Refuse()
		rec.Rule = d.Rule
		sb.record(rec, start)
		return
	}
	rec.Allowed, rec.Rule = true, d.Rule
	ctx, cancel := context.WithTimeout(sb.ctx, dialTimeout)
	up, err := sb.svc.cfg.Upstream.Dial(ctx, dst)
	cancel()
	if err != nil {
		req.Refuse()
		rec.Error = "connect: " + err.Error()
		sb.record(rec, start)
		return
	}
	c, err := req.Accept()
	if err != nil {
		up.Close()
		rec.Error = err.Error()
		sb.record(rec, start)
		return
	}
	stop := context.AfterFunc(sb.ctx, func() { c.Close(); up.Close() })
	defer stop()
	defer c.Close()
	defer up.Close()
	if dst.Port() == 80 || dst.Port() == 443 {
		sb.inspect(c, up, dst, p, rec, start)
		return
	}
	rec.BytesOut, rec.BytesIn = splice(c, up, nil)
	sb.record(rec, start)
}

// inspect reads the first bytes of a connection to port 80 or 443.
func (sb *Sandbox) inspect(c, up net.Conn, dst netip.AddrPort, p *Policy, rec api.EgressRecord, start time.Time) {
	c.SetReadDeadline(time.Now().Add(sniffTimeout))
	kind, name, prefix := sniff(c)
	c.SetReadDeadline(time.Time{})
	switch kind {
	case kindTLS:
		rec.Proto, rec.Name = api.EgressTLS, name
		if d := sb.checkServerName(p, name, dst); !d.Allowed {
			rec.Allowed, rec.Rule = false, d.Rule
			rec.BytesOut = int64(len(prefix))
			sb.record(rec, start)
			return
		}
		if dst.Port() == 443 && len(p.BindingsFor(name)) > 0 {
			sb.terminate(c, up, prefix, name, dst, rec, start)
			return
		}
	case kindHTTP:
		sb.proxyHTTP(&prefixConn{Conn: c, prefix: prefix}, up, "", dst, rec)
		return
	default:
		if p.Mode == api.NetworkAllowlist && !p.AddrAllowedByCIDR(dst.Addr(), dst.Port()) {
			rec.Allowed = false
			rec.Rule = fmt.Sprintf("neither TLS nor HTTP on port %d: the name it is for cannot be checked", dst.Port())
			rec.BytesOut = int64(len(prefix))
			sb.record(rec, start)
			return
		}
	}
	out, in := splice(c, up, prefix)
	rec.BytesOut, rec.BytesIn = out, in
	sb.record(rec, start)
}

// checkServerName decides on a name the sandbox sent to dst (a TLS server
// name or an HTTP Host): the policy must allow it and, in allowlist mode,
// the name must have resolved to dst (unless an allow CIDR covers dst).
func (sb *Sandbox) checkServerName(p *Policy, name string, dst netip.AddrPort) Decision {
	cidr := p.AddrAllowedByCIDR(dst.Addr(), dst.Port())
	if name == "" {
		if p.Mode == api.NetworkAllowlist && !cidr {
			return deny("no server name: an address is reached by name, or named in an allow CIDR")
		}
		return allow("open")
	}
	if _, err := netip.ParseAddr(name); err == nil {
		if p.Mode == api.NetworkAllowlist && !cidr {
			return deny("an address as the server name: name it in an allow CIDR")
		}
		return allow("open")
	}
	d := p.CheckName(name)
	if !d.Allowed {
		return d
	}
	if p.Mode == api.NetworkAllowlist && !cidr && !sb.pins.has(strings.ToLower(strings.TrimSuffix(name, ".")), dst.Addr()) {
		return deny(fmt.Sprintf("%s did not resolve to %s for this sandbox", name, dst.Addr()))
	}
	return d
}

const (
	kindOther = iota
	kindTLS
	kindHTTP
)

// sniff reads the start of a connection: a TLS ClientHello (kind TLS and
// its server name) or an HTTP request's head (kind HTTP); prefix is every
// byte read, to be sent on.
func sniff(c net.Conn) (kind int, name string, prefix []byte) {
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return kindOther, "", nil
	}
	if first[0] == 0x16 { // TLS handshake record
		rec := &recordingConn{Conn: c, buf: append([]byte(nil), first[0])}
		var hello string
		tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello = h.ServerName
			return nil, errSniffed
		}}).Handshake()
		return kindTLS, hello, rec.buf
	}
	if !isToken(first[0]) {
		return kindOther, "", first[:]
	}
	// An HTTP request line: read the head (up to maxSniff) for http.ReadRequest.
	buf := append(make([]byte, 0, 4096), first[0])
	tmp := make([]byte, 4096)
	for !bytes.Contains(buf, []byte("\r\n\r\n")) && !bytes.Contains(buf, []byte("\n\n")) && len(buf) < maxSniff {
		n, err := c.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if err != nil {
			break
		}
		if i := bytes.IndexByte(buf, '\n'); i >= 0 && !looksLikeRequestLine(buf[:i]) {
			return kindOther, "", buf
		}
	}
	if i := bytes.IndexByte(buf, '\n'); i < 0 || !looksLikeRequestLine(buf[:i]) {
		return kindOther, "", buf
	}
	return kindHTTP, "", buf
}

var errSniffed = errors.New("client hello read")

func isToken(b byte) bool { return b >= 'A' && b <= 'Z' }

// looksLikeRequestLine: "METHOD TARGET HTTP/1.x".
func looksLikeRequestLine(line []byte) bool {
	f := strings.Fields(string(line))
	return len(f) == 3 && strings.HasPrefix(f[2], "HTTP/1.")
}

// recordingConn keeps what is read and drops what is written (the TLS
// server's alert after the sniff).
type recordingConn struct {
	net.Conn
	buf  []byte
	read int
}

func (r *recordingConn) Read(b []byte) (int, error) {
	if r.read < len(r.buf) {
		n := copy(b, r.buf[r.read:])
		r.read += n
		return n, nil
	}
	if len(r.buf) >= maxSniff {
		return 0, errors.New("client hello too long")
	}
	n, err := r.Conn.Read(b)
	r.buf = append(r.buf, b[:n]...)
	r.read += n
	return n, err
}

func (r *recordingConn) Write(b []byte) (int, error) { return len(b), nil }

// prefixConn reads prefix before the connection.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// splice relays between the sandbox's side c and the upstream, after
// sending prefix upstream; each direction's end is passed on as a
// half-close. It returns the bytes sent each way.
func splice(c, up net.Conn, prefix []byte) (out, in int64) {
	if len(prefix) > 0 {
		n, err := up.Write(prefix)
		out += int64(n)
		if err != nil {
			return out, 0
		}
	}
	var wg sync.WaitGroup
	var sent int64
	wg.Add(1)
	go func() { // the sandbox to the upstream; ends with the connection
		defer wg.Done()
		n, err := io.Copy(up, c)
		sent = n
		if err != nil {
			up.Close()
			c.Close()
			return
		}
		closeWrite(up)
	}()
	in, err := io.Copy(c, up)
	if err != nil {
		c.Close()
		up.Close()
	} else {
		closeWrite(c)
	}
	wg.Wait()
	return out + sent, in
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
