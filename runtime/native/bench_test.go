package native_test

import (
	"slices"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/runtimetest"
)

// BenchmarkGuestExecRoundTrip measures exec of /bin/true straight to a
// sandbox's guest (no daemon, no public API): the floor under the API's
// exec round trip.
func BenchmarkGuestExecRoundTrip(b *testing.B) {
	h, _ := harness(b)
	sb := runtimetest.Create(b, h, runtime.Spec{})
	spec := guestapi.ProcessSpec{Args: []string{"/bin/true"}}
	for range 10 {
		runtimetest.ExecErr(b.Context(), sb, spec)
	}
	var samples []time.Duration
	for b.Loop() {
		start := time.Now()
		r, err := runtimetest.ExecErr(b.Context(), sb, spec)
		if err != nil || r.ExitCode != 0 {
			b.Fatal(r, err)
		}
		samples = append(samples, time.Since(start))
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds())/1000, "p99-ms")
}
