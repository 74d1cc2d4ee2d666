package network

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// pins are the DNS answers a sandbox got, kept so that a connection to an
// address can be traced to the names that resolved to it: in allowlist
// mode a connection must go to an address an allowed name resolved to, and
// a TLS server name or HTTP Host must be one that resolved to the
// connection's address. An answer is kept for its TTL, at least minPin
// (programs cache answers longer than they are told), and a sandbox keeps
// at most maxPins names (the oldest go first).
type pins struct {
	mu     sync.Mutex
	byName map[string]*pin
	now    func() time.Time
}

type pin struct {
	addrs   []netip.Addr
	expires time.Time
}

const (
	minPin  = 5 * time.Minute
	maxPins = 4096
)

func newPins(now func() time.Time) *pins {
	return &pins{byName: map[string]*pin{}, now: now}
}

// add records that name resolved to addrs for ttl.
func (p *pins) add(name string, addrs []netip.Addr, ttl time.Duration) {
	if len(addrs) == 0 {
		return
	}
	ttl = max(ttl, minPin)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	expires := now.Add(ttl)
	if old, ok := p.byName[name]; ok && old.expires.After(now) {
		// Answers rotate: keep what the sandbox may still hold.
		for _, a := range addrs {
			if !slices.Contains(old.addrs, a) {
				old.addrs = append(old.addrs, a)
			}
		}
		if len(old.addrs) > 64 {
			old.addrs = old.addrs[len(old.addrs)-64:]
		}
		old.expires = maxTime(old.expires, expires)
		return
	}
	if len(p.byName) >= maxPins {
		p.evict(now)
	}
	p.byName[name] = &pin{addrs: slices.Clone(addrs), expires: expires}
}

// evict drops expired pins, and the one expiring first if none is.
func (p *pins) evict(now time.Time) {
	var first string
	for name, pn := range p.byName {
		if !pn.expires.After(now) {
			delete(p.byName, name)
		} else if first == "" || pn.expires.Before(p.byName[first].expires) {
			first = name
		}
	}
	if len(p.byName) >= maxPins && first != "" {
		delete(p.byName, first)
	}
}

// names returns the names that resolved to addr and are still pinned.
func (p *pins) names(addr netip.Addr) []string {
	addr = addr.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var out []string
	for name, pn := range p.byName {
		if pn.expires.After(now) && slices.Contains(pn.addrs, addr) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// has says whether name resolved to addr (and is still pinned).
func (p *pins) has(name string, addr netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	pn, ok := p.byName[name]
	return ok && pn.expires.After(p.now()) && slices.Contains(pn.addrs, addr.Unmap())
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
