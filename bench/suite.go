package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

// config is what one run measures.
type config struct {
	berth         string        // the berth binary
	work          string        // scratch directory (state, bundles, logs)
	rounds        int           // interleaved rounds of start samples
	execRounds    int           // interleaved rounds of exec samples
	idleRounds    int           // rounds of exec samples after an idle pause
	idle          time.Duration // the pause before each of those
	density       int           // idle sandboxes for the density measurement
	bursts        []int         // sizes of concurrent-create bursts
	clients       []int         // concurrent clients for exec throughput
	window        time.Duration // how long each throughput level runs
	churnClients  int           // clients of the create/exec/delete loop
	churnWindow   time.Duration // how long the loop runs at most
	churnMax      int           // the most creates the loop makes
	bigBytes      int64         // the large transfer (0: none)
	smallFiles    int           // files in the many-small-files transfer
	peers         bool          // measure the peers too
	net           bool          // measure the network
	netRounds     int           // rounds of a batch of requests on each network path
	netRequests   int           // requests in a batch
	netDensity    int           // idle sandboxes per network mode for its memory
	portsRounds   int           // rounds of a batch of round trips on each port path
	portsRequests int           // round trips in a batch
	portsIdle     int           // idle WebSockets held for the daemon's memory
	pullRounds    int           // first pulls of the image
	imageBytes    int64         // random bytes in the pulled image, over its data layers
	snapRounds    int           // rounds of snapshot, fork and diff samples
	gvisorRounds  int           // rounds of pause with memory and resume, per case
	gvisorDensity int           // idle gvisor sandboxes for their memory
	snapFiles     int           // files the changed sandbox wrote (of snapBytes/snapFiles bytes each)
	snapBytes     int64         // bytes it wrote
	diffFiles     int           // files the diffed sandbox changed
	snapHostOnly  bool          // the snapshots step on the bench's disk only, not on ext4 and XFS images too
	e2bRounds     int           // rounds of create samples through E2B's SDK and the native API
	e2bPython     string        // the Python that has E2B's SDK (its venv's)
	only          []string      // the steps to run (by key; empty: all)
	runsc         string        // the runsc of the gvisor runtime and of the runsc peer
}

// suite runs the measurements; everything it starts is stopped by close.
type suite struct {
	cfg   config
	log   *slog.Logger
	warm  *daemon // the default: a warm pool of 2
	cold  *daemon // no warm pool: every create boots (on a spare guest when one is ready)
	bare  *daemon // no warm pool, no spare guests: every create spawns its guest
	res   *Results
	undos []func()
}

