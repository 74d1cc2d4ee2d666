package hostcheck

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthsh/berth/internal/testutil"
)

// TestMain answers the user namespace check, which runs this executable as
// `berth guest --check`, as berth does: at once.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "guest" {
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// On this host (as root, as CI runs), every check runs, says what it
// found, and gives a fix for what is not ok; the checks every create needs
// pass, or no test of berth could.
func TestAllChecksRunOnThisHost(t *testing.T) {
	testutil.RequireRoot(t)
	// The guest is a built berth, as in a daemon (this test binary is none).
	o := Options{StateDir: filepath.Join(testutil.StateDir(t), "state"), Runsc: os.Getenv("BERTH_RUNSC"), GuestBinary: testutil.Berth(t)}
	rs := All(context.Background(), o)
	var names []string
	for _, r := range rs {
		names = append(names, r.Name)
		t.Logf("%-16s %-4s %s", r.Name, r.Status, r.Detail)
		if r.Detail == "" {
			t.Errorf("%s: no detail", r.Name)
		}
		switch r.Status {
		case OK:
			if r.Fix != "" {
				t.Errorf("%s: ok with a fix %q", r.Name, r.Fix)
			}
		case Warn, Fail:
			if r.Fix == "" {
				t.Errorf("%s: %s without a fix", r.Name, r.Status)
			}
		default:
			t.Errorf("%s: status %q", r.Name, r.Status)
		}
		if r.Required && r.Status != OK {
			t.Errorf("%s: every create needs it, and it is %s on this host: %s", r.Name, r.Status, r.Detail)
		}
	}
	if !slices.Equal(names, Names()) {
		t.Errorf("checks run %v, want %v", names, Names())
	}
	for _, r := range rs {
		// runsc is there wherever the test suite runs (make test-go makes it).
		if r.Name == "runsc" && o.Runsc != "" && r.Status != OK {
			t.Errorf("runsc %s: %s", o.Runsc, r.Detail)
		}
	}
	if _, err := os.Stat(o.StateDir); err == nil {
		t.Errorf("the checks made the state dir %s", o.StateDir)
	}
}

