// Package e2e tests berth from the outside: a real `berth serve` process on
// a private state dir, driven by the Go client and the CLI binary.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/internal/testutil"
)

// daemon is a running `berth serve`.
type daemon struct {
	t      testing.TB
	bin    string
	state  string
	listen string
	url    string
	args   []string // extra serve flags
	cmd    *exec.Cmd
	log    *testutil.Buffer
	client *client.Client
	// key is the admin key the daemon made on its first start (admin.key
	// in the state dir), which client and cli send.
	key    string
	testCA []byte // the test internet's CA, which network tests' sandboxes trust
}

// startDaemon starts berth serve on a fresh state dir (or state, if given)
// and waits until it answers; it is stopped at the end of the test. The
// warm pool is off unless args turn it on, so that tests count only the
// sandboxes they make.
func startDaemon(t testing.TB, state string, args ...string) *daemon {
	t.Helper()
	return startDaemonOn(t, testutil.FreeAddr(t), state, args...)
}

// startDaemonOn is startDaemon with the daemon listening on listen
// (host:port; the client calls it at that address).
func startDaemonOn(t testing.TB, listen, state string, args ...string) *daemon {
	t.Helper()
	testutil.RequireRoot(t)
	if state == "" {
		state = testutil.StateDir(t)
	}
	pre := []string{"--warm-pool", "0"}
	if runsc := os.Getenv("BERTH_RUNSC"); runsc != "" {
		pre = append(pre, "--runsc", runsc)
	}
	d := &daemon{t: t, bin: testutil.Berth(t), state: state, listen: listen, args: append(pre, args...)}
	d.url = "http://" + d.listen
	d.start()
	t.Cleanup(func() {
		// Remove what the test left (with a daemon again if the test killed
		// it), then stop the daemon.
		if d.cmd != nil && d.cmd.ProcessState != nil {
			d.start()
		}
		if d.cmd != nil && d.cmd.ProcessState == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if list, err := d.client.ListSandboxes(ctx, nil); err == nil {
				for _, sb := range list {
					d.client.DeleteSandbox(ctx, sb.ID)
				}
			}
			d.cmd.Process.Signal(syscall.SIGTERM)
			d.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	return d
}

func (d *daemon) start() {
	t := d.t
	t.Helper()
	d.log = &testutil.Buffer{}
	d.cmd = exec.Command(d.bin, append([]string{"serve", "--state-dir", d.state, "--listen", d.listen}, d.args...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(d.url)
	if err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c, d.log)
	d.key = testutil.AdminKey(t, d.state)
	if d.client, err = client.New(d.url, client.WithAPIKey(d.key)); err != nil {
		t.Fatal(err)
	}
}

// stop stops the daemon gracefully (SIGTERM) and waits for it.
func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
}

// sandboxDirs counts the sandbox directories on disk, of every runtime
// (pooled ones included).
func (d *daemon) sandboxDirs() int {
	dirs, _ := filepath.Glob(filepath.Join(d.state, "runtimes", "*", "sandboxes", "*"))
	return len(dirs)
}

// guests counts the running guests of this daemon's sandboxes: its guest
// processes (guestPids) but for spares, whose output is a log among the
// spares'. (Other tests' daemons, in this package or another run in
// parallel, have their own guests.)
func (d *daemon) guests() int {
	n := 0
	spares := filepath.Join(d.state, "runtimes", "native", "spares") + string(filepath.Separator)
	for _, pid := range d.guestPids() {
		if out, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", "1")); err == nil && strings.HasPrefix(out, spares) {
			continue
		}
		n++
	}
	return n
}

// guestPids are the processes whose program is the guest binary installed
// under this daemon's state dir, spares included, but not its spawner (the
// same binary in its spawner mode).
func (d *daemon) guestPids() []int {
	var pids []int
	exes, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, exe := range exes {
		target, err := os.Readlink(exe)
		if err != nil || !strings.HasPrefix(target, d.state+string(filepath.Separator)) {
			continue
		}
		proc := filepath.Dir(exe)
		if args, err := os.ReadFile(filepath.Join(proc, "cmdline")); err == nil && slices.Contains(strings.Split(string(args), "\x00"), guestapi.SpawnerFlag) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(proc)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// spares lists the ids of this daemon's ready spare guests.
func (d *daemon) spares() []string {
	logs, _ := filepath.Glob(filepath.Join(d.state, "runtimes", "native", "spares", "*.log"))
	ids := make([]string, len(logs))
	for i, l := range logs {
		ids[i] = strings.TrimSuffix(filepath.Base(l), ".log")
	}
	return ids
}

// kill9 kills the daemon the hard way; sandboxes must survive it.
func (d *daemon) kill9() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
}

// cli runs the berth CLI against the daemon and returns stdout, stderr and the exit code.
func (d *daemon) cli(stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	cmd := exec.Command(d.bin, append([]string{"--url", d.url}, args...)...)
	cmd.Env = append(os.Environ(), "BERTH_API_KEY="+d.key)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// traces lists what sandbox id left on the host.
func (d *daemon) traces(id string) []string {
	var out []string
	if m, _ := filepath.Glob(filepath.Join(d.state, "runtimes", "*", "sandboxes", id)); len(m) > 0 {
		out = append(out, "sandbox directory "+m[0])
	}
	if m, _ := filepath.Glob(filepath.Join(d.state, "runtimes", "gvisor", "runsc", id+"*")); len(m) > 0 {
		out = append(out, "runsc state "+m[0])
	}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/berth/" + id)
	out = append(out, dirs...)
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/berth/" + id); len(dirs) > 0 {
		out = append(out, dirs...)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "/berth/"+id) {
			out = append(out, "process "+p)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), id) {
		out = append(out, "mount")
	}
	return out
}

func (d *daemon) String() string { return fmt.Sprintf("daemon(%s)", d.url) }
