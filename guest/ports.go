package guest

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// procNet is where the guest, PID 1 of the sandbox and in its network
// namespace, reads the sockets of that namespace.
const procNet = "/proc/self/net"

// spliceBuffer is each direction's copy buffer on a port stream: large
// enough that a bulk copy takes few system calls.
const spliceBuffer = 256 << 10

// dial connects to a port on the sandbox's loopback and, once connected,
// turns the request into a stream spliced to it (guestapi.PathDial).
func (s *server) dial(w http.ResponseWriter, r *http.Request) error {
	v := r.URL.Query().Get("port")
	port, err := strconv.Atoi(v)
	if err != nil || port < 1 || port > 65535 {
		if len(v) > 32 {
			v = v[:32] + "…"
		}
		return errdefs.New(errdefs.InvalidArgument, "port: %q is not a port number (1 to 65535)", v)
	}
	// Refuse a plain request before connecting anywhere (upgrade checks again).
	if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), guestapi.UpgradeProtocol) {
		return errdefs.New(errdefs.InvalidArgument, "%s needs Connection: Upgrade and Upgrade: %s", r.URL.Path, guestapi.UpgradeProtocol)
	}
	target, err := dialPort(r.Context(), port)
	if err != nil {
		return err
	}
	// The target is a stream's too: a guest that shuts down closes it, which
	// ends a splice that waits on a quiet server.
	if !s.streams.add(target) {
		target.Close()
		return errdefs.New(errdefs.Unavailable, "the guest is shutting down")
	}
	defer s.streams.remove(target)
	defer target.Close()
	return s.upgrade(w, r, func(c *streamConn) error { return splice(c, target) })
}

// dialPort connects to port on 127.0.0.1, or on ::1 when nothing listens on
// the IPv4 loopback, within guestapi.DialTimeout.
func dialPort(ctx context.Context, port int) (*net.TCPConn, error) {
	d := net.Dialer{Deadline: time.Now().Add(guestapi.DialTimeout)}
	p := strconv.Itoa(port)
	conn, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", p))
	if errors.Is(err, syscall.ECONNREFUSED) {
		var err6 error
		conn, err6 = d.DialContext(ctx, "tcp6", net.JoinHostPort("::1", p))
		// No IPv6 loopback in the sandbox leaves the IPv4 refusal as the answer.
		if err6 == nil || !noIPv6(err6) {
			err = err6
		}
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		// A server bound to one address that is not loopback (127.0.0.2,
		// the sandbox's own): the address it listens on, as listed.
		if addr, ok := boundAddr(port); ok {
			conn, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(addr, uint16(port)).String())
		}
	}
	var ne net.Error
	switch {
	case err == nil:
		return conn.(*net.TCPConn), nil
	case ctx.Err() != nil:
		return nil, ctx.Err() // the daemon went away
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, errdefs.WithReason(errdefs.New(errdefs.Unavailable, "nothing listens on port %d in the sandbox", port), errdefs.PortClosed)
	case errors.As(err, &ne) && ne.Timeout():
		return nil, errdefs.New(errdefs.Unavailable, "port %d in the sandbox accepted no connection within %s", port, guestapi.DialTimeout)
	default:
		return nil, errdefs.New(errdefs.Unavailable, "connect to port %d in the sandbox: %v", port, err)
	}
}

// boundAddr is the address a server listening on port is bound to, when it
// is bound to one (not a wildcard).
func boundAddr(port int) (netip.Addr, bool) {
	ls, err := listeningPorts(procNet, guestapi.MaxPorts)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, l := range ls {
		addr, err := netip.ParseAddr(l.Address)
		if l.Port == port && err == nil && !addr.IsUnspecified() {
			return addr, true
		}
	}
	return netip.Addr{}, false
}

// noIPv6 reports a refusal that means the sandbox has no IPv6 loopback.
func noIPv6(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EADDRNOTAVAIL) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EAFNOSUPPORT)
}

// halfConn is a connection whose write half closes on its own.
type halfConn interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// splice copies bytes both ways until both directions have ended: a side
// that reads EOF half-closes the other. A failed direction closes both
// connections, which ends the other direction too.
func splice(a, b halfConn) error {
	done := make(chan error, 2)
	go func() { done <- pipe(b, a) }()
	go func() { done <- pipe(a, b) }()
	var first error
	for range 2 {
		if err := <-done; err != nil && first == nil {
			first = err
			a.Close()
			b.Close()
		}
	}
	return first
}

