package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// Policy is a sandbox's network policy, compiled from api.Network. It is
// immutable: a change compiles a new one.
type Policy struct {
	Mode    string
	allow   []rule
	deny    []rule
	secrets []api.SecretBinding
}

// rule is one Allow or Deny entry.
type rule struct {
	text string // as written, for logs
	// One of: name (exact), suffix ("*.example.com" keeps ".example.com"),
	// prefix (an address is a /32).
	name   string
	suffix string
	prefix netip.Prefix
	// Ports is the inclusive range [lo, hi]; 0-0 means every port.
	lo, hi uint16
}

func (r rule) isName() bool { return r.name != "" || r.suffix != "" }

func (r rule) matchesName(name string) bool {
	if r.name != "" {
		return name == r.name
	}
	return r.suffix != "" && strings.HasSuffix(name, r.suffix)
}

func (r rule) matchesPort(port uint16) bool {
	return (r.lo == 0 && r.hi == 0) || (port >= r.lo && port <= r.hi)
}

// Compile validates n and compiles it. Errors are invalid_argument naming
// the field (network.allow[2], network.secrets[0].host, …).
func Compile(n api.Network) (*Policy, error) {
	if err := CheckLimits(n); err != nil {
		return nil, err
	}
	p := &Policy{Mode: n.Mode}
	switch n.Mode {
	case api.NetworkNone, api.NetworkAllowlist, api.NetworkOpen:
	default:
		return nil, errdefs.New(errdefs.InvalidArgument, "network.mode: %q: want %s, %s or %s",
			n.Mode, api.NetworkNone, api.NetworkAllowlist, api.NetworkOpen)
	}
	for i, s := range n.Allow {
		r, err := parseRule(s)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "network.allow[%d]: %q", i, s)
		}
		p.allow = append(p.allow, r)
	}
	for i, s := range n.Deny {
		r, err := parseRule(s)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "network.deny[%d]: %q", i, s)
		}
		p.deny = append(p.deny, r)
	}
	seen := map[string]bool{}
	for i, b := range n.Secrets {
		field := fmt.Sprintf("network.secrets[%d]", i)
		if sub, err := checkBinding(b); err != nil {
			return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "%s%s", field, sub)
		}
		if b.Env != "" {
			if seen[b.Env] {
				return nil, errdefs.New(errdefs.InvalidArgument, "%s.env: %q is bound twice", field, b.Env)
			}
			seen[b.Env] = true
		}
		b.Host = strings.ToLower(strings.TrimSuffix(b.Host, "."))
		p.secrets = append(p.secrets, b)
	}
	return p, nil
}

// maxRules bounds Allow and Deny together, and Secrets.
const maxRules = 1024

// checkBinding returns the field of b that is wrong (".host", or "" for the
// binding as a whole) and why.
func checkBinding(b api.SecretBinding) (string, error) {
	if !validSecretName(b.Secret) {
		return ".secret", fmt.Errorf("%q: want a stored secret's name", b.Secret)
	}
	host := strings.ToLower(strings.TrimSuffix(b.Host, "."))
	if strings.HasPrefix(host, "*") {
		return ".host", fmt.Errorf("%q: a secret may not be bound to a wildcard, only to one host", b.Host)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ".host", fmt.Errorf("%q: a secret is bound to a host name, whose certificate the daemon checks, not to an address", b.Host)
	}
	if err := checkDomain(host); err != nil {
		return ".host", fmt.Errorf("%q: %w", b.Host, err)
	}
	if b.Header == "" && b.Env == "" {
		return "", fmt.Errorf("set header (the daemon sets it) or env (a placeholder the daemon replaces), or both")
	}
	if b.Header != "" && !validHeaderName(b.Header) {
		return ".header", fmt.Errorf("%q is not a header name", b.Header)
	}
	if b.Format != "" && !strings.Contains(b.Format, "{secret}") {
		return ".format", fmt.Errorf("%q has no {secret}", b.Format)
	}
	if strings.ContainsAny(b.Format, "\r\n") {
		return ".format", fmt.Errorf("a header value cannot hold a line break")
	}
	if b.Env != "" && !validEnvName(b.Env) {
		return ".env", fmt.Errorf("%q is not an environment variable name", b.Env)
	}
	return "", nil
}

