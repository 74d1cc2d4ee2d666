package native_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/native"
	"github.com/berthsh/berth/runtime/runtimetest"
)

// spareBook is a manager's side of KeepSpares: the ids it reserved and
// those it got back.
type spareBook struct {
	mu       sync.Mutex
	reserved []string
	released []string
}

func (b *spareBook) reserve() (string, runtime.IDMap, error) {
	r := make([]byte, 6)
	rand.Read(r)
	id := "spare-" + hex.EncodeToString(r)
	b.mu.Lock()
	b.reserved = append(b.reserved, id)
	b.mu.Unlock()
	return id, testRange, nil
}

func (b *spareBook) release(id string) {
	b.mu.Lock()
	b.released = append(b.released, id)
	b.mu.Unlock()
}

func (b *spareBook) wasReleased(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Contains(b.released, id)
}

// initOf is the pid of the one process in sandbox id's cgroup.
func initOf(t *testing.T, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", cgroupRoot, id, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		t.Fatalf("cgroup of %s holds %v, want one process", id, f)
	}
	pid, _ := strconv.Atoi(f[0])
	return pid
}

func takeSpare(t *testing.T, rt *native.Runtime) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if id, ok := rt.TakeSpare(); ok {
			return id
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no spare guest within 10 s")
	return ""
}

// TestSpares: a create of a spare's id boots on the spare (the init is the
// process started ahead), as an isolated sandbox like any other; a spare
// that dies, is discarded, handed out for another range, or still ready
// when KeepSpares ends, leaves nothing, and the ranges of those never
// handed out go back.
func TestSpares(t *testing.T) {
	h, state := harness(t)
	rt := h.Runtime.(*native.Runtime)
	var book spareBook
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		rt.KeepSpares(ctx, 2, book.reserve, book.release)
	}()
	defer func() { cancel(); <-done }()

	// A create of a spare's id boots on it.
	id := takeSpare(t, rt)
	pid := initOf(t, id)
	sb := runtimetest.Create(t, h, runtime.Spec{ID: id, Users: testRange, Root: h.Base.Root, Mounts: h.Base.Mounts, Network: h.Base.Network})
	var st struct{ Pid int }
	if err := json.Unmarshal(sb.Inst.State, &st); err != nil {
		t.Fatal(err)
	}
	if st.Pid != pid {
		t.Fatalf("the sandbox's init is pid %d, not the spare's %d", st.Pid, pid)
	}
	if got := runtimetest.Sh(t, sb, "hostname; id -u; cat /proc/1/cmdline | tr '\\0' ' '"); !strings.HasPrefix(got, id+"\n0\n") {
		t.Fatalf("inside the spare's sandbox: %q", got)
	}
	if uid := hostUID(t, pid); uid != strconv.Itoa(int(testRange.HostID)) {
		t.Fatalf("the spare's sandbox root is host uid %s, want %d", uid, testRange.HostID)
	}
	if _, err := os.Stat(filepath.Join(state, "sandboxes", id, "guest.log")); err != nil {
		t.Fatalf("the spare's log did not move into its sandbox: %v", err)
	}
	if book.wasReleased(id) {
		t.Fatal("the range of a spare that became a sandbox was released")
	}

	// One handed out for another range is not used.
	other := takeSpare(t, rt)
	otherPid := initOf(t, other)
	sb2 := runtimetest.Create(t, h, runtime.Spec{ID: other, Users: runtime.DefaultIDMap.Range(7), Root: h.Base.Root, Mounts: h.Base.Mounts, Network: h.Base.Network})
	json.Unmarshal(sb2.Inst.State, &st)
	if st.Pid == otherPid {
		t.Fatal("a spare of another id range became the sandbox's init")
	}
	if err := syscall.Kill(otherPid, 0); err == nil {
		t.Fatalf("the spare %d handed out for another range still runs", otherPid)
	}

	// One handed out and discarded leaves nothing; its range stays the caller's.
	discarded := takeSpare(t, rt)
	rt.DiscardSpare(discarded)
	if l := leaks(state, discarded); len(l) > 0 {
		t.Fatalf("a discarded spare left %v", l)
	}
	if book.wasReleased(discarded) {
		t.Fatal("a discarded spare's range was released: it is the caller's")
	}

	// One that dies while ready is replaced, and its range goes back.
	var ready string
	waitUntil(t, func() bool {
		ready = readySpare(&book, state)
		return ready != ""
	})
	syscall.Kill(initOf(t, ready), syscall.SIGKILL)
	waitUntil(t, func() bool { return book.wasReleased(ready) })
	if l := leaks(state, ready); len(l) > 0 {
		t.Fatalf("a dead spare left %v", l)
	}
	waitUntil(t, func() bool { r := readySpare(&book, state); return r != "" && r != ready })

	// The end of KeepSpares ends the ready ones and gives their ranges back.
	book.mu.Lock()
	all := slices.Clone(book.reserved)
	book.mu.Unlock()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("KeepSpares did not return within 10 s of its context's end")
	}
	for _, s := range all {
		if s == id || s == other || s == discarded {
			continue
		}
		if l := leaks(state, s); len(l) > 0 {
			t.Errorf("spare %s left %v", s, l)
		}
		if !book.wasReleased(s) {
			t.Errorf("spare %s's range was not given back", s)
		}
	}
	if left, _ := os.ReadDir(filepath.Join(state, "spares")); len(left) > 0 {
		t.Errorf("spare logs left: %v", left)
	}
}

// readySpare is a spare reserved, not released, and not yet handed out
// (its log is still among the spares').
func readySpare(b *spareBook, state string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range b.reserved {
		if slices.Contains(b.released, id) {
			continue
		}
		if _, err := os.Stat(filepath.Join(state, "spares", id+".log")); err == nil {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/pids", cgroupRoot, id)); err == nil {
				return id
			}
		}
	}
	return ""
}
