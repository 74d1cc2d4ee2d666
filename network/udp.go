package network

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/network/netstack"
)

// udpIdle ends a UDP flow nothing was sent on for this long.
const udpIdle = 60 * time.Second

// onUDP decides on a UDP flow (DNS to the gateway never gets here: the
// gateway's resolver takes it). In allowlist mode no other UDP leaves; in
// open mode a flow to a public address is relayed from a socket of its own
// in the egress namespace.
func (sb *Sandbox) onUDP(req *netstack.UDPRequest) {
	start := time.Now()
	dst := req.Dst
	p := sb.policy()
	rec := api.EgressRecord{Proto: api.EgressUDP, Addr: dst.Addr().String(), Port: int(dst.Port())}
	var d Decision
	switch {
	case p.Mode == api.NetworkOpen || p.AddrAllowedByCIDR(dst.Addr(), dst.Port()):
		d = p.CheckAddr(dst.Addr(), dst.Port(), nil)
	case dst.Port() == 53:
		d = deny(fmt.Sprintf("DNS goes to the gateway's resolver (%s), not to another", sb.gateway))
	default:
		d = deny("UDP other than DNS leaves only in open mode or to an allow CIDR")
	}
	if sb.svc.deniedByDaemon(dst) {
		d = deny("the daemon's own listener")
	}
	rec.Allowed, rec.Rule = d.Allowed, d.Rule
	if !d.Allowed {
		sb.record(rec, start)
		return
	}
	if !sb.udpFlows.TryAcquire() {
		rec.Allowed, rec.Rule = false, fmt.Sprintf("over %d UDP flows", cap(sb.udpFlows))
		sb.record(rec, start)
		return
	}
	c, err := req.Accept()
	if err != nil {
		sb.udpFlows.Release()
		rec.Error = err.Error()
		sb.record(rec, start)
		return
	}
	sb.wg.Add(1)
	go func() {
		defer sb.wg.Done()
		defer sb.udpFlows.Release()
		defer c.Close()
		rec.BytesOut, rec.BytesIn, rec.Error = sb.relayUDP(c, dst)
		sb.record(rec, start)
	}()
}

// relayUDP relays a flow until it is idle for udpIdle or the network closes.
func (sb *Sandbox) relayUDP(c net.Conn, dst netip.AddrPort) (out, in int64, errMsg string) {
	pc, err := sb.svc.cfg.Upstream.ListenUDP()
	if err != nil {
		return 0, 0, err.Error()
	}
	defer pc.Close()
	stop := contextClose(sb, c, pc)
	defer stop()
	to := net.UDPAddrFromAddrPort(dst)
	done := make(chan int64, 1)
	go func() { // answers from dst to the sandbox
		buf := make([]byte, 65536)
		var n int64
		for {
			pc.SetReadDeadline(time.Now().Add(udpIdle))
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				c.Close()
				done <- n
				return
			}
			if ua, ok := from.(*net.UDPAddr); !ok || ua.AddrPort().Addr().Unmap() != dst.Addr().Unmap() || ua.AddrPort().Port() != dst.Port() {
				continue // only the destination answers the flow
			}
			n += int64(k)
			c.Write(buf[:k])
		}
	}()
	buf := make([]byte, 65536)
	for {
		c.SetReadDeadline(time.Now().Add(udpIdle))
		k, err := c.Read(buf)
		if err != nil {
			break
		}
		out += int64(k)
		pc.WriteTo(buf[:k], to)
	}
	pc.Close()
	in = <-done
	return out, in, ""
}

// contextClose closes cs when the sandbox's network closes.
func contextClose(sb *Sandbox, cs ...interface{ Close() error }) (stop func() bool) {
	return afterFunc(sb, func() {
		for _, c := range cs {
			c.Close()
		}
	})
}
