package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthsh/berth/api"
)

// churn is the loop of many clients at once, each creating a sandbox,
// running true in it and deleting it, again and again, on the default
// daemon (its warm pool refilling behind them), for churnWindow or
// churnMax creates, whichever comes first. Then the leak check: every
// sandbox the bursts and the loop made and deleted has left nothing on
// the host (directory, cgroup, mount). Then the same clients loop on each
// crowd peer, a third of the window each: there a turn is one whole
// environment (start, `echo hi`, exit), since bwrap has no exec into a
// running one and an OCI runtime's run is its create, start and delete.
func (s *suite) churn(ctx context.Context, subjects []subject) error {
	d := s.warm
	if err := d.settle(ctx); err != nil {
		return err
	}
	n := s.cfg.churnClients
	type lats struct{ create, exec, del, turn []float64 }
	per := make([]lats, n)
	var made, failed atomic.Int64
	var firstErr atomic.Pointer[string]
	fail := func(err error) {
		failed.Add(1)
		msg := firstLine(err.Error())
		firstErr.CompareAndSwap(nil, &msg)
	}
	lctx, cancel := context.WithTimeout(ctx, s.cfg.churnWindow)
	defer cancel()
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Go(func() {
			for lctx.Err() == nil && made.Add(1) <= int64(s.cfg.churnMax) {
				t := time.Now()
				sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
				if err != nil {
					fail(err)
					continue
				}
				d.track(sb.ID)
				per[i].create = append(per[i].create, ms(time.Since(t)))
				t = time.Now()
				if err := d.execTrue(ctx, sb.ID); err != nil {
					fail(err)
				} else {
					per[i].exec = append(per[i].exec, ms(time.Since(t)))
				}
				t = time.Now()
				if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
					fail(err)
					continue
				}
				per[i].del = append(per[i].del, ms(time.Since(t)))
				if len(per[i].exec) > 0 && len(per[i].exec) == len(per[i].del) {
					last := func(v []float64) float64 { return v[len(v)-1] }
					per[i].turn = append(per[i].turn, last(per[i].create)+last(per[i].exec)+last(per[i].del))
				}
				d.untrack(sb.ID)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	var all lats
	for _, p := range per {
		all.create = append(all.create, p.create...)
		all.exec = append(all.exec, p.exec...)
		all.del = append(all.del, p.del...)
		all.turn = append(all.turn, p.turn...)
	}
	name := func(what string) string {
		return fmt.Sprintf("%d clients in a create/exec/delete loop (%d loops in %.0f s), %s", n, len(all.del), elapsed.Seconds(), what)
	}
	for _, row := range []struct {
		what    string
		samples []float64
		target  *Target
	}{
		{"create", all.create, &Target{Stat: "p99", AtMost: true, Limit: 150}},
		{"exec of true", all.exec, nil},
		{"delete", all.del, nil},
	} {
		sum := summarize(row.samples)
		m := Metric{Group: "start", Name: name(row.what), Subject: "berth", Unit: "ms", Summary: &sum, Target: row.target}
		if f := failed.Load(); f > 0 {
			m.NotMeasured = fmt.Sprintf("%d calls failed, first: %s", f, *firstErr.Load())
		}
		if len(row.samples) == 0 {
			m.Summary = nil
		}
		s.res.Metrics = append(s.res.Metrics, m)
	}
	if err := s.leakCheck(ctx, d); err != nil {
		return err
	}
	turns := Metric{Group: "start", Name: turnName(n), Subject: "berth", Unit: "ms", Note: "create, exec of true, delete"}
	s.res.Metrics = append(s.res.Metrics, crowdRow(turns, all.turn, len(all.turn), nil))
	for _, sub := range crowdPeers(subjects) {
		s.res.Metrics = append(s.res.Metrics, s.peerLoop(ctx, sub, n, s.cfg.churnWindow/3))
	}
	return nil
}

// turnName is the row name of a whole turn of the loop of n clients.
func turnName(n int) string {
	return fmt.Sprintf("%d clients in a loop, a whole turn", n)
}

// peerLoop runs sub's once from n clients at once, each in a loop, for
// window or churnMax turns, and returns the turns' latencies as a row.
func (s *suite) peerLoop(ctx context.Context, sub subject, n int, window time.Duration) Metric {
	m := Metric{Group: "start", Name: turnName(n), Subject: sub.name, Unit: "ms", Note: "start, `echo hi`, exit"}
	if sub.why != "" {
		m.NotMeasured = sub.why
		return m
	}
	lctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	per := make([][]float64, n)
	errs := make([]error, n) // each client's first failure
	fails := make([]int, n)
	var turns atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for lctx.Err() == nil && turns.Add(1) <= int64(s.cfg.churnMax) {
				t := time.Now()
				undo, err := sub.once(ctx)
				if undo != nil {
					undo()
				}
				if err != nil {
					if fails[i]++; errs[i] == nil {
						errs[i] = err
					}
					continue
				}
				per[i] = append(per[i], ms(time.Since(t)))
			}
		})
	}
	wg.Wait()
	var all []float64
	failed := 0
	for i, p := range per {
		all = append(all, p...)
		failed += fails[i]
	}
	return crowdRow(m, all, len(all)+failed, errs)
}

// leakCheck looks, for every sandbox the bench deleted on d, for what it
// could have left on the host: its directory in the daemon's state, a
// cgroup, a mount. It is a row: the count of leftovers, target 0.
func (s *suite) leakCheck(ctx context.Context, d *daemon) error {
	d.mu.Lock()
	ids := append([]string(nil), d.deleted...)
	d.mu.Unlock()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var cgroups []string
	for _, pat := range []string{"/sys/fs/cgroup/*/berth/*", "/sys/fs/cgroup/berth/*"} {
		m, _ := filepath.Glob(pat)
		cgroups = append(cgroups, m...)
	}
	dirs, _ := filepath.Glob(filepath.Join(d.state, "runtimes", "*", "sandboxes", "*"))
	var left []string
	for _, id := range ids {
		for _, p := range append(append([]string(nil), cgroups...), dirs...) {
			if filepath.Base(p) == id {
				left = append(left, p)
			}
		}
		sc := bufio.NewScanner(strings.NewReader(string(mounts)))
		for sc.Scan() {
			if strings.Contains(sc.Text(), "/"+id+"/") || strings.HasSuffix(strings.Fields(sc.Text())[4], "/"+id) {
				left = append(left, "mount "+strings.Fields(sc.Text())[4])
			}
		}
	}
	v := float64(len(left))
	m := Metric{Group: "start", Name: fmt.Sprintf("what %d deleted sandboxes left on the host (directories, cgroups, mounts), after the bursts and the loop", len(ids)),
		Subject: "berth", Unit: "count", Value: &v, Target: &Target{Stat: "value", AtMost: true, Limit: 0}}
	if len(left) > 0 {
		m.Note = "first: " + left[0]
	}
	s.res.Metrics = append(s.res.Metrics, m)
	return nil
}
