package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// TestBurstWithGuestsKilledLeavesNothing: under a burst of concurrent
// creates, guests are killed as they start (every other one the test sees,
// spares too), so that creates fail midway, in the spawn, the guest's
// set-up or its first contact. Each create either makes a sandbox or fails
// with a classified error naming its sandbox; once the sandboxes made are
// deleted, no sandbox that ever had a directory or a spare's log (watched
// with inotify, so that none made and removed between two looks is missed)
// has left a directory, cgroup, process or mount, and no guest runs but the
// spares.
func TestBurstWithGuestsKilledLeavesNothing(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	waitFor(t, 10*time.Second, func() bool { return len(d.spares()) == 2 })
	seen := watchNames(t, filepath.Join(d.state, "runtimes", "native", "sandboxes"), filepath.Join(d.state, "runtimes", "native", "spares"))
	for _, id := range d.spares() {
		seen.add(id)
	}

	stop := make(chan struct{})
	var killed []int
	var killer sync.WaitGroup
	killer.Go(func() {
		looked := map[int]bool{}
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, pid := range d.guestPids() {
				if looked[pid] {
					continue
				}
				looked[pid] = true
				if len(looked)%2 == 1 {
					if syscall.Kill(pid, syscall.SIGKILL) == nil {
						killed = append(killed, pid)
					}
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	})

	const n = 24
	var mu sync.Mutex
	var made []string
	var failed []error
	var burst sync.WaitGroup
	for range n {
		burst.Go(func() {
			sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
				return
			}
			made = append(made, sb.ID)
		})
	}
	burst.Wait()
	close(stop)
	killer.Wait()
	t.Logf("%d creates: %d made, %d failed; %d guests killed", n, len(made), len(failed), len(killed))
	if len(killed) == 0 || len(failed) == 0 || len(made) == 0 {
		t.Fatalf("want some guests killed, some creates failed and some made: %d killed, %d failed, %d made", len(killed), len(failed), len(made))
	}
	for _, err := range failed {
		t.Logf("failed create: %v", err)
		if c := errdefs.ClassOf(err); c != errdefs.Unavailable {
			t.Errorf("a create whose guest was killed: class %q (%v), want unavailable", c, err)
		}
		if !strings.Contains(err.Error(), "sb-") {
			t.Errorf("a failed create's error names no sandbox: %v", err)
		}
	}

	list, err := d.client.ListSandboxes(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if !slices.Contains(made, sb.ID) {
			t.Errorf("sandbox %s (%s) is listed, but no create returned it", sb.ID, sb.State)
		}
		if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Errorf("delete %s (%s): %v", sb.ID, sb.State, err)
		}
	}
	waitFor(t, 30*time.Second, func() bool { return len(d.spares()) == 2 && d.guests() == 0 })
	spares := d.spares()
	ids := seen.names()
	for _, id := range made {
		if !slices.Contains(ids, id) {
			t.Errorf("the watch missed sandbox %s", id)
		}
	}
	var left []string
	waitFor(t, 10*time.Second, func() bool {
		left = left[:0]
		for _, id := range ids {
			if !slices.Contains(spares, id) {
				for _, tr := range d.traces(id) {
					left = append(left, id+": "+tr)
				}
			}
		}
		return len(left) == 0
	})
	if list, err := d.client.ListSandboxes(ctx, nil); err != nil || len(list) != 0 {
		t.Fatalf("after deleting every sandbox: %v %v", list, err)
	}
	t.Logf("%d sandboxes and spares seen, none left but the %d spares", len(ids), len(spares))
}

// nameWatch collects the names made in some directories (inotify), until
// the test ends.
type nameWatch struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (w *nameWatch) add(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen[strings.TrimSuffix(name, ".log")] = true
}

func (w *nameWatch) names() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for n := range w.seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// watchNames watches dirs for names created or moved in (a spare's log is
// named by its sandbox's id).
func watchNames(t *testing.T, dirs ...string) *nameWatch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range dirs {
		if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
			unix.Close(fd)
			t.Fatalf("watch %s: %v", dir, err)
		}
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: reads park in Go's poller
	w := &nameWatch{seen: map[string]bool{}}
	var done sync.WaitGroup
	done.Go(func() {
		buf := make([]byte, 64<<10)
		for {
			k, err := f.Read(buf)
			if err != nil {
				return // closed at the test's end
			}
			for off := 0; off+unix.SizeofInotifyEvent <= k; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				if i := bytes.IndexByte(name, 0); i >= 0 {
					name = name[:i]
				}
				if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
					t.Errorf("inotify queue overflowed: names were missed")
				}
				if len(name) > 0 {
					w.add(string(name))
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	})
	t.Cleanup(func() {
		f.Close()
		done.Wait()
	})
	return w
}
