package e2e

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
)

// reportPercentiles reports p50 and p99 of samples in milliseconds.
func reportPercentiles(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	pct := func(p float64) float64 {
		i := int(p * float64(len(samples)-1))
		return float64(samples[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(samples[0].Microseconds())/1000, "min-ms")
}

// BenchmarkCreateExec measures create → first exec output through the
// public API (HTTP on loopback, Go client), one sandbox at a time, every
// create a cold boot (--warm-pool 0). Deletes happen outside the timed region.
func BenchmarkCreateExec(b *testing.B) { benchCreateExec(b, 0) }

// BenchmarkCreateExecWarmPool measures the same when the create is served by
// the warm pool (--warm-pool 2): between iterations, untimed, the benchmark
// waits for the pool to refill, as it would between an agent's creates.
func BenchmarkCreateExecWarmPool(b *testing.B) { benchCreateExec(b, 2) }

func benchCreateExec(b *testing.B, pool int) {
	d := startDaemon(b, "", "--warm-pool", strconv.Itoa(pool))
	ctx := context.Background()
	var samples []time.Duration
	var ids []string
	refilled := func() { // pooled dirs + live sandboxes
		for deadline := time.Now().Add(10 * time.Second); d.sandboxDirs() < len(ids)+pool && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	refilled()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if err != nil {
			b.Fatal(err)
		}
		r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hi"}})
		if err != nil || string(r.Stdout) != "hi\n" {
			b.Fatalf("exec: %+v %v", r, err)
		}
		samples = append(samples, time.Since(start))
		ids = append(ids, sb.ID)
		b.StopTimer()
		if len(ids) == 20 {
			for _, id := range ids {
				d.client.DeleteSandbox(ctx, id)
			}
			ids = ids[:0]
		}
		refilled()
		b.StartTimer()
	}
	b.StopTimer()
	for _, id := range ids {
		d.client.DeleteSandbox(ctx, id)
	}
	reportPercentiles(b, samples)
}

// BenchmarkExecRoundTrip measures exec of /bin/true in a running sandbox
// through the public API, result included.
func BenchmarkExecRoundTrip(b *testing.B) {
	d := startDaemon(b, "")
	ctx := context.Background()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		b.Fatal(err)
	}
	for range 10 { // warm the connections
		d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
	}
	var samples []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"/bin/true"}})
		if err != nil || r.ExitCode != 0 {
			b.Fatalf("exec: %+v %v", r, err)
		}
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}

// BenchmarkExecUnderBombs measures exec round trips in a quiet sandbox while
// four others run a fork bomb (pids 128), a memory bomb (128 MiB, allocating
// in a loop so the OOM killer keeps firing), a disk fill (a 256 MiB disk,
// filled and emptied in a loop) and a CPU spin on both cores (cpus 1): the
// host and the other sandboxes must stay responsive.
func BenchmarkExecUnderBombs(b *testing.B) {
	d := startDaemon(b, "")
	ctx := context.Background()
	bombs := []struct {
		limits api.Limits
		shell  string
	}{
		{api.Limits{Pids: 128}, "while true; do sleep 60 & done"},
		{api.Limits{MemoryBytes: 128 << 20}, "while true; do python3 -c 'b = bytearray(1 << 30)'; done"},
		{api.Limits{DiskBytes: 256 << 20}, "while true; do dd if=/dev/zero of=/tmp/fill bs=1M count=1000 2>/dev/null; rm -f /tmp/fill; done"},
		{api.Limits{CPUs: 1}, "while true; do :; done & while true; do :; done"},
	}
	var bombIDs []string
	for _, bomb := range bombs {
		sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: bomb.limits, User: "root"})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: bomb.shell}); err != nil {
			b.Fatal(err)
		}
		bombIDs = append(bombIDs, sb.ID)
	}
	victim, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second) // let the bombs reach their ceilings
	var samples []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		r, err := d.client.Exec(ctx, victim.ID, api.ExecRequest{Cmd: []string{"echo", "ok"}})
		if err != nil || string(r.Stdout) != "ok\n" {
			b.Fatalf("exec beside the bombs: %+v %v", r, err)
		}
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	for _, id := range bombIDs {
		d.client.DeleteSandbox(ctx, id)
	}
	reportPercentiles(b, samples)
}
