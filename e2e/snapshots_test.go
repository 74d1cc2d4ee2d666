package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testregistry"
	"github.com/berthsh/berth/internal/testutil"
	"golang.org/x/sys/unix"
)

func mustExec(t *testing.T, c *client.Client, id, shell string) string {
	t.Helper()
	r, err := c.Exec(t.Context(), id, api.ExecRequest{Shell: shell, User: "root"})
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d: %s%s", shell, r.ExitCode, r.Stdout, r.Stderr)
	}
	return string(r.Stdout)
}

// snapshotLayers lists the snapshot layers in the image store.
func (d *daemon) snapshotLayers() []string {
	dirs, _ := filepath.Glob(filepath.Join(d.state, "images", "oci", "layers", "snapshot-*"))
	return dirs
}

// TestSnapshotWhileWriting takes snapshots of a sandbox whose process
// rewrites a 1 MiB file in a loop (each version written beside and renamed
// over, as careful programs do): every snapshot holds one complete version,
// the process was frozen for the capture's last pass only, and it runs on.
func TestSnapshotWhileWriting(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	writer := `i=0; while :; do i=$((i+1)); head -c 1048576 /dev/zero | tr '\0' "$(printf \\$(printf %o $((65 + i % 26))))" > /home/user/f.tmp; mv /home/user/f.tmp /home/user/f; echo $i > /home/user/n; done`
	p, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: writer})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "test -f /home/user/f"})
		return err == nil && r.ExitCode == 0
	})
	var longest float64
	for i := range 4 {
		name := "writing-" + string(rune('a'+i))
		sn, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if sn.FrozenMs <= 0 || sn.SizeBytes < 1<<20 {
			t.Fatalf("snapshot %+v: want a freeze and at least the 1 MiB file", sn)
		}
		longest = max(longest, sn.FrozenMs)
		cp, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: api.SnapshotPrefix + name})
		if err != nil {
			t.Fatal(err)
		}
		out := mustExec(t, c, cp.ID, `f=/home/user/f; s=$(stat -c %s $f); u=$(tr -d "$(head -c 1 $f)" < $f | wc -c); echo $s $u`)
		if out != "1048576 0\n" {
			t.Fatalf("snapshot %s: the file is not one complete version (size, bytes unlike the first): %q", name, out)
		}
		if err := c.DeleteSandbox(ctx, cp.ID); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteSnapshot(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("longest freeze: %.2f ms", longest)
	proc, err := c.GetProcess(ctx, sb.ID, p.Pid)
	if err != nil || !proc.Running {
		t.Fatalf("the writer after the snapshots: %+v %v", proc, err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if l := d.snapshotLayers(); len(l) > 0 {
		t.Fatalf("snapshot layers left: %v", l)
	}
}

// TestSnapshotOutlivesItsSandbox: snapshot, delete the source, create from
// the snapshot (files, env, user, workdir kept), the rules of delete, and
// no layer, mount or row left at the end.
func TestSnapshotOutlivesItsSandbox(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Env: map[string]string{"STAGE": "one"}, Workdir: "/srv", User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, sb.ID, "mkdir -p /srv/app && echo v1 > /srv/app/main.py && rm /etc/debian_version && chmod 700 /srv/app")
	sn, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: "prepared", Labels: map[string]string{"task": "t1"}})
	if err != nil {
		t.Fatal(err)
	}
	if sn.Name != "prepared" || sn.Sandbox != sb.ID || sn.Image != "host" || sn.Labels["task"] != "t1" || sn.SizeBytes == 0 {
		t.Fatalf("snapshot: %+v", sn)
	}
	if _, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: "prepared"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second snapshot of the same name: %v", err)
	}
	for _, bad := range []string{"", "../x", "a b", strings.Repeat("x", 200)} {
		if _, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: bad}); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("snapshot name %q: %v", bad, err)
		}
	}
	if _, err := c.CreateSnapshot(ctx, "sb-nosuchsandbox", api.CreateSnapshotRequest{Name: "x"}); !errdefs.IsNotFound(err) {
		t.Fatalf("snapshot of a missing sandbox: %v", err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListSnapshots(ctx, "task=t1")
	if err != nil || len(list) != 1 || list[0].Name != "prepared" {
		t.Fatalf("list by label: %+v %v", list, err)
	}
	cp, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "snapshot:prepared"})
	if err != nil {
		t.Fatal(err)
	}
	out := mustExec(t, c, cp.ID, `echo $STAGE $(pwd) $(id -u) $(cat app/main.py) $(stat -c %a app); test -e /etc/debian_version || echo gone`)
	if out != "one /srv 0 v1 700\ngone\n" {
		t.Fatalf("a sandbox from the snapshot sees %q", out)
	}
	if err := c.DeleteSnapshot(ctx, "prepared"); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), cp.ID) {
		t.Fatalf("delete of a snapshot in use: %v", err)
	}
	got, err := c.GetSnapshot(ctx, "snapshot:prepared")
	if err != nil || !slices.Equal(got.InUse, []string{cp.ID}) {
		t.Fatalf("inspect: %+v %v", got, err)
	}
	// A snapshot of a sandbox made from a snapshot stacks on it.
	mustExec(t, c, cp.ID, "echo v2 > /srv/app/main.py")
	child, err := c.CreateSnapshot(ctx, cp.ID, api.CreateSnapshotRequest{Name: "child"})
	if err != nil || child.Parent != sn.ID {
		t.Fatalf("child snapshot: %+v %v", child, err)
	}
	if err := c.DeleteSandbox(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, "prepared"); err != nil {
		t.Fatal(err)
	}
	gc, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "snapshot:child"})
	if err != nil {
		t.Fatal(err)
	}
	if out := mustExec(t, c, gc.ID, "cat /srv/app/main.py; stat -c %a /srv/app"); out != "v2\n700\n" {
		t.Fatalf("from the child snapshot after its parent was deleted: %q", out)
	}
	if err := c.DeleteSandbox(ctx, gc.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, "child"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSnapshot(ctx, "child"); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
	if l := d.snapshotLayers(); len(l) > 0 {
		t.Fatalf("snapshot layers left: %v", l)
	}
	for _, id := range []string{sb.ID, cp.ID, gc.ID} {
		if tr := d.traces(id); len(tr) > 0 {
			t.Fatalf("%s left %v", id, tr)
		}
	}
}

