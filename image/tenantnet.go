package image

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/berthsh/berth/errdefs"
)

// A tenant's pull is the daemon fetching a URL the tenant chose, from the
// daemon's place in the network. So that a tenant cannot use it to reach
// what only the host reaches (a service on its loopback, the cloud's
// metadata address, a private network) and read it back in an error, a
// tenant's pull connects only to public addresses, checked on the address
// actually dialed (a name that resolves to a private address, or a
// redirect to one, is refused too), except to the registries the operator
// named with --insecure-registry. It carries none of the daemon's registry
// credentials: the operator's private images reach tenants through the
// operator's catalog.

// publicOnly refuses addresses that are not on the public internet.
func publicOnly(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsMulticast() ||
		a.IsUnspecified() || a.IsInterfaceLocalMulticast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// nonPublic are special ranges the netip predicates leave out.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("100.64.0.0/10"),  // shared address space (carrier NAT)
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and the broadcast
	netip.MustParsePrefix("0.0.0.0/8"),      // this network
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("2001:db8::/32"),  // documentation
}

// tenantTransport is the transport of tenants' pulls: base's settings with
// a dialer that lets through the operator's registries (host:port as
// named) and public addresses only.
func tenantTransport(base *http.Transport, allowed []string) *http.Transport {
	t := base.Clone()
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if slices.Contains(allowed, addr) {
			return d.DialContext(ctx, network, addr)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			if !publicOnly(ip) {
				return nil, errdefs.New(errdefs.PermissionDenied,
					"registry %s is at %s, not a public address: a tenant's pull reaches public registries only, or those the operator names with --insecure-registry", addr, ip.Unmap())
			}
		}
		var last error
		for _, ip := range ips { // the addresses checked, not a second lookup
			c, err := d.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
			if err == nil {
				return c, nil
			}
			last = err
		}
		if last == nil {
			last = fmt.Errorf("%s has no address", host)
		}
		return nil, last
	}
	return t
}