// A state dir under a parent that others cannot search fails, naming the
// parent and the chmod that fixes it, in doctor's checks and at start-up.
func TestUnsearchableStateDirParentFails(t *testing.T) {
	testutil.RequireRoot(t)
	parent := filepath.Join(testutil.StateDir(t), "private")
	if err := os.Mkdir(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	o := Options{StateDir: filepath.Join(parent, "state")}
	for _, rs := range [][]Result{All(context.Background(), o), Startup(context.Background(), o)} {
		var found bool
		for _, r := range Failed(rs) {
			if r.Name != "state_dir" {
				continue
			}
			found = true
			if !r.Required || !strings.Contains(r.Detail, parent) || r.Fix != "chmod o+x "+parent+" (or pick another --state-dir)" {
				t.Errorf("state_dir: %+v", r)
			}
		}
		if !found {
			t.Errorf("no state_dir failure in %+v", rs)
		}
	}
	if err := os.Chmod(parent, 0o711); err != nil {
		t.Fatal(err)
	}
	if failed := Failed(Startup(context.Background(), o)); len(failed) > 0 {
		t.Errorf("after chmod o+x: %v", failed)
	}
}

// Serve's flags that turn a feature off turn its check into a warning that
// says so, and seccomp is then not required.
func TestTurnedOffFeaturesWarn(t *testing.T) {
	testutil.RequireRoot(t)
	o := Options{StateDir: testutil.StateDir(t), NoSeccomp: true, NoIDMappedLayers: true}
	rs := All(context.Background(), o)
	for _, r := range rs {
		switch r.Name {
		case "seccomp", "idmapped_mounts":
			if r.Status != Warn || !strings.Contains(r.Detail, "turned off") || r.Required {
				t.Errorf("%s: %+v", r.Name, r)
			}
		}
	}
	for _, r := range Startup(context.Background(), o) {
		if r.Name == "seccomp" {
			t.Errorf("start-up checks seccomp although --no-seccomp: %+v", r)
		}
	}
}

func TestStartupRunsOnlyRequiredChecks(t *testing.T) {
	testutil.RequireRoot(t)
	for _, r := range Startup(context.Background(), Options{StateDir: testutil.StateDir(t)}) {
		if !r.Required {
			t.Errorf("start-up ran optional check %s", r.Name)
		}
	}
}

func TestErrorNamesCheckAndFix(t *testing.T) {
	r := Result{Name: "static_binary", Status: Fail, Detail: "linked with cgo", Fix: "CGO_ENABLED=0"}
	if got := r.Error(); got != "static_binary: linked with cgo; fix: CGO_ENABLED=0" {
		t.Errorf("Error() = %q", got)
	}
}

// BenchmarkStartup is what serve's start-up check adds to every start.
func BenchmarkStartup(b *testing.B) {
	testutil.RequireRoot(b)
	o := Options{StateDir: testutil.StateDir(b)}
	for b.Loop() {
		if failed := Failed(Startup(context.Background(), o)); len(failed) > 0 {
			b.Fatal(failed)
		}
	}
}

// BenchmarkAll is berth doctor's checks.
func BenchmarkAll(b *testing.B) {
	testutil.RequireRoot(b)
	o := Options{StateDir: testutil.StateDir(b), GuestBinary: testutil.Berth(b), Runsc: os.Getenv("BERTH_RUNSC")}
	for b.Loop() {
		All(context.Background(), o)
	}
}

// TestCgroupMoveIsTimed: on cgroup v1 the check times a real move (the
// spawner's, by "0") and leaves no scratch group behind; on v2 it says
// there is no move.
func TestCgroupMoveIsTimed(t *testing.T) {
	testutil.RequireRoot(t)
	st, detail, fix := checkCgroupMoves(context.Background(), &Options{})
	t.Logf("%s %s %s", st, detail, fix)
	if strings.HasPrefix(detail, "cgroup v2") {
		return
	}
	if !strings.Contains(detail, "one move here took") || !strings.Contains(detail, " ms") {
		t.Errorf("no time in %q", detail)
	}
	if (st == OK) != (fix == "") {
		t.Errorf("%s with fix %q", st, fix)
	}
	if left, _ := filepath.Glob(filepath.Join(cgroupMount, "pids", "berth-doctor-*")); len(left) > 0 {
		t.Errorf("scratch groups left: %v", left)
	}
}

// A state dir on an ext4 without a journal warns, with the device and the
// fix; one with a journal, and one on tmpfs, is ok. Real file systems:
// two ext4 images on loop devices.
func TestStateFSWarnsWithoutAJournal(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	for _, c := range []struct {
		name    string
		feature string
		want    Status
	}{{"journaled", "has_journal", OK}, {"nojournal", "^has_journal", Warn}} {
		img, mnt := filepath.Join(base, c.name+".img"), filepath.Join(base, c.name)
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", c.feature, img, "16M").CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v: %s", err, out)
		}
		os.Mkdir(mnt, 0o755)
		if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount %s: %v: %s", img, err, out)
		}
		t.Cleanup(func() { exec.Command("umount", mnt).Run() })
		st, detail, fix := checkStateFS(context.Background(), &Options{StateDir: filepath.Join(mnt, "state", "not-yet")})
		t.Logf("%s: %s %s %s", c.name, st, detail, fix)
		if st != c.want || !strings.Contains(detail, mnt+" is on ext4") {
			t.Errorf("%s: %s %q, want %s", c.name, st, detail, c.want)
		}
		if c.want == Warn && (!strings.Contains(detail, "without a journal (loop") || !strings.Contains(fix, "tune2fs -O has_journal /dev/loop")) {
			t.Errorf("%s: %q, fix %q: want the loop device named", c.name, detail, fix)
		}
	}
	if st, detail, _ := checkStateFS(context.Background(), &Options{StateDir: "/dev/shm/berth"}); st != OK || detail != "/dev/shm is on tmpfs" {
		t.Errorf("tmpfs: %s %q", st, detail)
	}
}