// TestFork copies a sandbox with files and a running process: the copies
// have the files and none of the processes, their own labels, and are
// independent of the source and of each other; the source runs on.
func TestFork(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"thread_id": "t-1"}})
	if err != nil {
		t.Fatal(err)
	}
	// A fresh sandbox forks from its image: no layer.
	fresh, err := c.Fork(ctx, sb.ID, api.ForkRequest{})
	if err != nil || len(fresh.Sandboxes) != 1 || fresh.Snapshot != "" {
		t.Fatalf("fork of a fresh sandbox: %+v %v", fresh, err)
	}
	mustExec(t, c, sb.ID, "mkdir -p /home/user/work && seq 1 1000 > /home/user/work/data && echo state > /home/user/state")
	p, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "while :; do date +%s%N > /home/user/clock.tmp; mv /home/user/clock.tmp /home/user/clock; sleep 0.01; done"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "test -s /home/user/clock"})
		return err == nil && r.ExitCode == 0
	})
	want := mustExec(t, c, sb.ID, "md5sum < /home/user/work/data; cat /home/user/state") + "clock\n"
	res, err := c.Fork(ctx, sb.ID, api.ForkRequest{Count: 3, Labels: []map[string]string{{"try": "1"}, {"try": "2"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sandboxes) != 3 || res.Snapshot == "" || res.FrozenMs <= 0 {
		t.Fatalf("fork: %+v", res)
	}
	for i, cp := range res.Sandboxes {
		if cp.Labels["berth.fork_of"] != sb.ID || cp.Labels["thread_id"] != "" {
			t.Fatalf("copy %d labels: %v", i, cp.Labels)
		}
		if i < 2 && cp.Labels["try"] != string(rune('1'+i)) {
			t.Fatalf("copy %d labels: %v", i, cp.Labels)
		}
		if out := mustExec(t, c, cp.ID, "md5sum < /home/user/work/data; cat /home/user/state; test -s /home/user/clock && echo clock"); out != want {
			t.Fatalf("copy %d sees %q", i, out)
		}
		procs, err := c.ListProcesses(ctx, cp.ID)
		if err != nil || len(procs) != 0 {
			t.Fatalf("copy %d processes: %+v %v", i, procs, err)
		}
		mustExec(t, c, cp.ID, "echo copy > /home/user/state")
	}
	if out := mustExec(t, c, sb.ID, "cat /home/user/state"); out != "state\n" {
		t.Fatalf("the source after its copies wrote: %q", out)
	}
	if proc, err := c.GetProcess(ctx, sb.ID, p.Pid); err != nil || !proc.Running {
		t.Fatalf("the source's process after the fork: %+v %v", proc, err)
	}
	// The shared layer goes with the last copy.
	for _, cp := range append(res.Sandboxes, fresh.Sandboxes...) {
		if err := c.DeleteSandbox(ctx, cp.ID); err != nil {
			t.Fatal(err)
		}
	}
	if l := d.snapshotLayers(); len(l) > 0 {
		t.Fatalf("snapshot layers after the copies went: %v", l)
	}
	if _, err := c.Fork(ctx, sb.ID, api.ForkRequest{Count: 100}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("fork of 100: %v", err)
	}
	if _, err := c.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// A stopped sandbox forks too (its files are still).
	stopped, err := c.Fork(ctx, sb.ID, api.ForkRequest{})
	if err != nil || stopped.FrozenMs != 0 {
		t.Fatalf("fork of a stopped sandbox: %+v %v", stopped, err)
	}
	if out := mustExec(t, c, stopped.Sandboxes[0].ID, "cat /home/user/state"); out != "state\n" {
		t.Fatalf("copy of a stopped sandbox: %q", out)
	}
}

// TestDiff lists writes, edits, deletes, renames, chmods and a directory
// replaced, as JSON, as a tar with whiteouts and as a text diff, and
// against a snapshot.
func TestDiff(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, sb.ID, `echo new > /root/added && sed -i 's/^root:/ROOT:/' /etc/group && rm /etc/debian_version &&
		mv /etc/issue /etc/issue.moved && chmod 600 /etc/profile &&
		rm -rf /etc/skel && mkdir /etc/skel && echo only > /etc/skel/only`)
	res, err := c.Diff(ctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, ch := range res.Changes {
		got[ch.Path] = ch.Kind
	}
	want := map[string]string{
		"/root/added": "added", "/etc/group": "modified", "/etc/debian_version": "deleted",
		"/etc/issue": "deleted", "/etc/issue.moved": "added", "/etc/profile": "modified",
		"/etc/skel/only": "added", "/etc/skel/.bashrc": "deleted",
	}
	for p, k := range want {
		if got[p] != k {
			t.Errorf("%s: %q, want %q (all: %v)", p, got[p], k, got)
		}
	}
	for _, p := range []string{"/etc/hostname", "/etc/hosts", "/etc/resolv.conf"} {
		if _, ok := got[p]; ok {
			t.Errorf("berth's own file %s is listed as a change", p)
		}
	}
	rc, err := c.DiffStream(ctx, sb.ID, "", api.DiffTar)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
	rc.Close()
	for _, n := range []string{"root/added", "etc/.wh.debian_version", "etc/issue.moved", "etc/.wh.issue"} {
		if !names[n] {
			t.Errorf("tar lacks %s (has %v)", n, names)
		}
	}
	rc, err = c.DiffStream(ctx, sb.ID, "", api.DiffPatch)
	if err != nil {
		t.Fatal(err)
	}
	patch, _ := io.ReadAll(rc)
	rc.Close()
	for _, s := range []string{"--- a/etc/group", "+++ b/etc/group", "-root:x:0:", "+ROOT:x:0:", "+++ b/root/added", "+new"} {
		if !bytes.Contains(patch, []byte(s)) {
			t.Errorf("patch lacks %q:\n%s", s, patch)
		}
	}
	// Against a snapshot: only what changed since.
	if _, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: "before"}); err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, sb.ID, "echo later >> /root/added && touch /root/later")
	res, err = c.Diff(ctx, sb.ID, "before")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, ch := range res.Changes {
		paths = append(paths, ch.Kind+" "+ch.Path)
	}
	if !slices.Equal(paths, []string{"modified /root/added", "added /root/later"}) || res.Against != "snapshot:before" {
		t.Fatalf("diff against the snapshot: %v (against %s)", paths, res.Against)
	}
	if _, err := c.Diff(ctx, sb.ID, "nosuch"); !errdefs.IsNotFound(err) {
		t.Fatalf("against a missing snapshot: %v", err)
	}
	if _, err := c.DiffStream(ctx, sb.ID, "", "zip"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("format zip: %v", err)
	}
}

