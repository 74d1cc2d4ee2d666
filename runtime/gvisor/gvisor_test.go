package gvisor_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/gvisor"
	"github.com/berthsh/berth/runtime/runtimetest"
)

const cgroupRoot = "berth-test"

// testRange is the range of host ids the harness's sandboxes map to.
var testRange = runtime.DefaultIDMap.Range(2)

func newRuntime(t testing.TB) (*gvisor.Runtime, string) {
	t.Helper()
	runsc := testutil.Runsc(t)
	state := testutil.StateDir(t)
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("BERTH_TEST_DEBUG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	rt, err := gvisor.New(runtime.Config{StateDir: state, GuestBinary: testutil.Berth(t), Log: log},
		gvisor.Options{Runsc: runsc, CgroupRoot: cgroupRoot, Debug: os.Getenv("BERTH_TEST_DEBUG") != ""})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return rt, state
}

// harness is the conformance harness over a new runtime, with the host
// image resolved as the manager resolves it for this runtime: a copy owned
// by the sandbox's range.
func harness(t testing.TB) (runtimetest.Harness, string) {
	rt, state := newRuntime(t)
	images, err := image.New(filepath.Join(state, "images"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	img, err := images.Resolve(t.Context(), image.Host, testRange)
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.Spec{Root: img.Root, Mounts: img.Mounts, Users: testRange, Network: runtime.Network{Mode: runtime.NetworkNone}}
	return runtimetest.Harness{Runtime: rt, StateDir: state, Base: base, Leaks: func(id string) []string { return leaks(state, id) }}, state
}

// leaks lists every trace of sandbox id on the host: its directory, runsc's
// state, cgroups, mounts and processes.
func leaks(state, id string) []string {
	var out []string
	if _, err := os.Lstat(filepath.Join(state, "sandboxes", id)); err == nil {
		out = append(out, "sandbox directory")
	}
	if m, _ := filepath.Glob(filepath.Join(state, "runsc", id+"*")); len(m) > 0 {
		out = append(out, "runsc state "+strings.Join(m, " "))
	}
	for _, ctrl := range []string{"cpu", "memory", "pids", "cpuacct", "freezer", "unified", ""} {
		p := filepath.Join("/sys/fs/cgroup", ctrl, cgroupRoot, id)
		if _, err := os.Stat(p); err == nil {
			out = append(out, "cgroup "+p)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), id) {
		out = append(out, "mount")
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), id) {
			out = append(out, "process "+p+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func TestConformance(t *testing.T) {
	h, _ := harness(t)
	runtimetest.Run(t, h)
}
