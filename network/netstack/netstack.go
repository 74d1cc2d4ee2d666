// Package netstack is the far end of a sandbox's network link: a user-space
// TCP/IP stack (gVisor's) on the link's TUN descriptor that hands every TCP
// connection and UDP flow the sandbox opens, to any address, to Go code
// that decides. Nothing is routed or NATed by the host kernel: a packet the
// handlers do not take goes nowhere. Only IPv4 is spoken.
package netstack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Handlers receive what the sandbox opens. Each is called on the stack's
// own goroutine and must not block: it decides, or hands the request to a
// goroutine of its own.
type Handlers struct {
	// TCP is called for the first packet (SYN) of every TCP connection to
	// an address other than the gateway's services.
	TCP func(*TCPRequest)
	// UDP is called for the first datagram of every UDP flow (source and
	// destination address and port) to an address other than the gateway's
	// services; the flow's later datagrams go to the connection it accepts.
	UDP func(*UDPRequest)
}

// TCPRequest is a connection the sandbox opens.
type TCPRequest struct {
	Src, Dst netip.AddrPort
	r        *tcp.ForwarderRequest
}

// Accept completes the handshake with the sandbox and returns the
// connection's sandbox side.
func (r *TCPRequest) Accept() (net.Conn, error) {
	var wq waiter.Queue
	ep, err := r.r.CreateEndpoint(&wq)
	if err != nil {
		r.r.Complete(true)
		return nil, fmt.Errorf("accept %s -> %s: %s", r.Src, r.Dst, err)
	}
	r.r.Complete(false)
	return gonet.NewTCPConn(&wq, ep), nil
}

// Refuse answers the SYN with a reset: the sandbox sees "connection refused".
func (r *TCPRequest) Refuse() { r.r.Complete(true) }

// UDPRequest is a UDP flow the sandbox opens.
type UDPRequest struct {
	Src, Dst netip.AddrPort
	// Payload is the flow's first datagram.
	r *udp.ForwarderRequest
}

// Accept returns the flow's sandbox side: reads return the sandbox's
// datagrams (the first one included), writes answer it from Dst.
func (r *UDPRequest) Accept() (net.Conn, error) {
	var wq waiter.Queue
	ep, err := r.r.CreateEndpoint(&wq)
	if err != nil {
		return nil, fmt.Errorf("accept udp %s -> %s: %s", r.Src, r.Dst, err)
	}
	return gonet.NewUDPConn(&wq, ep), nil
}

// Stack is one sandbox's network stack.
type Stack struct {
	s       *stack.Stack
	ep      *gatedLink
	gateway netip.Addr

	closeOnce sync.Once
}

const nicID = 1

