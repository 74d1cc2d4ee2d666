// Package guestclient is the daemon's side of the guest protocol: it speaks
// api/guestapi to one sandbox's guest and treats every answer as untrusted.
package guestclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Bounds on what the daemon accepts from a guest.
const (
	maxLine      = 16 << 20 // one NDJSON event (a 4 MiB chunk is ~5.4 MiB in base64)
	maxBody      = 256 << 20
	maxErrorText = 1024
)

// socketBuffer is the send buffer of a connection to the guest.
const socketBuffer = 4 << 20

// Client talks to one guest.
type Client struct {
	id    string
	token string
	dial  func(ctx context.Context) (net.Conn, error)
	http  *http.Client
}

// New returns a client that dials the guest with dial and authenticates with token.
func New(id, token string, dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := dial(ctx)
			if b, ok := conn.(interface{ SetWriteBuffer(int) error }); ok && err == nil {
				b.SetWriteBuffer(socketBuffer) // fewer, larger copies for file uploads
			}
			return conn, err
		},
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		WriteBufferSize:       256 << 10, // file uploads pass through
		ReadBufferSize:        64 << 10,
		ResponseHeaderTimeout: 0,
	}
	return &Client{id: id, token: token, dial: dial, http: &http.Client{Transport: tr}}
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Hello checks the guest's protocol version and that it knows the token.
func (c *Client) Hello(ctx context.Context) (guestapi.HelloResponse, error) {
	nb := make([]byte, 16)
	rand.Read(nb)
	nonce := hex.EncodeToString(nb)
	var h guestapi.HelloResponse
	err := c.do(ctx, http.MethodGet, guestapi.PathHello, nil, map[string]string{guestapi.HeaderNonce: nonce}, &h)
	if err != nil {
		return h, err
	}
	if subtle.ConstantTimeCompare([]byte(h.Proof), []byte(guestapi.Proof(c.token, nonce))) != 1 {
		return h, errdefs.New(errdefs.Unavailable, "sandbox %s: guest failed authentication", c.id)
	}
	return h, CheckProtocol(c.id, h)
}

// CheckProtocol refuses the hello of sandbox id's guest when it speaks no
// protocol version this daemon speaks.
func CheckProtocol(id string, h guestapi.HelloResponse) error {
	if h.Protocol < guestapi.MinProtocol || h.MinProtocol > guestapi.Protocol {
		return errdefs.New(errdefs.Unavailable, "sandbox %s: guest speaks protocol %d..%d, daemon %d..%d",
			id, h.MinProtocol, h.Protocol, guestapi.MinProtocol, guestapi.Protocol)
	}
	return nil
}

// Exec starts spec and returns its event stream; the stream ends with an exit
// or error event. Closing the stream before the end kills the process.
func (c *Client) Exec(ctx context.Context, spec guestapi.ProcessSpec) (*Stream, error) {
	resp, err := c.send(ctx, http.MethodPost, guestapi.PathExec, spec, nil)
	if err != nil {
		return nil, err
	}
	return newStream(resp.Body, true), nil
}

// Start starts spec in the background.
func (c *Client) Start(ctx context.Context, spec guestapi.ProcessSpec) (guestapi.ProcessInfo, error) {
	var info guestapi.ProcessInfo
	err := c.do(ctx, http.MethodPost, guestapi.PathProcesses, spec, nil, &info)
	return info, err
}

// List lists the guest's processes.
func (c *Client) List(ctx context.Context) ([]guestapi.ProcessInfo, error) {
	var out []guestapi.ProcessInfo
	err := c.do(ctx, http.MethodGet, guestapi.PathProcesses, nil, nil, &out)
	return out, err
}

// Get describes one process.
func (c *Client) Get(ctx context.Context, pid int) (guestapi.ProcessInfo, error) {
	var info guestapi.ProcessInfo
	err := c.do(ctx, http.MethodGet, procPath(pid, ""), nil, nil, &info)
	return info, err
}

// Output streams a process's kept output, then live output if follow.
func (c *Client) Output(ctx context.Context, pid int, follow bool) (*Stream, error) {
	p := procPath(pid, "/output")
	if follow {
		p += "?follow=true"
	}
	resp, err := c.send(ctx, http.MethodGet, p, nil, nil)
	if err != nil {
		return nil, err
	}
	// Without follow, the output of a running process ends with no exit event.
	return newStream(resp.Body, follow), nil
}

// Wait waits for a process to end (timeout 0: no limit).
func (c *Client) Wait(ctx context.Context, pid int, timeout time.Duration) (guestapi.Result, error) {
	p := procPath(pid, "/wait")
	if timeout > 0 {
		p += "?timeout_ms=" + strconv.FormatInt(timeout.Milliseconds(), 10)
	}
	var r guestapi.Result
	err := c.do(ctx, http.MethodPost, p, nil, nil, &r)
	return r, err
}

