package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// ListPorts lists the TCP ports processes inside a sandbox listen on.
func (c *Client) ListPorts(ctx context.Context, id string) ([]api.Port, error) {
	var out api.ListPortsResponse
	err := c.do(ctx, http.MethodGet, sbPath(id, "ports"), nil, nil, &out)
	return out.Ports, err
}

// RotateAccessToken gives a sandbox a new port access token and returns it;
// the old one opens nothing from then on.
func (c *Client) RotateAccessToken(ctx context.Context, id string) (string, error) {
	var out api.AccessTokenResponse
	err := c.do(ctx, http.MethodPost, sbPath(id, "access-token"), nil, nil, &out)
	return out.AccessToken, err
}

// SetPublicPorts replaces the ports of a sandbox that open without its
// access token.
func (c *Client) SetPublicPorts(ctx context.Context, id string, ports []int) (api.Sandbox, error) {
	if ports == nil {
		ports = []int{}
	}
	return c.UpdateSandbox(ctx, id, api.UpdateSandboxRequest{PublicPorts: &ports})
}

// PortURL is the address of port inside a sandbox on this daemon, in the
// path form: /v1/sandboxes/ID/ports/PORT/. With token, it carries the
// access token as a query parameter (the daemon turns it into a cookie, so
// that a browser can open the link). A daemon on a unix socket has no
// such URL: use DialPort.
func (c *Client) PortURL(id string, port int, token string) (string, error) {
	if c.unix {
		return "", errdefs.New(errdefs.InvalidArgument, "the daemon at %s listens on a unix socket: a port has no URL there (berth port-forward)", c.display)
	}
	u := c.base + sbPath(id, "ports", strconv.Itoa(port)) + "/"
	if token != "" {
		u += "?" + url.Values{api.QueryAccessToken: {token}}.Encode()
	}
	return u, nil
}

// PortHostURL is the address of port inside a sandbox in the host form,
// http://PORT-ID.DOMAIN:DAEMONPORT/, for apps that use absolute paths;
// domain is the daemon's (Version's PortsDomain; api.DefaultDomain when
// empty).
func (c *Client) PortHostURL(id string, port int, domain, token string) (string, error) {
	if c.unix {
		return "", errdefs.New(errdefs.InvalidArgument, "the daemon at %s listens on a unix socket: a port has no URL there (berth port-forward)", c.display)
	}
	if domain == "" {
		domain = api.DefaultDomain
	}
	u, err := url.Parse(c.base)
	if err != nil {
		return "", err
	}
	host := fmt.Sprintf("%d-%s.%s", port, id, domain)
	if p := u.Port(); p != "" {
		host += ":" + p
	}
	out := u.Scheme + "://" + host + "/"
	if token != "" {
		out += "?" + url.Values{api.QueryAccessToken: {token}}.Encode()
	}
	return out, nil
}

// WaitPort waits until a process inside the sandbox listens on port, or ctx
// ends.
func (c *Client) WaitPort(ctx context.Context, id string, port int) error {
	delay := 20 * time.Millisecond
	for {
		ports, err := c.ListPorts(ctx, id)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(ports, func(p api.Port) bool { return p.Port == port }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("port %d of sandbox %s: nothing listens yet: %w", port, id, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 250*time.Millisecond)
	}
}

// DialPort opens one TCP connection to port inside a sandbox, through the
// daemon (GET /v1/sandboxes/ID/tunnel/PORT): what berth port-forward does
// for each connection it accepts. token is the sandbox's access token
// (api.Sandbox.AccessToken; "" for a public port).
func (c *Client) DialPort(ctx context.Context, id string, port int, token string) (io.ReadWriteCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+sbPath(id, "tunnel", strconv.Itoa(port)), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.TunnelProtocol)
	if token != "" {
		req.Header.Set(api.HeaderAccessToken, token)
	}
	c.identify(req.Header)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.unreachable(ctx, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok || !strings.EqualFold(resp.Header.Get("Upgrade"), api.TunnelProtocol) {
		resp.Body.Close()
		return nil, errdefs.New(errdefs.Unavailable, "the daemon at %s answered the tunnel without %s", c.display, api.TunnelProtocol)
	}
	return rwc, nil
}
