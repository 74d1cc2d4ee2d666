// Package runtimetest is the conformance suite every runtime passes: create,
// guest hello, exec, concurrency, re-attach, isolation basics and delete
// without leaks, and what a runtime declares beyond them (stop and start,
// pause and resume, capture), run unchanged against each implementation.
package runtimetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guestclient"
	"github.com/berthsh/berth/runtime"
)

// Harness is what a runtime's test hands the suite.
type Harness struct {
	// Runtime is the runtime under test.
	Runtime runtime.Runtime
	// StateDir is the runtime's state directory.
	StateDir string
	// Base is a resolved spec without an id (root file system, mounts, user
	// mapping, network), as the manager would hand the runtime.
	Base runtime.Spec
	// Leaks reports what a deleted (or never created) sandbox left behind on
	// the host: processes, mounts, cgroups, files. Empty means clean.
	Leaks func(id string) []string
}

var seq struct {
	sync.Mutex
	n int
}

func newID(t testing.TB) string {
	seq.Lock()
	defer seq.Unlock()
	seq.n++
	return fmt.Sprintf("sb-rt%d%d", time.Now().UnixNano()%1e9, seq.n)
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	t.Run("CreateExecDelete", func(t *testing.T) { testCreateExecDelete(t, h) })
	t.Run("ExitCodesAndStderr", func(t *testing.T) { testExitCodes(t, h) })
	t.Run("ConcurrentExecs", func(t *testing.T) { testConcurrent(t, h) })
	t.Run("Reattach", func(t *testing.T) { testReattach(t, h) })
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, h) })
	t.Run("FailedCreateLeavesNothing", func(t *testing.T) { testFailedCreate(t, h) })
	t.Run("DeleteIsIdempotent", func(t *testing.T) { testDeleteTwice(t, h) })
	t.Run("TwoWayStream", func(t *testing.T) { testStream(t, h) })
	if _, ok := h.Runtime.(runtime.Stopper); ok && h.Runtime.Capabilities().StopStart {
		t.Run("StopStartKeepsFiles", func(t *testing.T) { testStopStart(t, h) })
	}
	if _, ok := h.Runtime.(runtime.Pauser); ok && h.Runtime.Capabilities().Pause {
		t.Run("PauseResume", func(t *testing.T) { testPauseResume(t, h) })
	}
	if _, ok := h.Runtime.(runtime.Capturer); ok && h.Runtime.Capabilities().Snapshot {
		t.Run("CaptureWhileRunning", func(t *testing.T) { testCapture(t, h) })
	}
	if _, ok := h.Runtime.(runtime.Checkpointer); ok && h.Runtime.Capabilities().MemoryCheckpoint {
		t.Run("CheckpointRestore", func(t *testing.T) { testCheckpoint(t, h) })
	}
}