// measure runs every measurement of cfg and returns the results. Every
// daemon, sandbox, container and image it made is gone when it returns,
// error, interruption or not.
func measure(ctx context.Context, cfg config, log *slog.Logger) (*Results, error) {
	if err := os.MkdirAll(cfg.work, 0o755); err != nil {
		return nil, err
	}
	s := &suite{cfg: cfg, log: log, res: &Results{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine()}}
	defer s.close()
	var err error
	if s.warm, err = startDaemon(ctx, cfg.berth, cfg.work, "berth-warm", 2, log); err != nil {
		return nil, err
	}
	s.undos = append(s.undos, s.warm.close)
	if s.cold, err = startDaemon(ctx, cfg.berth, cfg.work, "berth-cold", 0, log); err != nil {
		return nil, err
	}
	s.undos = append(s.undos, s.cold.close)
	if s.bare, err = startDaemon(ctx, cfg.berth, cfg.work, "berth-bare", 0, log, "--spare-guests", "0"); err != nil {
		return nil, err
	}
	s.undos = append(s.undos, s.bare.close)

	subjects := []subject{
		apiSubject("berth", s.warm, false),
		apiSubject("berth, no warm pool", s.cold, false),
		apiSubject("berth, no warm pool, no spares", s.bare, false),
		apiSubject("berth, delete in the clock", s.warm, true),
		cliSubject(s.warm),
	}
	// One berth API row is enough for exec: these differ only in create.
	subjects[1].boot, subjects[2].boot, subjects[3].boot = nil, nil, nil
	subjects = append(subjects, bareSubject())
	if cfg.peers {
		peers, err := s.peers(ctx)
		if err != nil {
			return nil, err
		}
		subjects = append(subjects, peers...)
	}
	for i := range subjects {
		subjects[i] = probe(ctx, subjects[i])
	}

	steps := []struct {
		key, what string
		run       func(context.Context, []subject) error
	}{
		{"starts", "start isolated, print hi", s.starts},
		{"exec", "exec round trip", s.execs},
		{"roundtrips", "round trips, back to back", func(ctx context.Context, _ []subject) error { return s.roundTrips(ctx) }},
		{"throughput", "exec throughput", func(ctx context.Context, _ []subject) error { return s.throughput(ctx) }},
		{"bursts", "bursts of concurrent creates", s.burstsOf},
		{"churn", "clients in a create/exec/delete loop", s.churn},
		{"files", "file transfers", func(ctx context.Context, _ []subject) error { return s.files(ctx) }},
		{"density", "density", func(ctx context.Context, _ []subject) error { return s.densityOf(ctx) }},
		{"network", "network", func(ctx context.Context, _ []subject) error {
			if !cfg.net {
				return nil
			}
			return s.network(ctx)
		}},
		{"ports", "ports", func(ctx context.Context, _ []subject) error { return s.ports(ctx) }},
		{"images", "images", func(ctx context.Context, _ []subject) error { return s.images(ctx) }},
		{"snapshots", "snapshots, forks and diffs", func(ctx context.Context, _ []subject) error { return s.snapshots(ctx) }},
		{"e2b", "E2B's SDK against berth", func(ctx context.Context, _ []subject) error { return s.e2b(ctx) }},
		{"gvisor", "the gvisor runtime beside runsc", func(ctx context.Context, _ []subject) error { return s.gvisor(ctx) }},
	}
	for _, step := range steps {
		if len(cfg.only) > 0 && !slices.Contains(cfg.only, step.key) {
			continue
		}
		log.Info(step.what)
		if err := step.run(ctx, subjects); err != nil {
			return nil, fmt.Errorf("%s: %w", step.what, err)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	s.res.checkTargets()
	return s.res, nil
}

func (s *suite) close() {
	for _, undo := range s.undos {
		undo()
	}
}

// peers prepares the root file system the peers share and their subjects.
func (s *suite) peers(ctx context.Context) ([]subject, error) {
	rootfs, err := makeRootfs(s.cfg.work)
	if err != nil {
		return nil, fmt.Errorf("peers' root file system: %w", err)
	}
	var out []subject
	for _, rt := range ociRuntimes {
		if rt.name == "runsc" {
			rt.path = s.cfg.runsc // the gvisor runtime's, pinned
		}
		out = append(out, ociSubject(rt, s.cfg.work, rootfs))
	}
	out = append(out, bwrapSubject())
	podman, cleanup := podmanSubject(ctx, rootfs)
	s.undos = append(s.undos, cleanup)
	return append(out, podman), nil
}

// interleave takes rounds of one sample of each live subject, in an order
// that rotates every round, so that a machine's drift falls on every
// subject alike. After each sample, outside the clock, its sandbox is
// deleted and, with settle (nil: none), the warm pools refilled before the
// next one.
func (s *suite) interleave(ctx context.Context, subjects []subject, rounds int, settle func(context.Context) error, sample func(context.Context, subject) (func(), error)) map[string]series {
	out := map[string]series{}
	for _, sub := range subjects {
		out[sub.name] = newSeries(rounds)
	}
	failures := map[string]int{}
	for r := range rounds {
		for i := range subjects {
			sub := subjects[(r+i)%len(subjects)]
			if settle != nil {
				if err := settle(ctx); err != nil {
					s.log.Warn("settle", "err", err)
				}
				// The pool check just woke the daemon; every sample, berth's
				// or a peer's, starts from a machine gone idle again.
				time.Sleep(5 * time.Millisecond)
			}
			if ctx.Err() != nil {
				return out
			}
			t0 := time.Now()
			undo, err := sample(ctx, sub)
			d := time.Since(t0)
			if undo != nil {
				undo()
			}
			if err != nil {
				if failures[sub.name]++; failures[sub.name] <= 3 {
					s.log.Warn("sample failed", "subject", sub.name, "round", r, "err", err)
				}
				continue
			}
			out[sub.name][r] = d
		}
	}
	return out
}

// starts measures "start isolated, print hi" for every subject.
func (s *suite) starts(ctx context.Context, subjects []subject) error {
	live := measurable(subjects)
	// Each sample starts with the warm pool and the spare guests refilled.
	settle := func(ctx context.Context) error { return errors.Join(s.warm.settle(ctx), s.cold.settle(ctx)) }
	got := s.interleave(ctx, live, s.cfg.rounds, settle, func(ctx context.Context, sub subject) (func(), error) { return sub.once(ctx) })
	const name = "create → first exec output (`echo hi`), sequential"
	s.res.Metrics = append(s.res.Metrics, rows("start", name, subjects, got, "berth", s.cfg.rounds, map[string]*Target{
		"berth":    {Stat: "p50", AtMost: true, Limit: 10},
		"crun run": {Stat: "ratio_p50", AtMost: true, Limit: 1 / 1.5},
	})...)
	// The cold-start issue's targets compare a create that has no warm pool
	// with bwrap and with the floor, round by round.
	for _, of := range []string{"berth, no warm pool", "berth, no warm pool, no spares"} {
		s.res.Metrics = append(s.res.Metrics,
			ratioRow("start", "create → first exec output, over bwrap's in the same round", of, "bwrap", got, 1),
			ratioRow("start", "create → first exec output, over the no-isolation floor's in the same round", of, floorName, got, 3))
	}
	return nil
}

// ratioRow is the per-round ratio of subject of over subject over, as a
// row of of's with a p50 target of at most limit; not measured where
// either has no samples.
func ratioRow(group, name, of, over string, got map[string]series, limit float64) Metric {
	m := Metric{Group: group, Name: name, Subject: of, Unit: "×", Target: &Target{Stat: "p50", AtMost: true, Limit: limit}}
	r := ratios(got[of], got[over])
	if len(r) == 0 {
		m.NotMeasured = fmt.Sprintf("no round with samples of both %s and %s", of, over)
		return m
	}
	sum := summarize(r)
	m.Summary, m.Samples = &sum, r
	return m
}

// execs measures exec of true into a running environment of each subject.
func (s *suite) execs(ctx context.Context, subjects []subject) error {
	envs, live, shown := bootAll(ctx, subjects)
	defer stopAll(envs)
	// No creates here, so nothing to refill: no request to the daemon
	// between samples that would wake it just before berth's.
	got := s.interleave(ctx, live, s.cfg.execRounds, nil, func(ctx context.Context, sub subject) (func(), error) {
		return nil, envs[sub.name].exec(ctx)
	})
	s.res.Metrics = append(s.res.Metrics, rows("exec", "exec round trip (`true`) in a running sandbox", shown, got, "berth", s.cfg.execRounds, map[string]*Target{
		"berth": {Stat: "p50", AtMost: true, Limit: 1},
	})...)
	s.res.Metrics = append(s.res.Metrics, ratioRow("exec", "exec round trip (`true`), over the no-isolation floor's in the same round", "berth", floorName, got, 1.5))
	// An agent's exec comes after its model's think time, when nothing of
	// berth's has run for a while. On some hosts (this bench's nested VM)
	// that alone makes the first work of any process slower, and more so
	// the more memory it touches: berth and the floor, each after a pause.
	var idlers []subject
	for _, sub := range live {
		if sub.name == "berth" || sub.name == floorName {
			idlers = append(idlers, sub)
		}
	}
	pause := func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.cfg.idle):
			return nil
		}
	}
	idle := s.interleave(ctx, idlers, s.cfg.idleRounds, pause, func(ctx context.Context, sub subject) (func(), error) {
		return nil, envs[sub.name].exec(ctx)
	})
	name := fmt.Sprintf("exec round trip (`true`) after %v with nothing running (an agent's think time)", s.cfg.idle)
	s.res.Metrics = append(s.res.Metrics, rows("exec", name, idlers, idle, "berth", s.cfg.idleRounds, nil)...)
	return nil
}

