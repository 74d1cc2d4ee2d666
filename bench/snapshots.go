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

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
)

// The snapshots bench measures snapshot, fork and diff on a daemon with a
// warm pool of 2 of the host image: of a fresh sandbox, and of one that
// changed 100 MiB in 1,000 files, beside `cp -a` of that sandbox's
// writable layer on the same disk (the copy a snapshot makes without
// reflinks). Samples of the snapshot and of cp -a alternate within each
// round. A process in the changed sandbox keeps a tight loop and records
// the longest gap it saw between two turns: the freeze as it felt it.

// snapFS is a file system the snapshots step runs a daemon's state on.
type snapFS struct {
	name string // in the rows: "host ext4 (no journal)", …
	mkfs []string
	// work is where the daemon's state goes ("": the bench's work dir).
	work string
}

// snapshots runs the measurements with the daemon's state on the bench's
// own disk, and again on file systems made in image files on that disk:
// a journaled ext4 (most hosts' default) and an XFS with reflinks, where
// a snapshot shares its blocks with the sandbox's layer. The diff of
// 10,000 files runs on the first only.
func (s *suite) snapshots(ctx context.Context) error {
	var st unix.Statfs_t
	host := "the bench's disk"
	if unix.Statfs(s.cfg.work, &st) == nil {
		switch st.Type {
		case unix.EXT4_SUPER_MAGIC:
			host = "host ext4"
			if b, err := os.ReadFile("/proc/mounts"); err == nil && !journaled(string(b), s.cfg.work) {
				host += " (no journal)"
			}
		case unix.XFS_SUPER_MAGIC:
			host = "host XFS"
		}
	}
	fss := []snapFS{{name: host}}
	if !s.cfg.snapHostOnly {
		fss = append(fss,
			snapFS{name: "ext4 image (journaled)", mkfs: []string{"mkfs.ext4", "-q", "-F", "-m", "0"}},
			snapFS{name: "XFS image (reflink=1)", mkfs: []string{"mkfs.xfs", "-q", "-f", "-m", "reflink=1"}})
	}
	for i, fs := range fss {
		if fs.mkfs != nil {
			dir, cleanup, err := mountImage(ctx, s.cfg.work, fmt.Sprintf("snapfs-%d", i), fs.mkfs, 4<<30)
			if err != nil {
				s.log.Warn("snapshots: no "+fs.name, "err", err)
				s.res.Metrics = append(s.res.Metrics, Metric{Group: "snapshots", Name: "snapshot of a changed sandbox", Subject: "berth, " + fs.name,
					Unit: "ms", NotMeasured: firstLine(err.Error())})
				continue
			}
			fs.work = dir
			err = s.snapshotsOn(ctx, fs, false)
			cleanup()
			if err != nil {
				return err
			}
			continue
		}
		fs.work = s.cfg.work
		if err := s.snapshotsOn(ctx, fs, true); err != nil {
			return err
		}
	}
	return nil
}

// journaled says whether the ext4 mount that holds dir has a journal:
// jbd2 lists each journal it runs as /proc/fs/jbd2/<device>-<inode>.
func journaled(mounts, dir string) bool {
	best, dev := "", ""
	for _, line := range strings.Split(mounts, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "ext4" {
			continue
		}
		if strings.HasPrefix(dir, f[1]) && len(f[1]) > len(best) {
			best, dev = f[1], filepath.Base(f[0])
		}
	}
	found, _ := filepath.Glob("/proc/fs/jbd2/" + dev + "-*")
	return len(found) > 0
}

// mountImage makes a file system of size bytes with mkfs in a sparse file
// in work and mounts it; cleanup unmounts it and removes both.
func mountImage(ctx context.Context, work, name string, mkfs []string, size int64) (string, func(), error) {
	img, dir := filepath.Join(work, name+".img"), filepath.Join(work, name)
	f, err := os.Create(img)
	if err != nil {
		return "", nil, err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		os.Remove(img)
		return "", nil, err
	}
	if out, err := exec.CommandContext(ctx, mkfs[0], append(mkfs[1:], img)...).CombinedOutput(); err != nil {
		os.Remove(img)
		return "", nil, fmt.Errorf("%s: %v: %s", mkfs[0], err, strings.TrimSpace(string(out)))
	}
	os.MkdirAll(dir, 0o711)
	if out, err := exec.CommandContext(ctx, "mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		os.Remove(img)
		return "", nil, fmt.Errorf("mount: %v: %s", err, strings.TrimSpace(string(out)))
	}
	os.Chmod(dir, 0o711)
	return dir, func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "umount %s: %v: %s\n", dir, err, out)
		}
		os.Remove(dir)
		os.Remove(img)
	}, nil
}

func (s *suite) snapshotsOn(ctx context.Context, fs snapFS, withDiff bool) (err error) {
	d, err := startDaemon(ctx, s.cfg.berth, fs.work, "berth-snapshots", 2, s.log)
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
	// The recorder counts gaps from half a second after it started (its
	// own start-up is not the snapshots').
	gap := `import time
m = 0.0
t = time.monotonic()
begin = t + 0.5
while True:
    time.sleep(0.0005)
    n = time.monotonic()
    if n > begin and n - t > m:
        m = n - t
        with open('/home/user/gap.tmp', 'w') as f:
            f.write('%.3f' % (m * 1000))
        import os; os.rename('/home/user/gap.tmp', '/home/user/gap')
    t = n
`
	if _, err := d.client.StartProcess(ctx, big.ID, api.ExecRequest{Cmd: []string{"python3", "-c", gap}}); err != nil {
		return fmt.Errorf("start the gap recorder: %w", err)
	}
	time.Sleep(700 * time.Millisecond)
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
	var listed int
	if withDiff {
		many, err := d.create(ctx)
		if err != nil {
			return err
		}
		mk := fmt.Sprintf(`mkdir -p /home/user/many && cd /home/user/many && for i in $(seq 1 %d); do echo $i > f$i; done`, diffFiles)
		if r, err := d.client.Exec(ctx, many.ID, api.ExecRequest{Shell: mk, TimeoutMs: 300000}); err != nil || r.ExitCode != 0 {
			return fmt.Errorf("make %d files: %v %s", diffFiles, err, r.Stderr)
		}
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
	}
	gapMs := -1.0
	if b, err := d.client.ReadFile(ctx, big.ID, "/home/user/gap"); err == nil {
		gapMs, _ = strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	}

	note := strings.Join(failures, "; ")
	add := func(name, subject string, got series, t *Target) {
		m := Metric{Group: "snapshots", Name: name, Subject: subject + ", " + fs.name, Unit: "ms", Target: t}
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
	ratio := Metric{Group: "snapshots", Name: "snapshot over `cp -a` of the same layer, per round", Subject: "berth, " + fs.name, Unit: "×",
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
	if withDiff {
		add(fmt.Sprintf("diff of a sandbox that changed %d files (JSON list, %d changes)", diffFiles, listed), "berth", diffs, &Target{Stat: "p50", AtMost: true, Limit: 200})
	}
	fm := Metric{Group: "snapshots", Name: "freeze of the running sandbox per snapshot (the daemon's frozen_ms)", Subject: "berth, " + fs.name, Unit: "ms"}
	if len(frozen) > 0 {
		sum := summarize(frozen)
		fm.Summary, fm.Samples = &sum, frozen
	}
	s.res.Metrics = append(s.res.Metrics, fm)
	gm := Metric{Group: "snapshots", Name: "longest stall a running process saw across every snapshot and fork (its own clock, 0.5 ms sleeps)", Subject: "berth, " + fs.name, Unit: "ms"}
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