// testCheckpoint saves a sandbox whole and brings it back: a loop that
// counts goes on from where it stopped, with the same pid; a file and a
// listening TCP socket are still there.
func testCheckpoint(t *testing.T, h Harness) {
	cp := h.Runtime.(runtime.Checkpointer)
	sb := Create(t, h, runtime.Spec{})
	ctx := t.Context()
	loop, err := sb.Guest.Start(ctx, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c",
		"i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.02; done"}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	server, err := sb.Guest.Start(ctx, guestapi.ProcessSpec{Args: []string{"python3", "-c",
		"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', 7123)); s.listen(); open('/tmp/ready','w').close(); time.sleep(1e6)"}})
	if err != nil {
		t.Fatal(err)
	}
	Sh(t, sb, "echo before > /root/f; for i in $(seq 100); do [ -e /tmp/ready ] && [ -s /tmp/count ] && exit 0; sleep 0.05; done; exit 1")
	if err := sb.Guest.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	state, err := cp.Checkpoint(ctx, sb.ID, sb.Inst.State)
	if err != nil {
		t.Fatal(err)
	}
	sb.Inst.State = state // the cleanup deletes what is there now
	if !cp.Checkpointed(state) {
		t.Fatal("the state after a checkpoint does not say so")
	}
	select {
	case <-sb.Inst.Exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the sandbox still runs after its checkpoint")
	}
	if _, err := h.Runtime.Attach(ctx, sb.ID, state); err == nil {
		t.Fatal("attached to a checkpointed sandbox")
	}
	inst, err := cp.Restore(ctx, sb.Spec, state)
	if err != nil {
		t.Fatal(err)
	}
	sb.Inst.State = inst.State
	again := &Sandbox{ID: sb.ID, Spec: sb.Spec, Inst: inst, Guest: guestclient.New(sb.ID, inst.Token, inst.Dial)}
	defer again.Guest.Close()
	first := Sh(t, again, "cat /tmp/count")
	for _, p := range []int{loop.Pid, server.Pid} {
		if info, err := again.Guest.Get(ctx, p); err != nil || !info.Running {
			t.Fatalf("process %d after restore: %+v %v", p, info, err)
		}
	}
	got := Sh(t, again, "sleep 0.3; cat /tmp/count /root/f; python3 -c \"import socket; socket.create_connection(('127.0.0.1', 7123), 2); print('connected')\"")
	lines := strings.Fields(got)
	if len(lines) != 3 || lines[1] != "before" || lines[2] != "connected" || atoi(lines[0]) <= atoi(first) || atoi(first) < 1 {
		t.Fatalf("after restore: count %s then %q", first, got)
	}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// Spec completes spec from h.Base: a new id and host name unless it has
// one, and Base's root, mounts, users and network unless it has a root.
func (h Harness) Spec(t testing.TB, spec runtime.Spec) runtime.Spec {
	if spec.ID == "" {
		spec.ID = newID(t)
	}
	if spec.Hostname == "" {
		spec.Hostname = spec.ID
	}
	if len(spec.Root.Layers) == 0 {
		spec.Root, spec.Mounts, spec.Users, spec.Network = h.Base.Root, h.Base.Mounts, h.Base.Users, h.Base.Network
	}
	return spec
}

func testStopStart(t *testing.T, h Harness) {
	st := h.Runtime.(runtime.Stopper)
	sb := Create(t, h, runtime.Spec{})
	Sh(t, sb, "echo kept > /root/f && echo user-kept > /tmp/g")
	if err := st.Stop(t.Context(), sb.ID, sb.Inst.State); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Inst.Exited:
	case <-time.After(5 * time.Second):
		t.Fatal("init still running after stop")
	}
	if err := st.Stop(t.Context(), sb.ID, sb.Inst.State); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	inst, err := st.Start(t.Context(), sb.Spec)
	if err != nil {
		t.Fatal(err)
	}
	sb.Inst.State = inst.State // the cleanup deletes what runs now
	again := &Sandbox{ID: sb.ID, Inst: inst, Guest: guestclient.New(sb.ID, inst.Token, inst.Dial)}
	defer again.Guest.Close()
	if _, err := again.Guest.Hello(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := Sh(t, again, "cat /root/f /tmp/g; hostname"); got != "kept\nuser-kept\n"+sb.ID {
		t.Fatalf("after start: %q", got)
	}
}

// Sandbox is a created sandbox with a connected guest.
type Sandbox struct {
	ID    string
	Spec  runtime.Spec
	Inst  *runtime.Instance
	Guest *guestclient.Client
}

// Create makes a sandbox, says hello to its guest, and deletes it (checking
// for leaks) at the end of the test.
func Create(t testing.TB, h Harness, spec runtime.Spec) *Sandbox {
	t.Helper()
	spec = h.Spec(t, spec)
	ctx := t.Context()
	inst, err := h.Runtime.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create %s: %v", spec.ID, err)
	}
	sb := &Sandbox{ID: spec.ID, Spec: spec, Inst: inst, Guest: guestclient.New(spec.ID, inst.Token, inst.Dial)}
	t.Cleanup(func() {
		sb.Guest.Close()
		if err := h.Runtime.Delete(context.Background(), spec.ID, inst.State); err != nil {
			t.Errorf("delete %s: %v", spec.ID, err)
		}
		if leaks := h.Leaks(spec.ID); len(leaks) > 0 {
			t.Errorf("sandbox %s left traces after delete: %v", spec.ID, leaks)
		}
	})
	if _, err := sb.Guest.Hello(ctx); err != nil {
		t.Fatalf("hello %s: %v", spec.ID, err)
	}
	return sb
}

