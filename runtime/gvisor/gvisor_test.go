package gvisor_test

import (
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/gvisor"
	"github.com/berthsh/berth/runtime/runtimetest"
)

const cgroupRoot = "berth-test"

// testRange is the range of host ids the harness's sandboxes map to.
var testRange = runtime.DefaultIDMap.Range(2)

func newRuntime(t testing.TB, opts ...func(*gvisor.Options)) (*gvisor.Runtime, string) {
	t.Helper()
	runsc := testutil.Runsc(t)
	state := testutil.StateDir(t)
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("BERTH_TEST_DEBUG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	o := gvisor.Options{Runsc: runsc, CgroupRoot: cgroupRoot, Debug: os.Getenv("BERTH_TEST_RUNSC_DEBUG") != ""}
	for _, f := range opts {
		f(&o)
	}
	rt, err := gvisor.New(runtime.Config{StateDir: state, GuestBinary: testutil.Berth(t), Log: log}, o)
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
func harness(t testing.TB, opts ...func(*gvisor.Options)) (runtimetest.Harness, string) {
	rt, state := newRuntime(t, opts...)
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

// Waived are the attacks of the escape suite that gVisor answers
// differently from native, with why it holds anyway (docs/security.md).
var Waived = map[string]string{
	"read init's fd details": "gVisor's /proc shows any process's fdinfo (position, flags, mount id: no path, " +
		"no content) although the guest is not dumpable; /proc/1/fd itself stays closed",
	"sysrq-trigger is masked or absent": "/proc is gVisor's own: its sysrq-trigger is a file of the sandbox's kernel " +
		"that reaches no host kernel",
}

// TestEscapes runs berth's escape suite on the gvisor tier.
func TestEscapes(t *testing.T) {
	h, _ := harness(t)
	sb := runtimetest.Create(t, h, runtime.Spec{Limits: runtime.Limits{Pids: 64}})
	runtimetest.Escapes(t, h, sb, Waived)
}

// TestEscapesWithoutSeccomp runs the escape suite with gVisor's kernel
// alone between the sandbox and the host (berth's seccomp profile left
// out): what gVisor contains by itself (docs/security.md).
func TestEscapesWithoutSeccomp(t *testing.T) {
	h, _ := harness(t, func(o *gvisor.Options) { o.NoSeccomp = true })
	sb := runtimetest.Create(t, h, runtime.Spec{Limits: runtime.Limits{Pids: 64}})
	waived := maps.Clone(Waived)
	maps.Copy(waived, WithoutSeccomp)
	runtimetest.Escapes(t, h, sb, waived)
}

// WithoutSeccomp are the attacks whose answer, without berth's seccomp
// profile, is gVisor's own rather than the profile's EPERM: each stays
// inside gVisor's kernel (docs/security.md has the table).
var WithoutSeccomp = map[string]string{
	"new user namespace":               "gVisor makes the namespace inside its own kernel: no host user namespace, no host capability",
	"steal init's fd with pidfd_getfd": "gVisor answers EBADF: no descriptor of the guest crosses",
	"read process memory":              "gVisor answers a zero-length read; the guest is not dumpable",
	"open_by_handle_at":                "gVisor does not implement it (EOPNOTSUPP)",
	"perf_event_open":                  "gVisor has no perf events (ENODEV)",
	"keyctl":                           "gVisor has no kernel keyring (ENOSYS)",
	"userfaultfd":                      "gVisor does not implement it (ENOSYS)",
	"no new privileges":                "berth's profile sets no_new_privs as it installs; gVisor alone leaves it 0, and has no setuid binaries' host privileges to gain",
}

// failingRunsc is a runsc that fails the command verb: after the real
// runsc did it, with after (a crash once the sandbox's processes run), or
// instead of it.
func failingRunsc(t *testing.T, verb string, after bool) string {
	t.Helper()
	real := testutil.Runsc(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	script := filepath.Join(dir, "runsc")
	first := ""
	if after {
		first = "    \"" + real + "\" \"$@\" >/dev/null 2>&1\n"
	}
	body := "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = " + verb + " ]; then\n" + first +
		"    echo \"runsc " + verb + " crashed (a test)\" >&2\n    exit 3\n  fi\ndone\nexec \"" + real + "\" \"$@\"\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// TestRunscCrashMidCreate: a runsc (run --detach) that fails after it started the
// sandbox's processes leaves nothing behind: no directory, runsc state,
// cgroup, mount or process.
func TestRunscCrashMidCreate(t *testing.T) {
	for _, verb := range []string{"run"} {
		t.Run(verb, func(t *testing.T) {
			bad := failingRunsc(t, verb, true)
			h, state := harness(t, func(o *gvisor.Options) { o.Runsc = bad })
			spec := h.Spec(t, runtime.Spec{})
			_, err := h.Runtime.Create(t.Context(), spec)
			if err == nil || !strings.Contains(err.Error(), "crashed") {
				t.Fatalf("create with a runsc that fails at %s: %v", verb, err)
			}
			if l := leaks(state, spec.ID); len(l) > 0 {
				t.Fatalf("traces after a failed create: %v", l)
			}
		})
	}
}

// TestFailedCheckpointKeepsRunning: a checkpoint that fails leaves the
// sandbox running as it was: its guest answers again, its processes go on.
func TestFailedCheckpointKeepsRunning(t *testing.T) {
	h, _ := harness(t, func(o *gvisor.Options) { o.Runsc = failingRunsc(t, "checkpoint", false) })
	sb := runtimetest.Create(t, h, runtime.Spec{})
	p, err := sb.Guest.Start(t.Context(), guestapi.ProcessSpec{Args: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Guest.Suspend(t.Context()); err != nil {
		t.Fatal(err)
	}
	cp := h.Runtime.(runtime.Checkpointer)
	if _, err := cp.Checkpoint(t.Context(), sb.ID, sb.Inst.State); err == nil || !strings.Contains(err.Error(), "runs on") {
		t.Fatalf("a failing checkpoint: %v", err)
	}
	if info, err := sb.Guest.Get(t.Context(), p.Pid); err != nil || !info.Running {
		t.Fatalf("the process after a failed checkpoint: %+v %v", info, err)
	}
	if got := runtimetest.Sh(t, sb, "echo still-here"); got != "still-here" {
		t.Fatalf("after a failed checkpoint: %q", got)
	}
}

// TestForkBomb runs runtimetest.ForkBomb: a fork bomb stops at the pids
// limit, enforced inside gVisor's kernel, and the sandbox answers after it.
func TestForkBomb(t *testing.T) {
	h, _ := harness(t)
	runtimetest.ForkBomb(t, h)
}