// CheckLimits refuses a policy with more entries than a daemon keeps.
func CheckLimits(n api.Network) error {
	if len(n.Allow)+len(n.Deny) > maxRules {
		return errdefs.New(errdefs.InvalidArgument, "network: %d allow and deny entries, over %d", len(n.Allow)+len(n.Deny), maxRules)
	}
	if len(n.Secrets) > maxRules {
		return errdefs.New(errdefs.InvalidArgument, "network.secrets: %d bindings, over %d", len(n.Secrets), maxRules)
	}
	return nil
}

// parseRule parses "HOST[:PORT[-PORT]]".
func parseRule(s string) (rule, error) {
	r := rule{text: s}
	host := s
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") > 1 {
		return rule{}, fmt.Errorf("IPv6 is not routed into sandboxes")
	}
	if h, ports, ok := strings.Cut(s, ":"); ok {
		host = h
		lo, hi, err := parsePorts(ports)
		if err != nil {
			return rule{}, err
		}
		r.lo, r.hi = lo, hi
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	switch {
	case host == "":
		return rule{}, fmt.Errorf("no host")
	case host == "*":
		return rule{}, fmt.Errorf("a bare * allows everything: use mode open")
	case strings.HasPrefix(host, "*."):
		base := host[2:]
		if err := checkDomain(base); err != nil {
			return rule{}, err
		}
		if strings.Count(base, ".") < 1 {
			return rule{}, fmt.Errorf("a wildcard must keep at least two labels (*.example.com, not *.com)")
		}
		r.suffix = "." + base
	case strings.Contains(host, "*"):
		return rule{}, fmt.Errorf("a wildcard is allowed only as the first label (*.example.com)")
	case strings.Contains(host, "/"):
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return rule{}, fmt.Errorf("bad CIDR: %w", err)
		}
		if !pfx.Addr().Is4() {
			return rule{}, fmt.Errorf("IPv6 is not routed into sandboxes")
		}
		r.prefix = pfx.Masked()
	default:
		if addr, err := netip.ParseAddr(host); err == nil {
			if !addr.Is4() {
				return rule{}, fmt.Errorf("IPv6 is not routed into sandboxes")
			}
			r.prefix = netip.PrefixFrom(addr, 32)
			break
		}
		if err := checkDomain(host); err != nil {
			return rule{}, err
		}
		r.name = host
	}
	return r, nil
}

func parsePorts(s string) (lo, hi uint16, err error) {
	a, b, isRange := strings.Cut(s, "-")
	lo, err = parsePort(a)
	if err != nil {
		return 0, 0, err
	}
	hi = lo
	if isRange {
		if hi, err = parsePort(b); err != nil {
			return 0, 0, err
		}
		if hi < lo {
			return 0, 0, fmt.Errorf("port range %s is backwards", s)
		}
	}
	return lo, hi, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q: want 1..65535", s)
	}
	return uint16(n), nil
}

// checkDomain accepts a lower-case DNS name of at least one label:
// letters, digits, '-' and '_' (SRV names), labels of 1..63, 253 at most.
func checkDomain(s string) error {
	if len(s) == 0 || len(s) > 253 {
		return fmt.Errorf("a domain is 1..253 characters")
	}
	for _, label := range strings.Split(s, ".") {
		if len(label) == 0 || len(label) > 63 {
			return fmt.Errorf("a domain's labels are 1..63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("a label cannot start or end with '-'")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%q is not a domain character", c)
			}
		}
	}
	return nil
}

func validSecretName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// ValidSecretName says whether s may name a secret.
func ValidSecretName(s string) bool { return validSecretName(s) }

func validHeaderName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}