// Exec runs args and returns the result with its output.
func Exec(t *testing.T, sb *Sandbox, spec guestapi.ProcessSpec) guestapi.Result {
	t.Helper()
	res, err := ExecErr(t.Context(), sb, spec)
	if err != nil {
		t.Fatalf("exec %v: %v", spec.Args, err)
	}
	return res
}

// ExecErr runs spec and collects its output.
func ExecErr(ctx context.Context, sb *Sandbox, spec guestapi.ProcessSpec) (guestapi.Result, error) {
	st, err := sb.Guest.Exec(ctx, spec)
	if err != nil {
		return guestapi.Result{}, err
	}
	defer st.Close()
	var out, errb []byte
	for {
		ev, err := st.Next()
		if err == io.EOF {
			return guestapi.Result{}, fmt.Errorf("stream ended without exit")
		}
		if err != nil {
			return guestapi.Result{}, err
		}
		switch ev.Type {
		case guestapi.EventStdout:
			out = append(out, ev.Data...)
		case guestapi.EventStderr:
			errb = append(errb, ev.Data...)
		case guestapi.EventError:
			return guestapi.Result{}, guestclient.EventError(sb.ID, ev)
		case guestapi.EventExit:
			r := *ev.Result
			r.Stdout, r.Stderr = out, errb
			return r, nil
		}
	}
}

// Sh runs a shell command as root and returns its trimmed stdout, failing the
// test on a non-zero exit.
func Sh(t *testing.T, sb *Sandbox, script string) string {
	t.Helper()
	r := Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", script}, User: "root"})
	if r.ExitCode != 0 {
		t.Fatalf("%q exited %d: stdout %q stderr %q", script, r.ExitCode, r.Stdout, r.Stderr)
	}
	return strings.TrimSpace(string(r.Stdout))
}

func testCreateExecDelete(t *testing.T, h Harness) {
	sb := Create(t, h, runtime.Spec{})
	r := Exec(t, sb, guestapi.ProcessSpec{Args: []string{"echo", "hello"}})
	if r.ExitCode != 0 || string(r.Stdout) != "hello\n" {
		t.Fatalf("echo hello: exit %d stdout %q stderr %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	if err := h.Runtime.Delete(t.Context(), sb.ID, sb.Inst.State); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Inst.Exited:
	case <-time.After(5 * time.Second):
		t.Fatal("Exited not closed after delete")
	}
	if leaks := h.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("traces after delete: %v", leaks)
	}
	if _, err := ExecErr(t.Context(), sb, guestapi.ProcessSpec{Args: []string{"true"}}); err == nil {
		t.Fatal("exec in a deleted sandbox succeeded")
	}
}

func testExitCodes(t *testing.T, h Harness) {
	sb := Create(t, h, runtime.Spec{})
	r := Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}})
	if r.ExitCode != 3 || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" {
		t.Fatalf("got exit %d stdout %q stderr %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	r = Exec(t, sb, guestapi.ProcessSpec{Args: []string{"no-such-binary-berth"}})
	if r.ExitCode != 127 || r.StartError == "" {
		t.Fatalf("missing binary: exit %d start error %q", r.ExitCode, r.StartError)
	}
	r = Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", "kill -9 $$"}})
	if r.Signal != 9 || r.ExitCode != 128+9 {
		t.Fatalf("killed: exit %d signal %d", r.ExitCode, r.Signal)
	}
	r = Exec(t, sb, guestapi.ProcessSpec{Args: []string{"sleep", "30"}, TimeoutMs: 200})
	if !r.TimedOut {
		t.Fatalf("sleep with 200ms timeout: not timed out: %+v", r)
	}
}