// bootAll starts the long-running environment of each live subject that
// has one. shown are the subjects of an exec table: those with an
// environment (live), and those that say why they have none; subjects
// without exec and without a reason are left out.
func bootAll(ctx context.Context, subjects []subject) (envs map[string]*running, live, shown []subject) {
	envs = map[string]*running{}
	for _, sub := range subjects {
		switch {
		case sub.why != "":
		case sub.boot == nil && sub.noExec == "":
			continue
		case sub.boot == nil:
			sub.why = sub.noExec
		default:
			env, err := sub.boot(ctx)
			if err != nil {
				sub.why = "its long-running environment did not start: " + firstLine(err.Error())
				break
			}
			envs[sub.name] = env
			live = append(live, sub)
		}
		shown = append(shown, sub)
	}
	return envs, live, shown
}

// stopAll removes the environments bootAll started.
func stopAll(envs map[string]*running) {
	for _, env := range envs {
		env.stop()
	}
}

func measurable(subjects []subject) []subject {
	var out []subject
	for _, sub := range subjects {
		if sub.why == "" {
			out = append(out, sub)
		}
	}
	return out
}

// rows turns interleaved samples into one row per subject, with the
// per-round ratio of base over each peer.
func rows(group, name string, subjects []subject, got map[string]series, base string, rounds int, targets map[string]*Target) []Metric {
	var out []Metric
	for _, sub := range subjects {
		shown := sub.name
		if (group == "exec" || strings.HasPrefix(name, "exec round trip")) && sub.execName != "" {
			shown = sub.execName
		}
		m := Metric{Group: group, Name: name, Subject: shown, Unit: "ms", Target: targets[sub.name]}
		if sub.why != "" {
			m.NotMeasured = sub.why
			out = append(out, m)
			continue
		}
		samples := got[sub.name].ms()
		if len(samples) == 0 {
			m.NotMeasured = "every sample failed (see the log)"
			out = append(out, m)
			continue
		}
		sum := summarize(samples)
		m.Summary, m.Samples = &sum, samples
		if len(samples) < rounds {
			m.NotMeasured = fmt.Sprintf("%d of %d samples failed", rounds-len(samples), rounds)
		}
		if !strings.HasPrefix(sub.name, "berth") {
			if r := ratios(got[base], got[sub.name]); len(r) > 0 {
				rs := summarize(r)
				m.Ratio, m.RatioTo, m.Ratios = &rs, base, r
			}
		}
		out = append(out, m)
	}
	return out
}

