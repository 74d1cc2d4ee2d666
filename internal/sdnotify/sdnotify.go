// Package sdnotify tells systemd about the daemon's state (sd_notify(3)): one datagram to the socket that $NOTIFY_SOCKET names, nothing when it names none.
package sdnotify

import (
	"fmt"
	"net"
	"os"
)

// Ready is the message of a daemon that has started; Stopping of one that
// is shutting down.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
)

// Notifier sends states to systemd's notification socket.
type Notifier struct {
	socket string // "" when not started by systemd with Type=notify
}

// FromEnv returns a Notifier for the socket $NOTIFY_SOCKET names, and
// unsets the variable (as sd_notify's unset_environment does), so that no
// process the daemon starts (runsc, a sandbox) inherits it and talks to
// systemd on the daemon's behalf.
func FromEnv() *Notifier {
	n := &Notifier{socket: os.Getenv("NOTIFY_SOCKET")}
	os.Unsetenv("NOTIFY_SOCKET")
	return n
}

// Notify sends state (such as Ready). It does nothing, and returns nil,
// without a socket. A name starting with @ is an abstract socket.
func (n *Notifier) Notify(state string) error {
	name := n.socket
	if name == "" {
		return nil
	}
	if name[0] == '@' {
		name = "\x00" + name[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	return nil
}
