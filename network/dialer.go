package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Upstream makes the daemon's side of a sandbox's connections: sockets in
// the egress network namespace (the daemon's own, or the one --egress-netns
// names), so that what a sandbox reaches is what that namespace routes.
type Upstream interface {
	// Dial connects a TCP socket to addr.
	Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	// ListenUDP opens an unconnected UDP socket.
	ListenUDP() (net.PacketConn, error)
	// DefaultRoute says whether the namespace has an IPv4 default route.
	DefaultRoute() (bool, error)
	Close() error
}

// HostUpstream dials from the daemon's own network namespace.
type HostUpstream struct{}

func (HostUpstream) Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp4", addr.String())
}

func (HostUpstream) ListenUDP() (net.PacketConn, error) { return net.ListenPacket("udp4", "0.0.0.0:0") }

func (HostUpstream) DefaultRoute() (bool, error) { return defaultRoute("/proc/thread-self/net/route") }

func (HostUpstream) Close() error { return nil }

// NamespaceUpstream makes its sockets in another network namespace: one
// OS thread, locked and moved into the namespace for the upstream's life,
// creates them (a socket stays in the namespace it was made in); the
// connects and everything after run on any thread.
type NamespaceUpstream struct {
	reqs chan socketReq
	done chan struct{}
}

type socketReq struct {
	typ   int // unix.SOCK_STREAM or unix.SOCK_DGRAM
	route bool
	reply chan socketReply
}

type socketReply struct {
	fd    int
	route bool
	err   error
}

// NewNamespaceUpstream opens the network namespace at path (a bind mount
// like /run/netns/NAME, or /proc/PID/ns/net).
func NewNamespaceUpstream(path string) (*NamespaceUpstream, error) {
	ns, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("egress network namespace: %w", err)
	}
	u := &NamespaceUpstream{reqs: make(chan socketReq), done: make(chan struct{})}
	ready := make(chan error, 1)
	go u.serve(ns, ready) // owns the namespace's thread until Close
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("egress network namespace %s: %w", path, err)
	}
	return u, nil
}

// serve runs on a thread of its own in the namespace. It never unlocks
// the thread: when it returns the Go runtime ends the thread, so no other
// goroutine ever runs in the namespace.
func (u *NamespaceUpstream) serve(ns int, ready chan<- error) {
	runtime.LockOSThread()
	err := unix.Setns(ns, unix.CLONE_NEWNET)
	unix.Close(ns)
	ready <- err
	if err != nil {
		return
	}
	for {
		select {
		case <-u.done:
			return
		case r := <-u.reqs:
			if r.route {
				ok, err := defaultRoute("/proc/thread-self/net/route")
				r.reply <- socketReply{route: ok, err: err}
				continue
			}
			fd, err := unix.Socket(unix.AF_INET, r.typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			r.reply <- socketReply{fd: fd, err: err}
		}
	}
}

func (u *NamespaceUpstream) ask(r socketReq) (socketReply, error) {
	r.reply = make(chan socketReply, 1)
	select {
	case u.reqs <- r:
	case <-u.done:
		return socketReply{}, errors.New("egress namespace closed")
	}
	rep := <-r.reply
	return rep, rep.err
}

func (u *NamespaceUpstream) socket(typ int) (*os.File, error) {
	rep, err := u.ask(socketReq{typ: typ})
	if err != nil {
		return nil, fmt.Errorf("socket in the egress namespace: %w", err)
	}
	return os.NewFile(uintptr(rep.fd), "egress"), nil
}

// Dial creates the socket in the namespace and connects it without
// blocking a thread: the connect's completion is awaited through the Go
// poller (a writable socket, then SO_ERROR).
func (u *NamespaceUpstream) Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	f, err := u.socket(unix.SOCK_STREAM)
	if err != nil {
		return nil, err
	}
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	if err := connect(ctx, c, addr); err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp4", Addr: net.TCPAddrFromAddrPort(addr), Err: err}
	}
	return c, nil
}

func connect(ctx context.Context, c net.Conn, addr netip.AddrPort) error {
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	sa := &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().Unmap().As4()}
	started := false
	var cerr error
	err = rc.Write(func(fd uintptr) bool {
		if !started {
			started = true
			switch err := unix.Connect(int(fd), sa); err {
			case nil:
				return true
			case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
				return false // wait until writable
			default:
				cerr = err
				return true
			}
		}
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			cerr = err
		case v != 0:
			cerr = syscall.Errno(v)
		default:
			// Writable and no error is not yet connected: the poller may
			// report the readiness the socket had before its connect.
			if _, err := unix.Getpeername(int(fd)); errors.Is(err, unix.ENOTCONN) {
				return false
			}
		}
		return true
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	c.SetWriteDeadline(time.Time{})
	return cerr
}

func (u *NamespaceUpstream) ListenUDP() (net.PacketConn, error) {
	f, err := u.socket(unix.SOCK_DGRAM)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := unix.Bind(int(f.Fd()), &unix.SockaddrInet4{}); err != nil {
		return nil, fmt.Errorf("bind a UDP socket in the egress namespace: %w", err)
	}
	return net.FilePacketConn(f)
}

func (u *NamespaceUpstream) DefaultRoute() (bool, error) {
	rep, err := u.ask(socketReq{route: true})
	return rep.route, err
}

// Close ends the namespace's thread.
func (u *NamespaceUpstream) Close() error {
	select {
	case <-u.done:
	default:
		close(u.done)
	}
	return nil
}

// defaultRoute reads an IPv4 routing table (/proc/net/route's format) for
// a route to 0.0.0.0/0 that is up and not a reject (unreachable,
// blackhole) route.
func defaultRoute(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[1] != "00000000" || fields[7] != "00000000" {
			continue
		}
		flags, err := strconv.ParseUint(fields[3], 16, 32)
		if err == nil && flags&unix.RTF_UP != 0 && flags&unix.RTF_REJECT == 0 {
			return true, nil
		}
	}
	return false, sc.Err()
}