// roundTrips splits an exec's time: the same client calls, one after
// another, the daemon alone (a health check), the daemon and the guest (a
// file stat inside the sandbox), and an exec of true, which adds the
// process.
func (s *suite) roundTrips(ctx context.Context) error {
	sb, err := s.warm.create(ctx)
	if err != nil {
		return err
	}
	defer s.warm.remove(sb.ID)
	c := s.warm.client
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"round trip to the daemon (GET /healthz), back to back", func() error { return c.Health(ctx) }},
		{"round trip through the guest (fs stat of /tmp), back to back", func() error {
			_, err := c.Stat(ctx, sb.ID, api.StatRequest{Path: "/tmp"})
			return err
		}},
		{"exec round trip (`true`), back to back", func() error { return s.warm.execTrue(ctx, sb.ID) }},
	} {
		var samples []float64
		for range s.cfg.execRounds {
			t0 := time.Now()
			if err := call.do(); err != nil {
				return fmt.Errorf("%s: %w", call.name, err)
			}
			samples = append(samples, ms(time.Since(t0)))
		}
		sum := summarize(samples)
		s.res.Metrics = append(s.res.Metrics, Metric{Group: "exec", Name: call.name, Subject: "berth", Unit: "ms", Summary: &sum, Samples: samples})
	}
	return nil
}

