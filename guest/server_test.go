package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest/files"
	"github.com/berthsh/berth/guest/proc"
)

const testToken = "test-token-0123456789"

// guestConn is a client of a guest protocol server on a real unix socket.
type guestConn struct {
	http  *http.Client
	table *proc.Table
}

// serve starts a process table and the protocol server on a unix socket in
// a temporary directory; both stop when the test ends.
func serve(tb testing.TB) *guestConn {
	tb.Helper()
	sock := filepath.Join(tb.TempDir(), "guest.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	table := proc.NewTable(log, proc.Defaults{Hostname: "sbx"})
	ctx, cancel := context.WithCancel(context.Background())
	reaped, served := make(chan error, 1), make(chan error, 1)
	go func() { reaped <- table.Run(ctx) }()
	fs, err := files.New(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fs.Close() })
	go func() { served <- Serve(ctx, l, testToken, table, fs, nil, nil, log) }()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	tb.Cleanup(func() {
		c.CloseIdleConnections()
		table.Close()
		cancel()
		if err := <-served; err != nil {
			tb.Errorf("Serve: %v", err)
		}
		<-reaped
	})
	return &guestConn{http: c, table: table}
}

// do sends a request with the test token and returns the response.
func (g *guestConn) do(tb testing.TB, method, path string, body any) *http.Response {
	tb.Helper()
	return g.doCtx(tb, context.Background(), method, path, body, "Bearer "+testToken)
}

func (g *guestConn) doCtx(tb testing.TB, ctx context.Context, method, path string, body any, auth string) *http.Response {
	tb.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case io.Reader:
		rd = b
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			tb.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://guest"+path, rd)
	if err != nil {
		tb.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := g.http.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	return resp
}

// decode reads a JSON response of the wanted status into v.
func decode(tb testing.TB, resp *http.Response, status int, v any) {
	tb.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		tb.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			tb.Fatalf("decode %s: %v", b, err)
		}
	}
}

// wantError checks an error response's status and class.
func wantError(tb testing.TB, resp *http.Response, class errdefs.Class, mention string) {
	tb.Helper()
	var e guestapi.Error
	decode(tb, resp, errdefs.HTTPStatus(class), &e)
	if e.Class != string(class) || !strings.Contains(e.Message, mention) {
		tb.Fatalf("error %+v, want class %s mentioning %q", e, class, mention)
	}
}

