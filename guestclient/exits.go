package guestclient

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Exits opens the guest's stream of background process exits
// (guestapi.PathExits). It lives until ctx ends or Close. A guest that
// predates the stream answers not_implemented.
func (c *Client) Exits(ctx context.Context) (*ExitStream, error) {
	resp, err := c.send(ctx, http.MethodGet, guestapi.PathExits, nil, nil)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, errdefs.New(errdefs.NotImplemented, "sandbox %s: its guest predates the exits stream", c.id)
		}
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 4<<10), guestapi.MaxExitLine)
	return &ExitStream{id: c.id, body: resp.Body, sc: sc}, nil
}

// ExitStream reads exits from the guest. What it returns is the guest's
// word: a pid above 0 and a result, nothing more is checked.
type ExitStream struct {
	id   string
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Next returns the next exit's result (Pid set). The stream never ends
// cleanly: a closed stream is an unavailable error, and so is a line
// longer than guestapi.MaxExitLine or one that is not an exit.
func (s *ExitStream) Next() (guestapi.Result, error) {
	if !s.sc.Scan() {
		err := s.sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return guestapi.Result{}, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: exits stream ended", s.id)
	}
	var ev guestapi.Event
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return guestapi.Result{}, errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s: bad exit from guest", s.id)
	}
	if ev.Type != guestapi.EventExit || ev.Result == nil || ev.Pid <= 0 || ev.Result.Pid != ev.Pid {
		return guestapi.Result{}, errdefs.New(errdefs.Unavailable, "sandbox %s: bad exit from guest: type %q, pid %d", s.id, truncate(ev.Type, 32), ev.Pid)
	}
	r := *ev.Result
	r.Stdout, r.Stderr = nil, nil // an exit carries no output
	if len(r.StartError) > maxErrorText {
		r.StartError = r.StartError[:maxErrorText] + "…"
	}
	return r, nil
}

// Close ends the stream.
func (s *ExitStream) Close() error { return s.body.Close() }