// throughput counts execs per second in one sandbox with several clients
// at once, each level for a fixed window.
func (s *suite) throughput(ctx context.Context) error {
	sb, err := s.warm.create(ctx)
	if err != nil {
		return err
	}
	defer s.warm.remove(sb.ID)
	for _, n := range s.cfg.clients {
		var ok, failed atomic.Int64
		lat := make([][]float64, n)
		ctx, cancel := context.WithTimeout(ctx, s.cfg.window)
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := range n {
			wg.Go(func() {
				for ctx.Err() == nil {
					t := time.Now()
					err := s.warm.execTrue(ctx, sb.ID)
					switch {
					case err == nil:
						ok.Add(1)
						lat[i] = append(lat[i], float64(time.Since(t))/float64(time.Millisecond))
					case ctx.Err() == nil:
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(t0)
		cancel()
		rate := float64(ok.Load()) / elapsed.Seconds()
		var all []float64
		for _, l := range lat {
			all = append(all, l...)
		}
		sum := summarize(all)
		m := Metric{Group: "exec", Name: fmt.Sprintf("exec throughput, %d concurrent clients (rate; latency below)", n), Subject: "berth", Unit: "execs/s", Value: &rate}
		lm := Metric{Group: "exec", Name: fmt.Sprintf("exec latency, %d concurrent clients", n), Subject: "berth", Unit: "ms", Summary: &sum}
		if f := failed.Load(); f > 0 {
			m.NotMeasured = fmt.Sprintf("%d execs failed", f)
		}
		s.res.Metrics = append(s.res.Metrics, m, lm)
	}
	return nil
}

// burstsOf creates sandboxes all at once (create → first exec output each)
// on the default daemon, and starts as many of each crowd peer's at once
// (start → `echo hi` output each), then the largest burst again on a
// daemon whose warm pool holds a whole burst.
func (s *suite) burstsOf(ctx context.Context, subjects []subject) error {
	for _, n := range s.cfg.bursts {
		if err := s.burst(ctx, s.warm, "berth", n, n == 100); err != nil {
			return err
		}
		for _, sub := range crowdPeers(subjects) {
			s.res.Metrics = append(s.res.Metrics, peerBurst(ctx, sub, n))
		}
	}
	n := slices.Max(s.cfg.bursts)
	sized, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-sized-pool", n, s.log)
	if err != nil {
		return err
	}
	defer sized.close()
	return s.burst(ctx, sized, fmt.Sprintf("berth, --warm-pool %d", n), n, false)
}

// burstName is the row name of a burst of n.
func burstName(n int) string {
	return fmt.Sprintf("burst of %d concurrent creates, create → first exec output each", n)
}

// crowdPeers are the subjects measured beside berth in the bursts and the
// loop: the floor, and the peers quick enough to start by the hundred
// (runsc and podman take 0.1–0.2 s for each start alone).
func crowdPeers(subjects []subject) []subject {
	var out []subject
	for _, sub := range subjects {
		if slices.Contains([]string{floorName, "bwrap", "crun run", "runc run"}, sub.name) {
			out = append(out, sub)
		}
	}
	return out
}

// peerBurst starts n environments of sub at once and returns their
// latencies (start → `echo hi` output, and the environment's exit) as a
// row.
func peerBurst(ctx context.Context, sub subject, n int) Metric {
	m := Metric{Group: "start", Name: burstName(n), Subject: sub.name, Unit: "ms"}
	if sub.why != "" {
		m.NotMeasured = sub.why
		return m
	}
	lat := newSeries(n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			t0 := time.Now()
			undo, err := sub.once(ctx)
			if err == nil {
				lat[i] = time.Since(t0)
			}
			if undo != nil {
				undo()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return crowdRow(m, lat.ms(), n, errs)
}

// crowdRow fills m with the samples of n tries and says how many failed,
// with the first failure.
func crowdRow(m Metric, samples []float64, n int, errs []error) Metric {
	if len(samples) > 0 {
		sum := summarize(samples)
		m.Summary, m.Samples = &sum, samples
	}
	for _, err := range errs {
		if err != nil {
			m.NotMeasured = fmt.Sprintf("%d of %d failed, first: %s", n-len(samples), n, firstLine(err.Error()))
			break
		}
	}
	return m
}

// burst creates n sandboxes at once on d and adds their latencies as a row.
func (s *suite) burst(ctx context.Context, d *daemon, subject string, n int, target bool) error {
	if err := d.settle(ctx); err != nil {
		return err
	}
	lat := newSeries(n)
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			t0 := time.Now()
			ids[i], errs[i] = d.createEcho(ctx, "")
			if errs[i] == nil {
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != "" {
			d.remove(id)
		}
	}
	m := crowdRow(Metric{Group: "start", Name: burstName(n), Subject: subject, Unit: "ms"}, lat.ms(), n, errs)
	if target {
		// The cold-start issue's target (the bench issue's was 500 ms).
		m.Target = &Target{Stat: "p99", AtMost: true, Limit: 300}
	}
	s.res.Metrics = append(s.res.Metrics, m)
	return nil
}

// zeros reads as n zero bytes, without WriteTo or ReadFrom shortcuts, so
// that the bytes travel through HTTP like a user's file would.
type zeros struct{ n int64 }

func (z *zeros) Read(b []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(b)), z.n)
	clear(b[:k])
	z.n -= k
	return int(k), nil
}

// Len lets the client send a Content-Length, as it does for files.
func (z *zeros) Len() int { return int(z.n) }

// files measures transfers through the API: one file each way, and many
// small files as a tar stream each way and as one batch request.
func (s *suite) files(ctx context.Context) error {
	sb, err := s.warm.create(ctx)
	if err != nil {
		return err
	}
	defer s.warm.remove(sb.ID)
	c := s.warm.client
	sizes := []int64{1 << 20}
	if s.cfg.bigBytes > 0 {
		sizes = append(sizes, s.cfg.bigBytes)
	}
	for _, size := range sizes {
		n := 20
		if size >= 256<<20 {
			n = 3
		}
		var up, down []float64
		for i := range n {
			// A new file each time, removed after its samples (outside the
			// clock), as an agent uploads new files: replacing a large file
			// would add the old one's removal to the sample.
			path := fmt.Sprintf("/tmp/blob%d", i)
			t0 := time.Now()
			if _, err := c.Upload(ctx, sb.ID, path, &zeros{n: size}, client.FileOptions{}); err != nil {
				return fmt.Errorf("upload %d bytes: %w", size, err)
			}
			up = append(up, float64(size)/1e6/time.Since(t0).Seconds())
			t0 = time.Now()
			rc, err := c.Download(ctx, sb.ID, path, client.FileOptions{})
			if err != nil {
				return fmt.Errorf("download %d bytes: %w", size, err)
			}
			got, err := io.Copy(io.Discard, struct{ io.Reader }{rc})
			rc.Close()
			if err != nil || got != size {
				return fmt.Errorf("download %d bytes: got %d: %v", size, got, err)
			}
			down = append(down, float64(size)/1e6/time.Since(t0).Seconds())
			if err := c.Remove(ctx, sb.ID, api.RemoveRequest{Path: path}); err != nil {
				return fmt.Errorf("remove %s: %w", path, err)
			}
		}
		label := sizeLabel(size)
		su, sd := summarize(up), summarize(down)
		target := func() *Target { return &Target{Stat: "p50", AtMost: false, Limit: 1000} }
		s.res.Metrics = append(s.res.Metrics,
			Metric{Group: "files", Name: "upload " + label + " (one file, raw stream)", Subject: "berth", Unit: "MB/s", Summary: &su, Samples: up, Target: target()},
			Metric{Group: "files", Name: "download " + label + " (one file, raw stream)", Subject: "berth", Unit: "MB/s", Summary: &sd, Samples: down, Target: target()})
	}
	if s.cfg.bigBytes > 0 {
		if m, err := diskBaseline(s.cfg.work, s.cfg.bigBytes); err == nil {
			s.res.Metrics = append(s.res.Metrics, m)
		} else {
			s.log.Warn("disk baseline", "err", err)
		}
	}
	// What the large transfers left for the disk to write back would slow
	// the small files' metadata writes: flush it first, outside any clock.
	unix.Sync()
	return s.smallFiles(ctx, sb.ID)
}

// smallFiles moves n small files (100 B to 1.1 KB, in 10 directories) in
// and out of a sandbox.
func (s *suite) smallFiles(ctx context.Context, id string) error {
	c, n := s.warm.client, s.cfg.smallFiles
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	batch := api.UploadRequest{}
	for i := range n {
		data := bytes.Repeat([]byte{'x'}, 100+i%1000)
		name := fmt.Sprintf("d%d/f%d.txt", i%10, i)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return err
		}
		tw.Write(data)
		batch.Files = append(batch.Files, api.UploadFile{Path: "/tmp/batch/" + name, Content: data})
	}
	if err := tw.Close(); err != nil {
		return err
	}
	const reps = 10
	var tarUp, tarDown, batchUp []float64
	for r := range reps {
		dir := fmt.Sprintf("/tmp/small%d", r)
		if _, err := c.Mkdir(ctx, id, api.MkdirRequest{Path: dir, Parents: true}); err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := c.UploadArchive(ctx, id, dir, bytes.NewReader(buf.Bytes()), client.FileOptions{}); err != nil {
			return fmt.Errorf("tar upload: %w", err)
		}
		tarUp = append(tarUp, ms(time.Since(t0)))
		t0 = time.Now()
		rc, err := c.DownloadArchive(ctx, id, dir, client.FileOptions{})
		if err != nil {
			return fmt.Errorf("tar download: %w", err)
		}
		files, err := countTar(rc)
		rc.Close()
		if err != nil || files != n {
			return fmt.Errorf("tar download: %d files, want %d: %v", files, n, err)
		}
		tarDown = append(tarDown, ms(time.Since(t0)))
		t0 = time.Now()
		res, err := c.UploadFiles(ctx, id, batch)
		if err != nil {
			return fmt.Errorf("batch upload: %w", err)
		}
		batchUp = append(batchUp, ms(time.Since(t0)))
		for _, f := range res.Results {
			if f.Error != nil {
				return fmt.Errorf("batch upload %s: %s", f.Path, f.Error.Message)
			}
		}
		if err := c.Remove(ctx, id, api.RemoveRequest{Path: dir, Recursive: true}); err != nil {
			return err
		}
	}
	what := fmt.Sprintf("%d small files", n)
	for _, row := range []struct {
		name    string
		samples []float64
	}{
		{"upload " + what + " (one tar stream)", tarUp},
		{"download " + what + " (one tar stream)", tarDown},
		{"upload " + what + " (one batch request)", batchUp},
	} {
		sum := summarize(row.samples)
		s.res.Metrics = append(s.res.Metrics, Metric{Group: "files", Name: row.name, Subject: "berth", Unit: "ms", Summary: &sum, Samples: row.samples})
	}
	return nil
}

func countTar(r io.Reader) (int, error) {
	tr := tar.NewReader(r)
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if h.Typeflag == tar.TypeReg {
			n++
		}
	}
}

// diskBaseline is the host writing the same amount to the scratch
// directory's file system, for scale.
func diskBaseline(dir string, size int64) (Metric, error) {
	var rates []float64
	buf := make([]byte, 1<<20)
	for range 3 {
		f, err := os.CreateTemp(dir, "disk-*")
		if err != nil {
			return Metric{}, err
		}
		t0 := time.Now()
		for w := int64(0); w < size; w += int64(len(buf)) {
			if _, err := f.Write(buf); err != nil {
				f.Close()
				os.Remove(f.Name())
				return Metric{}, err
			}
		}
		f.Close()
		rates = append(rates, float64(size)/1e6/time.Since(t0).Seconds())
		os.Remove(f.Name())
	}
	sum := summarize(rates)
	return Metric{Group: "files", Name: "baseline: the host writing " + sizeLabel(size) + " to a file (page cache, same disk)", Subject: "host", Unit: "MB/s", Summary: &sum, Samples: rates}, nil
}

// densityOf boots idle sandboxes one after another on the daemon without a
// pool and measures the memory they take and how create latency changes.
func (s *suite) densityOf(ctx context.Context) error {
	n := s.cfg.density
	d := s.cold
	unix.Sync() // nothing left to write back from earlier measurements
	before := memAvailable()
	lat := make([]float64, 0, n)
	ids := make([]string, 0, n)
	defer func() {
		for _, id := range ids {
			d.remove(id)
		}
	}()
	for range n {
		t0 := time.Now()
		sb, err := d.create(ctx)
		if err != nil {
			s.res.Metrics = append(s.res.Metrics, Metric{Group: "density", Name: fmt.Sprintf("%d idle sandboxes", n), Subject: "berth",
				NotMeasured: fmt.Sprintf("create %d failed: %v", len(ids)+1, err)})
			return nil
		}
		lat = append(lat, ms(time.Since(t0)))
		ids = append(ids, sb.ID)
	}
	time.Sleep(2 * time.Second) // let the guests finish starting and settle
	after := memAvailable()
	rss, pss, procs := guestMemory(ids)
	var charged int64
	for _, id := range ids {
		u, err := d.client.Stats(ctx, id)
		if err != nil {
			return fmt.Errorf("stats of %s: %w", id, err)
		}
		charged += u.MemoryBytes
	}
	per := func(v int64) *float64 { x := float64(v) / float64(n) / (1 << 20); return &x }
	k := min(20, n)
	first, last := summarize(lat[:k]), summarize(lat[n-k:])
	growth := last.P50 / first.P50
	s.res.Metrics = append(s.res.Metrics,
		Metric{Group: "density", Name: fmt.Sprintf("memory per idle sandbox: drop in host MemAvailable / %d", n), Subject: "berth", Unit: "MiB", Value: per(before - after),
			Target: &Target{Stat: "value", AtMost: true, Limit: 8}},
		Metric{Group: "density", Name: "memory per idle sandbox: charged to its memory cgroup (kernel objects, page cache, processes)", Subject: "berth", Unit: "MiB", Value: per(charged)},
		Metric{Group: "density", Name: fmt.Sprintf("memory per idle sandbox: guest PSS (%d guest processes, shared pages split)", procs), Subject: "berth", Unit: "MiB", Value: per(pss)},
		Metric{Group: "density", Name: "memory per idle sandbox: guest RSS (shared binary pages counted in each)", Subject: "berth", Unit: "MiB", Value: per(rss)},
		Metric{Group: "density", Name: fmt.Sprintf("create (no warm pool), sandboxes 1–%d", k), Subject: "berth", Unit: "ms", Summary: &first},
		Metric{Group: "density", Name: fmt.Sprintf("create (no warm pool), sandboxes %d–%d", n-k+1, n), Subject: "berth", Unit: "ms", Summary: &last},
		Metric{Group: "density", Name: fmt.Sprintf("create latency growth: p50 of the last %d over the first %d", k, k), Subject: "berth", Unit: "×", Value: &growth},
	)
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func sizeLabel(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

func memAvailable() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}

// guestMemory sums the resident and proportional memory of the processes
// in the cgroups of the given sandboxes (their guests, when idle).
func guestMemory(ids []string) (rss, pss int64, procs int) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cg, err := os.ReadFile(d + "/cgroup")
		if err != nil || !inSandbox(string(cg), want) {
			continue
		}
		b, err := os.ReadFile(d + "/smaps_rollup")
		if err != nil {
			continue
		}
		procs++
		for _, line := range strings.Split(string(b), "\n") {
			var kb int64
			if _, err := fmt.Sscanf(line, "Rss: %d kB", &kb); err == nil {
				rss += kb << 10
			}
			if _, err := fmt.Sscanf(line, "Pss: %d kB", &kb); err == nil {
				pss += kb << 10
			}
		}
	}
	return rss, pss, procs
}

// inSandbox says whether a /proc/PID/cgroup text places the process in the
// cgroup of one of the sandboxes (berth's groups end in the sandbox id).
func inSandbox(cgroups string, ids map[string]bool) bool {
	for _, line := range strings.Split(cgroups, "\n") {
		if i := strings.LastIndexByte(line, '/'); i >= 0 && ids[line[i+1:]] {
			return true
		}
	}
	return false
}
