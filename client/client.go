// Package client is the Go client of berth's HTTP API: client.New(url) and
// one method per operation, with errors that errdefs classifies the same way
// on both sides of the wire.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// DefaultURL is where a local daemon listens.
const DefaultURL = "http://127.0.0.1:7680"

// Client talks to one berth daemon.
type Client struct {
	base      string // scheme://host, no trailing slash
	unix      bool   // the daemon is on a unix socket (base is made up)
	display   string // the URL as the user gave it, for messages
	http      *http.Client
	apiKey    string
	userAgent string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient replaces the HTTP client. For a unix:// URL, a client whose
// Transport is nil gets the socket-dialing transport; one with its own
// Transport must dial the socket itself.
func WithHTTPClient(h *http.Client) Option {
	return func(c *Client) {
		if h != nil {
			c.http = h
		}
	}
}

// WithAPIKey sends key as a bearer token.
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// New returns a client for rawURL: http(s)://host:port[/prefix],
// unix:///path/to/berth.sock, or a bare host:port (http). Empty means DefaultURL.
func New(rawURL string, opts ...Option) (*Client, error) {
	if rawURL == "" {
		rawURL = DefaultURL
	}
	parse := rawURL
	if !strings.Contains(parse, "://") {
		parse = "http://" + parse
	}
	u, err := url.Parse(parse)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "berth URL %q", rawURL)
	}
	c := &Client{display: rawURL, userAgent: "berth-go"}
	// No automatic gzip: file downloads ask for it explicitly (it costs
	// more than it saves on loopback).
	// Large write buffers: file uploads move gigabytes through them.
	tr := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, DisableCompression: true,
		WriteBufferSize: 256 << 10, ReadBufferSize: 64 << 10}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return nil, errdefs.New(errdefs.InvalidArgument, "berth URL %q: no host", rawURL)
		}
		c.base = u.Scheme + "://" + u.Host + strings.TrimRight(u.Path, "/")
	case "unix":
		sock := u.Path
		if sock == "" {
			return nil, errdefs.New(errdefs.InvalidArgument, "berth URL %q: no socket path", rawURL)
		}
		c.base, c.unix = "http://berth", true
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
	default:
		return nil, errdefs.New(errdefs.InvalidArgument, "berth URL %q: scheme must be http, https or unix", rawURL)
	}
	c.http = &http.Client{Transport: tr}
	for _, o := range opts {
		o(c)
	}
	if c.http.Transport == nil && u.Scheme == "unix" {
		h := *c.http
		h.Transport = tr
		c.http = &h
	}
	return c, nil
}

// URL is the daemon's URL as given.
func (c *Client) URL() string { return c.display }

// CloseIdleConnections closes the connections to the daemon that no
// request is using (each holds a descriptor on both ends until then).
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

func (c *Client) request(ctx context.Context, method, path string, query url.Values, in any) (*http.Response, error) {
	var body io.Reader
	var hdr http.Header
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
		hdr = http.Header{"Content-Type": {"application/json"}}
	}
	return c.requestRaw(ctx, method, path, query, body, hdr)
}

// identify sets the headers every request to the daemon carries: the API
// key, if any, and the User-Agent.
func (c *Client) identify(h http.Header) {
	if c.apiKey != "" {
		h.Set("Authorization", "Bearer "+c.apiKey)
	}
	h.Set("User-Agent", c.userAgent)
}

// unreachable is the error of a request that got no answer: ctx's own, or
// unavailable naming the daemon's URL as the user gave it (the *url.Error
// names the request's URL, which for a unix socket is made up).
func (c *Client) unreachable(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return errdefs.Wrap(errdefs.Unavailable, err, "berth daemon not reachable at %s", c.display)
}

