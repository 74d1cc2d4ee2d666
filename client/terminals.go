package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// WriteStdin writes data to the input of a process started with OpenStdin
// or a TTY; with close, the input is closed after it (EOF).
func (c *Client) WriteStdin(ctx context.Context, id string, pid int, data []byte, close bool) error {
	var q url.Values
	if close {
		q = url.Values{"close": {"true"}}
	}
	resp, err := c.requestRaw(ctx, http.MethodPost, sbPath(id, "processes", strconv.Itoa(pid), "stdin"), q, bytes.NewReader(data),
		http.Header{"Content-Type": {"application/octet-stream"}})
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// TerminalOptions start a terminal (Terminal): Cmd defaults to the user's
// login shell, the size to 24 by 80.
type TerminalOptions struct {
	Cmd        []string
	Rows, Cols int
	Cwd, User  string
	Env        map[string]string
}

// OpenTerminal starts a process on a terminal in a sandbox and attaches to
// it (GET /v1/sandboxes/ID/pty).
func (c *Client) OpenTerminal(ctx context.Context, id string, o TerminalOptions) (*Terminal, error) {
	q := url.Values{}
	for _, a := range o.Cmd {
		q.Add("cmd", a)
	}
	if o.Rows != 0 {
		q.Set("rows", strconv.Itoa(o.Rows))
	}
	if o.Cols != 0 {
		q.Set("cols", strconv.Itoa(o.Cols))
	}
	if o.Cwd != "" {
		q.Set("cwd", o.Cwd)
	}
	if o.User != "" {
		q.Set("user", o.User)
	}
	for k, v := range o.Env {
		q.Add("env", k+"="+v)
	}
	return c.dialTerminal(ctx, sbPath(id, "pty")+"?"+q.Encode())
}

// Attach attaches to a running process (a terminal again, after a dropped
// connection; a REPL started with OpenStdin): what it printed before
// comes first.
func (c *Client) Attach(ctx context.Context, id string, pid int) (*Terminal, error) {
	return c.dialTerminal(ctx, sbPath(id, "processes", strconv.Itoa(pid), "attach"))
}

func (c *Client) dialTerminal(ctx context.Context, path string) (*Terminal, error) {
	hdr := http.Header{}
	c.identify(hdr)
	u := "ws" + strings.TrimPrefix(c.base, "http") + path
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: hdr,
		CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			// websocket.Dial kept a prefix of the body for us.
			if derr := decodeError(resp); derr != nil {
				return nil, derr
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "berth daemon at %s: attach: %v", c.display, err)
	}
	ws.SetReadLimit(4 << 20)
	t := &Terminal{ws: ws}
	m, err := t.message(ctx)
	if err != nil || m.Type != api.MsgAttached || m.Pid <= 0 {
		ws.CloseNow()
		return nil, errdefs.New(errdefs.Unavailable, "berth daemon at %s: the attachment did not begin with %q: %v", c.display, api.MsgAttached, err)
	}
	t.Pid, t.TTY = m.Pid, m.TTY
	return t, nil
}

// Terminal is an attachment to a process over a WebSocket: its output
// comes from Next, its input goes to Write. Closing it leaves the process
// running.
type Terminal struct {
	ws *websocket.Conn
	// Pid is the process; TTY its terminal's size (nil without one).
	Pid int
	TTY *api.TTY
}

// TerminalEvent is one piece of a terminal's output: Stdout or Stderr
// bytes, or Exit (the last event); Error is a message the daemon could not
// take (a bad resize), after which the attachment goes on.
type TerminalEvent struct {
	Stdout, Stderr []byte
	Exit           *api.ExecResult
	Error          *api.Error
}

// Next returns the next event; after Exit it returns io.EOF-like errors
// (the WebSocket's close).
func (t *Terminal) Next(ctx context.Context) (TerminalEvent, error) {
	for {
		typ, b, err := t.ws.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) && ce.Code != websocket.StatusNormalClosure && ce.Reason != "" {
				return TerminalEvent{}, errdefs.New(errdefs.Unavailable, "%s", ce.Reason)
			}
			return TerminalEvent{}, err
		}
		if typ == websocket.MessageBinary {
			return TerminalEvent{Stdout: b}, nil
		}
		var m api.TerminalMessage
		if err := json.Unmarshal(b, &m); err != nil {
			return TerminalEvent{}, errdefs.New(errdefs.Unavailable, "a terminal message that is not JSON: %v", err)
		}
		switch m.Type {
		case api.MsgStderr:
			return TerminalEvent{Stderr: m.Data}, nil
		case api.MsgExit:
			if m.Result == nil {
				return TerminalEvent{}, errdefs.New(errdefs.Unavailable, "an exit message without a result")
			}
			return TerminalEvent{Exit: m.Result}, nil
		case api.MsgError:
			if m.Error == nil {
				m.Error = &api.Error{Class: string(errdefs.Internal), Message: "an error message without an error"}
			}
			return TerminalEvent{Error: m.Error}, nil
		}
		// A message type from a newer daemon: skip it.
	}
}

func (t *Terminal) message(ctx context.Context) (api.TerminalMessage, error) {
	var m api.TerminalMessage
	typ, b, err := t.ws.Read(ctx)
	if err != nil {
		return m, err
	}
	if typ != websocket.MessageText {
		return m, errors.New("a binary message first")
	}
	return m, json.Unmarshal(b, &m)
}

// Write sends p to the process's input.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.ws.Write(context.Background(), websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Resize gives the terminal a new size.
func (t *Terminal) Resize(ctx context.Context, rows, cols int) error {
	return t.send(ctx, api.TerminalMessage{Type: api.MsgResize, Rows: rows, Cols: cols})
}

// CloseStdin closes the process's input (EOF).
func (t *Terminal) CloseStdin(ctx context.Context) error {
	return t.send(ctx, api.TerminalMessage{Type: api.MsgEOF})
}

func (t *Terminal) send(ctx context.Context, m api.TerminalMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return t.ws.Write(ctx, websocket.MessageText, b)
}

// Close leaves the process running and ends the attachment.
func (t *Terminal) Close() error {
	return t.ws.Close(websocket.StatusNormalClosure, "")
}
