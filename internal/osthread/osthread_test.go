package osthread

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
)

// statusField returns the first value of a /proc status line.
func statusField(t *testing.T, path, key string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return field(t, path, string(b), key)
}

func field(t *testing.T, path, status, key string) string {
	t.Helper()
	for line := range strings.Lines(status) {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatalf("%s: no %s", path, key)
	return ""
}

// TestSetIDsOnADiscardedThread: SetIDs changes the ids of its thread alone,
// which keeps its capabilities, and the thread is gone once Discarded
// returns, so no goroutine runs with those ids after.
func TestSetIDsOnADiscardedThread(t *testing.T) {
	testutil.RequireRoot(t)
	const id = 1_000_123_456
	var status []byte
	tid, err := Discarded(func(tid int) error {
		if tid == unix.Getpid() {
			return fmt.Errorf("ran on the main thread")
		}
		if err := SetIDs(id); err != nil {
			return err
		}
		var err error
		status, err = os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", tid))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	uid, capEff := field(t, "thread", string(status), "Uid"), field(t, "thread", string(status), "CapEff")
	if uid != fmt.Sprint(id) {
		t.Errorf("the thread's real uid is %s, want %d", uid, id)
	}
	if want := statusField(t, "/proc/self/status", "CapEff"); capEff != want {
		t.Errorf("the thread's effective capabilities are %s, want the process's %s", capEff, want)
	}
	for tries := 0; ; tries++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); os.IsNotExist(err) {
			break
		}
		if tries == 1000 {
			t.Fatalf("thread %d still there", tid)
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, task := range tasks {
		if got := statusField(t, task, "Uid"); got != "0" {
			t.Errorf("%s runs as uid %s", task, got)
		}
	}
}
