package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/berthsh/berth/api"
)

// The sandbox's resolver is the gateway: the daemon answers every query.
// A name the policy refuses gets NXDOMAIN without leaving the host; an
// allowed one is forwarded to the daemon's upstream resolvers and the
// answer's addresses are pinned (pins). AAAA queries get an empty answer:
// sandboxes have no IPv6 route, and an empty answer sends programs to A.

const (
	dnsTimeout = 3 * time.Second
	maxDNSMsg  = 65535
)

// answerDNS answers one query from the sandbox.
func (sb *Sandbox) answerDNS(ctx context.Context, query []byte) []byte {
	start := time.Now()
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil // not DNS: no answer
	}
	q, err := p.Question()
	if err != nil {
		return reply(h, nil, dnsmessage.RCodeFormatError)
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		return reply(h, &q, dnsmessage.RCodeFormatError) // one question per query, as every resolver sends
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	rec := api.EgressRecord{Proto: api.EgressDNS, Name: name, Addr: sb.gateway.String(), Port: 53, BytesOut: int64(len(query))}
	d := sb.policy().CheckName(name)
	rec.Allowed, rec.Rule = d.Allowed, d.Rule
	if !d.Allowed {
		sb.record(rec, start)
		return reply(h, &q, dnsmessage.RCodeNameError)
	}
	if q.Type == dnsmessage.TypeAAAA {
		sb.record(rec, start)
		return reply(h, &q, dnsmessage.RCodeSuccess)
	}
	answer, err := sb.svc.resolve(ctx, query)
	rec.BytesIn = int64(len(answer))
	if err != nil {
		rec.Error = err.Error()
		sb.record(rec, start)
		return reply(h, &q, dnsmessage.RCodeServerFailure)
	}
	addrs, ttl, err := aRecords(answer)
	if err != nil {
		rec.Error = "bad answer from upstream: " + err.Error()
		sb.record(rec, start)
		return reply(h, &q, dnsmessage.RCodeServerFailure)
	}
	sb.pins.add(name, addrs, ttl)
	sb.record(rec, start)
	// The upstream answered the daemon's copy of the query: its ID is ours.
	binary.BigEndian.PutUint16(answer, h.ID)
	return answer
}

// reply is an answer with no records: rcode, echoing q.
func reply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	b.StartQuestions()
	if q != nil {
		b.Question(*q)
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// aRecords returns the IPv4 addresses of an answer and their least TTL.
func aRecords(msg []byte) ([]netip.Addr, time.Duration, error) {
	var p dnsmessage.Parser
	if _, err := p.Start(msg); err != nil {
		return nil, 0, err
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, 0, err
	}
	var addrs []netip.Addr
	ttl := time.Duration(-1)
	for {
		h, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		if h.Type != dnsmessage.TypeA || h.Class != dnsmessage.ClassINET {
			if err := p.SkipAnswer(); err != nil {
				return nil, 0, err
			}
			continue
		}
		a, err := p.AResource()
		if err != nil {
			return nil, 0, err
		}
		addrs = append(addrs, netip.AddrFrom4(a.A))
		if d := time.Duration(h.TTL) * time.Second; ttl < 0 || d < ttl {
			ttl = d
		}
	}
	return addrs, max(ttl, 0), nil
}

// resolve sends query to the upstream resolvers in turn, over UDP, and
// over TCP when the answer was truncated.
func (s *Service) resolve(ctx context.Context, query []byte) ([]byte, error) {
	if len(s.cfg.Resolvers) == 0 {
		return nil, errors.New("the daemon has no upstream resolver")
	}
	var last error
	for _, r := range s.cfg.Resolvers {
		ans, err := s.resolveUDP(ctx, r, query)
		if err == nil && len(ans) > 2 && ans[2]&0x02 != 0 { // TC
			ans, err = s.resolveTCP(ctx, r, query)
		}
		if err == nil {
			return ans, nil
		}
		last = fmt.Errorf("resolver %s: %w", r, err)
	}
	return nil, last
}

func (s *Service) resolveUDP(ctx context.Context, r netip.AddrPort, query []byte) ([]byte, error) {
	pc, err := s.cfg.Upstream.ListenUDP()
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	deadline := time.Now().Add(dnsTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	pc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { pc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	id := binary.BigEndian.Uint16(query)
	if _, err := pc.WriteTo(query, net.UDPAddrFromAddrPort(r)); err != nil {
		return nil, err
	}
	buf := make([]byte, maxDNSMsg)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return nil, err
		}
		// Only the resolver's answer to this query counts.
		if ua, ok := from.(*net.UDPAddr); !ok || ua.AddrPort().Addr().Unmap() != r.Addr().Unmap() || ua.AddrPort().Port() != r.Port() ||
			n < 12 || binary.BigEndian.Uint16(buf) != id {
			continue
		}
		return append([]byte(nil), buf[:n]...), nil
	}
}

func (s *Service) resolveTCP(ctx context.Context, r netip.AddrPort, query []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	c, err := s.cfg.Upstream.Dial(ctx, r)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	msg := binary.BigEndian.AppendUint16(nil, uint16(len(query)))
	if _, err := c.Write(append(msg, query...)); err != nil {
		return nil, err
	}
	return readDNSTCP(c)
}

func readDNSTCP(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// serveDNS answers the sandbox's queries at the gateway, over UDP and TCP,
// until the sandbox's network closes.
func (sb *Sandbox) serveDNS(udp net.PacketConn, tcp net.Listener) {
	sb.wg.Add(2)
	go func() { // owns udp
		defer sb.wg.Done()
		buf := make([]byte, maxDNSMsg)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			if !sb.dnsSlots.TryAcquire() {
				continue // too many queries in flight: the sandbox retries
			}
			query := append([]byte(nil), buf[:n]...)
			sb.wg.Add(1)
			go func() {
				defer sb.wg.Done()
				defer sb.dnsSlots.Release()
				if ans := sb.answerDNS(sb.ctx, query); ans != nil {
					if len(ans) > 512 && !hasEDNS(query) {
						ans = truncated(ans)
					}
					udp.WriteTo(ans, from)
				}
			}()
		}
	}()
	go func() { // owns tcp
		defer sb.wg.Done()
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			sb.wg.Add(1)
			go func() {
				defer sb.wg.Done()
				defer c.Close()
				stop := context.AfterFunc(sb.ctx, func() { c.Close() })
				defer stop()
				for {
					c.SetReadDeadline(time.Now().Add(30 * time.Second))
					q, err := readDNSTCP(c)
					if err != nil {
						return
					}
					ans := sb.answerDNS(sb.ctx, q)
					if ans == nil {
						return
					}
					c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(ans))), ans...))
				}
			}()
		}
	}()
}

// hasEDNS says whether a query carries an OPT record (a bigger UDP size).
func hasEDNS(query []byte) bool {
	var p dnsmessage.Parser
	if _, err := p.Start(query); err != nil {
		return false
	}
	if p.SkipAllQuestions() != nil || p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return false
	}
	for {
		h, err := p.AdditionalHeader()
		if err != nil {
			return false
		}
		if h.Type == dnsmessage.TypeOPT {
			return true
		}
		if p.SkipAdditional() != nil {
			return false
		}
	}
}

// truncated is ans cut to its header and question with TC set: the client
// asks again over TCP.
func truncated(ans []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(ans)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	h.Truncated = true
	b := dnsmessage.NewBuilder(nil, h)
	b.StartQuestions()
	b.Question(q)
	out, _ := b.Finish()
	return out
}