func testConcurrent(t *testing.T, h Harness) {
	sb := Create(t, h, runtime.Spec{})
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := fmt.Sprintf("n%d", i)
			r, err := ExecErr(t.Context(), sb, guestapi.ProcessSpec{Args: []string{"echo", want}})
			if err != nil {
				errs <- err
				return
			}
			if strings.TrimSpace(string(r.Stdout)) != want {
				errs <- fmt.Errorf("exec %d: got %q (exit %d, signal %d, stderr %q, start error %q)", i, r.Stdout, r.ExitCode, r.Signal, r.Stderr, r.StartError)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testReattach(t *testing.T, h Harness) {
	sb := Create(t, h, runtime.Spec{})
	Sh(t, sb, "echo kept > /tmp/marker")
	st, err := json.Marshal(json.RawMessage(sb.Inst.State))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := h.Runtime.Attach(t.Context(), sb.ID, st)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	again := &Sandbox{ID: sb.ID, Inst: inst, Guest: guestclient.New(sb.ID, inst.Token, inst.Dial)}
	defer again.Guest.Close()
	if _, err := again.Guest.Hello(t.Context()); err != nil {
		t.Fatalf("hello after attach: %v", err)
	}
	if got := Sh(t, again, "cat /tmp/marker"); got != "kept" {
		t.Fatalf("after attach: %q", got)
	}
	// Attach to a sandbox that is gone fails with unavailable.
	if err := h.Runtime.Delete(t.Context(), sb.ID, sb.Inst.State); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Runtime.Attach(t.Context(), sb.ID, st); !errdefs.IsUnavailable(err) {
		t.Fatalf("attach to a deleted sandbox: %v, want unavailable", err)
	}
}

func testIsolation(t *testing.T, h Harness) {
	sb := Create(t, h, runtime.Spec{})
	if got := Sh(t, sb, "hostname"); got != sb.ID {
		t.Errorf("hostname %q, want %q", got, sb.ID)
	}
	if got := Sh(t, sb, "id -u"); got != "0" {
		t.Errorf("root inside: uid %q", got)
	}
	// Only the sandbox's own processes are visible: init and this command.
	for _, comm := range strings.Fields(Sh(t, sb, "ps -e -o comm=")) {
		if !strings.HasPrefix(comm, "berth-guest") && comm != "ps" && comm != "sh" {
			t.Errorf("process %q visible inside a sandbox that runs only init and ps", comm)
		}
	}
	if got := Sh(t, sb, "cat /proc/1/cmdline | tr '\\0' ' '"); !strings.Contains(got, "guest") {
		t.Errorf("pid 1 is %q, want the berth guest", got)
	}
	// Loopback only.
	if got := Sh(t, sb, "awk -F: 'NR>2{print $1}' /proc/net/dev | tr -d ' '"); got != "lo" {
		t.Errorf("network interfaces: %q, want lo only", got)
	}
	// The writable layer is private and writable by root; the system dirs are read-only.
	Sh(t, sb, "echo x > /etc/berth-test && rm /etc/berth-test")
	r := Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", "touch /usr/bin/berth-test"}, User: "root"})
	if r.ExitCode == 0 {
		t.Error("/usr is writable inside the sandbox")
	}
	// The unprivileged user exists, with a home.
	r = Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", "id -un; echo $HOME; pwd"}, User: "user"})
	if got := string(r.Stdout); got != "user\n/home/user\n/home/user\n" {
		t.Errorf("as user: %q (stderr %q)", got, r.Stderr)
	}
}

// testFailedCreate makes creates fail before and after the runtime has made
// things (a spec without a root; a root layer that is not there, which only
// the booting guest finds out) and checks that nothing is left.
func testFailedCreate(t *testing.T, h Harness) {
	noRoot := runtime.Spec{ID: newID(t), Users: h.Base.Users, Network: h.Base.Network}
	noRoot.Hostname = noRoot.ID
	if _, err := h.Runtime.Create(t.Context(), noRoot); err == nil {
		t.Fatal("create without a root file system succeeded")
	}
	if leaks := h.Leaks(noRoot.ID); len(leaks) > 0 {
		t.Fatalf("failed create left traces: %v", leaks)
	}
	missing := h.Spec(t, runtime.Spec{})
	missing.Root.Layers = []string{filepath.Join(h.StateDir, "no-such-layer")}
	if _, err := h.Runtime.Create(t.Context(), missing); err == nil {
		t.Fatal("create on a missing root layer succeeded")
	}
	if leaks := h.Leaks(missing.ID); len(leaks) > 0 {
		t.Fatalf("failed create left traces: %v", leaks)
	}
}

// testStream copies 64 MiB both ways through the guest's echo stream and
// half-closes it.
func testStream(t *testing.T, h Harness) {
	sb := Create(t, h, runtime.Spec{})
	conn, err := sb.Guest.Echo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := EchoRoundTrip(conn, 64<<20); err != nil {
		t.Fatal(err)
	}
}

// halfCloser is a stream whose write half closes on its own.
type halfCloser interface {
	io.ReadWriter
	CloseWrite() error
}

// EchoRoundTrip writes n bytes of a pattern into an echo stream while it
// reads them back, half-closes after the last byte, and checks that exactly
// those bytes come back, then EOF: what a two-way stream must do.
func EchoRoundTrip(conn halfCloser, n int64) error {
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i*7 + i>>11)
	}
	wrote := make(chan error, 1)
	go func() {
		var err error
		for left := n; left > 0 && err == nil; {
			chunk := block[:min(left, int64(len(block)))]
			_, err = conn.Write(chunk)
			left -= int64(len(chunk))
		}
		if err == nil {
			err = conn.CloseWrite()
		}
		wrote <- err
	}()
	buf := make([]byte, 256<<10)
	var got int64
	for {
		k, err := conn.Read(buf)
		for i := range k {
			if buf[i] != block[(got+int64(i))%int64(len(block))] {
				return fmt.Errorf("byte %d came back as %d, want %d", got+int64(i), buf[i], block[(got+int64(i))%int64(len(block))])
			}
		}
		got += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read after %d bytes: %w", got, err)
		}
	}
	if err := <-wrote; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if got != n {
		return fmt.Errorf("%d bytes came back, want %d", got, n)
	}
	return nil
}

