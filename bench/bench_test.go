package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/internal/testnet"
	"github.com/berthsh/berth/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestSummarizeNearestRank(t *testing.T) {
	var v []float64
	for i := 100; i >= 1; i-- { // unsorted on purpose
		v = append(v, float64(i))
	}
	got := summarize(v)
	want := Summary{N: 100, P10: 10, P50: 50, P90: 90, P99: 99, Min: 1, Max: 100}
	if got != want {
		t.Fatalf("summarize(1..100) = %+v, want %+v", got, want)
	}
	if got := summarize([]float64{7}); got.P50 != 7 || got.P99 != 7 || got.N != 1 {
		t.Fatalf("one value: %+v", got)
	}
	if got := summarize(nil); got != (Summary{}) {
		t.Fatalf("no values: %+v", got)
	}
}

func TestRatiosPairOnlyRoundsWithBothSamples(t *testing.T) {
	a := series{2 * time.Millisecond, missing, 3 * time.Millisecond, 4 * time.Millisecond}
	b := series{4 * time.Millisecond, 1 * time.Millisecond, missing, 8 * time.Millisecond}
	got := ratios(a, b)
	if len(got) != 2 || got[0] != 0.5 || got[1] != 0.5 {
		t.Fatalf("ratios = %v, want [0.5 0.5] (rounds 0 and 3)", got)
	}
	if ms := a.ms(); len(ms) != 3 || ms[0] != 2 {
		t.Fatalf("ms() = %v", ms)
	}
}

func TestRowsRatioAndNotMeasured(t *testing.T) {
	subjects := []subject{{name: "berth"}, {name: "crun run", execName: "crun exec"}, {name: "bwrap", why: "bwrap is not installed"}, {name: "runc run"}}
	got := map[string]series{
		"berth":    {1 * time.Millisecond, 2 * time.Millisecond},
		"crun run": {4 * time.Millisecond, 4 * time.Millisecond},
		"runc run": {missing, missing},
	}
	targets := map[string]*Target{"crun run": {Stat: "ratio_p50", AtMost: true, Limit: 1 / 1.5}}
	rs := rows("exec", "exec", subjects, got, "berth", 2, targets)
	if len(rs) != 4 {
		t.Fatalf("%d rows, want one per subject", len(rs))
	}
	if rs[1].Subject != "crun exec" || rs[1].Ratio == nil || rs[1].Ratio.P50 != 0.25 || rs[1].RatioTo != "berth" ||
		len(rs[1].Ratios) != 2 || rs[1].Ratios[0] != 0.25 || rs[1].Ratios[1] != 0.5 {
		t.Fatalf("crun row: %+v ratio %+v", rs[1], rs[1].Ratio)
	}
	if rs[0].Ratio != nil {
		t.Fatal("the berth row has a ratio to itself")
	}
	if rs[2].NotMeasured != "bwrap is not installed" || rs[2].Summary != nil {
		t.Fatalf("bwrap row: %+v", rs[2])
	}
	if rs[3].NotMeasured == "" || rs[3].Summary != nil {
		t.Fatalf("a subject whose samples all failed must say so: %+v", rs[3])
	}
	rs[1].check()
	if rs[1].Target.Met == nil || !*rs[1].Target.Met {
		t.Fatalf("ratio 0.25 ≤ 0.67 is met: %+v", rs[1].Target)
	}
}

func TestTargetCheck(t *testing.T) {
	v := 9.0
	for _, tc := range []struct {
		m    Metric
		want string // met, missed, none
	}{
		{Metric{Summary: &Summary{N: 1, P50: 9}, Target: &Target{Stat: "p50", AtMost: true, Limit: 10}}, "met"},
		{Metric{Summary: &Summary{N: 1, P99: 600}, Target: &Target{Stat: "p99", AtMost: true, Limit: 500}}, "missed"},
		{Metric{Summary: &Summary{N: 1, P50: 900}, Target: &Target{Stat: "p50", AtMost: false, Limit: 1000}}, "missed"},
		{Metric{Value: &v, Target: &Target{Stat: "value", AtMost: true, Limit: 8}}, "missed"},
		{Metric{NotMeasured: "no", Target: &Target{Stat: "p50", AtMost: true, Limit: 10}}, "none"},
	} {
		tc.m.check()
		got := "none"
		if tc.m.Target.Met != nil {
			got = map[bool]string{true: "met", false: "missed"}[*tc.m.Target.Met]
		}
		if got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.m.Target, got, tc.want)
		}
	}
}

