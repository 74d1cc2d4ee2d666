package store

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkSandboxLife is the store's part of one sandbox's create, two
// execs and delete, as the manager makes the calls: insert with a label,
// state and runtime state written, read back whole, two status reads, an
// audit record per call, and the delete.
func BenchmarkSandboxLife(b *testing.B) {
	s, err := Open(b.Context(), filepath.Join(b.TempDir(), "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := b.Context()
	rs := json.RawMessage(`{"pid":1234,"cgroup":"berth/x"}`)
	audit := func(id, route string) {
		if err := s.AppendAudit(ctx, []AuditRecord{{At: time.Now(), Tenant: "t", Method: "POST", Route: route,
			Path: "/v1/sandboxes/" + id, SandboxID: id, Status: 200}}, 100000); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("sb-%d", i)
		if err := s.CreateSandbox(ctx, Sandbox{ID: id, Tenant: "t", State: "creating", Image: "host", Runtime: "native",
			Spec: json.RawMessage(`{"image":"host"}`), Labels: map[string]string{"thread": "42"}, IDRange: uint32(i + 1)}); err != nil {
			b.Fatal(err)
		}
		if err := s.SetRuntimeState(ctx, id, rs); err != nil {
			b.Fatal(err)
		}
		if err := s.UpdateState(ctx, id, "running", "", time.Time{}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.GetSandbox(ctx, id); err != nil {
			b.Fatal(err)
		}
		audit(id, "/v1/sandboxes")
		for range 2 {
			if _, err := s.GetStatus(ctx, id); err != nil {
				b.Fatal(err)
			}
			audit(id, "/v1/sandboxes/{id}/exec")
		}
		if err := s.UpdateState(ctx, id, "deleting", "", time.Time{}); err != nil {
			b.Fatal(err)
		}
		if err := s.DeleteSandbox(ctx, id); err != nil {
			b.Fatal(err)
		}
		audit(id, "/v1/sandboxes/{id}")
	}
}
