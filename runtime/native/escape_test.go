package native_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/runtimetest"
)

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}

// TestEscapes is berth's escape suite (runtimetest.Escapes) on the native
// tier, and its fork bomb against the cgroup's pids limit.
func TestEscapes(t *testing.T) {
	h, _ := harness(t)
	sb := runtimetest.Create(t, h, runtime.Spec{Limits: runtime.Limits{Pids: 64}})
	runtimetest.Escapes(t, h, sb, nil)
	t.Run("fork bomb stops at the pids limit", func(t *testing.T) {
		bomb, err := sb.Guest.Start(t.Context(), guestapi.ProcessSpec{Args: []string{"/bin/bash", "-c", "while true; do sleep 30 & done"}, User: "root"})
		if err != nil {
			t.Fatal(err)
		}
		cg := "/sys/fs/cgroup/pids/" + cgroupRoot + "/" + sb.ID
		waitUntil(t, func() bool {
			b, _ := os.ReadFile(cg + "/pids.events")
			return strings.TrimSpace(string(b)) != "max 0" // forks are being refused
		})
		b, _ := os.ReadFile(cg + "/pids.current")
		var n int
		fmt.Sscan(string(b), &n)
		if n > 64 {
			t.Fatalf("%d tasks in a sandbox limited to 64", n)
		}
		if err := sb.Guest.Signal(t.Context(), bomb.Pid, int(unix.SIGKILL)); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, func() bool {
			r, err := runtimetest.ExecErr(t.Context(), sb, guestapi.ProcessSpec{Args: []string{"true"}})
			return err == nil && r.ExitCode == 0
		})
	})
	// After all of it, the sandbox still answers.
	if got := runtimetest.Sh(t, sb, "echo still-here"); got != "still-here" {
		t.Fatalf("sandbox broken after the attacks: %q", got)
	}
}

// TestWhatTheFilterLeaves: the socket families and signals a workload needs
// still work after the hardening: IPv4 and IPv6 sockets, routing netlink
// (what ip and getifaddrs use), and SIGPIPE, SIGTERM and SIGINT in the
// workload's own processes (the guest catches them, it does not ignore
// them, so children keep the defaults).
func TestWhatTheFilterLeaves(t *testing.T) {
	h, _ := harness(t)
	sb := runtimetest.Create(t, h, runtime.Spec{})
	for _, tc := range []struct{ name, script, want string }{
		{"inet sockets", `python3 -c "import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s = socket.socket(); s.bind(('127.0.0.1', 0)); print('ok')"`, "ok"},
		{"routing netlink", `python3 -c "import socket; s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); s.bind((0, 0)); print('ok')"`, "ok"},
		{"interfaces via netlink", `python3 -c "import socket; print(sorted(n for _, n in socket.if_nameindex()))"`, "['lo']"},
		{"SIGPIPE ends a writer", "yes | head -c 1 >/dev/null; echo ${PIPESTATUS[0]}", "141"},
		{"SIGTERM ends a process", "sleep 30 & kill -TERM $!; wait $!; echo $?", "143"},
		{"SIGINT is not ignored", "grep -E '^SigIgn' /proc/self/status | cut -f2", "0000000000000000"},
	} {
		r := runtimetest.Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/bash", "-c", tc.script}, User: "root"})
		if got := strings.TrimSpace(string(r.Stdout)); got != tc.want {
			t.Errorf("%s: %q (stderr %q), want %q", tc.name, got, r.Stderr, tc.want)
		}
	}
}
