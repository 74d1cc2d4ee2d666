package fds

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

func TestInheritedDescriptorsDoNotReachChildren(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	// Simulate a descriptor inherited without close-on-exec at a high number.
	if err := syscall.Dup3(int(w.Fd()), 251, 0); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(251)
	out, _ := exec.Command("ls", "/proc/self/fd").Output()
	if !strings.Contains(string(out), "251") {
		t.Fatalf("test set-up: fd 251 should leak before the fix: %q", out)
	}
	if err := CloseOnExecFrom(3); err != nil {
		t.Fatal(err)
	}
	out, _ = exec.Command("ls", "/proc/self/fd").Output()
	if strings.Contains(string(out), "251") {
		t.Fatalf("fd 251 still reaches children: %q", out)
	}
}