func TestMarkdownGolden(t *testing.T) {
	rate, mem := 1234.5, 6.25
	res := &Results{
		Date:    "2026-11-23T00:00:00Z",
		Machine: Machine{Cores: 2, MemBytes: 24 << 30, Kernel: "6.18", Cgroup: "v1 (hybrid)", Berth: "commit abc"},
		Command: "make bench",
		Metrics: []Metric{
			{Group: "start", Name: "create", Subject: "berth", Unit: "ms", Summary: &Summary{N: 60, P10: 2, P50: 3.14159, P90: 5, P99: 12.5, Min: 1.5, Max: 150}, Target: &Target{Stat: "p50", AtMost: true, Limit: 10}},
			{Group: "start", Name: "create", Subject: "crun run", Unit: "ms", Summary: &Summary{N: 59, P10: 10, P50: 11, P90: 12, P99: 13, Min: 9, Max: 14}, Ratio: &Summary{N: 59, P10: 0.2, P50: 0.3, P90: 0.5}, NotMeasured: "1 of 60 samples failed",
				Target: &Target{Stat: "ratio_p50", AtMost: true, Limit: 1 / 1.5}},
			{Group: "start", Name: "create", Subject: "runsc run", Unit: "ms", NotMeasured: "runsc is not installed | see\nthe log"},
			{Group: "exec", Name: "throughput", Subject: "berth", Unit: "execs/s", Value: &rate, Note: "for scale: 1000/s elsewhere"},
			{Group: "density", Name: "memory", Subject: "berth", Unit: "MiB", Value: &mem, Target: &Target{Stat: "value", AtMost: true, Limit: 8}},
		},
		Notes: []string{"A note."},
	}
	res.checkTargets()
	got := markdown(res)
	golden := filepath.Join("testdata", "table.md")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("markdown differs from %s (go test ./bench -update rewrites it):\n%s", golden, got)
	}
}

func TestReplaceBetween(t *testing.T) {
	path := filepath.Join(t.TempDir(), "README.md")
	os.WriteFile(path, []byte("# x\n"+startMark+"\nold table\n"+endMark+"\nrest\n"), 0o644)
	if err := replaceBetween(path, "new table\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if want := "# x\n" + startMark + "\nnew table\n" + endMark + "\nrest\n"; string(b) != want {
		t.Fatalf("got %q, want %q", b, want)
	}
	os.WriteFile(path, []byte("no marks"), 0o644)
	if err := replaceBetween(path, "t"); err == nil {
		t.Fatal("a file without the marks must be an error")
	}
}

func TestConfigCheck(t *testing.T) {
	good := config{berth: os.Args[0], rounds: 1, execRounds: 1, idleRounds: 1, idle: time.Millisecond, density: 1, window: time.Second, smallFiles: 1,
		netRounds: 1, netRequests: 1, netDensity: 1, portsRounds: 1, portsRequests: 1, portsIdle: 1, pullRounds: 1, imageBytes: 1 << 20,
		snapRounds: 1, snapFiles: 10, snapBytes: 1 << 20, diffFiles: 1, e2bRounds: 1, churnClients: 1, churnWindow: time.Second, churnMax: 1,
		gvisorRounds: 1, gvisorDensity: 1}
	if err := good.check(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*config){
		"rounds":   func(c *config) { c.rounds = 0 },
		"window":   func(c *config) { c.window = 0 },
		"big":      func(c *config) { c.bigBytes = -1 },
		"files":    func(c *config) { c.smallFiles = 0 },
		"berth":    func(c *config) { c.berth = "/nonexistent/berth" },
		"net":      func(c *config) { c.netDensity = 0 },
		"ports":    func(c *config) { c.portsIdle = 0 },
		"only":     func(c *config) { c.only = []string{"nope"} },
		"net load": func(c *config) { c.netRounds, c.netRequests = 1000, 1000 },
		"pulls":    func(c *config) { c.pullRounds = 0 },
		"image":    func(c *config) { c.imageBytes = 2 << 30 },
		"snaps":    func(c *config) { c.snapFiles = 1 },
		"e2b":      func(c *config) { c.e2bRounds = 0 },
		"churn":    func(c *config) { c.churnWindow = time.Hour },
		"gvisor":   func(c *config) { c.gvisorDensity = 0 },
	} {
		c := good
		mut(&c)
		if err := c.check(); err == nil {
			t.Errorf("%s: accepted a bad config", name)
		}
	}
}

func TestInSandbox(t *testing.T) {
	ids := map[string]bool{"sb-abc": true}
	if !inSandbox("4:memory:/berth/sb-abc\n0::/\n", ids) {
		t.Fatal("v1 memory line not matched")
	}
	if !inSandbox("0::/berth/sb-abc\n", ids) {
		t.Fatal("v2 line not matched")
	}
	if inSandbox("4:memory:/berth/sb-abcd\n0::/sb-ab\n", ids) {
		t.Fatal("matched another sandbox")
	}
}

