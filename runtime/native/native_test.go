package native_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/native"
	"github.com/berthsh/berth/runtime/runtimetest"
)

const cgroupRoot = "berth-test"

func newRuntime(t testing.TB) (*native.Runtime, string) {
	t.Helper()
	testutil.RequireRoot(t)
	state := testutil.StateDir(t)
	rt, err := native.New(runtime.Config{StateDir: state, GuestBinary: testutil.Berth(t), Log: slog.New(slog.DiscardHandler)},
		native.Options{CgroupRoot: cgroupRoot})
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

// testRange is the range of host ids the harness's sandboxes map to (as
// the manager would give the first sandbox).
var testRange = runtime.DefaultIDMap.Range(1)

// harness is the conformance harness over a new runtime, with the host
// image (built in the test's own state dir) as the base spec's root,
// resolved as the manager would: one unmapped copy, idmapped by the
// runtime. This host must be able to: CI runs on it.
func harness(t testing.TB) (runtimetest.Harness, string) {
	h, state := harnessWith(t, true)
	if !h.Base.Root.IDMapped {
		t.Fatalf("this host cannot idmap layers: %s", h.Runtime.Capabilities().Missing["idmapped_layers"])
	}
	return h, state
}

// harnessWith is the harness with the image idmapped by the runtime, when
// it can and idmapped is set, or owned by the range (a copy per range, as
// on a host whose kernel cannot idmap an overlay's layers).
func harnessWith(t testing.TB, idmapped bool) (runtimetest.Harness, string) {
	rt, state := newRuntime(t)
	images, err := image.New(filepath.Join(state, "images"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	layers := testRange
	if idmapped && rt.Capabilities().IDMappedLayers {
		layers = image.Unmapped
	}
	img, err := images.Resolve(t.Context(), image.Host, layers)
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.Spec{Root: img.Root, Mounts: img.Mounts, Users: testRange, Network: runtime.Network{Mode: runtime.NetworkNone}}
	return runtimetest.Harness{Runtime: rt, StateDir: state, Base: base, Leaks: func(id string) []string { return leaks(state, id) }}, state
}

// leaks lists every trace of sandbox id on the host.
func leaks(state, id string) []string {
	var out []string
	if _, err := os.Lstat(filepath.Join(state, "sandboxes", id)); err == nil {
		out = append(out, "sandbox directory")
	}
	for _, ctrl := range []string{"cpu", "memory", "pids", "cpuacct", "unified", ""} {
		p := filepath.Join("/sys/fs/cgroup", ctrl, cgroupRoot, id)
		if _, err := os.Stat(p); err == nil {
			out = append(out, "cgroup "+p)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), id) {
		out = append(out, "mount")
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "/"+cgroupRoot+"/"+id) {
			out = append(out, "process "+p)
		}
	}
	return out
}

func TestConformance(t *testing.T) {
	h, _ := harness(t)
	runtimetest.Run(t, h)
}

// TestRootInsideIsNotRootOutside checks the user namespace mapping from the host's side.
func TestRootInsideIsNotRootOutside(t *testing.T) {
	h, _ := harness(t)
	sb := runtimetest.Create(t, h, runtime.Spec{})
	var st struct{ Pid int }
	json.Unmarshal(sb.Inst.State, &st)
	uid := hostUID(t, st.Pid)
	if uid != fmt.Sprint(testRange.HostID) {
		t.Fatalf("the sandbox's root is host uid %s, want %d", uid, testRange.HostID)
	}
	if got := runtimetest.Sh(t, sb, "id -u"); got != "0" {
		t.Fatalf("inside: uid %s", got)
	}
	// A file root creates inside belongs to the mapped uid on the host.
	runtimetest.Sh(t, sb, "echo hi > /root/owned")
	var fi os.FileInfo
	fi, err := os.Stat(filepath.Join(sandboxDir(t, h, sb.ID), "upper", "root", "owned"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fileUID(fi); got != int(testRange.HostID) {
		t.Fatalf("file owner on the host: %d", got)
	}
}

func sandboxDir(t *testing.T, h runtimetest.Harness, id string) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(h.StateDir, "sandboxes", id))
	if len(matches) != 1 {
		t.Fatalf("sandbox dir of %s: %v", id, matches)
	}
	return matches[0]
}

func hostUID(t *testing.T, pid int) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatal("no Uid line")
	return ""
}

// TestHostFilesInvisible checks that nothing of the host but the system
// directories is visible: homes, /root, the state dir, a secret file.
func TestHostFilesInvisible(t *testing.T) {
	h, state := harness(t)
	secretDir, err := os.MkdirTemp("/var/tmp", "berth-secret-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(secretDir) })
	secret := filepath.Join(secretDir, "token")
	os.WriteFile(secret, []byte("s3cret"), 0o644)
	os.Chmod(secretDir, 0o755)

	sb := runtimetest.Create(t, h, runtime.Spec{})
	for _, p := range []string{secret, secretDir, state, "/root/.bash_history", "/root/go", "/work", "/etc/shadow", "/etc/ssh", "/etc/machine-id", "/proc/1/root" + state} {
		r := runtimetest.Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", "ls -d " + p}, User: "root"})
		if r.ExitCode == 0 {
			t.Errorf("%s is visible inside: %q", p, r.Stdout)
		}
	}
	if got := runtimetest.Sh(t, sb, "ls -A /root | wc -l"); got != "0" {
		t.Errorf("/root inside is not empty: %s entries", got)
	}
	if got := runtimetest.Sh(t, sb, "env | grep -c -i -E 'PIP_|AWS_|CLOUDSDK|SSL_CERT' || true"); got != "0" {
		t.Errorf("daemon environment leaked into the sandbox: %s variables", got)
	}
}

// TestHardeningInPlace checks the first hardening layer: no new user
// namespaces, no mount, reduced capabilities, guest not dumpable.
func TestHardeningInPlace(t *testing.T) {
	h, _ := harness(t)
	sb := runtimetest.Create(t, h, runtime.Spec{})
	for _, attack := range []string{
		"unshare -U true",
		"unshare -m true && mount -t tmpfs none /mnt",
		"mount -t tmpfs none /mnt",
		"ls -l /proc/1/fd/",
		"cat /proc/1/environ",
		"echo x > /proc/sysrq-trigger",
	} {
		r := runtimetest.Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", attack}, User: "root"})
		if r.ExitCode == 0 {
			t.Errorf("%q succeeded inside the sandbox: %q", attack, r.Stdout)
		}
	}
	capEff := runtimetest.Sh(t, sb, "grep CapEff /proc/self/status | cut -f2")
	if capEff == "000001ffffffffff" || capEff == "" {
		t.Errorf("root inside has every capability: %s", capEff)
	}
}

// TestMaskedPaths: root inside finds the host's kernel memory, keys,
// timers and firmware masked (files empty, directories empty, read-only
// mounts it cannot write to) and /proc's kernel settings read-only. The
// list is the guest's; a path this kernel lacks is skipped.
func TestMaskedPaths(t *testing.T) {
	h, _ := harness(t)
	sb := runtimetest.Create(t, h, runtime.Spec{})
	// The top mount's options at a path: the last mountinfo line for it.
	opts := func(p string) string {
		return runtimetest.Sh(t, sb, "awk '$5==\""+p+"\"{o=$6} END{print o}' /proc/self/mountinfo")
	}
	checked := 0
	for _, p := range []string{
		"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats",
		"/proc/kallsyms", "/proc/kpagecount", "/proc/kpageflags", "/proc/kpagecgroup", "/proc/sysrq-trigger",
		"/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware", "/sys/kernel/debug", "/sys/kernel/security",
		"/sys/devices/virtual/powercap",
	} {
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		checked++
		if fi.IsDir() {
			if got := runtimetest.Sh(t, sb, "ls -A "+p+" | wc -l"); got != "0" {
				t.Errorf("%s inside has %s entries", p, got)
			}
			if r := runtimetest.Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", "mkdir " + p + "/x || touch " + p + "/x"}, User: "root"}); r.ExitCode == 0 {
				t.Errorf("root inside wrote to %s", p)
			}
			if o := opts(p); !strings.HasPrefix(o, "ro,") {
				t.Errorf("%s inside is not a read-only mount: %q", p, o)
			}
			continue
		}
		if got := runtimetest.Sh(t, sb, "wc -c < "+p); got != "0" {
			t.Errorf("%s inside reads %s bytes", p, got)
		}
	}
	if checked < 5 {
		t.Fatalf("only %d of the masked paths exist on this host", checked)
	}
	for _, p := range []string{"/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"} {
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if o := opts(p); !strings.HasPrefix(o, "ro,") {
			t.Errorf("%s inside is not read-only: %q", p, o)
		}
	}
}

// TestGuestOutlivesEverySignal: root inside sends its init every signal
// it can, each to a fresh guest (a signal that ends one must not hide
// behind an earlier one), and the guest still answers. The guest asks Go
// for the standard signals only; the real-time ones (32 to 64), 32 and 34
// among them (which end gvisor's guest), must reach nothing either.
func TestGuestOutlivesEverySignal(t *testing.T) {
	h, _ := harness(t)
	for _, group := range [][]int{{1, 2, 3, 6, 10, 12, 13, 14, 15}, {16, 20, 21, 22, 23, 24, 25, 26, 27}, {28, 29, 30, 31}, {32}, {33}, {34}, {35, 40, 50, 63, 64}} {
		sb := runtimetest.Create(t, h, runtime.Spec{})
		script := ""
		for _, s := range group {
			script += fmt.Sprintf("kill -%d 1; ", s)
		}
		runtimetest.Exec(t, sb, guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", script + "sleep 0.2"}, User: "root"})
		if got := runtimetest.Sh(t, sb, "echo still-here"); got != "still-here" {
			t.Errorf("after signals %v the guest answers %q", group, got)
		}
	}
}

// TestCgoGuestIsRefused: a guest binary built with cgo cannot harden a
// sandbox (it cannot change every thread's credentials at once); the
// runtime refuses it when it starts, saying how to build berth, instead of
// failing every create.
func TestCgoGuestIsRefused(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireProgram(t, "gcc") // cgo's C compiler
	bin := filepath.Join(t.TempDir(), "berth-guest-cgo")
	build := exec.Command("go", "build", "-o", bin, "github.com/berthsh/berth/cmd/berth-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("cgo build: %v\n%s", err, out)
	}
	_, err := native.New(runtime.Config{StateDir: testutil.StateDir(t), GuestBinary: bin, Log: slog.New(slog.DiscardHandler)},
		native.Options{CgroupRoot: cgroupRoot})
	if err == nil || !strings.Contains(err.Error(), "cgo") || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("a cgo guest: %v", err)
	}
}

// TestEachSandboxOwnsItsRange: a sandbox's user namespace is owned by its
// range's root, not by the daemon's root (the kernel charges per-user
// counts to the owner), and its root file system shows root's files as
// root's whether the image is idmapped through the range or a copy owned
// by it; root inside changes them through its writable layer only. The
// daemon still sets the init's open-files limit, at create and after.
func TestEachSandboxOwnsItsRange(t *testing.T) {
	for _, idmapped := range []bool{true, false} {
		t.Run(map[bool]string{true: "IDMappedLayers", false: "LayersOwnedByTheRange"}[idmapped], func(t *testing.T) {
			h, state := harnessWith(t, idmapped)
			if h.Base.Root.IDMapped != idmapped {
				t.Fatalf("the image is idmapped: %v, want %v", h.Base.Root.IDMapped, idmapped)
			}
			images, err := image.New(filepath.Join(state, "images"), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			var layers []string
			for _, n := range []uint32{1, 2} {
				spec := h.Spec(t, runtime.Spec{})
				spec.Users = runtime.DefaultIDMap.Range(n)
				if !idmapped { // a copy owned by each range, as the manager resolves it
					img, err := images.Resolve(t.Context(), image.Host, spec.Users)
					if err != nil {
						t.Fatal(err)
					}
					spec.Root = img.Root
				}
				spec.Limits.OpenFiles = 512 // set on the init, whose ids the daemon's are not
				layers = append(layers, spec.Root.Layers[0])
				sb := runtimetest.Create(t, h, spec)
				if got := runtimetest.Sh(t, sb, "ulimit -n"); got != "512" {
					t.Errorf("range %d: open files %s, want 512", n, got)
				}
				if err := h.Runtime.(runtime.Updater).SetLimits(t.Context(), sb.ID, runtime.Limits{OpenFiles: 256}); err != nil {
					t.Fatalf("range %d: lower open files: %v", n, err)
				}
				if got := runtimetest.Sh(t, sb, "ulimit -n"); got != "256" {
					t.Errorf("range %d: open files %s after lowering, want 256", n, got)
				}
				var st struct{ Pid int }
				json.Unmarshal(sb.Inst.State, &st)
				if got := nsOwner(t, st.Pid); got != spec.Users.HostID {
					t.Errorf("range %d: the user namespace is owned by host uid %d, want %d", n, got, spec.Users.HostID)
				}
				if uid := hostUID(t, st.Pid); uid != fmt.Sprint(spec.Users.HostID) {
					t.Errorf("range %d: init runs as host uid %s", n, uid)
				}
				if got := runtimetest.Sh(t, sb, "stat -c %u:%g / /etc /etc/passwd /root /home/user | tr '\\n' ' '"); got != "0:0 0:0 0:0 0:0 1000:1000" {
					t.Errorf("range %d: owners inside %q", n, got)
				}
				runtimetest.Sh(t, sb, "echo 'extra:x:2000:2000::/:/bin/sh' >> /etc/passwd")
				fi, err := os.Stat(filepath.Join(sandboxDir(t, h, sb.ID), "upper", "etc", "passwd"))
				if err != nil {
					t.Fatal(err)
				}
				if got := fileUID(fi); got != int(spec.Users.HostID) {
					t.Errorf("range %d: the copied-up /etc/passwd is host uid %d's", n, got)
				}
			}
			if idmapped != (layers[0] == layers[1]) {
				t.Errorf("the two ranges' layers %v: idmapped ones are one copy, others a copy each", layers)
			}
			for _, l := range layers {
				b, err := os.ReadFile(filepath.Join(l, "etc", "passwd"))
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(b), "extra") {
					t.Errorf("a sandbox's write reached the image layer %s", l)
				}
			}
		})
	}
}

// nsOwner is the host uid that owns process pid's user namespace.
func nsOwner(t *testing.T, pid int) uint32 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var uid uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.NS_GET_OWNER_UID, uintptr(unsafe.Pointer(&uid))); e != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", e)
	}
	return uid
}