func testDeleteTwice(t *testing.T, h Harness) {
	spec := h.Spec(t, runtime.Spec{})
	id := spec.ID
	inst, err := h.Runtime.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := h.Runtime.Delete(t.Context(), id, inst.State); err != nil {
			t.Fatalf("delete #%d: %v", i+1, err)
		}
	}
	if leaks := h.Leaks(id); len(leaks) > 0 {
		t.Fatalf("traces: %v", leaks)
	}
}

// ForkBomb: a fork bomb meets the pids limit (its forks fail with EAGAIN,
// which bash reports), and once it is killed the sandbox answers. It is not
// part of Run: on native the guest shares the sandbox's pids limit and can
// die when it must make a thread at the limit (the test showed it under
// load), which a nested cgroup for workloads would fix; native's escape
// test keeps its own bomb, gvisor (whose limit is per user, inside) runs
// this one.
// The bomb is watched from the host, through the sandbox's writable layer,
// and killed at its first refused fork: the guest shares the limit, and
// neither it nor the test should ask much of it meanwhile.
func ForkBomb(t *testing.T, h Harness) {
	sb := Create(t, h, runtime.Spec{Limits: runtime.Limits{Pids: 64}})
	ctx := t.Context()
	bomb, err := sb.Guest.Start(ctx, guestapi.ProcessSpec{Args: []string{"/bin/bash", "-c", "while true; do sleep 30 & done 2>/tmp/bomb.err"}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	refused := func() bool {
		c, ok := h.Runtime.(runtime.Capturer)
		if !ok {
			time.Sleep(time.Second)
			return true
		}
		upper, err := c.WritableLayer(sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(upper, "tmp", "bomb.err"))
		return strings.Contains(string(b), "Resource temporarily unavailable")
	}
	for !refused() {
		if time.Now().After(deadline) {
			t.Fatal("no fork of the bomb was refused in 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sb.Guest.Signal(ctx, bomb.Pid, 9); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := ExecErr(ctx, sb, guestapi.ProcessSpec{Args: []string{"true"}})
		if err == nil && r.ExitCode == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox did not come back after the bomb: %+v %v", r, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
