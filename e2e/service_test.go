package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/hostcheck"
	"github.com/berthsh/berth/internal/testutil"
)

// runBerth runs the berth binary bin with args (up to a minute) and returns
// its stdout, stderr and exit code.
func runBerth(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("berth %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

type doctorJSON struct {
	OK     bool `json:"ok"`
	Checks []struct {
		Name       string `json:"name"`
		Status     string `json:"status"`
		Detail     string `json:"detail"`
		Fix        string `json:"fix"`
		Required   bool   `json:"required"`
		DurationNs int64  `json:"duration_ns"`
	} `json:"checks"`
}

func doctor(t *testing.T, bin string, args ...string) (doctorJSON, int) {
	t.Helper()
	out, stderr, code := runBerth(t, bin, append([]string{"doctor", "--json"}, args...)...)
	var r doctorJSON
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("doctor --json: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	return r, code
}

// berth doctor on this host (as root, as CI runs): every check runs and
// the ones every create needs are ok; JSON and the table agree; exit 0.
func TestDoctorOnThisHost(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Berth(t)
	state := testutil.StateDir(t)
	args := []string{"--state-dir", state}
	if runsc := os.Getenv("BERTH_RUNSC"); runsc != "" {
		args = append(args, "--runsc", runsc)
	}
	start := time.Now()
	r, code := doctor(t, bin, args...)
	t.Logf("doctor took %v", time.Since(start))
	if code != 0 || !r.OK {
		t.Errorf("doctor exit %d, ok %v: %+v", code, r.OK, r)
	}
	var names []string
	for _, c := range r.Checks {
		names = append(names, c.Name)
		if !slices.Contains([]string{"ok", "warn", "fail"}, c.Status) || c.Detail == "" || (c.Status != "ok" && c.Fix == "") || c.DurationNs <= 0 {
			t.Errorf("check %+v", c)
		}
		if c.Required && c.Status != "ok" {
			t.Errorf("%s is needed by every create and is %s here: %s", c.Name, c.Status, c.Detail)
		}
		if c.Name == "runsc" && os.Getenv("BERTH_RUNSC") != "" && c.Status != "ok" {
			t.Errorf("runsc: %s", c.Detail)
		}
	}
	if !slices.Equal(names, hostcheck.Names()) {
		t.Errorf("checks %v, want %v", names, hostcheck.Names())
	}
	table, _, code := runBerth(t, bin, append([]string{"doctor"}, args...)...)
	if code != 0 {
		t.Errorf("doctor exit %d:\n%s", code, table)
	}
	for _, n := range names {
		if !strings.Contains(table, "\n"+n+" ") {
			t.Errorf("the table has no row %s:\n%s", n, table)
		}
	}
	if !strings.Contains(table, "berth can run sandboxes here") {
		t.Errorf("no verdict:\n%s", table)
	}
}

// A state dir under a parent that others cannot search: doctor fails it
// (exit 1) with the chmod, and serve refuses to start with the same words.
func TestUnsearchableStateDirRefused(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Berth(t)
	parent := filepath.Join(testutil.StateDir(t), "private")
	if err := os.Mkdir(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(parent, "state")
	r, code := doctor(t, bin, "--state-dir", state)
	var fix string
	for _, c := range r.Checks {
		if c.Name == "state_dir" {
			fix = c.Fix
			if c.Status != "fail" || !c.Required {
				t.Errorf("state_dir: %+v", c)
			}
		}
	}
	if code != 1 || r.OK || fix != "chmod o+x "+parent+" (or pick another --state-dir)" {
		t.Errorf("doctor exit %d, ok %v, fix %q", code, r.OK, fix)
	}
	out, stderr, code := runBerth(t, bin, "serve", "--state-dir", state, "--listen", testutil.FreeAddr(t), "--warm-pool", "0")
	if code != 78 || !strings.Contains(stderr, "state_dir") || !strings.Contains(stderr, fix) || strings.Contains(stderr+out, "berth ready") {
		t.Errorf("serve exit %d:\n%s%s", code, out, stderr)
	}
	if _, err := os.Stat(state); err == nil {
		t.Errorf("serve made %s before refusing", state)
	}
}

// A berth built with cgo cannot harden sandboxes (syscall.AllThreadsSyscall
// answers ENOTSUP): doctor fails it, and serve exits at once naming the
// cause and CGO_ENABLED=0, never saying "berth ready".
func TestCgoBuiltBerthRefusesToServe(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireProgram(t, "gcc")
	bin := filepath.Join(testutil.StateDir(t), "berth-cgo")
	build := exec.Command("go", "build", "-o", bin, "github.com/berthsh/berth/cmd/berth")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with cgo: %v\n%s", err, out)
	}
	if info, err := exec.Command("go", "version", "-m", bin).Output(); err != nil || !strings.Contains(string(info), "CGO_ENABLED=1") {
		t.Fatalf("not a cgo build: %v\n%s", err, info)
	}
	state := testutil.StateDir(t)
	r, code := doctor(t, bin, "--state-dir", state)
	for _, c := range r.Checks {
		if c.Name == "static_binary" && (c.Status != "fail" || !strings.Contains(c.Detail, "cgo") || !strings.Contains(c.Fix, "CGO_ENABLED=0")) {
			t.Errorf("static_binary: %+v", c)
		}
	}
	if code != 1 || r.OK {
		t.Errorf("doctor of a cgo build: exit %d, ok %v", code, r.OK)
	}
	start := time.Now()
	out, stderr, code := runBerth(t, bin, "serve", "--state-dir", state, "--listen", testutil.FreeAddr(t), "--warm-pool", "0")
	took := time.Since(start)
	if code != 78 || !strings.Contains(stderr, "static_binary") || !strings.Contains(stderr, "linked with cgo") ||
		!strings.Contains(stderr, "CGO_ENABLED=0") || strings.Contains(out+stderr, "berth ready") {
		t.Errorf("serve of a cgo build: exit %d\n%s%s", code, out, stderr)
	}
	if took > 5*time.Second {
		t.Errorf("serve took %v to refuse", took)
	}
	t.Logf("a cgo build's serve refused in %v", took)
}

// serve reads its settings from --config; flags win over the file;
// --print-config shows the result; a bad key stops it naming file and line.
func TestServeConfigFile(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Berth(t)
	state := testutil.StateDir(t)
	listen := testutil.FreeAddr(t)
	file := filepath.Join(state, "config.yaml")
	text := "# from the file\nlisten: " + listen + "\nstate-dir: " + filepath.Join(state, "s") + "\nwarm-pool: [0]\ndefault-pids: 321\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := runBerth(t, bin, "serve", "--config", file, "--default-pids", "42", "--print-config")
	if code != 0 {
		t.Fatalf("--print-config: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"\nlisten: " + listen + "\n", "\nstate-dir: " + filepath.Join(state, "s") + "\n", "\ndefault-pids: 42\n", "\nwarm-pool: [\"0\"]\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}

	// A daemon from the file alone answers where the file says.
	cmd := exec.Command(bin, "serve", "--config", file)
	var log testutil.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	c, err := client.New("http://" + listen)
	if err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c, &log)
	if _, err := os.Stat(filepath.Join(state, "s", "berth.db")); err != nil {
		t.Errorf("the file's state dir is not used: %v", err)
	}

	bad := filepath.Join(state, "bad.yaml")
	os.WriteFile(bad, []byte("listen: 127.0.0.1:1\nwarm-pools: 3\n"), 0o644)
	_, stderr, code = runBerth(t, bin, "serve", "--config", bad)
	if code != 78 || !strings.Contains(stderr, bad+":2:") || !strings.Contains(stderr, `unknown key "warm-pools"`) {
		t.Errorf("unknown key: exit %d: %s", code, stderr)
	}
	_, stderr, code = runBerth(t, bin, "serve", "--config", filepath.Join(state, "absent.yaml"))
	if code == 0 || !strings.Contains(stderr, "absent.yaml") {
		t.Errorf("absent --config: exit %d: %s", code, stderr)
	}
}

// Under systemd (Type=notify) serve says READY=1 on $NOTIFY_SOCKET once it
// serves.
func TestServeNotifiesSystemd(t *testing.T) {
	testutil.RequireRoot(t)
	state := testutil.StateDir(t)
	sock := filepath.Join(state, "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	listen := testutil.FreeAddr(t)
	cmd := exec.Command(testutil.Berth(t), "serve", "--state-dir", filepath.Join(state, "s"), "--listen", listen, "--warm-pool", "0")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	var log testutil.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	l.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 256)
	n, _, err := l.ReadFromUnix(buf)
	if err != nil {
		t.Fatalf("no notification: %v\n%s", err, log.String())
	}
	if string(buf[:n]) != "READY=1" {
		t.Errorf("notified %q", buf[:n])
	}
	c, err := client.New("http://" + listen)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Health(ctx); err != nil {
		t.Errorf("READY=1 before the API answers: %v", err)
	}
}

// waitHealthy waits up to 30 s for the daemon behind c to answer, failing
// the test with its log if it does not.
func waitHealthy(t testing.TB, c *client.Client, log *testutil.Buffer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not become ready: %v\n%s", err, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// make install DESTDIR=… lays out the binary, the systemd unit (ExecStart
// at the installed binary, valid to systemd-analyze verify) and the example
// config, which a second install keeps once the user changed it; make run
// still installs the binary alone and serves as before.
func TestMakeInstall(t *testing.T) {
	testutil.RequireProgram(t, "make")
	bin := testutil.Berth(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	install := func(vars ...string) string {
		t.Helper()
		// -o build: install the berth under test, never rebuild the tree's.
		args := append([]string{"-C", root, "-o", "build", "install", "DESTDIR=" + dest, "BIN=" + bin}, vars...)
		cmd := exec.Command("make", args...)
		cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=") // not the outer make's jobs or -n
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	install()
	for path, mode := range map[string]os.FileMode{
		"usr/local/bin/berth":              0o755,
		"lib/systemd/system/berth.service": 0o644,
		"etc/berth/config.yaml":            0o644,
	} {
		fi, err := os.Stat(filepath.Join(dest, path))
		if err != nil {
			t.Errorf("make install: %v", err)
			continue
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %o, want %o", path, fi.Mode().Perm(), mode)
		}
	}
	example, _ := os.ReadFile(filepath.Join(root, "dist", "berth", "config.yaml"))
	if got, _ := os.ReadFile(filepath.Join(dest, "etc/berth/config.yaml")); !bytes.Equal(got, example) {
		t.Error("the installed config is not dist/berth/config.yaml")
	}
	unit, err := os.ReadFile(filepath.Join(dest, "lib/systemd/system/berth.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"Type=notify", "ExecStart=/usr/local/bin/berth serve --config /etc/berth/config.yaml",
		"KillMode=process", "Restart=on-failure", "RestartPreventExitStatus=78", "WantedBy=multi-user.target"} {
		if !strings.Contains(string(unit), "\n"+line+"\n") {
			t.Errorf("the unit lacks %q", line)
		}
	}
	// systemd-analyze verify (the unit's ExecStart must exist: the staged
	// one). A machine without systemd (a CI container) has no
	// systemd-analyze: there the keys above are the check, and the log says so.
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		staged := filepath.Join(t.TempDir(), "berth.service")
		text := strings.ReplaceAll(string(unit), "/usr/local/bin/berth", filepath.Join(dest, "usr/local/bin/berth"))
		if err := os.WriteFile(staged, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("systemd-analyze", "verify", staged)
		cmd.Dir = filepath.Dir(staged)
		out, err := cmd.CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("no systemd-analyze here: the unit's keys were checked, not verified by systemd")
	}

	// A config the user changed stays; PREFIX moves the binary and ExecStart.
	mine := []byte("listen: 127.0.0.1:7777\n")
	os.WriteFile(filepath.Join(dest, "etc/berth/config.yaml"), mine, 0o600)
	out := install("PREFIX=/opt/berth")
	if got, _ := os.ReadFile(filepath.Join(dest, "etc/berth/config.yaml")); !bytes.Equal(got, mine) {
		t.Errorf("make install wrote over the user's config:\n%s", out)
	}
	if !strings.Contains(out, "exists: kept") {
		t.Errorf("make install does not say it kept the config:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dest, "opt/berth/bin/berth")); err != nil {
		t.Error(err)
	}
	if unit, _ := os.ReadFile(filepath.Join(dest, "lib/systemd/system/berth.service")); !strings.Contains(string(unit), "\nExecStart=/opt/berth/bin/berth serve") {
		t.Errorf("PREFIX=/opt/berth: the unit's ExecStart is not moved:\n%s", unit)
	}

	// make run: the binary on PATH, then serve as the README says.
	dry := exec.Command("make", "-C", root, "-n", "-o", "build", "-o", "runsc", "run")
	dry.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	runOut, err := dry.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, runOut)
	}
	for _, want := range []string{"install -D -m 0755 bin/berth /usr/local/bin/berth\n",
		"exec /usr/local/bin/berth serve --state-dir /var/lib/berth --listen 127.0.0.1:7680 --runsc " + root + "/bin/runsc\n"} {
		if !strings.Contains(string(runOut), want) {
			t.Errorf("make run does not do %q:\n%s", want, runOut)
		}
	}
	if strings.Contains(string(runOut), "systemd") || strings.Contains(string(runOut), "/etc/berth") {
		t.Errorf("make run installs more than the binary:\n%s", runOut)
	}
}