// TestBootHelloIsTheGuests: the hello the guest reports on its status pipe
// at boot (which spares the manager a round trip) says what its hello over
// the control socket says.
func TestBootHelloIsTheGuests(t *testing.T) {
	h, _ := harness(t)
	sb := runtimetest.Create(t, h, runtime.Spec{})
	if sb.Inst.Hello == nil {
		t.Fatal("no hello from the guest at boot")
	}
	over, err := sb.Guest.Hello(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	at := *sb.Inst.Hello
	if at.Protocol != over.Protocol || at.MinProtocol != over.MinProtocol || !slices.Equal(at.Features, over.Features) || at.Proof != "" {
		t.Fatalf("hello at boot %+v, over the socket %+v", at, over)
	}
}

// TestInitHoldsNothingOfTheSpawner: a sandbox's init is the spawner's child
// (the spawner, the daemon's child, runs as root on the host), and holds
// none of the spawner's descriptors: not its socket to the daemon, nor
// another request's. Inside, the parent is outside the PID namespace.
func TestInitHoldsNothingOfTheSpawner(t *testing.T) {
	h, _ := harness(t)
	sb := runtimetest.Create(t, h, runtime.Spec{})
	var st struct{ Pid int }
	json.Unmarshal(sb.Inst.State, &st)
	spawner := statusField(t, st.Pid, "PPid")
	cmdline, err := os.ReadFile("/proc/" + spawner + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cmdline), guestapi.SpawnerFlag) {
		t.Fatalf("the init's parent %s is not the spawner: %q", spawner, cmdline)
	}
	if got := statusField(t, mustAtoi(t, spawner), "PPid"); got != fmt.Sprint(os.Getpid()) {
		t.Fatalf("the spawner's parent is %s, not the daemon %d", got, os.Getpid())
	}
	spawnerFDs := openFiles(t, mustAtoi(t, spawner))
	for fd, target := range openFiles(t, st.Pid) {
		if strings.HasPrefix(target, "socket:") || strings.HasPrefix(target, "pipe:") {
			for sfd, starget := range spawnerFDs {
				if starget == target {
					t.Errorf("the init's descriptor %s is the spawner's %s: %s", fd, sfd, target)
				}
			}
		}
	}
	if got := runtimetest.Sh(t, sb, "grep PPid /proc/1/status"); got != "PPid:\t0" {
		t.Errorf("inside, init's parent: %q", got)
	}
}

func statusField(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// openFiles maps each open descriptor of pid to what it refers to.
func openFiles(t *testing.T, pid int) map[string]string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			m[e.Name()] = target
		}
	}
	return m
}