// requestRaw sends a request with a raw body (nil for none; its length is
// taken from a *bytes.Reader, *bytes.Buffer or *strings.Reader, else the
// body goes chunked) and extra headers.
func (c *Client) requestRaw(ctx context.Context, method, path string, query url.Values, body io.Reader, hdr http.Header) (*http.Response, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if n := lengthOf(body); n > 0 {
		req.ContentLength = n // sent with Content-Length, not chunked (and a file by sendfile)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	c.identify(req.Header)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.unreachable(ctx, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// lengthOf is a body's length when it knows it (a regular file, or a reader
// with Len), else -1.
func lengthOf(body io.Reader) int64 {
	switch b := body.(type) {
	case interface{ Len() int }:
		return int64(b.Len())
	case *os.File:
		if st, err := b.Stat(); err == nil && st.Mode().IsRegular() {
			if off, err := b.Seek(0, io.SeekCurrent); err == nil {
				return st.Size() - off
			}
		}
	}
	return -1
}

// decodeError turns an error response into a classified error.
func decodeError(resp *http.Response) error {
	var body api.ErrorResponse
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(b, &body) != nil || body.Error.Message == "" {
		text := strings.TrimSpace(string(b))
		if text == "" {
			text = http.StatusText(resp.StatusCode)
		}
		return errdefs.New(classForStatus(resp.StatusCode), "HTTP %d: %s", resp.StatusCode, text)
	}
	return fromAPIError(body.Error)
}

// fromAPIError is the classified error an API error body (or a stream's
// error event) describes; an unknown class is internal.
func fromAPIError(e api.Error) error {
	class := errdefs.Internal
	if errdefs.Known(e.Class) {
		class = errdefs.Class(e.Class)
	}
	err := errdefs.New(class, "%s", e.Message)
	if errdefs.KnownReason(e.Reason) {
		err = errdefs.WithReason(err, errdefs.Reason(e.Reason))
	}
	if len(e.Paths) > 0 {
		err = errdefs.WithPaths(err, e.Paths)
	}
	return err
}

// classForStatus classifies an error answer without a JSON body (a proxy's
// page, an old daemon) by its status code alone.
func classForStatus(code int) errdefs.Class {
	switch code {
	case http.StatusNotFound:
		return errdefs.NotFound
	case http.StatusBadRequest:
		return errdefs.InvalidArgument
	case http.StatusConflict:
		return errdefs.Conflict
	case http.StatusTooManyRequests:
		return errdefs.ResourceExhausted
	case http.StatusForbidden:
		return errdefs.PermissionDenied
	case http.StatusUnauthorized:
		return errdefs.Unauthenticated
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return errdefs.Unavailable
	case http.StatusGatewayTimeout:
		return errdefs.DeadlineExceeded
	case http.StatusNotImplemented:
		return errdefs.NotImplemented
	case http.StatusRequestEntityTooLarge:
		return errdefs.TooLarge
	case http.StatusMethodNotAllowed:
		return errdefs.MethodNotAllowed
	default:
		return errdefs.Internal
	}
}

func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	resp, err := c.request(ctx, method, path, query, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

func sbPath(id string, rest ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

func procPath(id string, pid int, rest ...string) string {
	return sbPath(id, append([]string{"processes", strconv.Itoa(pid)}, rest...)...)
}

// Health checks that the daemon answers.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, nil, nil)
}

// Version returns the daemon's version and runtimes.
func (c *Client) Version(ctx context.Context) (api.VersionResponse, error) {
	var v api.VersionResponse
	err := c.do(ctx, http.MethodGet, "/v1/version", nil, nil, &v)
	return v, err
}

// Runtimes lists the daemon's runtimes: the available ones with what each
// can do on this host, the others with why they cannot run here.
func (c *Client) Runtimes(ctx context.Context) ([]api.Runtime, error) {
	var out api.ListRuntimesResponse
	err := c.do(ctx, http.MethodGet, "/v1/runtimes", nil, nil, &out)
	return out.Runtimes, err
}

// CreateSandbox creates a sandbox and returns it running.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb)
	return sb, err
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodGet, sbPath(id), nil, nil, &sb)
	return sb, err
}

// ListSandboxes lists sandboxes that carry every label in labels.
func (c *Client) ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	pairs := make([]string, 0, len(labels))
	for k, v := range labels {
		pairs = append(pairs, k+"="+v)
	}
	sort.Strings(pairs)
	q := url.Values{}
	for _, p := range pairs {
		q.Add("label", p)
	}
	var out api.ListSandboxesResponse
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out)
	return out.Sandboxes, err
}

// DeleteSandbox deletes a sandbox and every trace of it.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, sbPath(id), nil, nil, nil)
}

// UpdateSandbox changes a sandbox's labels (merge patch) and, while it runs, its limits.
func (c *Client) UpdateSandbox(ctx context.Context, id string, req api.UpdateSandboxRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodPatch, sbPath(id), nil, req, &sb)
	return sb, err
}

