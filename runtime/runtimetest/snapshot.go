package runtimetest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/runtime"
)

// testPauseResume: a paused sandbox's process stops counting, then counts
// on after resume; a second resume is no error.
func testPauseResume(t *testing.T, h Harness) {
	p := h.Runtime.(runtime.Pauser)
	sb := Create(t, h, runtime.Spec{})
	if _, err := sb.Guest.Start(t.Context(), guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c",
		"while :; do date +%s%N >> /root/ticks; sleep 0.01; done"}, User: "root"}); err != nil {
		t.Fatal(err)
	}
	waitTicks(t, sb, 5)
	if err := p.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if err := p.Resume(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(t.Context(), sb.ID); err != nil {
		t.Fatalf("a second resume: %v", err)
	}
	before := len(ticks(t, sb))
	waitTicks(t, sb, before+5)
	// The longest gap between two ticks is the pause.
	ts, longest := ticks(t, sb), time.Duration(0)
	for i := 1; i < len(ts); i++ {
		longest = max(longest, ts[i].Sub(ts[i-1]))
	}
	if longest < 350*time.Millisecond {
		t.Fatalf("the longest gap between ticks is %v: the process ran while paused", longest)
	}
}

func ticks(t *testing.T, sb *Sandbox) []time.Time {
	var out []time.Time
	// The loop may not have made the file yet: that is no ticks.
	for _, line := range strings.Fields(Sh(t, sb, "cat /root/ticks 2>/dev/null; true")) {
		if ns, err := strconv.ParseInt(line, 10, 64); err == nil {
			out = append(out, time.Unix(0, ns))
		}
	}
	return out
}

func waitTicks(t *testing.T, sb *Sandbox, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for len(ticks(t, sb)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d ticks in 10 s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testCapture: what a running sandbox changed, captured as a layer: files
// with ids as the sandbox sees them, a whiteout for a deleted image file,
// berth's skipped file left out; the sandbox runs on; its writable layer
// is readable.
func testCapture(t *testing.T, h Harness) {
	c := h.Runtime.(runtime.Capturer)
	sb := Create(t, h, runtime.Spec{})
	Sh(t, sb, "mkdir -p /root/work && echo captured > /root/work/f && chmod 640 /root/work/f && echo skip-me > /root/skipped && rm -f /etc/debian_version")
	dst := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	capt, err := c.Capture(t.Context(), sb.ID, sb.Spec.Users, map[string][]byte{"/root/skipped": nil}, dst)
	if err != nil {
		t.Fatal(err)
	}
	if capt.Entries == 0 || capt.Bytes == 0 {
		t.Fatalf("capture: %+v", capt)
	}
	b, err := os.ReadFile(filepath.Join(dst, "root", "work", "f"))
	if err != nil || string(b) != "captured\n" {
		t.Fatalf("the captured file: %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dst, "root", "work", "f"), &st); err != nil || st.Uid != 0 || st.Mode&0o7777 != 0o640 {
		t.Fatalf("the captured file's owner and mode: %d %o %v (want 0, 640)", st.Uid, st.Mode&0o7777, err)
	}
	if err := unix.Lstat(filepath.Join(dst, "etc", "debian_version"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("no whiteout for a deleted image file: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "root", "skipped")); !os.IsNotExist(err) {
		t.Fatalf("a skipped file was captured: %v", err)
	}
	if got := Sh(t, sb, "cat /root/work/f"); got != "captured" {
		t.Fatalf("the sandbox after the capture: %q", got)
	}
	upper, err := c.WritableLayer(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(upper, "root", "work", "f")); err != nil {
		t.Fatalf("the writable layer: %v", err)
	}
}
