package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestNotifySendsOneDatagram(t *testing.T) {
	for _, abstract := range []bool{false, true} {
		name := filepath.Join(t.TempDir(), "notify")
		env := name
		if abstract {
			name = "\x00berth-sdnotify-test-" + t.Name()
			env = "@" + name[1:]
		}
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("NOTIFY_SOCKET", env)
		n := FromEnv()
		if v, set := os.LookupEnv("NOTIFY_SOCKET"); set {
			t.Errorf("NOTIFY_SOCKET=%q still set: children would inherit it", v)
		}
		if err := n.Notify(Ready); err != nil {
			t.Fatal(err)
		}
		l.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		size, _, err := l.ReadFromUnix(buf)
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := string(buf[:size]); got != Ready {
			t.Errorf("abstract=%v: got %q, want %q", abstract, got, Ready)
		}
	}
}

func TestNotifyWithoutSocketDoesNothing(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := FromEnv().Notify(Ready); err != nil {
		t.Errorf("no socket: %v", err)
	}
}