// TestApply: three forks try, the winner's changes go back onto the
// source; a path both changed is a conflict unless overwrite.
func TestApply(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	src, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, src.ID, "mkdir -p /work && echo base > /work/shared && echo keep > /work/keep && echo gone > /work/gone")
	forks, err := c.Fork(ctx, src.ID, api.ForkRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i, cp := range forks.Sandboxes {
		mustExec(t, c, cp.ID, "echo try"+string(rune('0'+i))+" > /work/result")
	}
	win := forks.Sandboxes[1].ID
	mustExec(t, c, win, "rm /work/gone && mkdir -p /work/new/dir && echo deep > /work/new/dir/f && chmod 640 /work/keep")
	res, err := c.Apply(ctx, src.ID, api.ApplyRequest{From: win})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 0 || len(res.Changes) == 0 {
		t.Fatalf("apply: %+v", res)
	}
	if out := mustExec(t, c, src.ID, "cat /work/result /work/new/dir/f; stat -c %a /work/keep; test -e /work/gone || echo gone-is-gone"); out != "try1\ndeep\n640\ngone-is-gone\n" {
		t.Fatalf("the source after apply: %q", out)
	}
	// Another fork's change to the same file now conflicts.
	other := forks.Sandboxes[2].ID
	_, err = c.Apply(ctx, src.ID, api.ApplyRequest{From: other})
	if !errdefs.IsConflict(err) || !slices.Contains(errdefs.PathsOf(err), "/work/result") || errdefs.ReasonOf(err) != errdefs.MergeConflict {
		t.Fatalf("conflicting apply: %v (paths %v)", err, errdefs.PathsOf(err))
	}
	if out := mustExec(t, c, src.ID, "cat /work/result"); out != "try1\n" {
		t.Fatalf("a refused apply changed the file: %q", out)
	}
	res, err = c.Apply(ctx, src.ID, api.ApplyRequest{From: other, Overwrite: true})
	if err != nil || !slices.Contains(res.Conflicts, "/work/result") {
		t.Fatalf("apply with overwrite: %+v %v", res, err)
	}
	if out := mustExec(t, c, src.ID, "cat /work/result"); out != "try2\n" {
		t.Fatalf("after overwrite: %q", out)
	}
	// From a snapshot: its changes over its parent's.
	if _, err := c.CreateSnapshot(ctx, forks.Sandboxes[0].ID, api.CreateSnapshotRequest{Name: "try0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, src.ID, api.ApplyRequest{From: "snapshot:try0", Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if out := mustExec(t, c, src.ID, "cat /work/result"); out != "try0\n" {
		t.Fatalf("after apply of a snapshot: %q", out)
	}
	for _, bad := range []api.ApplyRequest{{}, {From: src.ID}} {
		if _, err := c.Apply(ctx, src.ID, bad); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("apply %+v: %v", bad, err)
		}
	}
	if _, err := c.Apply(ctx, src.ID, api.ApplyRequest{From: "sb-nosuchsandbox"}); !errdefs.IsNotFound(err) {
		t.Fatalf("apply from a missing sandbox: %v", err)
	}
}

