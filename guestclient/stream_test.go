package guestclient_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest"
	"github.com/berthsh/berth/guest/files"
	"github.com/berthsh/berth/guest/proc"
	"github.com/berthsh/berth/guestclient"
	"github.com/berthsh/berth/runtime/runtimetest"
)

const token = "stream-test-token-0123456789"

// guestOnSocket serves the real guest protocol on a unix socket in a test
// directory and returns a client of it and the server's stop.
func guestOnSocket(t testing.TB) (*guestclient.Client, func() error, func(context.Context) (net.Conn, error)) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "guest.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	fs, err := files.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- guest.Serve(ctx, l, token, proc.NewTable(log, proc.Defaults{}), fs, nil, nil, log) }()
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	c := guestclient.New("sb-stream", token, dial)
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-served
	}
	t.Cleanup(func() {
		c.Close()
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
		fs.Close()
	})
	return c, stop, dial
}

// TestStreamCopiesAGibibyteBothWays sends 1 GiB through the guest's echo
// stream while reading it back, half-closes, and checks every byte and the
// EOF that follows the half-close.
func TestStreamCopiesAGibibyteBothWays(t *testing.T) {
	c, _, _ := guestOnSocket(t)
	conn, err := c.Echo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if err := runtimetest.EchoRoundTrip(conn, 1<<30); err != nil {
		t.Fatal(err)
	}
	t.Logf("1 GiB each way in %v", time.Since(start))
}

// TestStreamRefusals: a stream needs the token and the upgrade headers.
func TestStreamRefusals(t *testing.T) {
	c, _, dial := guestOnSocket(t)
	wrong := guestclient.New("sb-stream", "wrong-token", dial)
	defer wrong.Close()
	if _, err := wrong.Echo(t.Context()); errdefs.ClassOf(err) != errdefs.Unauthenticated {
		t.Fatalf("echo with a wrong token: %v", err)
	}
	// A plain request to the echo route (no Upgrade) is refused, not hung.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }}}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://guest/guest/v1/echo", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("plain GET of the echo route: %s", resp.Status)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := c.Echo(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("echo with a cancelled context: %v", err)
	}
}

// TestStreamsEndWithTheGuest: a guest that shuts down closes its open
// streams (net/http forgets hijacked connections) and returns.
func TestStreamsEndWithTheGuest(t *testing.T) {
	c, stop, _ := guestOnSocket(t)
	conn, err := c.Echo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	done := make(chan error, 1)
	go func() { done <- stop() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the guest did not shut down with a stream open")
	}
	if _, err := conn.Read(buf); err == nil {
		t.Fatal("the stream outlived the guest")
	}
}
