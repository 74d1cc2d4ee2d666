package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
)

// The snapshots bench measures snapshot, fork and diff on a daemon with a
// warm pool of 2 of the host image: of a fresh sandbox, and of one that
// changed 100 MiB in 1,000 files, beside `cp -a` of that sandbox's
// writable layer on the same disk (the copy a snapshot makes without
// reflinks). Samples of the snapshot and of cp -a alternate within each
// round. A process in the changed sandbox keeps a tight loop and records
// the longest gap it saw between two turns: the freeze as it felt it.

func (s *suite) snapshots(ctx context.Context) (err error) {
	d, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-snapshots", 2, s.log)
	if err != nil {
		return err
	}
	defer d.close()
	if err := d.settle(ctx); err != nil {
		return err
	}
	rounds, snapFiles, diffFiles := s.cfg.snapRounds, s.cfg.snapFiles, s.cfg.diffFiles
	snapFileBytes := s.cfg.snapBytes / int64(snapFiles)
	fresh, err := d.create(ctx)
	if err != nil {
		return err
	}
	big, err := d.createFrom(ctx, api.CreateSandboxRequest{Limits: api.Limits{MemoryBytes: 1 << 30}})
	if err != nil {
		return err
	}
	// Files of random bytes (one seed, each made distinct by its number).
	fill := fmt.Sprintf(`mkdir -p /home/user/data && cd /home/user/data && head -c %d /dev/urandom > seed &&
		for i in $(seq 1 %d); do mkdir -p d$((i %% 10)); cp seed d$((i %% 10))/f$i; echo $i >> d$((i %% 10))/f$i; done && rm seed`, snapFileBytes-8, snapFiles)
	if r, err := d.client.Exec(ctx, big.ID, api.ExecRequest{Shell: fill, TimeoutMs: 120000}); err != nil || r.ExitCode != 0 {
		return fmt.Errorf("fill the sandbox: %v %s", err, r.Stderr)
	}
	gap := `import time
m = 0.0
t = time.monotonic()
while True:
    time.sleep(0.0005)
    n = time.monotonic()
    if n - t > m:
        m = n - t
        with open('/home/user/gap.tmp', 'w') as f:
            f.write('%.3f' % (m * 1000))
        import os; os.rename('/home/user/gap.tmp', '/home/user/gap')
    t = n
`
	if _, err := d.client.StartProcess(ctx, big.ID, api.ExecRequest{Cmd: []string{"python3", "-c", gap}}); err != nil {
		return fmt.Errorf("start the gap recorder: %w", err)
	}
	time.Sleep(500 * time.Millisecond) // its gaps at start-up are not the snapshots'
	if _, err := d.client.Exec(ctx, big.ID, api.ExecRequest{Shell: "rm -f /home/user/gap"}); err != nil {
		return err
	}
	upper := filepath.Join(d.state, "runtimes", "native", "sandboxes", big.ID, "upper")
	cpDir := filepath.Join(d.state, "cp-a")

	var (
		snapFresh, forkFresh, snapBig, forkBig, cpBig, fork10, diffs series = newSeries(rounds), newSeries(rounds), newSeries(rounds), newSeries(rounds), newSeries(rounds), newSeries(rounds), newSeries(rounds)
		frozen                                                       []float64
		failures                                                     []string
	)
	fail := func(what string, err error) {
		if len(failures) < 3 {
			failures = append(failures, what+": "+firstLine(err.Error()))
		}
		s.log.Warn("sample failed", "what", what, "err", err)
	}
	snap := func(id, name string, into series, r int) {
		t0 := time.Now()
		sn, err := d.client.CreateSnapshot(ctx, id, api.CreateSnapshotRequest{Name: name})
		if err != nil {
			fail("snapshot", err)
			return
		}
		into[r] = time.Since(t0)
		if sn.FrozenMs > 0 {
			frozen = append(frozen, sn.FrozenMs)
		}
		if err := d.client.DeleteSnapshot(ctx, name); err != nil {
			fail("delete snapshot", err)
		}
	}
	fork := func(id string, n int, into series, r int) {
		t0 := time.Now()
		res, err := d.client.Fork(ctx, id, api.ForkRequest{Count: n})
		if err != nil {
			fail("fork", err)
			return
		}
		into[r] = time.Since(t0)
		for _, sb := range res.Sandboxes {
			d.track(sb.ID)
			d.remove(sb.ID)
		}
	}
	for r := range rounds {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d.settle(ctx)
		snap(fresh.ID, "fresh", snapFresh, r)
		d.settle(ctx)
		fork(fresh.ID, 1, forkFresh, r)
		// Alternate which of the two copies goes first.
		copyBig := func() {
			os.RemoveAll(cpDir)
			t0 := time.Now()
			if out, err := exec.CommandContext(ctx, "cp", "-a", upper, cpDir).CombinedOutput(); err != nil {
				fail("cp -a", fmt.Errorf("%v: %s", err, out))
				return
			}
			cpBig[r] = time.Since(t0)
			os.RemoveAll(cpDir)
		}
		if r%2 == 0 {
			copyBig()
			snap(big.ID, "big", snapBig, r)
		} else {
			snap(big.ID, "big", snapBig, r)
			copyBig()
		}
		d.settle(ctx)
		fork(big.ID, 1, forkBig, r)
	}
	for r := range min(rounds, 5) { // ten copies at a time: a few rounds
		d.settle(ctx)
		fork(big.ID, 10, fork10, r)
	}
	// Diff: a sandbox that changed 10,000 small files.
	many, err := d.create(ctx)
	if err != nil {
		return err
	}
	mk := fmt.Sprintf(`mkdir -p /home/user/many && cd /home/user/many && for i in $(seq 1 %d); do echo $i > f$i; done`, diffFiles)
	if r, err := d.client.Exec(ctx, many.ID, api.ExecRequest{Shell: mk, TimeoutMs: 300000}); err != nil || r.ExitCode != 0 {
		return fmt.Errorf("make %d files: %v %s", diffFiles, err, r.Stderr)
	}
	var listed int
	for r := range rounds {
		t0 := time.Now()
		res, err := d.client.Diff(ctx, many.ID, "")
		if err != nil {
			fail("diff", err)
			continue
		}
		diffs[r] = time.Since(t0)
		listed = len(res.Changes)
	}
	gapMs := -1.0
	if b, err := d.client.ReadFile(ctx, big.ID, "/home/user/gap"); err == nil {
		gapMs, _ = strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	}

	note := strings.Join(failures, "; ")
	add := func(name, subject string, got series, t *Target) {
		m := Metric{Group: "snapshots", Name: name, Subject: subject, Unit: "ms", Target: t}
		if samples := got.ms(); len(samples) > 0 {
			sum := summarize(samples)
			m.Summary, m.Samples = &sum, samples
		} else {
			m.NotMeasured = "every sample failed: " + note
		}
		s.res.Metrics = append(s.res.Metrics, m)
	}
	changed := fmt.Sprintf("a sandbox that changed %s in %d files, a process running", mib(int64(snapFiles)*snapFileBytes), snapFiles)
	add("snapshot of a fresh sandbox (API call to answer)", "berth", snapFresh, &Target{Stat: "p50", AtMost: true, Limit: 10})
	add("fork of a fresh sandbox, 1 copy running (from the warm pool)", "berth", forkFresh, &Target{Stat: "p50", AtMost: true, Limit: 10})
	add("snapshot of "+changed, "berth", snapBig, &Target{Stat: "p50", AtMost: true, Limit: 150})
	add("the same sandbox's writable layer copied with `cp -a` on the same disk", "cp -a", cpBig, nil)
	ratio := Metric{Group: "snapshots", Name: "snapshot over `cp -a` of the same layer, per round", Subject: "berth", Unit: "×",
		Target: &Target{Stat: "p50", AtMost: true, Limit: 1}}
	if r := ratios(snapBig, cpBig); len(r) > 0 {
		sum := summarize(r)
		ratio.Summary, ratio.Samples = &sum, r
	} else {
		ratio.NotMeasured = "no round with both"
	}
	s.res.Metrics = append(s.res.Metrics, ratio)
	add("fork of "+changed+", 1 copy running", "berth", forkBig, &Target{Stat: "p50", AtMost: true, Limit: 150})
	add("fork of "+changed+", 10 copies running", "berth", fork10, nil)
	add(fmt.Sprintf("diff of a sandbox that changed %d files (JSON list, %d changes)", diffFiles, listed), "berth", diffs, &Target{Stat: "p50", AtMost: true, Limit: 200})
	fm := Metric{Group: "snapshots", Name: "freeze of the running sandbox per snapshot (the daemon's frozen_ms)", Subject: "berth", Unit: "ms"}
	if len(frozen) > 0 {
		sum := summarize(frozen)
		fm.Summary, fm.Samples = &sum, frozen
	}
	s.res.Metrics = append(s.res.Metrics, fm)
	gm := Metric{Group: "snapshots", Name: "longest stall a running process saw across every snapshot and fork (its own clock, 0.5 ms sleeps)", Subject: "berth", Unit: "ms"}
	if gapMs >= 0 {
		gm.Value = &gapMs
	} else {
		gm.NotMeasured = "the recorder wrote nothing"
	}
	s.res.Metrics = append(s.res.Metrics, gm)
	if slices.ContainsFunc(s.res.Metrics, func(m Metric) bool { return m.Group == "snapshots" && m.NotMeasured != "" }) {
		s.log.Warn("snapshots: some samples failed", "first", note)
	}
	return nil
}