// TestPauseResume pauses a sandbox while an exec runs: the exec waits,
// calls answer conflict, the paused sandbox survives a daemon restart,
// and after resume the exec finishes and the process counts on.
func TestPauseResume(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "i=0; while :; do i=$((i+1)); echo $i > /home/user/count; sleep 0.02; done"}); err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		res  api.ExecResult
		xerr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, xerr = c.Exec(context.WithoutCancel(ctx), sb.ID, api.ExecRequest{Shell: "sleep 0.5; echo done"})
	}()
	time.Sleep(100 * time.Millisecond)
	if got, err := c.Pause(ctx, sb.ID); err != nil || got.State != api.StatePaused {
		t.Fatalf("pause: %+v %v", got, err)
	}
	upper := filepath.Join(d.state, "runtimes", "native", "sandboxes", sb.ID, "upper", "home", "user", "count")
	before, _ := os.ReadFile(upper)
	time.Sleep(300 * time.Millisecond)
	if after, _ := os.ReadFile(upper); !bytes.Equal(before, after) {
		t.Fatalf("the counter ran while paused: %q → %q", before, after)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "true"}); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("exec while paused: %v", err)
	}
	if got, err := c.Pause(ctx, sb.ID); err != nil || got.State != api.StatePaused {
		t.Fatalf("a second pause: %+v %v", got, err)
	}
	d.kill9()
	d.start()
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StatePaused {
		t.Fatalf("after a restart: %+v %v", got, err)
	}
	if after, _ := os.ReadFile(upper); !bytes.Equal(before, after) {
		t.Fatalf("the counter ran across the restart: %q → %q", before, after)
	}
	if got, err := c.Resume(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("resume: %+v %v", got, err)
	}
	waitFor(t, 5*time.Second, func() bool {
		after, _ := os.ReadFile(upper)
		return !bytes.Equal(before, after)
	})
	wg.Wait()
	// The exec's connection went with the killed daemon; a new one works.
	_ = res
	_ = xerr
	if out := mustExec(t, c, sb.ID, "echo alive"); out != "alive\n" {
		t.Fatalf("exec after resume: %q", out)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume of a running sandbox: %v", err)
	}
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("delete of a paused sandbox: %v", err)
	}
	if tr := d.traces(sb.ID); len(tr) > 0 {
		t.Fatalf("traces: %v", tr)
	}
}

