package e2e

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
)

func TestWarmPoolHandOver(t *testing.T) {
	d := startDaemon(t, "", "--warm-pool", "2")
	ctx := t.Context()
	waitFor(t, 10*time.Second, func() bool { return d.sandboxDirs() == 2 })
	if list, _ := d.client.ListSandboxes(ctx, nil); len(list) != 0 {
		t.Fatalf("pooled sandboxes are visible: %+v", list)
	}
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"thread_id": "p1"},
		Env: map[string]string{"GREETING": "hi"}, Limits: api.Limits{MemoryBytes: 128 << 20, Pids: 64}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.Labels["thread_id"] != "p1" || sb.Limits.Pids != 64 {
		t.Fatalf("handed-over sandbox: %+v", sb)
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo $GREETING; id -un; hostname"})
	if err != nil || string(r.Stdout) != "hi\nroot\n"+sb.ID+"\n" {
		t.Fatalf("exec: %q %v", r.Stdout, err)
	}
	for file, want := range map[string]string{
		"/sys/fs/cgroup/memory/berth/" + sb.ID + "/memory.limit_in_bytes": "134217728",
		"/sys/fs/cgroup/pids/berth/" + sb.ID + "/pids.max":                "64",
	} {
		if b, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %s, want %s", file, b, want)
		}
	}
	list, _ := d.client.ListSandboxes(ctx, nil)
	if len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("list after hand-over: %+v", list)
	}
	waitFor(t, 10*time.Second, func() bool { return d.sandboxDirs() == 3 }) // refilled
	// A request the pool cannot serve (another image) does not take from it.
	if _, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "ubuntu"}); err == nil {
		t.Fatal("unknown image accepted")
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// kill -9: the next daemon throws the old pool away and boots a new one.
	d.kill9()
	d.start()
	waitFor(t, 10*time.Second, func() bool { return d.sandboxDirs() == 2 && d.guests() == 2 })
	// A graceful stop drains the pool: nothing is left running.
	d.stop()
	if n := d.sandboxDirs(); n != 0 {
		t.Fatalf("%d sandbox dirs after a graceful stop", n)
	}
	if n := d.guests(); n != 0 {
		t.Fatalf("%d guests left after a graceful stop", n)
	}
}

// TestSpareGuests: the daemon keeps two guests started ahead (spares); a
// create boots on one, with its own limits, and another takes its place.
// A daemon killed with -9 takes its spares along (they end with their
// bootstrap socket), and the next one clears their cgroups and logs.
func TestSpareGuests(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	waitFor(t, 10*time.Second, func() bool { return len(d.spares()) == 2 })
	before := d.spares()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{User: "root", Limits: api.Limits{Pids: 77}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(before, sb.ID) {
		t.Fatalf("sandbox %s did not boot on a spare (spares: %v)", sb.ID, before)
	}
	if out := mustExec(t, d.client, sb.ID, "hostname; cat /sys/fs/cgroup/pids.max 2>/dev/null || echo none"); !strings.HasPrefix(out, sb.ID+"\n") {
		t.Fatalf("inside: %q", out)
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/pids/berth/" + sb.ID + "/pids.max"); err == nil && strings.TrimSpace(string(b)) != "77" {
		t.Fatalf("the spare's sandbox has pids.max %q, want 77", b)
	}
	waitFor(t, 10*time.Second, func() bool {
		now := d.spares()
		return len(now) == 2 && !slices.Contains(now, sb.ID)
	})

	old := d.spares()
	d.kill9()
	waitFor(t, 10*time.Second, func() bool {
		for _, id := range old {
			if b, err := os.ReadFile("/sys/fs/cgroup/pids/berth/" + id + "/cgroup.procs"); err == nil && len(strings.TrimSpace(string(b))) > 0 {
				return false
			}
		}
		return true
	})
	d.start()
	for _, id := range old {
		if tr := d.traces(id); len(tr) > 0 {
			t.Fatalf("spare %s of the killed daemon left %v", id, tr)
		}
	}
	if out := mustExec(t, d.client, sb.ID, "echo alive"); out != "alive\n" {
		t.Fatalf("the sandbox after the restart: %q", out)
	}
	waitFor(t, 10*time.Second, func() bool {
		now := d.spares()
		return len(now) == 2 && !slices.Contains(now, old[0]) && !slices.Contains(now, old[1])
	})
}
