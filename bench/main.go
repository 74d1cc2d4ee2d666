// Command bench measures berth, and the tools a user would pick instead on
// the same machine, in one run, and writes the results as a Markdown table
// and a JSON file (make bench).
//
//	go run ./bench -berth bin/berth -readme README.md
//
// Samples of different subjects are taken in interleaved rounds: each round
// takes one sample of every subject, in an order that rotates from round to
// round, so that the drift of a shared machine falls on all of them alike.
// The ratio berth/peer is computed per round from the two samples of that
// round and then summarized. Work that is not part of an operation (deleting
// a sandbox after its sample, refilling the warm pool) happens between
// samples, outside every clock. Everything the bench starts it stops, also
// when interrupted; all load is bounded in count and time.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	cfg := config{bursts: []int{10, 100}, clients: []int{1, 8, 32}}
	flag.StringVar(&cfg.berth, "berth", "bin/berth", "the berth binary to measure")
	flag.StringVar(&cfg.work, "work", "/var/tmp/berth-bench", "scratch directory: daemon state, bundles, logs")
	flag.IntVar(&cfg.rounds, "rounds", 60, "interleaved rounds of start samples")
	flag.IntVar(&cfg.execRounds, "exec-rounds", 200, "interleaved rounds of exec samples")
	flag.IntVar(&cfg.idleRounds, "idle-rounds", 15, "rounds of exec samples after an idle pause")
	flag.DurationVar(&cfg.idle, "idle", time.Second, "the idle pause before each of those")
	flag.IntVar(&cfg.density, "density", 200, "idle sandboxes for the density measurement")
	flag.DurationVar(&cfg.window, "window", 3*time.Second, "how long each exec throughput level runs")
	flag.IntVar(&cfg.churnClients, "churn-clients", 32, "clients of the create/exec/delete loop")
	flag.DurationVar(&cfg.churnWindow, "churn-window", time.Minute, "how long the create/exec/delete loop runs at most")
	flag.IntVar(&cfg.churnMax, "churn-max", 5000, "the most creates the create/exec/delete loop makes")
	flag.Int64Var(&cfg.bigBytes, "big", 1<<30, "size of the large transfer in bytes (0: skip it)")
	flag.IntVar(&cfg.smallFiles, "small-files", 1000, "files in the many-small-files transfer")
	flag.StringVar(&cfg.runsc, "runsc", defaultRunsc(), "runsc for the gvisor runtime and the runsc peer (make runsc links the pinned one at bin/runsc)")
	flag.BoolVar(&cfg.peers, "peers", true, "measure crun, runc, runsc, bwrap and podman too")
	flag.BoolVar(&cfg.net, "net", true, "measure sandboxes' network against the host's direct path (needs iproute2 and python3)")
	flag.IntVar(&cfg.netRounds, "net-rounds", 10, "rounds of a batch of requests on each network path")
	flag.IntVar(&cfg.netRequests, "net-requests", 50, "requests in each batch")
	flag.IntVar(&cfg.netDensity, "net-density", 100, "idle sandboxes per network mode for the network's memory")
	flag.IntVar(&cfg.portsRounds, "ports-rounds", 20, "rounds of a batch of round trips on each port path")
	flag.IntVar(&cfg.snapRounds, "snap-rounds", 20, "rounds of snapshot, fork and diff samples")
	flag.IntVar(&cfg.gvisorRounds, "gvisor-rounds", 5, "rounds of pause with memory and resume of each gvisor sandbox (idle, 512 MiB)")
	flag.IntVar(&cfg.gvisorDensity, "gvisor-density", 20, "idle gvisor sandboxes for their memory")
	flag.IntVar(&cfg.snapFiles, "snap-files", 1000, "files the snapshotted sandbox writes")
	flag.Int64Var(&cfg.snapBytes, "snap-bytes", 100<<20, "bytes the snapshotted sandbox writes, over its files")
	flag.IntVar(&cfg.diffFiles, "diff-files", 10000, "files the diffed sandbox writes")
	flag.BoolVar(&cfg.snapHostOnly, "snap-host-only", false, "measure snapshots on the bench's disk only (not also on a journaled ext4 and an XFS made in image files)")
	flag.IntVar(&cfg.portsRequests, "ports-requests", 100, "round trips in each batch")
	flag.IntVar(&cfg.portsIdle, "ports-idle", 1000, "idle WebSockets held open for the daemon's memory")
	flag.IntVar(&cfg.pullRounds, "pull-rounds", 10, "first pulls of the image from the bench's registry")
	flag.Int64Var(&cfg.imageBytes, "image", 100<<20, "random bytes in the pulled image, split over its 4 data layers")
	flag.IntVar(&cfg.e2bRounds, "e2b-rounds", 30, "rounds of create samples through E2B's SDK and the native API (the exec round trips take -exec-rounds)")
	flag.StringVar(&cfg.e2bPython, "e2b-python", "compat/e2b/sdktest/.venv/bin/python", "the Python with E2B's SDK (make compat/e2b/sdktest/.venv/.installed); missing: the e2b rows say so")
	only := flag.String("only", "", "run only these steps, comma-separated: starts, exec, roundtrips, throughput, bursts, churn, files, density, network, ports, images, snapshots, e2b, gvisor (a partial run; do not give -readme)")
	out := flag.String("out", "bench/results", "directory for latest.md and latest.json")
	readme := flag.String("readme", "", "a file whose section between <!-- bench:start --> and <!-- bench:end --> gets the table")
	flag.Parse()
	if *only != "" {
		cfg.only = strings.Split(*only, ",")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(cfg, *out, *readme, log); err != nil {
		log.Error("bench failed", "err", err)
		os.Exit(1)
	}
}

