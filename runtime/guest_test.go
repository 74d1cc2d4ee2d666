package runtime

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func hashName(b []byte) string {
	sum := sha256.Sum256(b)
	return "berth-guest-" + hex.EncodeToString(sum[:8])
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestInstallGuest: a binary lands in dir named by its hash, mode 0755; one
// installed so already is linked into another runtime's dir (the same
// file, not read again) or returned as it is; a file whose name is not a
// hash, or that lies in a directory others may write, is read and hashed.
func TestInstallGuest(t *testing.T) {
	root := t.TempDir()
	os.Chmod(root, 0o711)
	src := filepath.Join(root, "guest")
	body := []byte("#!/bin/true\nnot really a guest\n")
	if err := os.WriteFile(src, body, 0o600); err != nil {
		t.Fatal(err)
	}
	daemonBin := filepath.Join(root, "bin")
	want := filepath.Join(daemonBin, hashName(body))
	got, err := InstallGuest(src, daemonBin)
	if err != nil || got != want {
		t.Fatalf("InstallGuest = %q, %v; want %q", got, err, want)
	}
	fi, err := os.Stat(got)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("installed: %v, %v; want mode 0755", fi, err)
	}
	if b, _ := os.ReadFile(got); !bytes.Equal(b, body) {
		t.Fatalf("installed %q, want %q", b, body)
	}
	if again, err := InstallGuest(got, daemonBin+"/"); err != nil || again != got {
		t.Fatalf("InstallGuest(installed, its dir) = %q, %v; want %q", again, err, got)
	}
	runtimeBin := filepath.Join(root, "runtimes", "native", "bin")
	linked, err := InstallGuest(got, runtimeBin)
	if err != nil || linked != filepath.Join(runtimeBin, hashName(body)) {
		t.Fatalf("InstallGuest(installed, another dir) = %q, %v", linked, err)
	}
	if inode(t, linked) != inode(t, got) {
		t.Fatal("the installed binary was copied into the runtime's dir, not linked")
	}

	// Named like an installed guest, but not by its hash, and where anyone
	// may write: not trusted by its name.
	open := filepath.Join(root, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	other := []byte("another binary")
	liar := filepath.Join(open, "berth-guest-0123456789abcdef")
	if err := os.WriteFile(liar, other, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := InstallGuest(liar, runtimeBin); err != nil || got != filepath.Join(runtimeBin, hashName(other)) {
		t.Fatalf("InstallGuest(%s) = %q, %v; want its hash's name", liar, got, err)
	}
	odd := filepath.Join(daemonBin, "berth-guest-nothex0123456789")
	if err := os.WriteFile(odd, other, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := InstallGuest(odd, daemonBin); err != nil || got != filepath.Join(daemonBin, hashName(other)) {
		t.Fatalf("InstallGuest(%s) = %q, %v; want its hash's name", odd, got, err)
	}
	if _, err := InstallGuest(filepath.Join(daemonBin, "berth-guest-fedcba9876543210"), runtimeBin); err == nil {
		t.Fatal("InstallGuest of a missing file succeeded")
	}
}
