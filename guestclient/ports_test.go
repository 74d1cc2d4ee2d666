package guestclient_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guestclient"
	"github.com/berthsh/berth/runtime/runtimetest"
)

// serveTCP listens on addr ("127.0.0.1:0", "[::1]:0") in this process,
// which shares the in-process guest's network namespace as a sandbox's
// server shares its guest's, and hands each connection to handle. It
// returns the port; the listener and its connections close when the test
// ends, and their goroutines are waited for.
func serveTCP(tb testing.TB, addr string, handle func(*net.TCPConn)) int {
	tb.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				handle(c.(*net.TCPConn))
			})
		}
	})
	tb.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().(*net.TCPAddr).Port
}

// echoThenBye echoes until EOF, then says "bye" and closes.
func echoThenBye(c *net.TCPConn) {
	io.Copy(c, c)
	io.WriteString(c, "bye")
}

// echo echoes until EOF, then half-closes.
func echo(c *net.TCPConn) {
	io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, make([]byte, 256<<10))
	c.CloseWrite()
}

// TestDialPort reaches a server on the sandbox's loopback through the guest:
// bytes go both ways, and a half-close reaches the server, which answers
// and closes.
func TestDialPort(t *testing.T) {
	c, _, _ := guestOnSocket(t)
	port := serveTCP(t, "127.0.0.1:0", echoThenBye)
	conn, err := c.DialPort(t.Context(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	if err := conn.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(conn)
	if err != nil || string(rest) != "bye" {
		t.Fatalf("after the half-close: %q %v", rest, err)
	}

	// Every byte, while both directions are busy.
	port = serveTCP(t, "127.0.0.1:0", echo)
	conn, err = c.DialPort(t.Context(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := runtimetest.EchoRoundTrip(conn, 64<<20); err != nil {
		t.Fatal(err)
	}
}

// TestDialPortIPv6 reaches a server that listens on ::1 only.
func TestDialPortIPv6(t *testing.T) {
	c, _, _ := guestOnSocket(t)
	if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	} else {
		l.Close()
	}
	// The guest tries 127.0.0.1 first, and this test's guest shares the
	// host's loopback: the same port number on IPv4 must be nobody's.
	var port int
	for try := 0; ; try++ {
		port = serveTCP(t, "[::1]:0", echoThenBye)
		if holdV4(t, port) {
			break
		}
		if try == 20 {
			t.Fatal("no port free on both ::1 and 127.0.0.1")
		}
	}
	conn, err := c.DialPort(t.Context(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.CloseWrite()
	if got, err := io.ReadAll(conn); err != nil || string(got) != "bye" {
		t.Fatalf("read %q %v", got, err)
	}
}

// holdV4 binds 127.0.0.1:port without listening, for the rest of the
// test: connections there are refused, and nothing else can listen there
// (the socket has no SO_REUSEADDR). It reports whether the port was free.
func holdV4(t *testing.T, port int) bool {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return false
	}
	t.Cleanup(func() { syscall.Close(fd) })
	return true
}

// TestDialPortCloseReachesTheServer: closing the stream closes the
// connection inside the sandbox.
func TestDialPortCloseReachesTheServer(t *testing.T) {
	c, _, _ := guestOnSocket(t)
	ended := make(chan error, 1)
	port := serveTCP(t, "127.0.0.1:0", func(c *net.TCPConn) {
		_, err := io.Copy(io.Discard, c)
		ended <- err
	})
	conn, err := c.DialPort(t.Context(), port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "hello"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the server's read ended with %v, want EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("closing the stream left the sandbox's connection open")
	}
}

// TestDialPortEndsWithTheGuest: a guest that shuts down ends its port
// streams, even one whose server is silent and whose daemon side is
// half-closed.
func TestDialPortEndsWithTheGuest(t *testing.T) {
	c, stop, _ := guestOnSocket(t)
	port := serveTCP(t, "127.0.0.1:0", func(c *net.TCPConn) { io.Copy(io.Discard, c); <-t.Context().Done() })
	conn, err := c.DialPort(t.Context(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.CloseWrite()
	done := make(chan error, 1)
	go func() { done <- stop() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the guest did not shut down with a port stream open")
	}
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("the stream outlived the guest")
	}
}

// TestDialPortRefusals: a closed port is unavailable with reason
// port_closed; a port that is not one is invalid, on both sides of the wire.
func TestDialPortRefusals(t *testing.T) {
	c, _, _ := guestOnSocket(t)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	_, err = c.DialPort(t.Context(), port)
	if !errdefs.IsUnavailable(err) || errdefs.ReasonOf(err) != errdefs.PortClosed ||
		errdefs.Message(err) != fmt.Sprintf("nothing listens on port %d in the sandbox", port) {
		t.Fatalf("closed port: %v (class %s, reason %q)", err, errdefs.ClassOf(err), errdefs.ReasonOf(err))
	}
	for _, p := range []int{0, -1, 70000} {
		if _, err := c.DialPort(t.Context(), p); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "port") {
			t.Errorf("DialPort(%d): %v", p, err)
		}
	}
	// The guest checks for itself.
	for _, q := range []string{"0", "70000", "abc", ""} {
		_, err := c.Upgrade(t.Context(), http.MethodGet, guestapi.PathDial+"?port="+q, nil)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "port") {
			t.Errorf("port=%s: %v", q, err)
		}
	}
}

// TestDialPortTimeout: a server whose accept queue is full takes no new
// connection; the guest gives up after guestapi.DialTimeout.
func TestDialPortTimeout(t *testing.T) {
	if testing.Short() {
		t.Skipf("waits %s", guestapi.DialTimeout)
	}
	c, _, _ := guestOnSocket(t)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // room for one connection, never accepted
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	first, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	start := time.Now()
	_, err = c.DialPort(t.Context(), port)
	if !errdefs.IsUnavailable(err) || errdefs.ReasonOf(err) != "" || !strings.Contains(err.Error(), "accepted no connection within") {
		t.Fatalf("full accept queue: %v", err)
	}
	if d := time.Since(start); d < guestapi.DialTimeout || d > guestapi.DialTimeout+2*time.Second {
		t.Fatalf("gave up after %v, want %v", d, guestapi.DialTimeout)
	}
}

// TestPorts lists the listeners of this process, which shares the guest's
// network namespace.
func TestPorts(t *testing.T) {
	c, _, _ := guestOnSocket(t)
	port := serveTCP(t, "127.0.0.1:0", func(*net.TCPConn) {})
	want := []guestapi.ListeningPort{{Port: port, Address: "127.0.0.1", Proto: "tcp"}}
	if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Logf("no IPv6 loopback here, only IPv4 checked: %v", err)
	} else {
		l.Close()
		port6 := serveTCP(t, "[::1]:0", func(*net.TCPConn) {})
		want = append(want, guestapi.ListeningPort{Port: port6, Address: "::1", Proto: "tcp6"})
	}
	got, err := c.Ports(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%+v not listed in %+v", w, got)
		}
	}
}

// hostileGuest serves h in place of a guest.
func hostileGuest(t *testing.T, h http.HandlerFunc) *guestclient.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := guestclient.New("sb-hostile", token, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
	t.Cleanup(c.Close)
	return c
}

// TestPortsDistrustsTheGuest: the daemon believes no port, protocol or
// address that cannot be, and reads a bounded answer.
func TestPortsDistrustsTheGuest(t *testing.T) {
	entry := func(port int, addr, proto string) string {
		return fmt.Sprintf(`{"port":%d,"address":%q,"proto":%q}`, port, addr, proto)
	}
	many := strings.Repeat(entry(80, "127.0.0.1", "tcp")+",", guestapi.MaxPorts) + entry(81, "127.0.0.1", "tcp")
	for name, body := range map[string]string{
		"port 0":           `{"ports":[` + entry(0, "127.0.0.1", "tcp") + `]}`,
		"port 70000":       `{"ports":[` + entry(70000, "127.0.0.1", "tcp") + `]}`,
		"udp":              `{"ports":[` + entry(53, "127.0.0.1", "udp") + `]}`,
		"not an address":   `{"ports":[` + entry(80, "localhost", "tcp") + `]}`,
		"v6 as tcp":        `{"ports":[` + entry(80, "::1", "tcp") + `]}`,
		"v4 as tcp6":       `{"ports":[` + entry(80, "127.0.0.1", "tcp6") + `]}`,
		"zone":             `{"ports":[` + entry(80, "fe80::1%eth0", "tcp6") + `]}`,
		"too many":         `{"ports":[` + many + `]}`,
		"endless":          `{"ports":[` + strings.Repeat(entry(80, "127.0.0.1", "tcp")+",", 40000),
		"not json":         `ports: 80`,
		"ports not a list": `{"ports":80}`,
	} {
		t.Run(name, func(t *testing.T) {
			c := hostileGuest(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })
			if got, err := c.Ports(t.Context()); !errdefs.IsUnavailable(err) {
				t.Fatalf("believed %d ports (%v)", len(got), err)
			}
		})
	}
	c := hostileGuest(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"ports":[`+entry(22, "0.0.0.0", "tcp")+","+entry(8000, "::", "tcp6")+`]}`)
	})
	got, err := c.Ports(t.Context())
	want := []guestapi.ListeningPort{{Port: 22, Address: "0.0.0.0", Proto: "tcp"}, {Port: 8000, Address: "::", Proto: "tcp6"}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("a sane answer: %+v %v", got, err)
	}
}

// TestPortsOnAnOlderGuest: a guest without the routes says not_found for
// them, which the daemon reports as not implemented.
func TestPortsOnAnOlderGuest(t *testing.T) {
	c := hostileGuest(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"class":"not_found","message":"no route for %s %s"}`, r.Method, r.URL.Path)
	})
	if _, err := c.Ports(t.Context()); !errdefs.IsNotImplemented(err) {
		t.Fatalf("ports: %v", err)
	}
	if _, err := c.DialPort(t.Context(), 8000); !errdefs.IsNotImplemented(err) {
		t.Fatalf("dial: %v", err)
	}
}

