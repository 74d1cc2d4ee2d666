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
// the host (directory, cgroup, mount).
func (s *suite) churn(ctx context.Context) error {
	d := s.warm
	if err := d.settle(ctx); err != nil {
		return err
	}
	n := s.cfg.churnClients
	type lats struct{ create, exec, del []float64 }
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
	return s.leakCheck(ctx, d)
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