// TestMeasureSmoke runs the whole bench at a tiny size against the real
// binary: every row has figures or says why not, berth's rows have figures,
// and nothing the bench made is left behind.
func TestMeasureSmoke(t *testing.T) {
	testutil.RequireRoot(t)
	work := testutil.StateDir(t)
	cfg := config{berth: testutil.Berth(t), runsc: testutil.Runsc(t), work: work, rounds: 2, execRounds: 3, idleRounds: 2, idle: 50 * time.Millisecond, density: 3, bursts: []int{3},
		clients: []int{1, 4}, window: 200 * time.Millisecond, churnClients: 3, churnWindow: time.Second, churnMax: 12, smallFiles: 20, peers: true,
		net: true, netRounds: 2, netRequests: 3, netDensity: 2, portsRounds: 2, portsRequests: 3, portsIdle: 5,
		pullRounds: 2, imageBytes: 4 << 20, snapRounds: 2, snapFiles: 20, snapBytes: 2 << 20, diffFiles: 50,
		e2bRounds: 2, e2bPython: "../compat/e2b/sdktest/.venv/bin/python", gvisorRounds: 1, gvisorDensity: 2}
	// E2B's SDK is measured where make test-e2b (or make bench) installed it.
	_, noSDK := os.Stat(cfg.e2bPython)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	res, err := measure(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]bool{}
	for _, m := range res.Metrics {
		groups[m.Group] = true
		measured := (m.Summary != nil && m.Summary.N > 0) || m.Value != nil
		if !measured && m.NotMeasured == "" {
			t.Errorf("%s / %s: neither figures nor a reason", m.Name, m.Subject)
		}
		if strings.HasPrefix(m.Subject, "berth") && !measured {
			t.Errorf("%s / %s: berth not measured: %s", m.Name, m.Subject, m.NotMeasured)
		}
		if m.Group == "e2b" && noSDK == nil && !measured {
			t.Errorf("%s / %s: not measured with E2B's SDK installed: %s", m.Name, m.Subject, m.NotMeasured)
		}
		if m.Summary != nil && m.Summary.N > 0 && (m.Summary.Min <= 0 || m.Summary.Min > m.Summary.P50 || m.Summary.P50 > m.Summary.Max) {
			t.Errorf("%s / %s: implausible summary %+v", m.Name, m.Subject, m.Summary)
		}
	}
	for _, g := range []string{"start", "exec", "files", "density", "network", "ports", "images", "snapshots", "e2b"} {
		if !groups[g] {
			t.Errorf("no %s rows", g)
		}
	}
	for _, peer := range []struct{ group, subject string }{
		{"start", "crun run"}, {"start", "runc run"}, {"start", "runsc run"}, {"start", "bwrap"}, {"start", "podman run --rm"},
		{"images", "podman run --rm (the same image, loaded)"},
	} {
		found := false
		for _, m := range res.Metrics {
			found = found || (m.Group == peer.group && m.Subject == peer.subject)
		}
		if !found {
			t.Errorf("peer %s has no %s row (a peer that cannot run is reported, not dropped)", peer.subject, peer.group)
		}
	}
	// Both daemons removed their state: no sandbox was left to delete.
	for _, d := range []string{"berth-warm", "berth-cold", "berth-sized-pool", "berth-net", "berth-net-none", "berth-net-allowlist", "berth-ports",
		"berth-images", "berth-images-pool", "image", "berth-e2b"} {
		if _, err := os.Stat(filepath.Join(work, d)); !os.IsNotExist(err) {
			t.Errorf("%s's state is still there (a sandbox was left?): %v", d, err)
		}
	}
	for _, rt := range []string{"crun", "runc"} {
		if _, err := exec.LookPath(rt); err != nil {
			continue
		}
		out, _ := exec.Command(rt, "list", "-q").Output()
		if strings.Contains(string(out), fmt.Sprintf("-%d-", os.Getpid())) {
			t.Errorf("%s containers left: %s", rt, out)
		}
	}
	if podman, err := exec.LookPath("podman"); err == nil {
		if exec.Command(podman, "image", "exists", podmanImageRef).Run() == nil {
			t.Errorf("podman still has %s", podmanImageRef)
		}
	}
	// The test internet's namespace went with the network step (other
	// packages' tests make their own meanwhile: only this process's count).
	netnsAfter, _ := filepath.Glob(filepath.Join("/run/netns", testnet.NamePrefix(os.Getpid())+"*"))
	if len(netnsAfter) > 0 {
		t.Errorf("network namespaces left: %v", netnsAfter)
	}
	if len(markdown(res)) == 0 {
		t.Fatal("empty table")
	}
}
