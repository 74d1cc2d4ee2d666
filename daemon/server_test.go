package daemon

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestIdleConnectionsAreClosed is the attack: a client that sends one
// request (here answered 401, as an unauthenticated one would be) and then
// holds its connection open without another. The server must close it after
// the idle timeout, over HTTP/1.1 and over HTTP/2 with prior knowledge.
func TestIdleConnectionsAreClosed(t *testing.T) {
	const idle = 200 * time.Millisecond
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no key", http.StatusUnauthorized)
	}), idle)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})

	t.Run("HTTP1", func(t *testing.T) {
		c := dial(t, ln.Addr().String())
		if _, err := io.WriteString(c, "GET /v1/sandboxes HTTP/1.1\r\nHost: berth\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Close {
			t.Fatalf("status %d, close %v: want a 401 on a kept-alive connection", resp.StatusCode, resp.Close)
		}
		waitClosed(t, c, br, idle)
	})
	t.Run("HTTP2", func(t *testing.T) {
		c := dial(t, ln.Addr().String())
		// The client preface and an empty SETTINGS frame: a connection with
		// no stream open.
		preface := "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"
		if _, err := io.WriteString(c, preface); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		// The server's first frame is its SETTINGS (type 4): it speaks h2.
		head := make([]byte, 9)
		if _, err := io.ReadFull(br, head); err != nil {
			t.Fatal(err)
		}
		if head[3] != 4 {
			t.Fatalf("first frame type %d, want SETTINGS", head[3])
		}
		waitClosed(t, c, br, idle)
	})
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitClosed reads c until the server closes it, failing if that takes far
// longer than idle.
func waitClosed(t *testing.T, c net.Conn, r io.Reader, idle time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(idle + 10*time.Second))
	start := time.Now()
	_, err := io.Copy(io.Discard, r)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the idle connection was still open after %v", time.Since(start))
	}
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read: %v", err)
	}
}
