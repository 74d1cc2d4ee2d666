package api

import (
	"net"
	"strconv"
	"strings"
)

// Ports: a server listening inside a sandbox is reached through the daemon,
// at /v1/sandboxes/{id}/ports/{port}/{path...} or at the host
// {port}-{id}.{domain} (the daemon's --domain, default berth.localhost).
// A port is private unless the sandbox lists it in PublicPorts or is
// Public (every port open): a request to a private port must carry the sandbox's access token, as the HeaderAccessToken
// header, the QueryAccessToken query parameter (the daemon removes it and
// sets a cookie, so that a browser's later requests carry it) or that
// cookie. The token never reaches the server inside.
const (
	HeaderAccessToken = "X-Berth-Access-Token"
	QueryAccessToken  = "berth_access_token"
	CookieAccessToken = "berth_access_token"
	// DefaultDomain is the daemon's default --domain: names under
	// .localhost resolve to loopback in browsers and curl.
	DefaultDomain = "berth.localhost"
	// TunnelProtocol is the Upgrade of GET /v1/sandboxes/{id}/tunnel/{port}:
	// after 101 the connection carries the bytes of one TCP connection to
	// the port inside (berth port-forward).
	TunnelProtocol = "berth-tcp/1"
	// MaxPublicPorts bounds a sandbox's PublicPorts.
	MaxPublicPorts = 64
)

// SplitPortHost reads a Host header of the form {port}-{id}.{domain} (an
// optional :port after it, any case, a trailing dot). domain is without a
// leading dot.
func SplitPortHost(host, domain string) (port int, id string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, ok := strings.CutSuffix(host, "."+strings.Trim(strings.ToLower(domain), "."))
	if !ok || strings.Contains(label, ".") {
		return 0, "", false
	}
	portText, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(portText)
	if !ok || err != nil || id == "" {
		return 0, "", false
	}
	return port, id, true
}

// Port is a TCP port a process inside the sandbox listens on.
type Port struct {
	Port int `json:"port"`
	// Address is what it listens on: 0.0.0.0, 127.0.0.1, ::, …
	Address string `json:"address"`
	// Proto is tcp or tcp6.
	Proto string `json:"proto"`
	// Public is true when the port needs no access token.
	Public bool `json:"public"`
}

// ListPortsResponse is the body of GET /v1/sandboxes/{id}/ports.
type ListPortsResponse struct {
	Ports []Port `json:"ports"`
}

// AccessTokenResponse is the body of POST /v1/sandboxes/{id}/access-token:
// the sandbox's new token; the old one no longer opens its ports.
type AccessTokenResponse struct {
	AccessToken string `json:"access_token"`
}