// BenchmarkDialPort1GiB pushes 64 MiB per op through DialPort to a sink
// listening in the guest's network namespace (push), and pulls 64 MiB per
// op from a source there (pull): daemon → unix socket → guest → TCP
// loopback and back. -benchtime=16x moves 1 GiB each way.
func BenchmarkDialPort1GiB(b *testing.B) {
	const size = 64 << 20
	c, _, _ := guestOnSocket(b)
	block := make([]byte, 1<<20)
	sink := serveTCP(b, "127.0.0.1:0", func(c *net.TCPConn) {
		buf := make([]byte, 256<<10)
		var n uint64
		for {
			k, err := c.Read(buf)
			n += uint64(k)
			if err != nil {
				break
			}
		}
		binary.Write(c, binary.BigEndian, n)
	})
	source := serveTCP(b, "127.0.0.1:0", func(c *net.TCPConn) {
		for range size / len(block) {
			if _, err := c.Write(block); err != nil {
				return
			}
		}
	})
	b.Run("push", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			conn, err := c.DialPort(b.Context(), sink)
			if err != nil {
				b.Fatal(err)
			}
			for range size / len(block) {
				if _, err := conn.Write(block); err != nil {
					b.Fatal(err)
				}
			}
			conn.CloseWrite()
			var n uint64
			if err := binary.Read(conn, binary.BigEndian, &n); err != nil || n != size {
				b.Fatalf("the sink got %d bytes (%v), want %d", n, err, size)
			}
			conn.Close()
		}
	})
	b.Run("pull", func(b *testing.B) {
		b.SetBytes(size)
		buf := make([]byte, 256<<10)
		for b.Loop() {
			conn, err := c.DialPort(b.Context(), source)
			if err != nil {
				b.Fatal(err)
			}
			var n int
			for {
				k, err := conn.Read(buf)
				n += k
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			if n != size {
				b.Fatalf("pulled %d bytes, want %d", n, size)
			}
			conn.Close()
		}
	})
}

// TestDialPortBoundAddress: a server bound to one loopback address other
// than 127.0.0.1 is reached at the address it is listed with.
func TestDialPortBoundAddress(t *testing.T) {
	c, _, _ := guestOnSocket(t)
	port := serveTCP(t, "127.0.0.2:0", echo)
	conn, err := c.DialPort(t.Context(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
}