// TestPauseWhileExec: an exec that runs across a pause finishes after
// resume, with its whole output.
func TestPauseWhileExec(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan api.ExecResult, 1)
	errs := make(chan error, 1)
	go func() {
		r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo start; sleep 0.3; echo end"})
		done <- r
		errs <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("the exec ended while paused: %+v %v", r, <-errs)
	default:
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if err := <-errs; err != nil || string(r.Stdout) != "start\nend\n" || r.ExitCode != 0 {
		t.Fatalf("exec across a pause: %+v %v", r, err)
	}
	if r.DurationMs < 700 {
		t.Fatalf("exec across a pause took %d ms; it was paused 700", r.DurationMs)
	}
}

// TestSnapshotAsImage uses a snapshot of a sandbox made from an OCI image
// where images go: a warm pool's source and a template's FROM.
func TestSnapshotAsImage(t *testing.T) {
	reg := testregistry.Start(t)
	reg.Push(t, "debian:bookworm", debianImage(t))
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: reg.Ref("debian:bookworm"), Env: map[string]string{"PREPARED": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, sb.ID, "mkdir -p /opt/prep && echo ready > /opt/prep/state && rm /etc/debian_version")
	if _, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: "prepared"}); err != nil {
		t.Fatal(err)
	}
	// A warm pool of the snapshot hands its sandboxes over.
	if _, err := c.SetPool(ctx, "snapshot:prepared", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		pools, err := c.Pools(ctx)
		return err == nil && slices.ContainsFunc(pools, func(p api.Pool) bool { return p.Image == "snapshot:prepared" && p.Ready == 1 })
	})
	pooled, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "snapshot:prepared"})
	if err != nil {
		t.Fatal(err)
	}
	if out := mustExec(t, c, pooled.ID, "cat /opt/prep/state; echo $PREPARED; test -e /etc/debian_version || echo gone"); out != "ready\nyes\ngone\n" {
		t.Fatalf("a pooled sandbox of the snapshot sees %q", out)
	}
	if _, err := c.SetPool(ctx, "snapshot:prepared", 0); err != nil {
		t.Fatal(err)
	}
	// A template builds on it.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM snapshot:prepared\nRUN cat /opt/prep/state > /opt/prep/copied && echo $PREPARED >> /opt/prep/copied\n"), 0o644)
	if _, err := c.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "from-snapshot"}, contextTar(t, dir), nil); err != nil {
		t.Fatal(err)
	}
	tpl, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "from-snapshot"})
	if err != nil {
		t.Fatal(err)
	}
	if out := mustExec(t, c, tpl.ID, "cat /opt/prep/copied; test -e /etc/debian_version || echo gone"); out != "ready\nyes\ngone\n" {
		t.Fatalf("a sandbox of the template sees %q", out)
	}
	// The host image is no image to build on.
	host, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSnapshot(ctx, host.ID, api.CreateSnapshotRequest{Name: "of-host"}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM snapshot:of-host\n"), 0o644)
	if _, err := c.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "bad"}, contextTar(t, dir), nil); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "host image") {
		t.Fatalf("a template FROM a host snapshot: %v", err)
	}
}

