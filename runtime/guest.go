package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/berthsh/berth/api/guestapi"
)

// CheckGuest runs `guest --check`: a binary that cannot harden a sandbox
// (a cgo build) is refused now, with its reason, not at every create.
func CheckGuest(bin string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "guest", guestapi.CheckFlag)
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("guest binary %s cannot run sandboxes: %v: %s", bin, err, bytes.TrimSpace(out))
	}
	return nil
}

// InstallGuest copies the guest binary into the runtime's state dir, named by
// its content hash: the copy is reachable by a sandbox's unprivileged host
// uid wherever the daemon's own binary lives, owned by root and read-only to
// sandboxes, and an upgrade never overwrites a binary that sandboxes run.
func InstallGuest(src, dir string) (string, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("read guest binary: %w", err)
	}
	sum := sha256.Sum256(b)
	dst := filepath.Join(dir, "berth-guest-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".guest-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return dst, nil
}
