package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/berthsh/berth/api"
)

// TestNoDescriptorReachesASandbox leaves a descriptor open without
// close-on-exec in the daemon's parent (a careless supervisor); neither the
// sandbox's init nor its processes may hold it.
func TestNoDescriptorReachesASandbox(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	const leak = 249
	if err := syscall.Dup3(int(w.Fd()), leak, 0); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, "")
	syscall.Close(leak) // the daemon has its copy now
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", "import os; print(' '.join(sorted(os.listdir('/proc/self/fd'))))"}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "0 1 2 3" {
		t.Fatalf("descriptors of a sandbox process: %q %v", res.Stdout, err)
	}
	for _, pid := range sandboxPids(sb.ID) {
		if _, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, leak)); err == nil {
			t.Fatalf("pid %d in the sandbox holds the daemon's inherited fd %d", pid, leak)
		}
	}
}