// TestSnapshotOnAFullDisk: a snapshot that runs out of space on the state
// directory's disk fails with resource_exhausted and leaves no snapshot,
// no layer and no temporary directory, and the source as it was.
func TestSnapshotOnAFullDisk(t *testing.T) {
	base := testutil.StateDir(t)
	img, state := filepath.Join(base, "disk.img"), filepath.Join(base, "state")
	if err := os.Mkdir(state, 0o711); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(160 << 20)
	f.Close()
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, state).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() { // after the daemon's clean-up (cleanups run last first)
		if out, err := exec.Command("umount", state).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	})
	os.Chmod(state, 0o711)
	d := startDaemon(t, state)
	ctx := t.Context()
	c := d.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(state, &st); err != nil {
		t.Fatal(err)
	}
	// Fill a little over half of what is left: the copy cannot fit.
	size := int64(st.Bavail) * st.Bsize * 6 / 10
	sum := mustExec(t, c, sb.ID, fmt.Sprintf("head -c %d /dev/urandom > /home/user/big && md5sum < /home/user/big", size))
	_, err = c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: "full"})
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a snapshot on a full disk: %v", err)
	}
	if _, err := c.GetSnapshot(ctx, "full"); !errdefs.IsNotFound(err) {
		t.Fatalf("the failed snapshot is there: %v", err)
	}
	if _, err := c.Fork(ctx, sb.ID, api.ForkRequest{}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a fork on a full disk: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(state, "images", "oci", "layers", "*"))
	if len(left) > 0 {
		t.Fatalf("left in the layer store: %v", left)
	}
	if out := mustExec(t, c, sb.ID, "md5sum < /home/user/big"); out != sum {
		t.Fatalf("the source's file after the failed snapshot: %q, want %q", out, sum)
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("the source after the failed snapshot: %+v %v", got, err)
	}
	list, err := c.ListSandboxes(ctx, nil)
	if err != nil || len(list) != 1 {
		t.Fatalf("sandboxes after the failed fork: %+v %v", list, err)
	}
}

// TestApplyTar carries changes as a tar: diff's tar of one sandbox applied
// onto another as it comes, and tars with paths outside the root (or into
// /proc) refused with nothing changed.
func TestApplyTar(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	a, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, a.ID, "mkdir -p /opt/tool && echo run > /opt/tool/run.sh && chmod 750 /opt/tool/run.sh && rm /etc/debian_version")
	rc, err := c.DiffStream(ctx, a.ID, "", api.DiffTar)
	if err != nil {
		t.Fatal(err)
	}
	changes, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.ApplyTar(ctx, b.ID, bytes.NewReader(changes))
	if err != nil || res.Entries == 0 || res.Whiteouts != 1 {
		t.Fatalf("apply the tar: %+v %v", res, err)
	}
	if out := mustExec(t, c, b.ID, "cat /opt/tool/run.sh; stat -c %a /opt/tool/run.sh; test -e /etc/debian_version || echo gone"); out != "run\n750\ngone\n" {
		t.Fatalf("after the tar: %q", out)
	}
	before := mustExec(t, c, b.ID, "ls -A / /etc /tmp /home/user | md5sum; md5sum /etc/passwd")
	for name, entries := range map[string][]tar.Header{
		"a path climbing out": {{Name: "ok.txt", Typeflag: tar.TypeReg}, {Name: "../../escape.txt", Typeflag: tar.TypeReg}},
		"an absolute climb":   {{Name: "/etc/../../escape.txt", Typeflag: tar.TypeReg}},
		"through a symlink":   {{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, {Name: "link/evil", Typeflag: tar.TypeReg}},
		"into /proc":          {{Name: "proc/sysrq-trigger", Typeflag: tar.TypeReg}},
		"a whiteout climbing": {{Name: "etc/.wh...", Typeflag: tar.TypeReg}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			h.Mode = 0o644
			body := "x"
			if h.Typeflag != tar.TypeReg {
				body = ""
			}
			h.Size = int64(len(body))
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			io.WriteString(tw, body)
		}
		tw.Close()
		if _, err := c.ApplyTar(ctx, b.ID, &buf); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
		if out := mustExec(t, c, b.ID, "ls -A / /etc /tmp /home/user | md5sum; md5sum /etc/passwd"); out != before {
			t.Errorf("%s changed the sandbox", name)
		}
	}
	if _, err := os.Stat("/escape.txt"); err == nil {
		t.Fatal("a tar wrote on the host")
	}
}

