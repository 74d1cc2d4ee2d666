package network

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
)

// terminate serves a TLS connection to a host a secret is bound to: the
// daemon completes the handshake with a certificate of the sandbox's CA
// for name and, at the same time, its own handshake with the upstream
// (verified against the host's roots for name), then proxies HTTP/1.1
// between them, adding the secret.
func (sb *Sandbox) terminate(c, up net.Conn, prefix []byte, name string, dst netip.AddrPort, rec api.EgressRecord, start time.Time) {
	cert, err := sb.ca.Leaf(name)
	if err != nil {
		rec.Error = "issue a certificate: " + err.Error()
		sb.record(rec, start)
		return
	}
	cfg := sb.tlsDown.Clone()
	cfg.Certificates = []tls.Certificate{cert}
	down := tls.Server(&prefixConn{Conn: c, prefix: prefix}, cfg)
	upTLS := tls.Client(up, &tls.Config{ServerName: name, RootCAs: sb.svc.cfg.RootCAs(), ClientSessionCache: sb.sessions,
		NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	ctx, cancel := context.WithTimeout(sb.ctx, dialTimeout)
	upErr := make(chan error, 1)
	go func() { upErr <- upTLS.HandshakeContext(ctx) }()
	down.SetDeadline(time.Now().Add(sniffTimeout))
	err = down.Handshake()
	down.SetDeadline(time.Time{})
	if err != nil {
		cancel()
		<-upErr
		rec.Error = "TLS with the sandbox: " + err.Error()
		sb.record(rec, start)
		return
	}
	err = <-upErr
	cancel()
	if err != nil {
		rec.Error = "TLS with " + name + ": " + err.Error()
		sb.record(rec, start)
		writeError(down, http.StatusBadGateway, "berth: the upstream's certificate for "+name+" did not verify: "+err.Error())
		return
	}
	sb.proxyHTTP(down, upTLS, name, dst, rec)
}

// proxyHTTP relays HTTP/1.1 requests from the sandbox (c) to the upstream
// one at a time, checking each request's Host: against the policy and
// the connection's address for plain HTTP, against the TLS server name
// (tlsName) for a terminated connection, where it adds the bound secrets.
// Each request is a record. An upgrade (101) turns into a plain relay.
func (sb *Sandbox) proxyHTTP(c, up net.Conn, tlsName string, dst netip.AddrPort, base api.EgressRecord) {
	cr, ur := bufio.NewReader(c), bufio.NewReader(up)
	proto := api.EgressHTTP
	if tlsName != "" {
		proto = api.EgressHTTPS
	}
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			return
		}
		start := time.Now()
		rec := base
		rec.Proto, rec.Method, rec.Path = proto, req.Method, truncatePath(req.URL.Path)
		rec.Allowed, rec.Error = false, ""
		host := hostOnly(req.Host)
		rec.Name = host
		p := sb.policy()
		var d Decision
		if tlsName != "" {
			if !strings.EqualFold(host, tlsName) {
				d = deny(fmt.Sprintf("Host %q differs from the TLS server name %q", host, tlsName))
			} else {
				d = p.CheckName(tlsName)
			}
		} else {
			d = sb.checkServerName(p, host, dst)
		}
		rec.Allowed, rec.Rule = d.Allowed, d.Rule
		if !d.Allowed {
			sb.record(rec, start)
			status := http.StatusForbidden
			if tlsName != "" {
				status = http.StatusMisdirectedRequest
			}
			writeError(c, status, "berth: "+d.Rule)
			return
		}
		var scrub [][]byte
		if tlsName != "" {
			names, secrets, err := sb.inject(req, p.BindingsFor(tlsName))
			if err != nil {
				rec.Allowed, rec.Rule = false, err.Error()
				sb.record(rec, start)
				writeError(c, http.StatusForbidden, "berth: "+err.Error())
				return
			}
			rec.Secret = strings.Join(names, ",")
			scrub = secrets
		}
		if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
			// The daemon sends the body on; the sandbox need not wait.
			req.Header.Del("Expect")
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
		}
		if _, ok := req.Header["User-Agent"]; !ok {
			req.Header["User-Agent"] = []string{""} // Write would add Go's own
		}
		body := &countingReader{}
		if req.Body != nil && req.Body != http.NoBody {
			body.r = req.Body
			req.Body = body
		}
		if err := req.Write(up); err != nil {
			rec.Error = "send the request: " + err.Error()
			rec.BytesOut = body.n
			sb.record(rec, start)
			return
		}
		rec.BytesOut = body.n
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			rec.Error = "read the response: " + err.Error()
			sb.record(rec, start)
			writeError(c, http.StatusBadGateway, "berth: the upstream's answer: "+err.Error())
			return
		}
		rec.Status = resp.StatusCode
		if len(scrub) > 0 {
			scrubHeader(resp.Header, scrub)
			scrubHeader(resp.Trailer, scrub)
			resp.Body = newScrubber(resp.Body, scrub)
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			err := resp.Write(c)
			sb.record(rec, start)
			if err == nil {
				splice(&prefixConn{Conn: c, prefix: buffered(cr)}, &prefixConn{Conn: up, prefix: buffered(ur)}, nil)
			}
			return
		}
		out := &countingWriter{w: c}
		err = resp.Write(out)
		resp.Body.Close()
		rec.BytesIn = out.n
		if err != nil {
			rec.Error = "relay the response: " + err.Error()
		}
		sb.record(rec, start)
		if err != nil || req.Close || resp.Close {
			return
		}
	}
}

// inject adds the secrets bound to the request's host: the header a
// binding names, and each binding's placeholder replaced wherever it
// appears in the request's headers. It returns the secrets' names and
// values (to scrub from the answer). The upstream is asked for an
// uncompressed answer, so that the scrub sees every byte.
func (sb *Sandbox) inject(req *http.Request, bindings []api.SecretBinding) (names []string, values [][]byte, err error) {
	for _, b := range bindings {
		v, err := sb.svc.cfg.Secret(sb.ctx, sb.tenant, b.Secret)
		if err != nil {
			return nil, nil, fmt.Errorf("secret %s: %v", b.Secret, err)
		}
		if b.Header != "" {
			f := b.Format
			if f == "" {
				f = "{secret}"
			}
			req.Header.Set(b.Header, strings.ReplaceAll(f, "{secret}", v))
		}
		if b.Placeholder != "" {
			for k, vals := range req.Header {
				for i := range vals {
					vals[i] = strings.ReplaceAll(vals[i], b.Placeholder, v)
				}
				req.Header[k] = vals
			}
		}
		names = append(names, b.Secret)
		values = append(values, secretForms(v)...)
	}
	req.Header.Set("Accept-Encoding", "identity")
	return names, values, nil
}

// writeError answers the sandbox with status and a one-line reason, and
// the connection closes.
func writeError(c net.Conn, status int, msg string) {
	msg += "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(msg), msg)
}

func hostOnly(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
}

func truncatePath(p string) string {
	if len(p) > 256 {
		return p[:256] + "…"
	}
	return p
}

func buffered(r *bufio.Reader) []byte {
	b, _ := r.Peek(r.Buffered())
	return append([]byte(nil), b...)
}

type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	if c.r == nil {
		return 0, io.EOF
	}
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error {
	if c.r == nil {
		return nil
	}
	return c.r.Close()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
