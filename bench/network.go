package main

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/internal/testnet"
)

// The network bench measures a sandbox's egress against the host calling
// the same servers directly. Its internet is the one the tests build
// (internal/testnet): a network namespace the bench makes, with an HTTP
// server, an HTTPS server with a test CA and a DNS server at documentation
// addresses; berth is pointed at it with --egress-netns, --egress-dns and
// --egress-ca, and nothing outside it is ever a target. The client is one
// program (netbench.py), run inside a sandbox and, for the direct path, in
// the test internet's namespace; it times each request itself, so neither
// side's process start is in a sample.

//go:embed netbench.py
var netbenchPy []byte

var (
	netWeb = netip.MustParseAddr("203.0.113.10") // web.bench: plain HTTP
	netAPI = netip.MustParseAddr("203.0.113.11") // api.bench: HTTPS, wants the secret
	netDNS = netip.MustParseAddrPort("203.0.113.53:53")
)

const netSecret = "bench-key"

// network runs the network measurements; every namespace, daemon and
// sandbox it makes is gone when it returns.
func (s *suite) network(ctx context.Context) (err error) {
	t := &fakeT{dir: s.cfg.work}
	defer t.close()
	defer recoverFatal(&err)
	inet := testnet.New(t)
	inet.SetRecord("web.bench", netWeb)
	inet.SetRecord("api.bench", netAPI)
	inet.ServeDNS(t, netDNS)
	inet.ServeHTTP(t, netip.AddrPortFrom(netWeb, 80), http.HandlerFunc(serveBytes))
	var b [16]byte
	rand.Read(b[:])
	secret := "sk-bench-" + hex.EncodeToString(b[:])
	inet.ServeHTTPS(t, netip.AddrPortFrom(netAPI, 443), []string{"api.bench"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+secret {
			http.Error(w, "no or wrong credential", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Length", "3")
		w.Write([]byte("ok\n"))
	}))
	flags := []string{"--egress-netns", inet.Path, "--egress-dns", netDNS.String(), "--egress-ca", inet.CAFile}
	script := filepath.Join(t.TempDir(), "netbench.py")
	if err := os.WriteFile(script, netbenchPy, 0o644); err != nil {
		return err
	}
	policy := api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.bench", "api.bench"},
		Secrets: []api.SecretBinding{{Secret: netSecret, Host: "api.bench", Header: "Authorization", Format: "Bearer {secret}"}}}

	// Memory first, each mode on a daemon of its own that has done nothing
	// else, so that neither inherits the other's heap.
	none, err := s.netMemory(ctx, flags, "", api.Network{Mode: api.NetworkNone})
	if err != nil {
		return err
	}
	with, err := s.netMemory(ctx, flags, secret, policy)
	if err != nil {
		return err
	}
	n := s.cfg.netDensity
	diff := with.perSandbox - none.perSandbox
	daemonDiff := with.daemonPer - none.daemonPer
	s.res.Metrics = append(s.res.Metrics,
		Metric{Group: "network", Name: fmt.Sprintf("memory per idle sandbox, network none: drop in host MemAvailable / %d", n), Subject: "berth", Unit: "MiB", Value: &none.perSandbox},
		Metric{Group: "network", Name: fmt.Sprintf("memory per idle sandbox, network allowlist: drop in host MemAvailable / %d", n), Subject: "berth", Unit: "MiB", Value: &with.perSandbox},
		Metric{Group: "network", Name: "memory a network adds to an idle sandbox (allowlist − none)", Subject: "berth", Unit: "MiB", Value: &diff,
			Target: &Target{Stat: "value", AtMost: true, Limit: 2}},
		Metric{Group: "network", Name: "of which the daemon's RSS (its stack, CA, goroutines), allowlist − none", Subject: "berth", Unit: "MiB", Value: &daemonDiff},
		Metric{Group: "network", Name: fmt.Sprintf("create (no warm pool), network none, %d in a row", n), Subject: "berth", Unit: "ms", Summary: &none.create},
		Metric{Group: "network", Name: fmt.Sprintf("create (no warm pool), network allowlist with a secret, %d in a row", n), Subject: "berth", Unit: "ms", Summary: &with.create},
	)

	d, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-net", 0, s.log, flags...)
	if err != nil {
		return err
	}
	defer d.close()
	if _, err := d.client.CreateSecret(ctx, netSecret, secret); err != nil {
		return err
	}
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Network: &policy})
	if err != nil {
		return err
	}
	d.track(sb.ID)
	defer d.remove(sb.ID)
	if _, err := d.client.Write(ctx, sb.ID, api.WriteRequest{Path: "/tmp/netbench.py", Content: string(netbenchPy)}); err != nil {
		return err
	}
	inside := func(ctx context.Context, args ...string) (string, error) {
		r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: append([]string{"/usr/bin/python3", "/tmp/netbench.py"}, args...), TimeoutMs: 120_000})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("netbench.py in the sandbox exited %d: %s", r.ExitCode, string(r.Stderr))
		}
		return string(r.Stdout), err
	}
	direct := func(ctx context.Context, args ...string) (string, error) {
		return command(ctx, "ip", append([]string{"netns", "exec", inet.Name, "/usr/bin/python3", script}, args...)...)
	}
	paths := []struct {
		name string
		run  func(context.Context, ...string) (string, error)
	}{{"berth: from inside a sandbox, through the policy", inside}, {"host: the same client, straight to the server", direct}}

	// Latency: rounds of a batch of requests on each path, in alternating order.
	for _, c := range []struct {
		name, target string
		limit        float64
		args         func(side int) []string
	}{
		{"HTTP GET, a new connection each (allowlist: address, pinned name and Host checked)", "http", 1, func(side int) []string {
			return []string{"latency", "web.bench", pick(side, "-", netWeb.String()), "80", "/bytes/64", strconv.Itoa(s.cfg.netRequests), "-"}
		}},
		{"HTTPS GET, a new connection each, the secret added by berth (TLS terminated and made again)", "https", 2, nil},
	} {
		args := c.args
		if c.target == "https" {
			args = func(side int) []string {
				if side == 0 { // berth adds the credential; the sandbox trusts its own CA
					return []string{"latency", "api.bench", "-", "443", "/", strconv.Itoa(s.cfg.netRequests), "/etc/ssl/certs/ca-certificates.crt"}
				}
				return []string{"latency", "api.bench", netAPI.String(), "443", "/", strconv.Itoa(s.cfg.netRequests), inet.CAFile, "Authorization: Bearer " + secret}
			}
		}
		got := [2][]float64{}
		for r := range s.cfg.netRounds {
			for i := range 2 {
				side := (r + i) % 2
				out, err := paths[side].run(ctx, args(side)...)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", c.name, paths[side].name, err)
				}
				for _, f := range strings.Fields(out) {
					v, err := strconv.ParseFloat(f, 64)
					if err != nil {
						return fmt.Errorf("%s: netbench.py printed %q", c.name, f)
					}
					got[side] = append(got[side], v)
				}
			}
		}
		berth, host := summarize(got[0]), summarize(got[1])
		added := berth.P50 - host.P50
		s.res.Metrics = append(s.res.Metrics,
			Metric{Group: "network", Name: c.name, Subject: paths[0].name, Unit: "ms", Summary: &berth, Samples: got[0]},
			Metric{Group: "network", Name: c.name, Subject: paths[1].name, Unit: "ms", Summary: &host, Samples: got[1]},
			Metric{Group: "network", Name: c.name + ": added by berth at p50", Subject: "berth", Unit: "ms", Value: &added,
				Target: &Target{Stat: "value", AtMost: true, Limit: c.limit}},
		)
	}

	// Throughput: a large download on each path, in alternating order.
	if size := s.cfg.bigBytes; size > 0 {
		name := "download of " + sizeLabel(size) + " over HTTP, one connection"
		got := [2][]float64{}
		for r := range 3 {
			for i := range 2 {
				side := (r + i) % 2
				out, err := paths[side].run(ctx, "download", "web.bench", pick(side, "-", netWeb.String()), "80", "/bytes/"+strconv.FormatInt(size, 10), strconv.FormatInt(size, 10))
				if err != nil {
					return fmt.Errorf("%s, %s: %w", name, paths[side].name, err)
				}
				v, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
				if err != nil {
					return fmt.Errorf("%s: netbench.py printed %q", name, out)
				}
				got[side] = append(got[side], v*8/1000) // MB/s → Gbit/s
			}
		}
		berth, host := summarize(got[0]), summarize(got[1])
		s.res.Metrics = append(s.res.Metrics,
			Metric{Group: "network", Name: name, Subject: paths[0].name, Unit: "Gbit/s", Summary: &berth, Samples: got[0],
				Target: &Target{Stat: "p50", AtMost: false, Limit: 1}},
			Metric{Group: "network", Name: name, Subject: paths[1].name, Unit: "Gbit/s", Summary: &host, Samples: got[1]},
		)
	}
	return nil
}