// UpdateLabels applies a merge patch to a sandbox's labels: a value sets a
// label, nil removes it.
func (c *Client) UpdateLabels(ctx context.Context, id string, patch map[string]*string) (api.Sandbox, error) {
	return c.UpdateSandbox(ctx, id, api.UpdateSandboxRequest{Labels: patch})
}

// Stats returns what a running sandbox uses now.
func (c *Client) Stats(ctx context.Context, id string) (api.Usage, error) {
	var u api.Usage
	err := c.do(ctx, http.MethodGet, sbPath(id, "stats"), nil, nil, &u)
	return u, err
}

// GetOrCreate returns the sandbox that carries every label of req (starting
// it if stopped) or creates one; created says which.
func (c *Client) GetOrCreate(ctx context.Context, req api.CreateSandboxRequest) (sb api.Sandbox, created bool, err error) {
	resp, err := c.request(ctx, http.MethodPost, "/v1/sandboxes/get-or-create", nil, req)
	if err != nil {
		return sb, false, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil {
		return sb, false, fmt.Errorf("decode get-or-create: %w", err)
	}
	return sb, resp.StatusCode == http.StatusCreated, nil
}

// StopSandbox ends a sandbox's processes and keeps its files.
func (c *Client) StopSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodPost, sbPath(id, "stop"), nil, nil, &sb)
	return sb, err
}

// StartSandbox boots a stopped sandbox again.
func (c *Client) StartSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodPost, sbPath(id, "start"), nil, nil, &sb)
	return sb, err
}

// Keepalive counts as activity and pushes the idle stop back.
func (c *Client) Keepalive(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, sbPath(id, "keepalive"), nil, nil, nil)
}

// ListSandboxesSelector lists sandboxes matching a selector such as "a=b,c!=d,e,!f".
func (c *Client) ListSandboxesSelector(ctx context.Context, selector string) ([]api.Sandbox, error) {
	var out api.ListSandboxesResponse
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes", url.Values{"selector": {selector}}, nil, &out)
	return out.Sandboxes, err
}

// Exec runs a command and waits for its result.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (api.ExecResult, error) {
	var r api.ExecResult
	err := c.do(ctx, http.MethodPost, sbPath(id, "exec"), nil, req, &r)
	return r, err
}

// ExecStream runs a command and streams its events.
func (c *Client) ExecStream(ctx context.Context, id string, req api.ExecRequest) (*ExecStream, error) {
	resp, err := c.request(ctx, http.MethodPost, sbPath(id, "exec"), url.Values{"stream": {"true"}}, req)
	if err != nil {
		return nil, err
	}
	return newExecStream(resp.Body), nil
}

// StartProcess starts a background process.
func (c *Client) StartProcess(ctx context.Context, id string, req api.ExecRequest) (api.Process, error) {
	var p api.Process
	err := c.do(ctx, http.MethodPost, sbPath(id, "processes"), nil, req, &p)
	return p, err
}

// ListProcesses lists a sandbox's processes started through the API.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]api.Process, error) {
	var out api.ListProcessesResponse
	err := c.do(ctx, http.MethodGet, sbPath(id, "processes"), nil, nil, &out)
	return out.Processes, err
}

// GetProcess describes one process (with its result and output once ended).
func (c *Client) GetProcess(ctx context.Context, id string, pid int) (api.Process, error) {
	var p api.Process
	err := c.do(ctx, http.MethodGet, procPath(id, pid), nil, nil, &p)
	return p, err
}

// ProcessOutput streams a process's kept output, then live output if follow.
func (c *Client) ProcessOutput(ctx context.Context, id string, pid int, follow bool) (*ExecStream, error) {
	q := url.Values{}
	if follow {
		q.Set("follow", "true")
	}
	resp, err := c.request(ctx, http.MethodGet, procPath(id, pid, "output"), q, nil)
	if err != nil {
		return nil, err
	}
	return newExecStream(resp.Body), nil
}

// WaitProcess waits for a process to end; timeout 0 waits without limit.
func (c *Client) WaitProcess(ctx context.Context, id string, pid int, timeout time.Duration) (api.ExecResult, error) {
	q := url.Values{}
	if timeout > 0 {
		q.Set("timeout_ms", strconv.FormatInt(timeout.Milliseconds(), 10))
	}
	var r api.ExecResult
	err := c.do(ctx, http.MethodPost, procPath(id, pid, "wait"), q, nil, &r)
	return r, err
}