// TestArchiveAfter: a stopped sandbox's files go into a compressed archive
// once its archive_after runs out and its directory is freed; after a
// daemon restart, start brings them back (owners, modes, deletions, a disk
// of its own), and delete leaves no archive.
func TestArchiveAfter(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	one := int64(1)
	var ids []string
	for _, disk := range []int64{0, 64 << 20} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{User: "root", Limits: api.Limits{DiskBytes: disk},
			Timeouts: api.Timeouts{ArchiveAfterSeconds: &one}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.Timeouts.ArchiveAfterSeconds == nil || *sb.Timeouts.ArchiveAfterSeconds != 1 {
			t.Fatalf("timeouts: %+v", sb.Timeouts)
		}
		mustExec(t, c, sb.ID, `mkdir -p /srv/data && head -c 300000 /dev/urandom > /srv/data/blob && md5sum /srv/data/blob > /srv/sum &&
			echo mine > /home/user/mine && chown user:user /home/user/mine && chmod 640 /home/user/mine && rm /etc/debian_version`)
		if _, err := c.StopSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	for _, id := range ids {
		dir := filepath.Join(d.state, "runtimes", "native", "sandboxes", id)
		// The archive is on record before the layer goes (a crash between
		// leaves both): wait for both, and for every part of the layer
		// (the disk's image goes before its mount point). Once in CI both
		// sandboxes were archived in the same sweep, just past a 15 s
		// bound; the likeliest wait is the archive's fsync under the
		// parallel tests' disk load. The bound is generous; a passing run
		// takes about a second.
		layer := []string{"upper", "work", "disk.img", "disk"}
		gone := func() bool {
			for _, p := range layer {
				if _, err := os.Lstat(filepath.Join(dir, p)); err == nil {
					return false
				}
			}
			return true
		}
		waitFor(t, 90*time.Second, func() bool {
			sb, err := c.GetSandbox(ctx, id)
			return err == nil && sb.Archived && gone()
		})
		if _, err := os.Stat(filepath.Join(d.state, "images", "archives", id+".tar.gz")); err != nil {
			t.Fatalf("%s: the archive: %v", id, err)
		}
		if _, err := c.CreateSnapshot(ctx, id, api.CreateSnapshotRequest{Name: "of-archived"}); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "archived") {
			t.Fatalf("a snapshot of an archived sandbox: %v", err)
		}
	}
	d.kill9()
	d.start()
	for i, id := range ids {
		sb, err := c.StartSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Archived {
			t.Fatalf("%s is still archived after start", id)
		}
		out := mustExec(t, c, id, "md5sum -c /srv/sum >/dev/null && echo ok; stat -c '%U %a' /home/user/mine; cat /home/user/mine; test -e /etc/debian_version || echo gone")
		if out != "ok\nuser 640\nmine\ngone\n" {
			t.Fatalf("%s after restore: %q", id, out)
		}
		if i == 1 { // its disk is its own again, of its size
			if out := mustExec(t, c, id, "head -c 100000000 /dev/zero > /srv/fill 2>&1; echo $?"); out == "0\n" {
				t.Fatalf("%s wrote 100 MB on a 64 MiB disk after restore", id)
			}
		}
		if _, err := os.Stat(filepath.Join(d.state, "images", "archives", id+".tar.gz")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: the archive after restore: %v", id, err)
		}
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		if tr := d.traces(id); len(tr) > 0 {
			t.Fatalf("%s left %v", id, tr)
		}
	}
}