// events reads an NDJSON event stream to its end.
func events(tb testing.TB, resp *http.Response) []guestapi.Event {
	tb.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		b, _ := io.ReadAll(resp.Body)
		tb.Fatalf("status %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var evs []guestapi.Event
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev guestapi.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			tb.Fatalf("line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return evs
}

// split sorts a stream's events into stdout, stderr and the exit event.
func split(evs []guestapi.Event) (stdout, stderr string, exit *guestapi.Result) {
	for _, ev := range evs {
		switch ev.Type {
		case guestapi.EventStdout:
			stdout += string(ev.Data)
		case guestapi.EventStderr:
			stderr += string(ev.Data)
		case guestapi.EventExit:
			exit = ev.Result
		}
	}
	return
}

func TestTokenRequired(t *testing.T) {
	g := serve(t)
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + testToken + "x", "Bearer " + testToken[:len(testToken)-1], testToken, "bearer " + testToken} {
		for _, path := range []string{guestapi.PathExec, guestapi.PathProcesses, "/nowhere"} {
			resp := g.doCtx(t, context.Background(), "POST", path, `{"args":["true"]}`, auth)
			wantError(t, resp, errdefs.Unauthenticated, "token")
		}
	}
	if l := g.table.List(); len(l) != 0 {
		t.Fatalf("unauthenticated requests started %+v", l)
	}
}

func TestHello(t *testing.T) {
	g := serve(t)
	nonce := "0123456789abcdef0123"
	req, _ := http.NewRequest("GET", "http://guest"+guestapi.PathHello, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set(guestapi.HeaderNonce, nonce)
	resp, err := g.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var h guestapi.HelloResponse
	decode(t, resp, http.StatusOK, &h)
	if h.Proof != guestapi.Proof(testToken, nonce) || h.Protocol != guestapi.Protocol || h.MinProtocol != guestapi.MinProtocol ||
		!slices.Equal(h.Features, []string{"exec", "processes", "files", guestapi.FeatureStream, guestapi.FeaturePorts, guestapi.FeatureTerminals, guestapi.FeatureApply, guestapi.FeatureExits}) {
		t.Fatalf("hello: %+v", h)
	}
	for _, bad := range []string{"", "short", strings.Repeat("n", 129)} {
		req.Header.Set(guestapi.HeaderNonce, bad)
		resp, err := g.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		wantError(t, resp, errdefs.InvalidArgument, guestapi.HeaderNonce)
	}
}

func TestExecStream(t *testing.T) {
	g := serve(t)
	evs := events(t, g.do(t, "POST", guestapi.PathExec, guestapi.ProcessSpec{
		Args: []string{"sh", "-c", "read x; echo out $x; echo err >&2; exit 2"}, Stdin: []byte("in\n"),
	}))
	if len(evs) < 4 || evs[0].Type != guestapi.EventStart || evs[0].Pid == 0 {
		t.Fatalf("events %+v", evs)
	}
	stdout, stderr, exit := split(evs)
	if last := evs[len(evs)-1]; last.Type != guestapi.EventExit || exit == nil || exit.ExitCode != 2 || exit.Pid != evs[0].Pid ||
		exit.Stdout != nil || stdout != "out in\n" || stderr != "err\n" {
		t.Fatalf("stdout %q stderr %q exit %+v (last %+v)", stdout, stderr, exit, last)
	}
	// The exec's process left the table.
	if _, err := g.table.Get(evs[0].Pid); !errdefs.IsNotFound(err) {
		t.Fatalf("exec'd process still in the table: %v", err)
	}
	// A program that cannot start is a stream too, ending with exit 127.
	_, stderr, exit = split(events(t, g.do(t, "POST", guestapi.PathExec, guestapi.ProcessSpec{Args: []string{"no-such-program"}})))
	if exit == nil || exit.ExitCode != 127 || !strings.Contains(stderr, "no-such-program") || exit.StartError == "" {
		t.Fatalf("missing program: %q %+v", stderr, exit)
	}
	// An invalid spec is an error before any stream.
	wantError(t, g.do(t, "POST", guestapi.PathExec, guestapi.ProcessSpec{}), errdefs.InvalidArgument, "args")
	wantError(t, g.do(t, "POST", guestapi.PathExec, `{"args":`), errdefs.InvalidArgument, "body")
	wantError(t, g.do(t, "POST", guestapi.PathExec, guestapi.ProcessSpec{Args: []string{"true"}, User: "no-such-user"}), errdefs.InvalidArgument, "user")
}

// TestExecBatch checks that a batched exec stream holds its events until
// the process ends (one write instead of one per event) and carries the same
// events as a streamed one, while an unbatched stream sends the start event
// at once.
func TestExecBatch(t *testing.T) {
	g := serve(t)
	for _, batch := range []bool{false, true} {
		gate := filepath.Join(t.TempDir(), "gate")
		type answer struct {
			resp *http.Response
			br   *bufio.Reader
			err  error
		}
		first := make(chan answer, 1)
		go func() {
			resp := g.do(t, "POST", guestapi.PathExec, guestapi.ProcessSpec{
				Args:  []string{"sh", "-c", `echo out; echo err >&2; while [ ! -e "$0" ]; do sleep 0.01; done; exit 3`, gate},
				Batch: batch,
			})
			br := bufio.NewReader(resp.Body)
			_, err := br.Peek(1)
			first <- answer{resp, br, err}
		}()
		var a answer
		select {
		case a = <-first:
			if batch {
				t.Fatalf("batched: the answer arrived while the process runs (%v)", a.err)
			}
		case <-time.After(300 * time.Millisecond):
			if !batch {
				t.Fatal("streamed: no start event while the process runs")
			}
		}
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if a.resp == nil {
			a = <-first
		}
		if a.err != nil {
			t.Fatal(a.err)
		}
		a.resp.Body = struct {
			io.Reader
			io.Closer
		}{a.br, a.resp.Body}
		evs := events(t, a.resp)
		stdout, stderr, exit := split(evs)
		if evs[0].Type != guestapi.EventStart || exit == nil || exit.ExitCode != 3 || stdout != "out\n" || stderr != "err\n" {
			t.Fatalf("batch=%v: events %+v", batch, evs)
		}
	}
}

func TestExecClientGoneKillsGroup(t *testing.T) {
	g := serve(t)
	marker := fmt.Sprintf("sleep %d", 1000+time.Now().UnixNano()%800)
	ctx, cancel := context.WithCancel(context.Background())
	spec, _ := json.Marshal(guestapi.ProcessSpec{Args: []string{"sh", "-c", marker + " & " + marker}})
	// A body of unknown length, sent chunked as a streaming client would.
	resp := g.doCtx(t, ctx, "POST", guestapi.PathExec, io.MultiReader(bytes.NewReader(spec)), "Bearer "+testToken)
	var start guestapi.Event
	if err := json.NewDecoder(resp.Body).Decode(&start); err != nil || start.Type != guestapi.EventStart {
		t.Fatalf("start event %+v: %v", start, err)
	}
	if !eventually(2*time.Second, func() bool { return countCmdline(marker) == 2 }) {
		t.Fatalf("%q not running", marker)
	}
	cancel()
	resp.Body.Close()
	if !eventually(3*time.Second, func() bool { return countCmdline(marker) == 0 }) {
		t.Fatalf("%q still running after the client went away", marker)
	}
	if !eventually(time.Second, func() bool { _, err := g.table.Get(start.Pid); return err != nil }) {
		t.Fatal("process still in the table")
	}
}

func TestBackgroundProcesses(t *testing.T) {
	g := serve(t)
	// Start: 201 and a running process.
	var info guestapi.ProcessInfo
	decode(t, g.do(t, "POST", guestapi.PathProcesses, guestapi.ProcessSpec{Args: []string{"sh", "-c", "echo first; sleep 0.5; echo second; echo late >&2"}}), http.StatusCreated, &info)
	if info.Pid == 0 || !info.Running || info.Args[0] != "sh" || info.Result != nil {
		t.Fatalf("start: %+v", info)
	}
	path := fmt.Sprintf("%s/%d", guestapi.PathProcesses, info.Pid)

	var list []guestapi.ProcessInfo
	decode(t, g.do(t, "GET", guestapi.PathProcesses, nil), http.StatusOK, &list)
	if len(list) != 1 || list[0].Pid != info.Pid || !list[0].Running {
		t.Fatalf("list: %+v", list)
	}
	// Output without follow: what is there now, no exit event.
	time.Sleep(100 * time.Millisecond)
	if out, _, exit := split(events(t, g.do(t, "GET", path+"/output", nil))); out != "first\n" || exit != nil {
		t.Fatalf("output now: %q %+v", out, exit)
	}
	// Wait with a timeout that passes first.
	wantError(t, g.do(t, "POST", path+"/wait?timeout_ms=50", nil), errdefs.DeadlineExceeded, "running")
	// Output with follow: everything up to the exit event.
	out, errOut, exit := split(events(t, g.do(t, "GET", path+"/output?follow=true", nil)))
	if out != "first\nsecond\n" || errOut != "late\n" || exit == nil || exit.ExitCode != 0 {
		t.Fatalf("follow: %q %q %+v", out, errOut, exit)
	}
	var r guestapi.Result
	decode(t, g.do(t, "POST", path+"/wait", nil), http.StatusOK, &r)
	if string(r.Stdout) != "first\nsecond\n" || string(r.Stderr) != "late\n" || r.Pid != info.Pid {
		t.Fatalf("wait: %+v", r)
	}
	decode(t, g.do(t, "GET", path, nil), http.StatusOK, &info)
	if info.Running || info.Result == nil || string(info.Result.Stdout) != "first\nsecond\n" {
		t.Fatalf("get finished: %+v", info)
	}
	// A finished process's output without follow ends with the exit event.
	if evs := events(t, g.do(t, "GET", path+"/output", nil)); evs[len(evs)-1].Type != guestapi.EventExit {
		t.Fatalf("output after exit: %+v", evs)
	}
	wantError(t, g.do(t, "POST", path+"/signal", guestapi.SignalRequest{Signal: 15}), errdefs.Conflict, "exited")
	decode(t, g.do(t, "DELETE", path, nil), http.StatusNoContent, nil)
	wantError(t, g.do(t, "GET", path, nil), errdefs.NotFound, fmt.Sprint(info.Pid))
	wantError(t, g.do(t, "DELETE", path, nil), errdefs.NotFound, fmt.Sprint(info.Pid))

	// Signal a running one, which cannot be deleted before it ends.
	decode(t, g.do(t, "POST", guestapi.PathProcesses, guestapi.ProcessSpec{Args: []string{"sleep", "60"}}), http.StatusCreated, &info)
	path = fmt.Sprintf("%s/%d", guestapi.PathProcesses, info.Pid)
	wantError(t, g.do(t, "DELETE", path, nil), errdefs.Conflict, "running")
	wantError(t, g.do(t, "POST", path+"/wait?timeout_ms=soon", nil), errdefs.InvalidArgument, "timeout_ms")
	wantError(t, g.do(t, "GET", path+"/output?follow=maybe", nil), errdefs.InvalidArgument, "follow")
	for _, bad := range []int{0, 65, -1} {
		wantError(t, g.do(t, "POST", path+"/signal", guestapi.SignalRequest{Signal: bad}), errdefs.InvalidArgument, "signal")
	}
	wantError(t, g.do(t, "POST", path+"/signal", "nonsense"), errdefs.InvalidArgument, "body")
	decode(t, g.do(t, "POST", path+"/signal", guestapi.SignalRequest{Signal: 9}), http.StatusNoContent, nil)
	decode(t, g.do(t, "POST", path+"/wait?timeout_ms=5000", nil), http.StatusOK, &r)
	if r.Signal != 9 || r.ExitCode != 137 {
		t.Fatalf("killed: %+v", r)
	}
	decode(t, g.do(t, "DELETE", path, nil), http.StatusNoContent, nil)

	// Errors carry their class.
	wantError(t, g.do(t, "GET", guestapi.PathProcesses+"/abc", nil), errdefs.InvalidArgument, "pid")
	wantError(t, g.do(t, "GET", guestapi.PathProcesses+"/999999999", nil), errdefs.NotFound, "999999999")
	wantError(t, g.do(t, "POST", guestapi.PathProcesses+"/999999999/wait", nil), errdefs.NotFound, "999999999")
	wantError(t, g.do(t, "POST", guestapi.PathProcesses, guestapi.ProcessSpec{Args: []string{"true"}, Cwd: "/no/such"}), errdefs.InvalidArgument, "cwd")
	wantError(t, g.do(t, "GET", "/guest/v1/nowhere", nil), errdefs.NotFound, "no route")
}

func TestSpecBodyLimit(t *testing.T) {
	g := serve(t)
	big := `{"args":["true"],"env":["A=` + strings.Repeat("x", maxSpecBody) + `"]}`
	wantError(t, g.do(t, "POST", guestapi.PathProcesses, big), errdefs.InvalidArgument, "larger")
}

func eventually(d time.Duration, ok func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if ok() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

func countCmdline(cmd string) int {
	n := 0
	files, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")) == cmd {
			n++
		}
	}
	return n
}

// BenchmarkExecTrue measures one exec of /bin/true through the protocol
// server on a unix socket, request to exit event.
func BenchmarkExecTrue(b *testing.B) {
	g := serve(b)
	body, _ := json.Marshal(guestapi.ProcessSpec{Args: []string{"/bin/true"}})
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		req, _ := http.NewRequest("POST", "http://guest"+guestapi.PathExec, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := g.http.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _, exit := split(events(b, resp))
		if exit == nil || exit.ExitCode != 0 {
			b.Fatalf("exit %+v", exit)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	pct := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
