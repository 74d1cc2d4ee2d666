package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// Terminals feeds processes' input and attaches to them (api/terminals.go
// has the protocol).
type Terminals interface {
	WriteStdin(ctx context.Context, tenant, id string, pid int, data []byte, close bool) error
	Attach(ctx context.Context, tenant, id string, pid int) (api.Attachment, error)
}

// maxStdinBody bounds one POST .../stdin.
const maxStdinBody = 16 << 20

// maxInputMessage bounds one WebSocket message from a client.
const maxInputMessage = 1 << 20

func (a *apiGroup) routeTerminals(r *Router) {
	r.Handle("POST /v1/sandboxes/{id}/processes/{pid}/stdin", a.writeStdin)
	r.Handle("GET /v1/sandboxes/{id}/processes/{pid}/attach", a.attach)
	r.Handle("GET /v1/sandboxes/{id}/pty", a.pty)
}

func (a *apiGroup) writeStdin(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	closeIt, err := boolQuery(r, "close")
	if err != nil {
		return err
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxStdinBody))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return errdefs.New(errdefs.TooLarge, "stdin: a body over %d bytes; send it in parts", maxStdinBody)
	}
	if err != nil {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "stdin: read the body")
	}
	if err := a.m.WriteStdin(r.Context(), Tenant(r), r.PathValue("id"), pid, data, closeIt); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *apiGroup) attach(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	if err := wantWebSocket(r); err != nil {
		return err
	}
	att, err := a.m.Attach(r.Context(), Tenant(r), r.PathValue("id"), pid)
	if err != nil {
		return err
	}
	p, err := a.m.GetProcess(r.Context(), Tenant(r), r.PathValue("id"), pid)
	if err != nil {
		att.Close()
		return err
	}
	bridge(w, r, att, api.TerminalMessage{Type: api.MsgAttached, Pid: pid, TTY: p.TTY})
	return nil
}

// pty starts a process on a terminal and attaches to it: the query gives
// rows and cols (default 24 by 80), cmd (repeated; default the login
// shell), cwd, user and env (repeated K=V).
func (a *apiGroup) pty(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tty := api.TTY{Rows: 24, Cols: 80}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"rows", &tty.Rows}, {"cols", &tty.Cols}} {
		if v := q.Get(f.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return errdefs.New(errdefs.InvalidArgument, "%s: %q is not a number", f.name, v)
			}
			*f.dst = n
		}
	}
	req := api.ExecRequest{Cmd: q["cmd"], Cwd: q.Get("cwd"), User: q.Get("user"), TTY: &tty, OpenStdin: true}
	if len(req.Cmd) == 0 {
		req.Cmd = api.DefaultShell
	}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return errdefs.New(errdefs.InvalidArgument, "env: %q is not K=V", kv)
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	if err := wantWebSocket(r); err != nil {
		return err
	}
	id := r.PathValue("id")
	p, err := a.m.StartProcess(r.Context(), Tenant(r), id, req)
	if err != nil {
		return err
	}
	att, err := a.m.Attach(r.Context(), Tenant(r), id, p.Pid)
	if err != nil {
		// Nothing half-made: the terminal nobody can reach goes.
		ctx := context.WithoutCancel(r.Context())
		a.m.SignalProcess(ctx, Tenant(r), id, p.Pid, "KILL")
		return err
	}
	bridge(w, r, att, api.TerminalMessage{Type: api.MsgAttached, Pid: p.Pid, TTY: p.TTY})
	return nil
}

// wantWebSocket refuses a request that is not a WebSocket handshake with
// berth's error body, before anything starts.
func wantWebSocket(r *http.Request) error {
	if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return errdefs.New(errdefs.InvalidArgument, "%s is a WebSocket: send Connection: Upgrade and Upgrade: websocket", r.URL.Path)
	}
	return nil
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// bridge carries an attachment over a WebSocket until the process ends,
// the client leaves or the sandbox goes; it closes att.
func bridge(w http.ResponseWriter, r *http.Request, att api.Attachment, first api.TerminalMessage) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled, Subprotocols: []string{api.WebSocketProtocol}})
	if err != nil {
		att.Close() // Accept answered the client
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(maxInputMessage)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if writeMessage(ctx, c, first) != nil {
		att.Close()
		return
	}

	// Output, until the exit or an error; then the close, which also ends
	// the input loop below.
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		for {
			stream, data, res, err := att.Next()
			switch {
			case err != nil:
				if ctx.Err() == nil {
					writeMessage(ctx, c, api.TerminalMessage{Type: api.MsgError, Error: apiError(err)})
					c.Close(websocket.StatusGoingAway, closeReason(err))
				}
				return
			case res != nil:
				if writeMessage(ctx, c, api.TerminalMessage{Type: api.MsgExit, Result: res}) == nil {
					c.Close(websocket.StatusNormalClosure, "the process exited")
				}
				return
			case stream == api.EventStderr:
				err = writeMessage(ctx, c, api.TerminalMessage{Type: api.MsgStderr, Data: data})
			default:
				err = c.Write(ctx, websocket.MessageBinary, data)
			}
			if err != nil {
				return
			}
		}
	}()

	// Input, until the client leaves or the output side ends.
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageBinary {
			err = att.Stdin(msg)
		} else {
			err = control(att, msg)
		}
		if err != nil && ctx.Err() == nil {
			// Input the process cannot take (a bad message, a closed
			// input): say so, go on.
			writeMessage(ctx, c, api.TerminalMessage{Type: api.MsgError, Error: apiError(err)})
		}
	}
	att.Close()
	<-done
}

// control acts on a text message from the client.
func control(att api.Attachment, msg []byte) error {
	var m api.TerminalMessage
	dec := json.NewDecoder(strings.NewReader(string(msg)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "a text message must be a JSON terminal message: %v", err)
	}
	switch m.Type {
	case api.MsgResize:
		if m.Rows < 1 || m.Rows > api.MaxTTY || m.Cols < 1 || m.Cols > api.MaxTTY {
			return errdefs.New(errdefs.InvalidArgument, "resize: rows %d, cols %d; each must be 1 to %d", m.Rows, m.Cols, api.MaxTTY)
		}
		return att.Resize(m.Rows, m.Cols)
	case api.MsgEOF:
		return att.CloseStdin()
	}
	t := m.Type
	if len(t) > 32 {
		t = t[:32] + "…"
	}
	return errdefs.New(errdefs.InvalidArgument, "type: %q is not a message a client sends (resize, eof)", t)
}

func writeMessage(ctx context.Context, c *websocket.Conn, m api.TerminalMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return c.Write(ctx, websocket.MessageText, b)
}

// apiError is err as the API shows it.
func apiError(err error) *api.Error {
	e := &api.Error{Class: string(errdefs.ClassOf(err)), Message: errdefs.Message(err)}
	if r := errdefs.ReasonOf(err); r != "" {
		e.Reason = string(r)
	}
	e.Paths = errdefs.PathsOf(err)
	return e
}

// closeReason fits err into a close frame (at most 123 bytes).
func closeReason(err error) string {
	s := errdefs.Message(err)
	for len(s) > 123 {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}