func validEnvName(s string) bool {
	if s == "" || len(s) > 256 || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Decision is what the policy says of an attempt, with the rule that said it.
type Decision struct {
	Allowed bool
	Rule    string
}

func allow(rule string) Decision { return Decision{true, rule} }
func deny(rule string) Decision  { return Decision{false, rule} }

// Networked says whether the sandbox has a network beyond loopback.
func (p *Policy) Networked() bool { return p.Mode != api.NetworkNone }

// CheckName decides whether the sandbox may resolve or name host (a DNS
// query, an SNI, a Host header), before any address is known.
func (p *Policy) CheckName(host string) Decision {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, r := range p.deny {
		if r.matchesName(host) {
			return deny("deny " + r.text)
		}
	}
	switch p.Mode {
	case api.NetworkOpen:
		return allow("open")
	case api.NetworkAllowlist:
		for _, r := range p.allow {
			if r.matchesName(host) {
				return allow("allow " + r.text)
			}
		}
		for _, b := range p.secrets {
			if b.Host == host {
				return allow("secret " + b.Secret + " for " + b.Host)
			}
		}
		return deny("not in the allowlist")
	}
	return deny("network none")
}

// CheckAddr decides whether the sandbox may connect to addr:port (proto is
// "tcp" or "udp"), given the names the sandbox resolved to addr (pinned
// DNS answers).
func (p *Policy) CheckAddr(addr netip.Addr, port uint16, names []string) Decision {
	addr = addr.Unmap()
	if !p.Networked() {
		return deny("network none")
	}
	for _, r := range p.deny {
		if r.prefix.IsValid() && r.prefix.Contains(addr) && r.matchesPort(port) {
			return deny("deny " + r.text)
		}
	}
	for _, r := range p.allow {
		if r.prefix.IsValid() && r.prefix.Contains(addr) && r.matchesPort(port) {
			return allow("allow " + r.text)
		}
	}
	if why := special(addr); why != "" {
		return deny(why + ": name it in an allow CIDR to reach it")
	}
	if p.Mode == api.NetworkOpen {
		return allow("open")
	}
	// allowlist: a name the sandbox resolved to this address must allow it.
	var last Decision = deny("not in the allowlist (no allowed name resolved to it)")
	for _, name := range names {
		d := p.checkNamePort(name, port)
		if d.Allowed {
			return d
		}
		if d.Rule != "" {
			last = d
		}
	}
	return last
}

// checkNamePort is CheckName for a connection to port.
func (p *Policy) checkNamePort(name string, port uint16) Decision {
	for _, r := range p.deny {
		if r.matchesName(name) && r.matchesPort(port) {
			return deny("deny " + r.text)
		}
	}
	for _, r := range p.allow {
		if r.matchesName(name) {
			if r.matchesPort(port) {
				return allow("allow " + r.text)
			}
			return deny(fmt.Sprintf("port %d not allowed by %s", port, r.text))
		}
	}
	for _, b := range p.secrets {
		if b.Host == name && (port == 443 || port == 80) {
			return allow("secret " + b.Secret + " for " + b.Host)
		}
	}
	return Decision{}
}

// AddrAllowedByCIDR says whether an allow CIDR covers addr:port: such a
// destination needs no name, and names sent to it are not checked against
// pinned answers.
func (p *Policy) AddrAllowedByCIDR(addr netip.Addr, port uint16) bool {
	for _, r := range p.allow {
		if r.prefix.IsValid() && r.prefix.Contains(addr.Unmap()) && r.matchesPort(port) {
			return true
		}
	}
	return false
}

// BindingsFor returns the secret bindings for requests to host.
func (p *Policy) BindingsFor(host string) []api.SecretBinding {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	var out []api.SecretBinding
	for _, b := range p.secrets {
		if b.Host == host {
			out = append(out, b)
		}
	}
	return out
}

// Bindings returns every secret binding.
func (p *Policy) Bindings() []api.SecretBinding { return slices.Clone(p.secrets) }
