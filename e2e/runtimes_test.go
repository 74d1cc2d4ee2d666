package e2e

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testnet"
)

// TestRuntimesSayWhatTheyCan checks GET /v1/runtimes and `berth runtimes`
// against the real daemon: native is the default, with every limit, the
// host's ceilings, and — on a host without CAP_SYS_RESOURCE, like this
// project's VM — grow_disk missing with the reason the refusal quotes. With
// an egress route, the network modes; without one, none and why.
func TestRuntimesSayWhatTheyCan(t *testing.T) {
	inet := testnet.New(t)
	d := startDaemon(t, "", "--egress-netns", inet.Path, "--egress-dns", "203.0.113.53")
	list, err := d.client.Runtimes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]api.Runtime{}
	for _, rt := range list {
		byName[rt.Name] = rt
	}
	native, gv := byName["native"], byName["gvisor"]
	if len(list) != 2 || !native.Default || !native.Available || native.Capabilities == nil || gv.Default || gv.Name != "gvisor" {
		t.Fatalf("runtimes: %+v", list)
	}
	// gvisor runs where the daemon has runsc (make test gives it the pinned
	// one); elsewhere it says why.
	if gv.Available != (os.Getenv("BERTH_RUNSC") != "") || (!gv.Available && !strings.Contains(gv.Reason, "runsc")) {
		t.Fatalf("gvisor: %+v", gv)
	}
	if gv.Available && (!gv.Capabilities.MemoryCheckpoint || native.Capabilities.MemoryCheckpoint ||
		strings.Join(gv.Capabilities.NetworkModes, ",") != "none,allowlist,open") {
		t.Fatalf("memory checkpoints and networks: gvisor %+v, native %+v", gv.Capabilities, native.Capabilities)
	}
	c := native.Capabilities
	if strings.Join(c.Limits, ",") != "cpus,memory_bytes,pids,disk_bytes,open_files" ||
		strings.Join(c.NetworkModes, ",") != "none,allowlist,open" || !c.StopStart || !c.UpdateLimits || !c.Stats {
		t.Fatalf("native capabilities: %+v", c)
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	if c.Max.MemoryBytes != int64(si.Totalram)*int64(si.Unit) || c.Max.CPUs < 1 || c.Max.DiskBytes <= 0 || c.Max.OpenFiles < 64 {
		t.Fatalf("host ceilings: %+v", c.Max)
	}
	// The ceiling is what create checks against.
	_, err = d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{Limits: api.Limits{CPUs: c.Max.CPUs + 1}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "limits.cpus") {
		t.Fatalf("cpus above the host's: %v", err)
	}
	if canResize, _ := capability.Effective(unix.CAP_SYS_RESOURCE); canResize != c.GrowDisk {
		t.Fatalf("grow_disk %v on a host where CAP_SYS_RESOURCE is %v", c.GrowDisk, canResize)
	}
	if !c.GrowDisk && !strings.Contains(c.Missing["grow_disk"], "CAP_SYS_RESOURCE") {
		t.Fatalf("grow_disk missing without the reason: %+v", c.Missing)
	}
	out, errOut, code := d.cli("", "runtimes")
	if code != 0 || !strings.HasPrefix(out, "NAME") || !strings.Contains(out, "native  yes      yes") {
		t.Fatalf("berth runtimes: exit %d\n%s%s", code, out, errOut)
	}
	// No egress route: mode none only, and why.
	bare := testnet.New(t)
	if out, err := runIP("-n", bare.Name, "route", "del", "default"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	d2 := startDaemon(t, "", "--egress-netns", bare.Path, "--egress-dns", "203.0.113.53")
	list, err = d2.client.Runtimes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range list {
		if rt.Name == "native" {
			native = rt
		}
	}
	if c := native.Capabilities; strings.Join(c.NetworkModes, ",") != "none" || !strings.Contains(c.Missing["network"], "no default route") {
		t.Fatalf("without an egress route: modes %v, missing %v", c.NetworkModes, c.Missing)
	}
}
