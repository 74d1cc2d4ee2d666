package network

import "net/netip"

// specialRanges are the IPv4 blocks no sandbox reaches in any mode unless an
// allow CIDR names them: the host's and other networks' private addresses,
// loopback, link-local (cloud metadata services at 169.254.169.254),
// berth's own link (100.64.0.0/10), multicast and reserved space. The
// documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24)
// are treated as public: nothing real answers there, and tests build
// their internet in them.
var specialRanges = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\" (0.0.0.0/8)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private range (10.0.0.0/8)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "the shared address space (100.64.0.0/10)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback (127.0.0.0/8)"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local, where metadata services live (169.254.0.0/16)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private range (172.16.0.0/12)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments (192.0.0.0/24)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private range (192.168.0.0/16)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "the benchmarking range (198.18.0.0/15)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast (224.0.0.0/4)"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved space (240.0.0.0/4)"},
}

// special says why addr is in a special range, or "" when it is public.
// An address other than IPv4 (after unmapping) is special: sandboxes have
// no IPv6 route.
func special(addr netip.Addr) string {
	addr = addr.Unmap()
	if !addr.Is4() {
		return "IPv6 (sandboxes have no IPv6 route)"
	}
	for _, r := range specialRanges {
		if r.prefix.Contains(addr) {
			return r.why
		}
	}
	return ""
}
