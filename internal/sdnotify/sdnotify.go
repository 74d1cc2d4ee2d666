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

// Notify sends state (such as Ready) to systemd's notification socket. It
// does nothing, and returns nil, when $NOTIFY_SOCKET is unset: the daemon
// was not started by systemd with Type=notify. A name starting with @ is
// an abstract socket.
func Notify(state string) error {
	name := os.Getenv("NOTIFY_SOCKET")
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
