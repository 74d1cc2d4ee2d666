package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	if hashNamed(src) {
		// Installed already (by InstallGuestBytes into the daemon's bin, or
		// here for another runtime): a link, without a read and a hash of
		// its megabytes again; a copy if dir is on another file system.
		dst := filepath.Join(dir, filepath.Base(src))
		if _, err := os.Stat(dst); err == nil {
			return dst, nil // src itself, or its link made before
		}
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return "", err
		}
		if err := os.Link(src, dst); err == nil || errors.Is(err, fs.ErrExist) {
			return dst, nil
		}
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("read guest binary: %w", err)
	}
	return InstallGuestBytes(b, dir)
}

// guestPrefix begins the name of every installed guest binary; 16 hex
// digits of its SHA-256 follow.
const guestPrefix = "berth-guest-"

// InstallGuestBytes writes b into dir as a guest binary named by its
// content hash, unless a file of that name and size is there already, and
// returns its path.
func InstallGuestBytes(b []byte, dir string) (string, error) {
	sum := sha256.Sum256(b)
	return InstallGuestBytesSum(b, hex.EncodeToString(sum[:]), dir)
}

// InstallGuestBytesSum is InstallGuestBytes for bytes whose SHA-256 is
// known already (sum, in hex): the embedded guest's, computed when berth
// was built, which spares each start hashing 10 MiB.
func InstallGuestBytesSum(b []byte, sum, dir string) (string, error) {
	if _, err := hex.DecodeString(sum); err != nil || len(sum) != 2*sha256.Size {
		return "", fmt.Errorf("guest binary: %q is not a SHA-256 in hex", sum)
	}
	dst := filepath.Join(dir, guestPrefix+strings.ToLower(sum[:16]))
	if fi, err := os.Stat(dst); err == nil && fi.Size() == int64(len(b)) {
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

// hashNamed says whether src is a guest binary installed by this package:
// a regular file of this process's user named berth-guest- and 16
// hex digits of its hash, in a directory only its owner may write, so that
// nobody else can have put another binary under that name.
func hashNamed(src string) bool {
	sum, ok := strings.CutPrefix(filepath.Base(src), guestPrefix)
	if !ok || len(sum) != 16 || strings.ToLower(sum) != sum {
		return false
	}
	if _, err := hex.DecodeString(sum); err != nil {
		return false
	}
	uid := uint32(os.Geteuid())
	fi, err := os.Lstat(src)
	if err != nil || !fi.Mode().IsRegular() || owner(fi) != uid {
		return false
	}
	di, err := os.Stat(filepath.Dir(src))
	return err == nil && owner(di) == uid && di.Mode().Perm()&0o022 == 0
}

func owner(fi fs.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0)
}