// New makes a stack on the TUN descriptor fd (IP packets, no packet
// information header) with MTU mtu; Start begins reading it. gateway is
// the stack's own address, where the services Listen and ListenUDP open
// are reached. The caller keeps fd open until Close returns, and closes it
// then.
func New(fd int, mtu uint32, gateway netip.Addr, h Handlers) (*Stack, error) {
	if !gateway.Is4() {
		return nil, errors.New("netstack: the gateway must be an IPv4 address")
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	link, err := fdbased.New(&fdbased.Options{FDs: []int{fd}, MTU: mtu})
	if err != nil {
		s.Destroy()
		return nil, fmt.Errorf("netstack: link endpoint: %w", err)
	}
	inner, ok := link.(gsoLink)
	if !ok {
		s.Destroy()
		return nil, errors.New("netstack: the link endpoint does not say its segmentation offload")
	}
	ep := &gatedLink{gsoLink: inner}
	fail := func(what string, e tcpip.Error) (*Stack, error) {
		s.Destroy()
		return nil, fmt.Errorf("netstack: %s: %s", what, e)
	}
	if e := s.CreateNIC(nicID, ep); e != nil {
		return fail("create NIC", e)
	}
	// Take packets to every address (the stack stands in for the whole
	// internet) and answer from them.
	if e := s.SetPromiscuousMode(nicID, true); e != nil {
		return fail("promiscuous mode", e)
	}
	if e := s.SetSpoofing(nicID, true); e != nil {
		return fail("spoofing", e)
	}
	if e := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddrFrom4(gateway.As4()).WithPrefix()}, stack.AddressProperties{}); e != nil {
		return fail("gateway address", e)
	}
	// No TIME-WAIT on the stack's side. It guards a new connection from a
	// delayed copy of an old one's segments, which a TUN link to one
	// sandbox does not deliver (it neither reorders nor duplicates), and it
	// cost a sandbox that reuses a source port at once (as Linux lets a
	// client do when the server closed first) every SYN for 60 s: gVisor
	// hands a SYN that arrives in TIME-WAIT only to a listening endpoint,
	// never to the forwarder, and drops it.
	noTimeWait := tcpip.TCPTimeWaitTimeoutOption(0)
	if e := s.SetTransportProtocolOption(tcp.ProtocolNumber, &noTimeWait); e != nil {
		return fail("TIME-WAIT timeout", e)
	}
	all, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes([]byte{0, 0, 0, 0}))
	s.SetRouteTable([]tcpip.Route{{Destination: all, NIC: nicID}})
	tcpFwd := tcp.NewForwarder(s, 0, 1024, func(r *tcp.ForwarderRequest) {
		id := r.ID()
		h.TCP(&TCPRequest{Src: addrPort(id.RemoteAddress, id.RemotePort), Dst: addrPort(id.LocalAddress, id.LocalPort), r: r})
	})
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	udpFwd := udp.NewForwarder(s, func(r *udp.ForwarderRequest) bool {
		id := r.ID()
		h.UDP(&UDPRequest{Src: addrPort(id.RemoteAddress, id.RemotePort), Dst: addrPort(id.LocalAddress, id.LocalPort), r: r})
		return true
	})
	s.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	return &Stack{s: s, ep: ep, gateway: gateway}, nil
}

// Start begins reading the link. Until then what the sandbox sends waits
// on the link (its queue holds it, as across a daemon's restart), so the
// caller opens the gateway's services (Listen, ListenUDP) first: a packet
// read before them would be taken for a flow to another host.
func (s *Stack) Start() { s.ep.open() }

// gsoLink is what the stack uses of a link endpoint: the interface and
// the segmentation offload it asks the endpoint about.
type gsoLink interface {
	stack.LinkEndpoint
	stack.GSOEndpoint
}

// gatedLink defers the attach of its link, which starts the link's
// readers, until open.
type gatedLink struct {
	gsoLink

	mu       sync.Mutex
	d        stack.NetworkDispatcher // what the stack attached, nil before or after
	attached bool                    // the inner link has the dispatcher
}

// Attach is the stack attaching the NIC (d) or removing it (nil).
func (g *gatedLink) Attach(d stack.NetworkDispatcher) {
	g.mu.Lock()
	g.d = d
	pass := g.attached
	if d == nil {
		g.attached = false
	}
	g.mu.Unlock()
	if pass {
		// Not under mu: a removal waits for the link's readers.
		g.gsoLink.Attach(d)
	}
}

// IsAttached says whether the stack attached the NIC (open or not).
func (g *gatedLink) IsAttached() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.d != nil
}

func (g *gatedLink) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.d != nil && !g.attached {
		g.attached = true
		g.gsoLink.Attach(g.d)
	}
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return netip.AddrPortFrom(ip, port)
}

// Listen opens a TCP listener on the gateway's port.
func (s *Stack) Listen(port uint16) (net.Listener, error) {
	return gonet.ListenTCP(s.s, tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(s.gateway.As4()), Port: port}, ipv4.ProtocolNumber)
}

// ListenUDP opens a UDP socket on the gateway's port.
func (s *Stack) ListenUDP(port uint16) (net.PacketConn, error) {
	return gonet.DialUDP(s.s, &tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(s.gateway.As4()), Port: port}, nil, ipv4.ProtocolNumber)
}

// Close ends every connection of the stack and waits until it no longer
// uses the TUN descriptor.
func (s *Stack) Close() {
	s.closeOnce.Do(func() {
		s.s.Close()
		s.s.Destroy() // removes the NIC: stops the link's readers
		s.ep.Wait()
	})
}
