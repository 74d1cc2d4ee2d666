package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

// dfKB is the size and use of the sandbox's root file system in KiB, as df
// inside it sees them (overlay reports its writable layer's file system).
func dfKB(t *testing.T, d *daemon, id string) (size, used int64) {
	t.Helper()
	r, err := d.client.Exec(t.Context(), id, api.ExecRequest{Shell: "df -k / | tail -1 | awk '{print $2, $3}'"})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("df: %+v %v", r, err)
	}
	f := strings.Fields(string(r.Stdout))
	size, _ = strconv.ParseInt(f[0], 10, 64)
	used, _ = strconv.ParseInt(f[1], 10, 64)
	return size, used
}

// TestDiskLimit fills a sandbox whose writable layer has a 64 MiB disk:
// ENOSPC inside, resource_exhausted for an upload, nothing of the host's
// disk beyond the limit; the disk grows on a running sandbox, survives
// stop and start, and leaves no mount or loop device after delete.
func TestDiskLimit(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Limits.DiskBytes != 64<<20 {
		t.Fatalf("limits: %+v", sb.Limits)
	}
	if size, _ := dfKB(t, d, sb.ID); size > 64<<10 || size < 48<<10 {
		t.Fatalf("df inside: %d KiB, want about 64 MiB", size)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "dd if=/dev/zero of=fill bs=1M count=200 2>&1; echo rc=$?"})
	if err != nil || !strings.Contains(string(r.Stdout), "No space left on device") || strings.Contains(string(r.Stdout), "rc=0") {
		t.Fatalf("filling the disk: %q %v", r.Stdout, err)
	}
	if st, err := d.client.Stats(ctx, sb.ID); err != nil || st.DiskBytes < 48<<20 || st.DiskBytes > 66<<20 {
		t.Fatalf("stats after filling: %+v %v", st, err)
	}
	// An upload that does not fit: resource_exhausted, no partial file.
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "rm fill"}); err != nil {
		t.Fatal(err)
	}
	_, err = d.client.Upload(ctx, sb.ID, "big", &zeros{n: 100 << 20}, client.FileOptions{})
	if !errdefs.IsResourceExhausted(err) || errdefs.ReasonOf(err) != errdefs.NoSpace {
		t.Fatalf("upload larger than the disk: %v", err)
	}
	if r, _ := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "ls -A /home/user | grep -c berth || true"}); strings.TrimSpace(string(r.Stdout)) != "0" {
		t.Fatalf("temporary upload file left: %q", r.Stdout)
	}
	// Grow while running (where the host allows: ext4 grows online only
	// with CAP_SYS_RESOURCE); shrinking and adding a disk are refused.
	want := int64(64 << 10)
	got, err := d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{DiskBytes: 128 << 20}})
	if canResize, _ := capability.Effective(unix.CAP_SYS_RESOURCE); canResize {
		if err != nil || got.Limits.DiskBytes != 128<<20 {
			t.Fatalf("grow: %+v %v", got.Limits, err)
		}
		want = 100 << 10
	} else if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
		t.Fatalf("grow without CAP_SYS_RESOURCE: %v", err)
	} else if sb2, _ := d.client.GetSandbox(ctx, sb.ID); sb2.Limits.DiskBytes != 64<<20 {
		t.Fatalf("a refused grow changed the recorded limit: %+v", sb2.Limits)
	}
	if size, _ := dfKB(t, d, sb.ID); size < want*3/4 {
		t.Fatalf("df after the grow: %d KiB", size)
	}
	_, err = d.client.UpdateSandbox(ctx, sb.ID, api.UpdateSandboxRequest{Limits: &api.Limits{DiskBytes: 32 << 20}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "limits.disk_bytes") || !strings.Contains(err.Error(), "only grows") {
		t.Fatalf("shrink: %v", err)
	}
	plain := newSandbox(t, d)
	_, err = d.client.UpdateSandbox(ctx, plain, api.UpdateSandboxRequest{Limits: &api.Limits{DiskBytes: 128 << 20}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "without a disk limit") {
		t.Fatalf("adding a disk: %v", err)
	}
	// Files and the disk survive stop and start.
	d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo kept > notes"})
	if _, err := d.client.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r, _ := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "cat notes"}); string(r.Stdout) != "kept\n" {
		t.Fatalf("after stop and start: %q", r.Stdout)
	}
	if size, _ := dfKB(t, d, sb.ID); size < want*3/4 {
		t.Fatalf("disk after start: %d KiB", size)
	}
	// Delete leaves no mount and no loop device.
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), sb.ID) {
		t.Fatal("a mount of the deleted sandbox is left")
	}
	if backing := loopBackings(); strings.Contains(backing, sb.ID) {
		t.Fatalf("a loop device of the deleted sandbox is left: %s", backing)
	}
	// Bad sizes name the range.
	for _, n := range []int64{1 << 20, 1 << 62} {
		_, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{DiskBytes: n}})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "limits.disk_bytes") || !strings.Contains(err.Error(), "outside") {
			t.Fatalf("disk %d: %v", n, err)
		}
	}
}

func loopBackings() string {
	var out strings.Builder
	entries, _ := os.ReadDir("/sys/block")
	for _, e := range entries {
		if b, err := os.ReadFile("/sys/block/" + e.Name() + "/loop/backing_file"); err == nil {
			out.Write(b)
		}
	}
	return out.String()
}
