package guestclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Conn is a two-way byte stream to the guest (guestapi's Upgrade): a
// net.Conn whose CloseWrite half-closes it, so the guest reads EOF while
// the daemon goes on reading.
type Conn struct {
	net.Conn
	br *bufio.Reader // the handshake's reader, until it has handed over what it read ahead
}

// Read reads the stream: bytes read ahead with the handshake first.
func (c *Conn) Read(p []byte) (int, error) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			return c.br.Read(p)
		}
		c.br = nil
	}
	return c.Conn.Read(p)
}

// CloseWrite closes the write half of the stream.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("the guest channel cannot half-close")
}

// Upgrade sends a request on a connection of its own that asks to turn it
// into a two-way stream, and returns the stream once the guest has agreed.
// ctx bounds the handshake only; the stream lives until it is closed. A
// refusal is the guest's error, classified like any other.
func (c *Client) Upgrade(ctx context.Context, method, pathQuery string, hdr http.Header) (*Conn, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: guest not reachable", c.id)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	st, err := c.handshake(conn, method, pathQuery, hdr)
	if !stop() || err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return st, nil
}

func (c *Client) handshake(conn net.Conn, method, pathQuery string, hdr http.Header) (*Conn, error) {
	req, err := http.NewRequest(method, "http://guest"+pathQuery, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", guestapi.UpgradeProtocol)
	if err := req.Write(conn); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: guest not reachable", c.id)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: bad answer from guest", c.id)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		var ge guestapi.Error
		json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&ge)
		return nil, guestError(c.id, ge, resp.StatusCode)
	}
	if !strings.EqualFold(resp.Header.Get("Upgrade"), guestapi.UpgradeProtocol) {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s: guest switched to %q, not %s", c.id,
			truncate(resp.Header.Get("Upgrade"), 64), guestapi.UpgradeProtocol)
	}
	return &Conn{Conn: conn, br: br}, nil
}

// Echo opens the guest's echo stream (guestapi.PathEcho).
func (c *Client) Echo(ctx context.Context) (*Conn, error) {
	return c.Upgrade(ctx, http.MethodGet, guestapi.PathEcho, nil)
}
