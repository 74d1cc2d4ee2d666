package mcpserver_test

import (
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthsh/berth/api"
)

// BenchmarkExecute is the round trip of `true` in one sandbox: straight
// through the Go client, and as an MCP execute call over each transport
// (in-process, the real `berth mcp` over stdio, streamable HTTP on
// loopback). It reports the median and p99 of its b.N calls:
//
//	BERTH_BINARY=$PWD/bin/berth go test -run '^$' -bench Execute -benchtime 300x ./mcpserver/
func BenchmarkExecute(b *testing.B) {
	d := startDaemon(b)
	sb, err := d.client.CreateSandbox(b.Context(), api.CreateSandboxRequest{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("direct", func(b *testing.B) {
		timed(b, func() error {
			_, err := d.client.Exec(b.Context(), sb.ID, api.ExecRequest{Shell: "true"})
			return err
		})
	})
	for _, tr := range []struct {
		name    string
		session func(testing.TB, string) *mcp.ClientSession
	}{{"mcp-inmemory", inMemorySession}, {"mcp-stdio", stdioSession}, {"mcp-http", httpSession}} {
		b.Run(tr.name, func(b *testing.B) {
			s := tr.session(b, d.url)
			args := map[string]any{"sandbox_id": sb.ID, "command": "true"}
			timed(b, func() error {
				res, err := s.CallTool(b.Context(), &mcp.CallToolParams{Name: "execute", Arguments: args})
				if err == nil && res.IsError {
					b.Fatalf("execute: %+v", res.Content)
				}
				return err
			})
		})
	}
}

// timed runs op b.N times and reports the median and p99 in microseconds.
func timed(b *testing.B, op func() error) {
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds()), "p99-µs")
}
