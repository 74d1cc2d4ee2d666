package e2e

import (
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testnet"
)

// TestQuotasAtTheirEdge: each bound of a tenant's quota admits up to it
// and refuses past it, naming the bound and the use; creates racing for
// the last share cannot all win; a lower quota stops nothing that runs;
// another tenant is not bound by it.
func TestQuotasAtTheirEdge(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	keyA, keyB, _ := tenantsOf(t, d)
	a, b := d.clientWith(t, keyA.Key), d.clientWith(t, keyB.Key)
	small := api.CreateSandboxRequest{Limits: api.Limits{CPUs: 0.5, MemoryBytes: 256 << 20}}

	if _, err := a.SetQuota(ctx, "tenant-a", api.Quota{Sandboxes: 1}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("a tenant set its own quota: %v", err)
	}
	for _, bad := range []struct {
		tenant string
		q      api.Quota
		field  string
	}{{"Tenant_A", api.Quota{Sandboxes: 1}, "tenant"}, {"tenant-a", api.Quota{Sandboxes: -1}, "sandboxes"}, {"tenant-a", api.Quota{MemoryBytes: -5}, "memory_bytes"}} {
		if _, err := d.client.SetQuota(ctx, bad.tenant, bad.q); !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), bad.field) {
			t.Fatalf("quota %+v for %q: %v", bad.q, bad.tenant, err)
		}
	}
	u, err := d.client.SetQuota(ctx, "tenant-a", api.Quota{Sandboxes: 2, CPUs: 1, MemoryBytes: 512 << 20})
	if err != nil || u.Tenant != "tenant-a" || u.Quota.Sandboxes != 2 || u.Sandboxes != 0 {
		t.Fatalf("set quota: %+v %v", u, err)
	}
	// A bounded resource needs the sandbox's limit.
	if _, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{CPUs: 0.5}}); !errdefs.IsInvalidArgument(err) ||
		!strings.Contains(err.Error(), "limits.memory_bytes") {
		t.Fatalf("create without a memory limit: %v", err)
	}
	// Up to the edge, and not past it: three creates race for two places.
	var wg sync.WaitGroup
	made := make(chan api.Sandbox, 3)
	refused := make(chan error, 3)
	for range 3 {
		wg.Go(func() {
			sb, err := a.CreateSandbox(ctx, small)
			if err != nil {
				refused <- err
				return
			}
			made <- sb
		})
	}
	wg.Wait()
	close(made)
	close(refused)
	var mine []api.Sandbox
	for sb := range made {
		mine = append(mine, sb)
	}
	if len(mine) != 2 || len(refused) != 1 {
		for err := range refused {
			t.Log(err)
		}
		t.Fatalf("three racing creates under a quota of 2: %d made, %d refused", len(mine), len(refused))
	}
	if err := <-refused; !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "sandboxes is 2") || !strings.Contains(err.Error(), "2 running") {
		t.Fatalf("the refused create: %v", err)
	}
	// Tenant B has no quota; the operator none either.
	sbB, err := b.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatalf("tenant b, unbounded: %v", err)
	}
	// A stopped sandbox frees its place; starting it again takes one.
	if _, err := a.StopSandbox(ctx, mine[0].ID); err != nil {
		t.Fatal(err)
	}
	third, err := a.CreateSandbox(ctx, small)
	if err != nil {
		t.Fatalf("create after a stop: %v", err)
	}
	if _, err := a.StartSandbox(ctx, mine[0].ID); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("start past the quota: %v", err)
	}
	if got, _ := a.GetSandbox(ctx, mine[0].ID); got.State != api.StateStopped {
		t.Fatalf("a refused start left the sandbox %s", got.State)
	}
	// Memory at its edge: 2 x 256 MiB of 512 MiB in use.
	if _, err := d.client.SetQuota(ctx, "tenant-a", api.Quota{Sandboxes: 10, CPUs: 4, MemoryBytes: 512 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{CPUs: 0.5, MemoryBytes: 32 << 20}}); !errdefs.IsResourceExhausted(err) ||
		!strings.Contains(err.Error(), "memory_bytes is 512 MiB") {
		t.Fatalf("memory past the quota: %v", err)
	}
	// Raising a running sandbox's limits counts too.
	if _, err := a.UpdateSandbox(ctx, third.ID, api.UpdateSandboxRequest{Limits: &api.Limits{MemoryBytes: 512 << 20}}); !errdefs.IsResourceExhausted(err) ||
		!strings.Contains(err.Error(), "memory_bytes is 512 MiB") {
		t.Fatalf("limits raised past the quota: %v", err)
	}
	if _, err := a.UpdateSandbox(ctx, third.ID, api.UpdateSandboxRequest{Limits: &api.Limits{MemoryBytes: 128 << 20}}); err != nil {
		t.Fatalf("limits lowered under the quota: %v", err)
	}
	if _, err := a.UpdateSandbox(ctx, third.ID, api.UpdateSandboxRequest{Limits: &api.Limits{MemoryBytes: 256 << 20}}); err != nil {
		t.Fatalf("limits raised back to the quota's edge: %v", err)
	}
	// A quota below the current use: what runs keeps running, creates wait.
	if _, err := d.client.SetQuota(ctx, "tenant-a", api.Quota{Sandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{mine[1].ID, third.ID} {
		if r, err := a.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}); err != nil || r.ExitCode != 0 {
			t.Fatalf("a running sandbox under a lowered quota: %+v %v", r, err)
		}
	}
	if _, err := a.CreateSandbox(ctx, small); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("create under a lowered quota: %v", err)
	}
	// Fork counts each copy.
	if _, err := d.client.SetQuota(ctx, "tenant-a", api.Quota{Sandboxes: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Fork(ctx, third.ID, api.ForkRequest{Count: 2}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a fork of 2 with one place left: %v", err)
	}
	if list, _ := a.ListSandboxes(ctx, nil); len(list) != 3 {
		t.Fatalf("a refused fork left copies: %d sandboxes", len(list))
	}
	// Snapshot storage: refused once reached.
	if _, err := d.client.SetQuota(ctx, "tenant-a", api.Quota{SnapshotBytes: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, third.ID, api.ExecRequest{Shell: "head -c 100000 /dev/urandom > /tmp/blob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateSnapshot(ctx, third.ID, api.CreateSnapshotRequest{Name: "one"}); err != nil {
		t.Fatalf("first snapshot: %v", err)
	}
	if _, err := a.CreateSnapshot(ctx, third.ID, api.CreateSnapshotRequest{Name: "two"}); !errdefs.IsResourceExhausted(err) ||
		!strings.Contains(err.Error(), "snapshot_bytes") {
		t.Fatalf("second snapshot past the quota: %v", err)
	}
	// The usage a tenant sees is its own; the operator's, everyone's.
	list, err := a.Usage(ctx, "")
	if err != nil || len(list) != 1 || list[0].Tenant != "tenant-a" || list[0].Sandboxes != 2 || list[0].SnapshotBytes == 0 {
		t.Fatalf("tenant a's usage: %+v %v", list, err)
	}
	all, err := d.client.Usage(ctx, "")
	if err != nil || len(all) != 2 {
		t.Fatalf("the operator's usage: %+v %v", all, err)
	}
	// Removing the quota unbinds.
	if _, err := d.client.SetQuota(ctx, "tenant-a", api.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.StartSandbox(ctx, mine[0].ID); err != nil {
		t.Fatalf("start with no quota: %v", err)
	}
	_ = sbB
}

// TestUsageCounters: a tenant's sandbox-seconds, CPU-seconds, memory
// GB-seconds and egress bytes count what its sandboxes did, appear in
// /v1/usage and /metrics, and survive a daemon restart.
func TestUsageCounters(t *testing.T) {
	inet := newInternet(t)
	d := startDaemon(t, "")
	d.stop()
	d.args = append(d.args, d.withInternet(inet)...)
	d.start()
	ctx := t.Context()
	keyA, _ := func() (api.APIKey, error) {
		return d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "tenant-a"})
	}()
	a := d.clientWith(t, keyA.Key)
	n := api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test"}}
	sb, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{Network: &n})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// A CPU-second of work, and a download. The shell spins until its own
	// user+system time (fields 14 and 15 of its stat, in 1/100 s) reaches a
	// second, not for a second of wall time: on a loaded host a second of
	// wall time can be much less CPU.
	spin := `while read -r l < /proc/$$/stat; set -- $l; [ $((${14} + ${15})) -lt 100 ]; do :; done`
	if r, err := a.Exec(ctx, sb.ID, api.ExecRequest{Shell: spin + "; curl -sS -m 5 http://web.test/ -o /dev/null", TimeoutMs: 20000}); err != nil {
		t.Fatalf("work: %+v %v", r, err)
	}
	if err := testnet.WaitFor(ctx, 5*time.Second, func() bool {
		recs, err := a.Egress(ctx, sb.ID, client.EgressQuery{})
		return err == nil && len(recs) > 0
	}); err != nil {
		t.Fatal("no egress record")
	}
	if err := a.DeleteSandbox(ctx, sb.ID); err != nil { // its last sample
		t.Fatal(err)
	}
	ran := time.Since(start).Seconds()
	list, err := a.Usage(ctx, "")
	if err != nil || len(list) != 1 {
		t.Fatalf("usage: %+v %v", list, err)
	}
	u := list[0]
	if u.SandboxSeconds < 1 || u.SandboxSeconds > ran+2 || u.CPUSeconds < 0.5 || u.CPUSeconds > u.SandboxSeconds*2+0.5 ||
		u.MemoryGBSeconds <= 0 || u.EgressBytesIn == 0 || u.EgressBytesOut == 0 {
		t.Fatalf("counters after ~%.1f s with 1 CPU-second and a download: %+v", ran, u)
	}
	resp, err := d.get(t, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`berth_tenant_sandbox_seconds_total{tenant="tenant-a"}`, `berth_tenant_cpu_seconds_total{tenant="tenant-a"}`,
		`berth_tenant_egress_bytes_total{direction="in",tenant="tenant-a"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// A graceful restart keeps the counters.
	d.stop()
	d.start()
	again, err := d.clientWith(t, keyA.Key).Usage(ctx, "")
	if err != nil || len(again) != 1 || again[0].SandboxSeconds != u.SandboxSeconds || again[0].EgressBytesIn != u.EgressBytesIn {
		t.Fatalf("after a restart: %+v (before %+v) %v", again, u, err)
	}
}
