package guestclient

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// maxPortsAnswer bounds a ports answer: MaxPorts entries of well under 128 bytes.
const maxPortsAnswer = guestapi.MaxPorts * 128

// DialPort opens a stream to a TCP port on the sandbox's loopback, which
// the guest connects to from inside the sandbox (guestapi.PathDial). ctx
// bounds the handshake and the guest's connection, not the stream. Nothing
// listening is unavailable with reason errdefs.PortClosed.
func (c *Client) DialPort(ctx context.Context, port int) (*Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.New(errdefs.InvalidArgument, "port: %d is not a port number (1 to 65535)", port)
	}
	conn, err := c.Upgrade(ctx, http.MethodGet, guestapi.PathDial+"?port="+strconv.Itoa(port), nil)
	if err != nil {
		return nil, c.predates(err)
	}
	return conn, nil
}

// Ports lists the TCP sockets listening in the sandbox, sorted by port.
func (c *Client) Ports(ctx context.Context) ([]guestapi.ListeningPort, error) {
	resp, err := c.send(ctx, http.MethodGet, guestapi.PathPorts, nil, nil)
	if err != nil {
		return nil, c.predates(err)
	}
	defer resp.Body.Close()
	var res guestapi.PortsResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPortsAnswer)).Decode(&res); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: bad answer from guest", c.id)
	}
	if len(res.Ports) > guestapi.MaxPorts {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s: guest listed %d ports, more than %d", c.id, len(res.Ports), guestapi.MaxPorts)
	}
	out := make([]guestapi.ListeningPort, 0, len(res.Ports))
	for _, p := range res.Ports {
		addr, ok := listenAddr(p)
		if !ok {
			return nil, errdefs.New(errdefs.Unavailable, "sandbox %s: guest listed a port that cannot be: %d %q %q",
				c.id, p.Port, truncate(p.Address, 64), truncate(p.Proto, 16))
		}
		out = append(out, guestapi.ListeningPort{Port: p.Port, Address: addr.String(), Proto: p.Proto})
	}
	return out, nil
}

// listenAddr checks one listening socket a guest reported and returns its
// address.
func listenAddr(p guestapi.ListeningPort) (netip.Addr, bool) {
	if p.Port < 1 || p.Port > 65535 {
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(p.Address)
	if err != nil || addr.Zone() != "" {
		return netip.Addr{}, false
	}
	switch p.Proto {
	case guestapi.ProtoTCP:
		return addr, addr.Is4()
	case guestapi.ProtoTCP6:
		return addr, addr.Is6()
	}
	return netip.Addr{}, false
}

// predates turns a guest's "no such route" into not_implemented: a guest
// older than ports (the ports routes answer not_found for nothing else).
func (c *Client) predates(err error) error {
	if errdefs.IsNotFound(err) {
		return errdefs.New(errdefs.NotImplemented, "sandbox %s: its guest predates ports", c.id)
	}
	return err
}