// TestSnapshotCLI drives the commands: snapshot create, ls, inspect and
// rm, fork, diff (list, patch, tar), apply (from a sandbox, a conflict,
// a tar), pause and resume.
func TestSnapshotCLI(t *testing.T) {
	d := startDaemon(t, "")
	run := func(stdin string, args ...string) string {
		t.Helper()
		out, errOut, code := d.cli(stdin, args...)
		if code != 0 {
			t.Fatalf("berth %v: exit %d: %s%s", args, code, out, errOut)
		}
		return out
	}
	id := strings.TrimSpace(run("", "create", "--user", "root"))
	run("", "exec", id, "--", "sh", "-c", "echo one > /root/f && rm /etc/debian_version")
	if out := run("", "snapshot", "create", "-l", "k=v", id, "first"); !strings.HasPrefix(out, "first\t") {
		t.Fatalf("snapshot create: %q", out)
	}
	if out := run("", "snapshot", "ls", "-s", "k=v"); !strings.Contains(out, "first") || !strings.Contains(out, id) {
		t.Fatalf("snapshot ls: %q", out)
	}
	var sn api.Snapshot
	if err := json.Unmarshal([]byte(run("", "snapshot", "inspect", "first")), &sn); err != nil || sn.Sandbox != id {
		t.Fatalf("snapshot inspect: %+v %v", sn, err)
	}
	forks := strings.Fields(run("", "fork", id, "-n", "2", "-l", "try=x"))
	if len(forks) != 2 {
		t.Fatalf("fork: %v", forks)
	}
	run("", "exec", forks[0], "--", "sh", "-c", "echo two > /root/f")
	run("", "exec", forks[1], "--", "sh", "-c", "echo three > /root/f")
	if out := run("", "diff", forks[0], "--against", "first"); out != "M /root/f\n" {
		t.Fatalf("diff against the snapshot: %q", out)
	}
	if out := run("", "diff", id); !strings.Contains(out, "A /root/f\n") || !strings.Contains(out, "D /etc/debian_version\n") {
		t.Fatalf("diff: %q", out)
	}
	if out := run("", "diff", forks[0], "--format", "patch", "--against", "first"); !strings.Contains(out, "-one\n+two\n") {
		t.Fatalf("diff --format patch: %q", out)
	}
	if out := run("", "apply", id, "--from", forks[0]); !strings.Contains(out, "M /root/f") {
		t.Fatalf("apply: %q", out)
	}
	out, errOut, code := d.cli("", "apply", id, "--from", forks[1])
	if code == 0 || !strings.Contains(errOut, "conflicts:\n  /root/f") {
		t.Fatalf("a conflicting apply: exit %d: %s%s", code, out, errOut)
	}
	tarFile := filepath.Join(t.TempDir(), "changes.tar")
	tarBytes := run("", "diff", forks[1], "--format", "tar", "--against", "first")
	os.WriteFile(tarFile, []byte(tarBytes), 0o644)
	if out := run("", "apply", id, "--tar", tarFile); !strings.Contains(out, " entries, 0 deletions, 6 B") {
		t.Fatalf("apply --tar: %q", out)
	}
	if out := run("", "exec", id, "--", "cat", "/root/f"); out != "three\n" {
		t.Fatalf("after apply --tar: %q", out)
	}
	run("", "pause", id)
	if _, errOut, code := d.cli("", "exec", id, "--", "true"); code == 0 || !strings.Contains(errOut, "paused") {
		t.Fatalf("exec while paused: exit %d: %s", code, errOut)
	}
	run("", "resume", id)
	run("", "exec", id, "--", "true")
	from := strings.TrimSpace(run("", "create", "--image", "snapshot:first"))
	if out := run("", "exec", from, "--", "cat", "/root/f"); out != "one\n" {
		t.Fatalf("a sandbox of the snapshot: %q", out)
	}
	if _, errOut, code := d.cli("", "snapshot", "rm", "first"); code == 0 || !strings.Contains(errOut, "in use") {
		t.Fatalf("snapshot rm of a snapshot in use: exit %d: %s", code, errOut)
	}
	run("", "rm", forks[0], forks[1], from)
	run("", "snapshot", "rm", "first")
}