// SignalProcess signals a process's group; signal is a name ("TERM") or number.
func (c *Client) SignalProcess(ctx context.Context, id string, pid int, signal string) error {
	return c.do(ctx, http.MethodPost, procPath(id, pid, "signal"), nil, api.SignalRequest{Signal: signal}, nil)
}

// RemoveProcess forgets a finished process.
func (c *Client) RemoveProcess(ctx context.Context, id string, pid int) error {
	return c.do(ctx, http.MethodDelete, procPath(id, pid), nil, nil, nil)
}

// Events subscribes to a sandbox's events; it returns once the subscription
// is active, so events of calls made after it are not missed.
func (c *Client) Events(ctx context.Context, id string) (*EventStream, error) {
	resp, err := c.request(ctx, http.MethodGet, sbPath(id, "events"), nil, nil)
	if err != nil {
		return nil, err
	}
	return &EventStream{body: resp.Body, r: bufio.NewReader(resp.Body)}, nil
}

// EventStream reads Server-Sent Events of a sandbox.
type EventStream struct {
	body io.ReadCloser
	r    *bufio.Reader
}

// Next returns the next event; io.EOF when the stream ends (after deleted).
func (s *EventStream) Next() (api.SandboxEvent, error) {
	var data []byte
	for {
		line, err := s.r.ReadBytes('\n')
		if err != nil {
			return api.SandboxEvent{}, io.EOF
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0 && data != nil:
			var ev api.SandboxEvent
			if err := json.Unmarshal(data, &ev); err != nil {
				return ev, fmt.Errorf("decode event: %w", err)
			}
			return ev, nil
		case bytes.HasPrefix(line, []byte("data: ")):
			data = append(data, line[len("data: "):]...)
		}
	}
}

// Close ends the subscription.
func (s *EventStream) Close() error { return s.body.Close() }

// ExecStream reads the NDJSON events of a streamed exec or process output.
type ExecStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	done bool
}

func newExecStream(body io.ReadCloser) *ExecStream {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 128<<20)
	return &ExecStream{body: body, sc: sc}
}

// Next returns the next event; io.EOF after the exit event or at a clean end
// of the stream; an error event is returned as a classified error.
func (s *ExecStream) Next() (api.ExecEvent, error) {
	if s.done {
		return api.ExecEvent{}, io.EOF
	}
	if !s.sc.Scan() {
		s.done = true
		if err := s.sc.Err(); err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return api.ExecEvent{}, fmt.Errorf("exec stream: %w", err)
			}
			return api.ExecEvent{}, errdefs.Wrap(errdefs.Unavailable, err, "exec stream broken")
		}
		return api.ExecEvent{}, io.EOF // a clean end without an exit event: output of a running process, unfollowed
	}
	var ev api.ExecEvent
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return ev, fmt.Errorf("decode exec event: %w", err)
	}
	switch ev.Type {
	case api.EventExit:
		s.done = true
	case api.EventError:
		s.done = true
		if ev.Error != nil {
			return ev, fromAPIError(*ev.Error)
		}
		return ev, errdefs.New(errdefs.Internal, "exec failed without a message")
	}
	return ev, nil
}

// Copy writes the stream's output to stdout and stderr as it comes and
// returns the result.
func (s *ExecStream) Copy(stdout, stderr io.Writer) (api.ExecResult, error) {
	for {
		ev, err := s.Next()
		if err == io.EOF {
			return api.ExecResult{}, errdefs.New(errdefs.Unavailable, "exec stream ended without a result")
		}
		if err != nil {
			return api.ExecResult{}, err
		}
		switch ev.Type {
		case api.EventStdout:
			if _, err := stdout.Write(ev.Data); err != nil {
				return api.ExecResult{}, err
			}
		case api.EventStderr:
			if _, err := stderr.Write(ev.Data); err != nil {
				return api.ExecResult{}, err
			}
		case api.EventExit:
			if ev.Result == nil {
				return api.ExecResult{}, errdefs.New(errdefs.Unavailable, "exit event without a result")
			}
			return *ev.Result, nil
		}
	}
}

// Close ends the stream (and, for an exec, kills the process if it still runs).
func (s *ExecStream) Close() error { return s.body.Close() }
