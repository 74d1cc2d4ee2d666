package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
)

// The gvisor step measures berth's gvisor runtime against runsc itself,
// the same gVisor at the same version and platform: create → first output
// beside `runsc run` of the same program, exec beside `runsc exec`, both
// interleaved; then pause with memory (runsc checkpoint) and resume
// (runsc restore) of an idle sandbox and of one holding 512 MiB, and the
// memory an idle gvisor sandbox takes.

// gvisor runs the step on daemons of its own whose default runtime is
// gvisor: one with a warm pool of 2, one without.
func (s *suite) gvisor(ctx context.Context) error {
	const group = "gvisor"
	flags := []string{"--default-runtime", "gvisor", "--runsc", s.cfg.runsc}
	warm, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-gvisor-warm", 2, s.log, flags...)
	if err != nil {
		s.res.Metrics = append(s.res.Metrics, Metric{Group: group, Name: "create → first exec output (`echo hi`)", Subject: "berth gvisor",
			Unit: "ms", NotMeasured: firstLine(err.Error())})
		return nil
	}
	defer warm.close()
	cold, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-gvisor-cold", 0, s.log, flags...)
	if err != nil {
		return err
	}
	defer cold.close()
	rootfs, err := makeRootfs(s.cfg.work)
	if err != nil {
		return fmt.Errorf("runsc's root file system: %w", err)
	}
	runsc := ociRuntime{name: "runsc", path: s.cfg.runsc, global: []string{"--platform=systrap", "--network=none"}, detach: "--detach",
		install: "not installed (make runsc builds the pinned one)"}
	subjects := []subject{
		apiSubject("berth gvisor", warm, false),
		apiSubject("berth gvisor, no warm pool", cold, false),
		ociSubject(runsc, s.cfg.work, rootfs),
	}
	subjects[1].boot = nil
	for i := range subjects {
		subjects[i] = probe(ctx, subjects[i])
	}
	settle := func(ctx context.Context) error { return warm.settle(ctx) }
	got := s.interleave(ctx, measurable(subjects), s.cfg.rounds, settle, func(ctx context.Context, sub subject) (func(), error) { return sub.once(ctx) })
	s.res.Metrics = append(s.res.Metrics, rows(group, "create → first exec output (`echo hi`), sequential", subjects, got, "berth gvisor", s.cfg.rounds, map[string]*Target{
		"runsc run": {Stat: "ratio_p50", AtMost: true, Limit: 1},
	})...)
	if err := s.gvisorExecs(ctx, subjects); err != nil {
		return err
	}
	if err := s.checkpoints(ctx, cold); err != nil {
		return err
	}
	return s.gvisorMemory(ctx, cold)
}

// gvisorExecs measures exec of true in a running gvisor sandbox beside
// runsc exec into a running container.
func (s *suite) gvisorExecs(ctx context.Context, subjects []subject) error {
	envs, live, shown := bootAll(ctx, subjects)
	defer stopAll(envs)
	got := s.interleave(ctx, live, s.cfg.execRounds, nil, func(ctx context.Context, sub subject) (func(), error) {
		return nil, envs[sub.name].exec(ctx)
	})
	s.res.Metrics = append(s.res.Metrics, rows("gvisor", "exec round trip (`true`) in a running sandbox", shown, got, "berth gvisor", s.cfg.execRounds, map[string]*Target{
		"runsc run": {Stat: "ratio_p50", AtMost: true, Limit: 0.2},
	})...)
	// The floor under both: a fork and exec of true inside gVisor's kernel,
	// timed by a process inside, no host round trip at all.
	if env, ok := envs["berth gvisor"]; ok && env.id != "" {
		var floor []float64
		for range 5 {
			r, err := env.d.client.Exec(ctx, env.id, api.ExecRequest{Cmd: []string{"python3", "-c",
				"import subprocess,time\nt=time.perf_counter()\nfor _ in range(40): subprocess.run(['/usr/bin/true'])\nprint((time.perf_counter()-t)/40*1000)"}})
			var v float64
			if err == nil && r.ExitCode == 0 {
				if _, err := fmt.Sscan(string(r.Stdout), &v); err == nil {
					floor = append(floor, v)
				}
			}
		}
		if len(floor) > 0 {
			sum := summarize(floor)
			s.res.Metrics = append(s.res.Metrics, Metric{Group: "gvisor", Name: "fork + exec of `true` inside gVisor, timed inside (the floor of both rows above; 5 runs of 40)",
				Subject: "berth gvisor", Unit: "ms", Summary: &sum, Samples: floor})
		}
	}
	return nil
}

