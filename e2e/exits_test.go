package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

// eventLog reads a sandbox's events stream in the background.
type eventLog struct {
	t  *testing.T
	st *client.EventStream
	ch chan api.SandboxEvent
}

func followEvents(t *testing.T, d *daemon, id string) *eventLog {
	t.Helper()
	st, err := d.client.Events(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	l := &eventLog{t: t, st: st, ch: make(chan api.SandboxEvent, 256)}
	go func() { // owned here: ends when the stream is closed (below)
		defer close(l.ch)
		for {
			ev, err := st.Next()
			if err != nil {
				return
			}
			l.ch <- ev
		}
	}()
	t.Cleanup(func() { st.Close() })
	return l
}

// waitFor returns the first event (skipping others) for which match holds,
// failing the test after limit.
func (l *eventLog) waitFor(limit time.Duration, what string, match func(api.SandboxEvent) bool) api.SandboxEvent {
	l.t.Helper()
	timeout := time.After(limit)
	var seen []string
	for {
		select {
		case ev, ok := <-l.ch:
			if !ok {
				l.t.Fatalf("events stream ended waiting for %s; saw %v", what, seen)
			}
			seen = append(seen, fmt.Sprintf("%s(pid %d)", ev.Type, ev.Pid))
			if match(ev) {
				return ev
			}
		case <-timeout:
			l.t.Fatalf("no %s within %s; saw %v", what, limit, seen)
		}
	}
}

// none fails the test if an event for which match holds comes within d.
func (l *eventLog) none(d time.Duration, what string, match func(api.SandboxEvent) bool) {
	l.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case ev, ok := <-l.ch:
			if !ok {
				return
			}
			if match(ev) {
				l.t.Fatalf("unexpected %s: %+v (result %+v)", what, ev, ev.Result)
			}
		case <-timeout:
			return
		}
	}
}

func exitOf(pid int) func(api.SandboxEvent) bool {
	return func(ev api.SandboxEvent) bool { return ev.Type == api.ProcessExited && ev.Pid == pid }
}

