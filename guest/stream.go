package guest

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// streams owns the connections handed over to two-way streams: net/http
// forgets a connection once it is hijacked, so the server closes these
// itself when it shuts down, and waits for their handlers.
type streams struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// add registers conn; false if the server is shutting down.
func (s *streams) add(conn net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[conn] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *streams) remove(conn net.Conn) {
	s.mu.Lock()
	delete(s.conns, conn)
	s.mu.Unlock()
	s.wg.Done()
}

// closeAll ends every open stream and waits until their handlers return.
func (s *streams) closeAll() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// streamConn is a hijacked connection: bytes net/http had already read
// come first, and CloseWrite half-closes the socket.
type streamConn struct {
	net.Conn
	buffered []byte
}

func (c *streamConn) Read(p []byte) (int, error) {
	if len(c.buffered) > 0 {
		n := copy(p, c.buffered)
		c.buffered = c.buffered[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite closes the write half: the peer reads EOF and may still send.
func (c *streamConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("this connection cannot half-close")
}

// upgrade answers a request that asks for a two-way stream with 101 and
// hands its connection to serve, which owns it until it returns; the
// connection is closed then, or when the server shuts down.
func (s *server) upgrade(w http.ResponseWriter, r *http.Request, serve func(*streamConn) error) error {
	if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), guestapi.UpgradeProtocol) {
		return errdefs.New(errdefs.InvalidArgument, "%s needs Connection: Upgrade and Upgrade: %s", r.URL.Path, guestapi.UpgradeProtocol)
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		return errors.New("connection cannot be taken over")
	}
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", guestapi.UpgradeProtocol)
	conn, brw, err := hj.Hijack()
	if err != nil {
		return err
	}
	if !s.streams.add(conn) {
		conn.Close()
		return nil
	}
	defer s.streams.remove(conn)
	defer conn.Close()
	// The server's header deadline may still be set; a stream has none.
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return err
	}
	sc := &streamConn{Conn: conn}
	if n := brw.Reader.Buffered(); n > 0 {
		sc.buffered, _ = brw.Reader.Peek(n)
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+guestapi.UpgradeProtocol+"\r\n\r\n"); err != nil {
		return err
	}
	return serve(sc)
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, part := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), token) {
				return true
			}
		}
	}
	return false
}

// echoBuffer is the echo's copy buffer: large enough that a bulk copy takes
// few system calls.
const echoBuffer = 256 << 10

// echo sends every byte of the stream back, then half-closes once the
// client has.
func (s *server) echo(w http.ResponseWriter, r *http.Request) error {
	return s.upgrade(w, r, func(c *streamConn) error {
		if _, err := io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, make([]byte, echoBuffer)); err != nil {
			return err
		}
		return c.CloseWrite()
	})
}