// pipe copies src to dst, then closes dst's write half.
func pipe(dst, src halfConn) error {
	// Plain Writer and Reader: the copy goes through the large buffer rather
	// than a ReaderFrom's small one.
	if _, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, spliceBuffer)); err != nil {
		return err
	}
	return dst.CloseWrite()
}

// ports lists the TCP sockets listening in the sandbox (guestapi.PathPorts).
func (s *server) ports(w http.ResponseWriter, r *http.Request) error {
	ports, err := listeningPorts(procNet, guestapi.MaxPorts)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, guestapi.PortsResult{Ports: ports})
}

// listener is one listening socket, as the kernel lists it.
type listener struct {
	port  uint16
	addr  netip.Addr
	proto string
}

func compareListeners(a, b listener) int {
	if c := cmp.Compare(a.port, b.port); c != 0 {
		return c
	}
	if c := a.addr.Compare(b.addr); c != 0 {
		return c
	}
	return strings.Compare(a.proto, b.proto)
}

// listenerSet keeps the first max listeners in their order, without
// duplicates, in memory bounded by max however many sockets there are.
type listenerSet struct {
	list []listener
	max  int
}

func (s *listenerSet) add(l listener) {
	s.list = append(s.list, l)
	if len(s.list) >= 2*s.max {
		s.compact()
	}
}

func (s *listenerSet) compact() {
	slices.SortFunc(s.list, compareListeners)
	s.list = slices.Compact(s.list)
	s.list = s.list[:min(len(s.list), s.max)]
}

// listeningPorts reads dir's tcp and tcp6 tables (tcp6 may be absent: a
// kernel without IPv6) and returns the first limit listeners.
func listeningPorts(dir string, limit int) ([]guestapi.ListeningPort, error) {
	set := listenerSet{max: limit}
	for _, proto := range []string{guestapi.ProtoTCP, guestapi.ProtoTCP6} {
		f, err := os.Open(dir + "/" + proto)
		if errors.Is(err, os.ErrNotExist) && proto == guestapi.ProtoTCP6 {
			continue
		}
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "read the sandbox's listening sockets")
		}
		err = parseProcNetTCP(f, proto, binary.NativeEndian, set.add)
		f.Close()
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "read the sandbox's listening sockets")
		}
	}
	set.compact()
	out := make([]guestapi.ListeningPort, len(set.list))
	for i, l := range set.list {
		out[i] = guestapi.ListeningPort{Port: int(l.port), Address: l.addr.String(), Proto: l.proto}
	}
	return out, nil
}

// tcpListen is the kernel's TCP_LISTEN state as /proc/net/tcp shows it.
const tcpListen = "0A"

// parseProcNetTCP calls add for each listening socket of a /proc/net/tcp
// (proto "tcp") or /proc/net/tcp6 ("tcp6") table; lines it cannot read are
// skipped. The kernel prints an address as 32-bit words in the host's byte
// order (order), and the port as a number.
//
//	sl  local_address rem_address   st tx_queue rx_queue ...
//	 0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 ...
func parseProcNetTCP(r io.Reader, proto string, order binary.ByteOrder, add func(listener)) error {
	words := 1
	if proto == guestapi.ProtoTCP6 {
		words = 4
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != tcpListen {
			continue
		}
		hexAddr, hexPort, ok := strings.Cut(f[1], ":")
		if !ok || len(hexAddr) != 8*words || len(hexPort) != 4 {
			continue
		}
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil || port == 0 {
			continue
		}
		var b [16]byte
		for i := range words {
			w, err := strconv.ParseUint(hexAddr[8*i:8*i+8], 16, 32)
			if err != nil {
				ok = false
				break
			}
			order.PutUint32(b[4*i:], uint32(w))
		}
		if !ok {
			continue
		}
		addr := netip.AddrFrom16(b)
		if words == 1 {
			addr = netip.AddrFrom4([4]byte(b[:4]))
		}
		add(listener{port: uint16(port), addr: addr, proto: proto})
	}
	return sc.Err()
}