// startBackground starts cmd as a background process and returns its pid.
func startBackground(t *testing.T, d *daemon, id string, cmd ...string) int {
	t.Helper()
	p, err := d.client.StartProcess(t.Context(), id, api.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid <= 0 {
		t.Fatalf("process %+v", p)
	}
	return p.Pid
}

// checkBackgroundExits: a background process that nobody waits on is
// reported when it exits, once (a wait afterwards publishes nothing more),
// and one the OOM killer ends is reported with oom.
func checkBackgroundExits(t *testing.T, d *daemon, runtime string) {
	ctx := t.Context()
	base := d.goroutines(t)
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: runtime, Limits: api.Limits{MemoryBytes: 128 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	evs := followEvents(t, d, sb.ID)

	pid := startBackground(t, d, sb.ID, "sleep", "0.2")
	evs.waitFor(5*time.Second, "process_started", func(ev api.SandboxEvent) bool { return ev.Type == api.ProcessStarted && ev.Pid == pid })
	ev := evs.waitFor(10*time.Second, "process_exited of sleep 0.2", exitOf(pid))
	if ev.Result == nil || ev.Result.Pid != pid || ev.Result.ExitCode != 0 || ev.Result.OOMKilled || ev.Sandbox != sb.ID {
		t.Fatalf("process_exited: %+v result %+v", ev, ev.Result)
	}
	// A failing one carries its exit code; one that ends at once is
	// reported after its start.
	pid2 := startBackground(t, d, sb.ID, "sh", "-c", "exit 3")
	evs.waitFor(5*time.Second, "process_started", func(ev api.SandboxEvent) bool { return ev.Type == api.ProcessStarted && ev.Pid == pid2 })
	ev = evs.waitFor(10*time.Second, "process_exited of exit 3", exitOf(pid2))
	if ev.Result == nil || ev.Result.ExitCode != 3 {
		t.Fatalf("process_exited: %+v result %+v", ev, ev.Result)
	}
	// Reported already: a wait (and a look) publishes no second exit.
	r, err := d.client.WaitProcess(ctx, sb.ID, pid, 5*time.Second)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("wait: %+v %v", r, err)
	}
	if _, err := d.client.GetProcess(ctx, sb.ID, pid2); err != nil {
		t.Fatal(err)
	}
	evs.none(time.Second, "second process_exited", func(ev api.SandboxEvent) bool {
		return ev.Type == api.ProcessExited && (ev.Pid == pid || ev.Pid == pid2)
	})

	// The OOM killer ends one: process_exited, then oom. (Not on gvisor,
	// whose memory limit bounds the whole sandbox: there the sandbox stops.)
	if runtime != "gvisor" {
		checkBackgroundOOM(t, d, sb.ID, evs)
	}

	// A process that runs across a pause (on gvisor, one that saves the
	// sandbox's memory and restores it) is reported when it exits after.
	pause := d.client.Pause
	if runtime == "gvisor" {
		pause = d.client.PauseMemory
	}
	pid5 := startBackground(t, d, sb.ID, "sleep", "1")
	if _, err := pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	evs.waitFor(15*time.Second, "process_exited after a pause", exitOf(pid5))

	// Stop and delete leave no goroutine or connection behind.
	if _, err := d.client.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	pid4 := startBackground(t, d, sb.ID, "sleep", "0.1")
	evs.waitFor(10*time.Second, "process_exited after a restart of the sandbox", exitOf(pid4))
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	evs.waitFor(10*time.Second, "deleted", func(ev api.SandboxEvent) bool { return ev.Type == api.SandboxDeleted })
	d.noLeak(t, base)
	if tr := d.traces(sb.ID); len(tr) > 0 {
		t.Fatalf("traces after delete: %v", tr)
	}
}

// checkBackgroundOOM: a background process the OOM killer ends, with
// nobody waiting, is reported by process_exited (OOMKilled) and oom, once.
func checkBackgroundOOM(t *testing.T, d *daemon, id string, evs *eventLog) {
	ctx := t.Context()
	pid3 := startBackground(t, d, id, "python3", "-c", allocGiB)
	ev := evs.waitFor(30*time.Second, "process_exited of the OOM-killed process", exitOf(pid3))
	if ev.Result == nil || !ev.Result.OOMKilled {
		t.Fatalf("process_exited of an OOM kill: %+v result %+v", ev, ev.Result)
	}
	evs.waitFor(5*time.Second, "oom", func(ev api.SandboxEvent) bool { return ev.Type == api.ProcessOOM && ev.Pid == pid3 })
	if r, err := d.client.WaitProcess(ctx, id, pid3, 5*time.Second); err != nil || !r.OOMKilled {
		t.Fatalf("wait: %+v %v", r, err)
	}
	evs.none(500*time.Millisecond, "second process_exited", exitOf(pid3))
}

func TestEventsBackgroundExit(t *testing.T) {
	checkBackgroundExits(t, startDaemon(t, ""), "")
}

func TestGvisorEventsBackgroundExit(t *testing.T) {
	checkBackgroundExits(t, startGvisorDaemon(t), "gvisor")
}

// TestEventsBackgroundExitAfterRestart: a daemon restarted (gracefully, or
// killed with -9) still reports a background process that exits
// afterwards, once, and does not report again one it reported before.
func TestEventsBackgroundExitAfterRestart(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, restart := range []string{"stop", "kill9"} {
		evs := followEvents(t, d, sb.ID)
		early := startBackground(t, d, sb.ID, "sleep", "0.1")
		evs.waitFor(10*time.Second, "process_exited before the restart", exitOf(early))
		evs.st.Close()
		late := startBackground(t, d, sb.ID, "sleep", "3")
		down := startBackground(t, d, sb.ID, "sleep", "0.5")
		if restart == "stop" {
			d.stop()
		} else {
			d.kill9()
		}
		time.Sleep(time.Second) // down ends while no daemon runs
		d.start()
		evs = followEvents(t, d, sb.ID)
		// down's exit is published at the attach, before anyone can
		// subscribe again (events are not kept): it may not be seen here.
		var got []int
		for !slices.Contains(got, late) {
			ev := evs.waitFor(15*time.Second, restart+": process_exited after the restart", func(ev api.SandboxEvent) bool {
				return ev.Type == api.ProcessExited
			})
			if ev.Pid == early || slices.Contains(got, ev.Pid) {
				t.Fatalf("%s: process %d reported again after the restart", restart, ev.Pid)
			}
			if ev.Pid != late && ev.Pid != down {
				t.Fatalf("%s: process_exited of %d, want %d or %d", restart, ev.Pid, late, down)
			}
			got = append(got, ev.Pid)
		}
		evs.none(500*time.Millisecond, "another process_exited", func(ev api.SandboxEvent) bool { return ev.Type == api.ProcessExited })
	}
}

// TestEventsBackgroundExitAfterHandOver: a sandbox handed over from the
// warm pool reports its background processes' exits too.
func TestEventsBackgroundExitAfterHandOver(t *testing.T) {
	d := startDaemon(t, "", "--warm-pool", "1")
	ctx := t.Context()
	waitFor(t, 10*time.Second, func() bool { return d.sandboxDirs() == 1 })
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{MemoryBytes: 128 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	evs := followEvents(t, d, sb.ID)
	pid := startBackground(t, d, sb.ID, "sh", "-c", "sleep 0.2; exit 5")
	ev := evs.waitFor(10*time.Second, "process_exited in a handed-over sandbox", exitOf(pid))
	if ev.Result == nil || ev.Result.ExitCode != 5 {
		t.Fatalf("process_exited: %+v result %+v", ev, ev.Result)
	}
}