func run(cfg config, out, readme string, log *slog.Logger) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("the bench runs sandboxes and containers: run it as root")
	}
	if done, err := withoutHybridCgroup(log); done || err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := measure(ctx, cfg, log)
	if err != nil {
		return err
	}
	res.Command = "make bench (go run ./bench " + strings.Join(os.Args[1:], " ") + ")"
	if os.Getenv(privateNSEnv) != "" {
		res.Notes = append(res.Notes, "This host mounts a controller-less cgroup2 beside its cgroup v1 controllers (hybrid), which crun and podman refuse; the whole bench ran in a private mount namespace without that mount, every subject alike.")
	}
	res.Notes = append(res.Notes, notes...)
	md := markdown(res)
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "latest.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "latest.md"), []byte(md), 0o644); err != nil {
		return err
	}
	if readme != "" {
		if err := replaceBetween(readme, md); err != nil {
			return err
		}
	}
	fmt.Print(md)
	return nil
}

// notes explain how to read the tables; they go under them.
var notes = []string{
	"**How to read this.** Every subject runs the same program from the same files: berth from its `host` image, the peers from a root file system holding `echo`, `true` and `sleep` copied from the host's `/usr/bin`. \"berth\" is `berth serve` as installed (a warm pool of 2) driven through its HTTP API by the Go client; the delete of each sandbox comes after the clock stops (an agent has its output by then), and the warm pool is refilled between samples. \"berth, delete in the clock\" counts the delete too; \"berth CLI\" is `berth run -- echo hi` and `berth exec`, a new process each time like the peers' command lines. The peers' `run` includes their teardown. Ratios are berth (the first row) over the peer, per round, then summarized: below 1 means berth was faster.",
	"berth's sandboxes carry more isolation than the peers' defaults here: a user namespace (root inside is unprivileged outside), a seccomp filter, a cgroup with a pids limit, an overlay root with a private writable layer. crun and runc run the spec `runc spec` writes (no user namespace, no seccomp); bwrap unshares every namespace it can; podman runs its default seccomp profile.",
}

