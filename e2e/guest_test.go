package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthsh/berth/api"
)

// TestSandboxesRunTheLeanGuest: a berth built as make builds it runs the
// lean guest (cmd/berth-guest) as every sandbox's init, not itself: none of
// the daemon's packages (the store, metrics, the CLI) is in a sandbox's
// init, so none of their initializers runs in every create.
func TestSandboxesRunTheLeanGuest(t *testing.T) {
	d := startDaemon(t, "")
	if _, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{}); err != nil {
		t.Fatal(err)
	}
	var guest string
	exes, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, exe := range exes {
		if target, err := os.Readlink(exe); err == nil && strings.HasPrefix(target, d.state+string(filepath.Separator)) {
			guest = target
			break
		}
	}
	if guest == "" {
		t.Fatal("no process runs a binary from the daemon's state dir")
	}
	g, err := os.ReadFile(guest)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(d.bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"modernc.org/sqlite", "github.com/prometheus/client_golang", "github.com/spf13/cobra"} {
		if !bytes.Contains(b, []byte(pkg)) {
			t.Fatalf("berth itself lacks %s: the check below would prove nothing", pkg)
		}
		if bytes.Contains(g, []byte(pkg)) {
			t.Errorf("the sandbox's init %s links %s: built without the lean guest? (make build embeds it)", guest, pkg)
		}
	}
	if len(g) >= len(b)/2 {
		t.Errorf("the guest (%d bytes) is not lean beside berth (%d bytes)", len(g), len(b))
	}
	// Named by its hash, which make computes when it embeds the guest (the
	// daemon does not hash it at start): a wrong one would let an upgrade
	// reuse another build's guest.
	sum := sha256.Sum256(g)
	if want := "berth-guest-" + hex.EncodeToString(sum[:8]); filepath.Base(guest) != want {
		t.Errorf("the guest is installed as %s, but its content is %s", filepath.Base(guest), want)
	}
}