// Signal signals a process's group.
func (c *Client) Signal(ctx context.Context, pid, sig int) error {
	return c.do(ctx, http.MethodPost, procPath(pid, "/signal"), guestapi.SignalRequest{Signal: sig}, nil, nil)
}

// Remove forgets a finished process.
func (c *Client) Remove(ctx context.Context, pid int) error {
	return c.do(ctx, http.MethodDelete, procPath(pid, ""), nil, nil, nil)
}

func procPath(pid int, suffix string) string {
	return guestapi.PathProcesses + "/" + strconv.Itoa(pid) + suffix
}

func (c *Client) do(ctx context.Context, method, path string, in any, hdr map[string]string, out any) error {
	resp, err := c.send(ctx, method, path, in, hdr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(out); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: bad answer from guest", c.id)
	}
	return nil
}

// send performs a request and turns a non-2xx answer into a classified error.
func (c *Client) send(ctx context.Context, method, path string, in any, hdr map[string]string) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://guest"+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: guest not reachable", c.id)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	var ge guestapi.Error
	json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&ge)
	return nil, guestError(c.id, ge, resp.StatusCode)
}

// guestError believes a guest's error class only if it is one we know, and
// bounds its message.
func guestError(id string, ge guestapi.Error, status int) error {
	class := errdefs.Internal
	if errdefs.Known(ge.Class) {
		class = errdefs.Class(ge.Class)
	}
	msg := ge.Message
	if len(msg) > maxErrorText {
		msg = msg[:maxErrorText] + "…"
	}
	if msg == "" {
		msg = fmt.Sprintf("guest answered HTTP %d", status)
	}
	if class == errdefs.Internal {
		return fmt.Errorf("sandbox %s: guest: %s", id, msg)
	}
	err := errdefs.New(class, "%s", msg)
	if errdefs.KnownReason(ge.Reason) {
		err = errdefs.WithReason(err, errdefs.Reason(ge.Reason))
	}
	return err
}

// Stream reads NDJSON events from the guest.
type Stream struct {
	body     io.ReadCloser
	sc       *bufio.Scanner
	done     bool
	needExit bool // a clean end before the exit or error event is an error
}

func newStream(body io.ReadCloser, needExit bool) *Stream {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	return &Stream{body: body, sc: sc, needExit: needExit}
}

// Next returns the next event; io.EOF after the terminal (exit or error)
// event, or at a clean end of a stream that owes none (unfollowed output).
func (s *Stream) Next() (guestapi.Event, error) {
	if s.done {
		return guestapi.Event{}, io.EOF
	}
	if !s.sc.Scan() {
		err := s.sc.Err()
		if err == nil && !s.needExit {
			s.done = true
			return guestapi.Event{}, io.EOF
		}
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return guestapi.Event{}, errdefs.Wrap(errdefs.Unavailable, err, "guest stream ended early")
	}
	var ev guestapi.Event
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return ev, errdefs.Wrap(errdefs.Unavailable, err, "bad event from guest")
	}
	switch ev.Type {
	case guestapi.EventExit:
		if ev.Result == nil {
			return ev, errdefs.New(errdefs.Unavailable, "guest sent an exit event without a result")
		}
		s.done = true
	case guestapi.EventError:
		s.done = true
		if ev.Error == nil {
			ev.Error = &guestapi.Error{Class: string(errdefs.Internal), Message: "guest error"}
		}
	case guestapi.EventStart, guestapi.EventStdout, guestapi.EventStderr:
	default:
		return ev, errdefs.New(errdefs.Unavailable, "unknown event type %q from guest", truncate(ev.Type, 32))
	}
	return ev, nil
}

// Err turns an error event into an error.
func EventError(id string, ev guestapi.Event) error {
	if ev.Error == nil {
		return nil
	}
	return guestError(id, *ev.Error, 0)
}

// Close ends the stream.
func (s *Stream) Close() error { return s.body.Close() }

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Suspend asks the guest to close its listener and every connection until
// its runtime signals it to listen again (guestapi.PathSuspend), and drops
// this client's idle connections.
//
// It returns once the guest has let go of its socket, which it says by
// removing the socket file (a dial then finds no file): the guest answers
// first and closes after, and a checkpoint must not begin while its
// socket is still open.
func (c *Client) Suspend(ctx context.Context) error {
	if err := c.do(ctx, http.MethodPost, guestapi.PathSuspend, nil, nil, nil); err != nil {
		return err
	}
	c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		conn, err := c.dial(ctx)
		if errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if err == nil {
			conn.Close()
		}
		select {
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "sandbox %s: the guest did not let go of its socket", c.id)
		case <-time.After(time.Millisecond):
		}
	}
}