func (c config) check() error {
	switch {
	case c.rounds < 1 || c.execRounds < 1 || c.density < 1:
		return errors.New("-rounds, -exec-rounds and -density must be at least 1")
	case c.idleRounds < 1 || c.idleRounds > 1000 || c.idle <= 0 || c.idle > time.Minute:
		return errors.New("-idle-rounds must be between 1 and 1000, -idle between 0 and 1m")
	case c.netRounds < 1 || c.netRequests < 1 || c.netDensity < 1 || c.netRounds*c.netRequests > 100_000 || c.netDensity > 1000:
		return errors.New("-net-rounds, -net-requests and -net-density must be at least 1 (at most 100000 requests, 1000 sandboxes)")
	case c.portsRounds < 1 || c.portsRequests < 1 || c.portsIdle < 1 || c.portsRounds*c.portsRequests > 100_000 || c.portsIdle > 10_000:
		return errors.New("-ports-rounds, -ports-requests and -ports-idle must be at least 1 (at most 100000 round trips, 10000 WebSockets)")
	case c.window <= 0 || c.window > time.Minute:
		return errors.New("-window must be between 0 and 1m")
	case c.churnClients < 1 || c.churnClients > 256 || c.churnWindow <= 0 || c.churnWindow > 5*time.Minute || c.churnMax < 1 || c.churnMax > 100_000:
		return errors.New("-churn-clients must be 1 to 256, -churn-window at most 5m, -churn-max 1 to 100000")
	case c.bigBytes < 0 || c.bigBytes > 4<<30:
		return errors.New("-big must be between 0 and 4 GiB")
	case c.smallFiles < 1 || c.smallFiles > 100_000:
		return errors.New("-small-files must be between 1 and 100000")
	case c.pullRounds < 1 || c.pullRounds > 100:
		return errors.New("-pull-rounds must be between 1 and 100")
	case c.imageBytes < imageLayers || c.imageBytes > 1<<30:
		return errors.New("-image must be between 4 bytes and 1 GiB")
	case c.snapRounds < 1 || c.snapRounds > 1000 || c.snapFiles < 10 || c.snapFiles > 100_000 || c.diffFiles < 1 || c.diffFiles > 100_000:
		return errors.New("-snap-rounds (1..1000), -snap-files (10..100000) and -diff-files (1..100000) are out of range")
	case c.snapBytes < int64(c.snapFiles) || c.snapBytes > 4<<30:
		return errors.New("-snap-bytes must be between -snap-files and 4 GiB")
	case c.e2bRounds < 1 || c.e2bRounds > 1000 || c.execRounds > 100_000:
		return errors.New("-e2b-rounds must be between 1 and 1000 (and -exec-rounds at most 100000)")
	case c.gvisorRounds < 1 || c.gvisorRounds > 100 || c.gvisorDensity < 1 || c.gvisorDensity > 1000:
		return errors.New("-gvisor-rounds must be between 1 and 100, -gvisor-density between 1 and 1000")
	}
	for _, k := range c.only {
		if !slices.Contains([]string{"starts", "exec", "roundtrips", "throughput", "bursts", "churn", "files", "density", "network", "ports", "images", "snapshots", "e2b", "gvisor"}, k) {
			return fmt.Errorf("-only: %q is not a step", k)
		}
	}
	if _, err := os.Stat(c.berth); err != nil {
		return fmt.Errorf("-berth: %w (make build makes bin/berth)", err)
	}
	return nil
}

const privateNSEnv = "BERTH_BENCH_PRIVATE_MOUNTS"

// withoutHybridCgroup re-runs the bench in a private mount namespace
// without a hybrid host's controller-less cgroup2 mount, which crun and
// podman refuse (berth uses the v1 controllers either way, and runc does
// too). done is true when the re-run has happened and this process should
// exit with its result.
func withoutHybridCgroup(log *slog.Logger) (done bool, err error) {
	const unified = "/sys/fs/cgroup/unified"
	var st unix.Statfs_t
	if unix.Statfs(unified, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return false, nil
	}
	if os.Getenv(privateNSEnv) != "" {
		if err := unix.Unmount(unified, unix.MNT_DETACH); err != nil {
			return false, fmt.Errorf("unmount %s in the private mount namespace: %w", unified, err)
		}
		return false, nil
	}
	self, err := os.Executable()
	if err != nil {
		return false, err
	}
	log.Info("hybrid cgroup host: running the bench in a private mount namespace without " + unified)
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), privateNSEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	// An interruption goes to the child, which cleans up; this process
	// waits for it rather than dying first.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return true, err
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			cmd.Process.Signal(sig)
		case err := <-waited:
			if err != nil {
				return true, fmt.Errorf("bench in a private mount namespace: %w", err)
			}
			return true, nil
		}
	}
}

// machine describes this host.
func machine() Machine {
	var u unix.Utsname
	unix.Uname(&u)
	var si unix.Sysinfo_t
	unix.Sysinfo(&si)
	cg := "v2"
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type != unix.CGROUP2_SUPER_MAGIC {
		cg = "v1"
		if unix.Statfs("/sys/fs/cgroup/unified", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC || os.Getenv(privateNSEnv) != "" {
			cg = "v1 (hybrid)"
		}
	}
	// The binary has no version of its own yet: the commit it was built
	// from, when the bench runs in the repository.
	version := "unknown commit"
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		version = "commit " + strings.TrimSpace(string(out))
	}
	return Machine{Cores: runtime.NumCPU(), MemBytes: int64(si.Totalram) * int64(si.Unit), Kernel: unix.ByteSliceToString(u.Release[:]), Cgroup: cg, Berth: version}
}

// defaultRunsc is bin/runsc when make runsc made it, else runsc on PATH.
func defaultRunsc() string {
	if p, err := filepath.Abs("bin/runsc"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "runsc"
}
