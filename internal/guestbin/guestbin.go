// Package guestbin carries the lean guest binary (cmd/berth-guest) inside
// berth when it is built with the berth_guest_embedded tag, as `make build`
// does: the daemon writes it out and runs it as every sandbox's init, so
// that no daemon package's initializer runs in a sandbox's start.
package guestbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// Install writes the embedded guest into dir, named by its content hash
// (an upgrade never overwrites a binary that sandboxes run), and returns
// its path; "" when this berth was built without one.
func Install(dir string) (string, error) {
	if len(binary) == 0 {
		return "", nil
	}
	sum := sha256.Sum256(binary)
	dst := filepath.Join(dir, "berth-guest-"+hex.EncodeToString(sum[:8]))
	if fi, err := os.Stat(dst); err == nil && fi.Size() == int64(len(binary)) {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("install guest: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".guest-")
	if err != nil {
		return "", fmt.Errorf("install guest: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(binary); err != nil {
		tmp.Close()
		return "", fmt.Errorf("install guest: %w", err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", fmt.Errorf("install guest: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("install guest: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("install guest: %w", err)
	}
	return dst, nil
}

// Embedded says whether this berth carries the lean guest.
func Embedded() bool { return len(binary) > 0 }