// pick is a for the sandbox's side (0) and b for the host's.
func pick(side int, a, b string) string {
	if side == 0 {
		return a
	}
	return b
}

// serveBytes answers /bytes/N with N zero bytes.
func serveBytes(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/bytes/"), 10, 64)
	if err != nil || n < 0 || n > 4<<30 {
		http.Error(w, "want /bytes/N", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.Header().Set("Content-Type", "application/octet-stream")
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		k, err := w.Write(buf[:min(n, int64(len(buf)))])
		if err != nil {
			return
		}
		n -= int64(k)
	}
}

// netMem is what idle sandboxes of one network mode took.
type netMem struct {
	perSandbox float64 // MiB: the drop in MemAvailable per sandbox
	daemonPer  float64 // MiB: the daemon's RSS growth per sandbox
	create     Summary // ms
}

// netMemory boots cfg.netDensity idle sandboxes with network n on a daemon
// of their own and measures what they take; the daemon and its sandboxes
// are gone when it returns.
func (s *suite) netMemory(ctx context.Context, flags []string, secret string, n api.Network) (netMem, error) {
	d, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-net-"+n.Mode, 0, s.log, flags...)
	if err != nil {
		return netMem{}, err
	}
	defer d.close()
	if secret != "" {
		if _, err := d.client.CreateSecret(ctx, netSecret, secret); err != nil {
			return netMem{}, err
		}
	}
	// A first sandbox, outside the measurement, builds the image and
	// writes the guest binary.
	first, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Network: &n})
	if err != nil {
		return netMem{}, fmt.Errorf("create with network %s: %w", n.Mode, err)
	}
	d.track(first.ID)
	d.remove(first.ID)
	count := s.cfg.netDensity
	unix.Sync()
	time.Sleep(time.Second)
	before, rssBefore := memAvailable(), rss(d.cmd.Process.Pid)
	lat := make([]float64, 0, count)
	var ids []string
	defer func() {
		for _, id := range ids {
			d.remove(id)
		}
	}()
	for i := range count {
		t0 := time.Now()
		sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Network: &n})
		if err != nil {
			return netMem{}, fmt.Errorf("create %d with network %s: %w", i+1, n.Mode, err)
		}
		lat = append(lat, ms(time.Since(t0)))
		d.track(sb.ID)
		ids = append(ids, sb.ID)
	}
	time.Sleep(2 * time.Second) // the guests finish starting and settle
	after, rssAfter := memAvailable(), rss(d.cmd.Process.Pid)
	mib := func(v int64) float64 { return float64(v) / float64(count) / (1 << 20) }
	return netMem{perSandbox: mib(before - after), daemonPer: mib(rssAfter - rssBefore), create: summarize(lat)}, nil
}

// rss is a process's resident set in bytes (0 when it cannot be read).
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(v)), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// fakeT gives internal/testnet and internal/testregistry what they need of
// a test outside go test: cleanups run by close, and a failure that ends
// the step (recoverFatal makes it the step's error).
type fakeT struct {
	// testing.TB, nil, only makes fakeT a testing.TB (its unexported method)
	// for testregistry's parameters; the methods those packages call are
	// fakeT's own, below.
	testing.TB
	dir      string
	cleanups []func()
}

type fatal string

// recoverFatal, deferred, turns a fakeT's failure into *err; any other
// panic goes on.
func recoverFatal(err *error) {
	switch r := recover().(type) {
	case nil:
	case fatal:
		*err = errors.New(string(r))
	default:
		panic(r)
	}
}

func (t *fakeT) Helper()                           {}
func (t *fakeT) Fatal(args ...any)                 { panic(fatal(fmt.Sprint(args...))) }
func (t *fakeT) Fatalf(format string, args ...any) { panic(fatal(fmt.Sprintf(format, args...))) }
func (t *fakeT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }

func (t *fakeT) TempDir() string {
	dir, err := os.MkdirTemp(t.dir, "net-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (t *fakeT) close() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
