package mcpserver_test

import (
	"context"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/internal/testutil"
)

// daemon is a berth daemon started for one test.
type daemon struct {
	url    string
	client *client.Client
}

// startDaemon runs `berth serve` as root on a loopback port with a fresh
// state directory; when the test ends its sandboxes are deleted and it is
// stopped (the state directory goes with testutil.StateDir's cleanup).
func startDaemon(t testing.TB) *daemon {
	t.Helper()
	testutil.RequireRoot(t)
	state := testutil.StateDir(t)
	addr := testutil.FreeAddr(t)
	var log testutil.Buffer
	cmd := exec.Command(testutil.Berth(t), "serve", "--state-dir", state, "--listen", addr, "--warm-pool", "0")
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{url: "http://" + addr}
	c, err := client.New(d.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if list, err := c.ListSandboxes(ctx, nil); err == nil {
			for _, sb := range list {
				c.DeleteSandbox(ctx, sb.ID)
			}
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("daemon log:\n%s", log.String())
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			daemonKeys.Store(d.url, testutil.AdminKey(t, state))
			c = mustClient(t, d.url)
			d.client = c
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not answer at %s: %v\n%s", d.url, err, log.String())
		}
	}
}

// daemonKeys holds the admin key of each test daemon by its URL, for the
// clients and the `berth mcp` processes the tests point at that URL.
var daemonKeys sync.Map

// keyFor is the admin key of the daemon at url ("" for no daemon's).
func keyFor(url string) string {
	k, _ := daemonKeys.Load(url)
	s, _ := k.(string)
	return s
}

func mustClient(t testing.TB, url string) *client.Client {
	t.Helper()
	c, err := client.New(url, client.WithAPIKey(keyFor(url)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