// checkpoints measures pause with memory and resume of an idle gvisor
// sandbox and of one whose process holds 512 MiB, several rounds each.
func (s *suite) checkpoints(ctx context.Context, d *daemon) error {
	for _, c := range []struct {
		what, setup string
	}{
		{"idle", ""},
		{"512 MiB resident", `b = b"x" * (512 << 20); import time; open("/tmp/ready", "w").close(); time.sleep(1e6)`},
	} {
		sb, err := d.createFrom(ctx, api.CreateSandboxRequest{Limits: api.Limits{MemoryBytes: 1 << 30}})
		if err != nil {
			return err
		}
		if c.setup != "" {
			if _, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", c.setup}}); err != nil {
				d.remove(sb.ID)
				return err
			}
			if r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Shell: "for i in $(seq 300); do [ -e /tmp/ready ] && exit 0; sleep 0.1; done; exit 1"}); err != nil || r.ExitCode != 0 {
				d.remove(sb.ID)
				return fmt.Errorf("the 512 MiB process did not start: %v", err)
			}
		}
		var pause, resume []float64
		var held float64
		for range s.cfg.gvisorRounds {
			if u, err := d.client.Stats(ctx, sb.ID); err == nil {
				held = float64(u.MemoryBytes) / (1 << 20)
			}
			t0 := time.Now()
			if _, err := d.client.PauseMemory(ctx, sb.ID); err != nil {
				d.remove(sb.ID)
				return fmt.Errorf("pause with memory: %w", err)
			}
			pause = append(pause, ms(time.Since(t0)))
			t0 = time.Now()
			if _, err := d.client.Resume(ctx, sb.ID); err != nil {
				d.remove(sb.ID)
				return fmt.Errorf("resume: %w (daemon log: %s)", err, logTail(filepath.Join(s.cfg.work, "berth-gvisor-cold.log")))
			}
			resume = append(resume, ms(time.Since(t0)))
		}
		d.remove(sb.ID)
		ps, rs := summarize(pause), summarize(resume)
		note := fmt.Sprintf("the sandbox's cgroup held %.0f MiB before the last pause", held)
		s.res.Metrics = append(s.res.Metrics,
			Metric{Group: "gvisor", Name: "pause with memory (runsc checkpoint), " + c.what, Subject: "berth gvisor", Unit: "ms", Summary: &ps, Samples: pause, Note: note},
			Metric{Group: "gvisor", Name: "resume from memory (runsc restore), " + c.what, Subject: "berth gvisor", Unit: "ms", Summary: &rs, Samples: resume})
	}
	return nil
}

// gvisorMemory measures the memory of idle gvisor sandboxes: what their
// cgroups hold (gVisor's kernel and file server with the guest) and the
// PSS of their processes.
func (s *suite) gvisorMemory(ctx context.Context, d *daemon) error {
	n := s.cfg.gvisorDensity
	var ids []string
	defer func() {
		for _, id := range ids {
			d.remove(id)
		}
	}()
	for range n {
		sb, err := d.create(ctx)
		if err != nil {
			return err
		}
		ids = append(ids, sb.ID)
	}
	time.Sleep(2 * time.Second)
	var charged int64
	for _, id := range ids {
		u, err := d.client.Stats(ctx, id)
		if err != nil {
			return fmt.Errorf("stats of %s: %w", id, err)
		}
		charged += u.MemoryBytes
	}
	_, pss, procs := guestMemory(ids)
	per := func(v int64) *float64 { x := float64(v) / float64(n) / (1 << 20); return &x }
	s.res.Metrics = append(s.res.Metrics,
		Metric{Group: "gvisor", Name: fmt.Sprintf("memory per idle gvisor sandbox: charged to its memory cgroup (%d sandboxes)", n), Subject: "berth gvisor", Unit: "MiB", Value: per(charged)},
		Metric{Group: "gvisor", Name: fmt.Sprintf("memory per idle gvisor sandbox: PSS of its processes (%d: sentry, gofer, stubs)", procs), Subject: "berth gvisor", Unit: "MiB", Value: per(pss)})
	return nil
}

// logTail is the last lines of a daemon's log that say something went wrong.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	var bad []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") {
			bad = append(bad, line)
		}
	}
	return strings.Join(bad[max(0, len(bad)-3):], " | ")
}
