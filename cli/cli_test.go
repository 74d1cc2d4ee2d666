package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// fakeDaemon is a scripted berth daemon: the real one is driven by the CLI
// binary in e2e; this one pins parsing, requests and output formatting.
type fakeDaemon struct {
	url string

	mu        sync.Mutex
	requests  []string // "METHOD /path?query"
	auth      string
	created   *api.CreateSandboxRequest
	execReq   *api.ExecRequest
	signal    string
	deleted   []string
	sandboxes []api.Sandbox
	processes []api.Process
	events    []api.ExecEvent // the answer of a streamed exec or process output
	execStart chan struct{}   // if set, exec sends start, signals here and waits for the hang-up
}

func newFake(t *testing.T) *fakeDaemon {
	t.Helper()
	f := &fakeDaemon{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandboxRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.created = &req
		f.mu.Unlock()
		reply(w, 201, api.Sandbox{ID: "sb-new", State: api.StateRunning, Image: "host", Labels: req.Labels})
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		reply(w, 200, api.ListSandboxesResponse{Sandboxes: f.sandboxes})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if sb, ok := f.find(r.PathValue("id")); ok {
			reply(w, 200, sb)
			return
		}
		notFound(w, r.PathValue("id"))
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if _, ok := f.find(id); !ok && id != "sb-new" {
			notFound(w, id)
			return
		}
		f.mu.Lock()
		f.deleted = append(f.deleted, id)
		f.mu.Unlock()
		w.WriteHeader(204)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.execReq = &req
		f.mu.Unlock()
		if r.URL.Query().Get("stream") != "true" {
			reply(w, 500, api.ErrorResponse{Error: api.Error{Class: "internal", Message: "the CLI must stream"}})
			return
		}
		if f.execStart != nil {
			w.Header().Set("Content-Type", "application/x-ndjson")
			json.NewEncoder(w).Encode(api.ExecEvent{Type: api.EventStart, Pid: 1})
			w.(http.Flusher).Flush()
			close(f.execStart)
			<-r.Context().Done()
			return
		}
		f.stream(w)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		reply(w, 200, api.ListProcessesResponse{Processes: f.processes})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/signal", func(w http.ResponseWriter, r *http.Request) {
		var req api.SignalRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.signal = req.Signal
		f.mu.Unlock()
		w.WriteHeader(204)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/output", func(w http.ResponseWriter, r *http.Request) {
		f.stream(w)
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		line := r.Method + " " + r.URL.EscapedPath()
		if r.URL.RawQuery != "" {
			line += "?" + r.URL.RawQuery
		}
		f.requests = append(f.requests, line)
		f.auth = r.Header.Get("Authorization")
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *fakeDaemon) find(id string) (api.Sandbox, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, sb := range f.sandboxes {
		if sb.ID == id {
			return sb, true
		}
	}
	return api.Sandbox{}, false
}

func (f *fakeDaemon) stream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	f.mu.Lock()
	events := f.events
	f.mu.Unlock()
	for _, ev := range events {
		enc.Encode(ev)
		w.(http.Flusher).Flush()
	}
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func notFound(w http.ResponseWriter, id string) {
	reply(w, 404, api.ErrorResponse{Error: api.Error{Class: "not_found", Message: fmt.Sprintf("sandbox %q not found", id)}})
}

// exitWith is the answer of a streamed exec that prints and ends with res.
func exitWith(res api.ExecResult) []api.ExecEvent {
	return []api.ExecEvent{
		{Type: api.EventStart, Pid: 9},
		{Type: api.EventStdout, Data: []byte("out ")},
		{Type: api.EventStderr, Data: []byte("err\n")},
		{Type: api.EventStdout, Data: []byte("put\n")},
		{Type: api.EventExit, Result: &res},
	}
}

// berth runs the CLI in-process the way cmd/berth's main does: stdout and
// stderr as they would be written, and the exit code main would exit with.
func berth(ctx context.Context, stdin string, args ...string) (stdout, stderr string, code int) {
	root := &cobra.Command{Use: "berth", SilenceUsage: true, SilenceErrors: true}
	AddCommands(root)
	var out, errOut bytes.Buffer
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		var exit *ExitError
		if errors.As(err, &exit) {
			return out.String(), errOut.String(), exit.Code
		}
		fmt.Fprintln(&errOut, "berth:", err)
		return out.String(), errOut.String(), 1
	}
	return out.String(), errOut.String(), 0
}

// run is berth against f.
func (f *fakeDaemon) run(t *testing.T, stdin string, args ...string) (string, string, int) {
	return berth(t.Context(), stdin, append([]string{"--url", f.url}, args...)...)
}

func (f *fakeDaemon) sawRequests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

func TestCreatePrintsTheIDAlone(t *testing.T) {
	f := newFake(t)
	out, errOut, code := f.run(t, "", "create", "--image", "host", "--runtime", "native", "--label", "thread_id=t1", "-l", "team=ml",
		"--env", "A=1", "-e", "B=x=y", "-w", "/work", "-u", "root", "--memory", "512M", "--cpus", "1.5", "--pids", "512",
		"--idle-timeout", "15m", "--delete-after", "1d", "--max-lifetime", "0")
	if out != "sb-new\n" || errOut != "" || code != 0 {
		t.Fatalf("stdout %q stderr %q exit %d", out, errOut, code)
	}
	idle, del, life := int64(900), int64(86400), int64(0)
	want := api.CreateSandboxRequest{Image: "host", Runtime: "native", Workdir: "/work", User: "root",
		Labels: map[string]string{"thread_id": "t1", "team": "ml"}, Env: map[string]string{"A": "1", "B": "x=y"},
		Limits:   api.Limits{MemoryBytes: 512 << 20, CPUs: 1.5, Pids: 512},
		Timeouts: api.Timeouts{IdleSeconds: &idle, DeleteAfterSeconds: &del, MaxLifetimeSeconds: &life}}
	if !reflect.DeepEqual(*f.created, want) {
		t.Fatalf("request %+v\nwant    %+v", *f.created, want)
	}
	// No flags: an empty request, the daemon's defaults.
	f.run(t, "", "create")
	if !reflect.DeepEqual(*f.created, api.CreateSandboxRequest{}) {
		t.Fatalf("bare create sent %+v", *f.created)
	}
}

func TestBadFlagsAreClearErrors(t *testing.T) {
	f := newFake(t)
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"create", "--memory", "lots"}, `--memory: "lots" is not a size`},
		{[]string{"create", "--memory", "12X"}, `--memory: "12X"`},
		{[]string{"create", "--cpus", "many"}, `"--cpus"`},
		{[]string{"create", "--cpus", "-1"}, "--cpus: -1 is negative"},
		{[]string{"create", "--pids", "-5"}, "--pids: -5 is negative"},
		{[]string{"create", "--label", "novalue"}, `--label "novalue": want KEY=VALUE`},
		{[]string{"create", "--env", "=x"}, `--env "=x"`},
		{[]string{"create", "--idle-timeout", "soon"}, "--idle-timeout"},
		{[]string{"create", "--nope"}, "unknown flag: --nope"},
		{[]string{"create", "extra"}, `unknown command "extra"`},
		{[]string{"run", "--memory", "1Q", "--", "true"}, "--memory"},
		{[]string{"exec", "--timeout", "soon", "sb-1", "--", "true"}, `"--timeout"`},
		{[]string{"exec", "--timeout", "-1s", "sb-1", "--", "true"}, "--timeout: -1s is negative"},
		{[]string{"exec", "-e", "NOEQUALS", "sb-1", "--", "true"}, `--env "NOEQUALS"`},
		{[]string{"exec", "sb-1"}, "usage: berth exec [flags] ID -- CMD [ARG...]"},
		{[]string{"exec"}, "usage: berth exec"},
		{[]string{"exec", "sb-1", "sb-2", "--", "true"}, "usage: berth exec"},
		{[]string{"run"}, "usage: berth run"},
		{[]string{"run", "x", "--", "true"}, "usage: berth run"},
		{[]string{"kill", "sb-1", "forty"}, `PID "forty" is not a number`},
		{[]string{"logs", "sb-1", "x"}, `PID "x" is not a number`},
		{[]string{"inspect"}, "requires at least 1 arg"},
		{[]string{"ps"}, "accepts 1 arg"},
	} {
		out, errOut, code := f.run(t, "", tc.args...)
		if code != 1 || out != "" || !strings.Contains(errOut, tc.want) || !strings.HasPrefix(errOut, "berth: ") {
			t.Errorf("%q: stdout %q stderr %q exit %d; want exit 1 and %q", tc.args, out, errOut, code, tc.want)
		}
	}
	if reqs := f.sawRequests(); len(reqs) != 0 {
		t.Fatalf("bad flags reached the daemon: %v", reqs)
	}
}

func TestExecSendsTheRequestAndStreams(t *testing.T) {
	f := newFake(t)
	f.events = exitWith(api.ExecResult{ExitCode: 0})
	out, errOut, code := f.run(t, "ignored", "exec", "-e", "A=1", "-w", "/tmp", "-u", "root", "--timeout", "30s",
		"sb-1", "--", "sh", "-c", "echo $A", "--not-a-berth-flag")
	if out != "out put\n" || errOut != "err\n" || code != 0 {
		t.Fatalf("stdout %q stderr %q exit %d", out, errOut, code)
	}
	want := api.ExecRequest{Cmd: []string{"sh", "-c", "echo $A", "--not-a-berth-flag"}, Env: map[string]string{"A": "1"},
		Cwd: "/tmp", User: "root", TimeoutMs: 30000}
	if !reflect.DeepEqual(*f.execReq, want) {
		t.Fatalf("request %+v, want %+v", *f.execReq, want)
	}
	if reqs := f.sawRequests(); !reflect.DeepEqual(reqs, []string{"POST /v1/sandboxes/sb-1/exec?stream=true"}) {
		t.Fatalf("requests %v", reqs)
	}
	// Without "--" the command is what follows the id.
	f.run(t, "", "exec", "sb-1", "echo", "hi")
	if !reflect.DeepEqual(f.execReq.Cmd, []string{"echo", "hi"}) {
		t.Fatalf("cmd %q", f.execReq.Cmd)
	}
}

func TestExecStdin(t *testing.T) {
	f := newFake(t)
	f.events = exitWith(api.ExecResult{})
	f.run(t, "piped\x00input", "exec", "-i", "sb-1", "--", "cat")
	if string(f.execReq.Stdin) != "piped\x00input" {
		t.Fatalf("stdin %q", f.execReq.Stdin)
	}
	f.run(t, "not sent", "exec", "sb-1", "--", "cat")
	if f.execReq.Stdin != nil {
		t.Fatalf("stdin without -i: %q", f.execReq.Stdin)
	}
}

func TestExecExitCodes(t *testing.T) {
	f := newFake(t)
	for _, tc := range []struct {
		name   string
		res    api.ExecResult
		args   []string
		code   int
		stderr string // after the command's own "err\n"
	}{
		{"zero", api.ExecResult{}, nil, 0, ""},
		{"three", api.ExecResult{ExitCode: 3}, nil, 3, ""},
		{"killed", api.ExecResult{ExitCode: 137, Signal: 9}, nil, 137, ""},
		{"signal only", api.ExecResult{Signal: 15}, nil, 143, ""},
		{"timed out", api.ExecResult{ExitCode: 137, Signal: 9, TimedOut: true}, []string{"--timeout", "30s"}, 124,
			"berth: timed out after 30s\n"},
		{"timed out 1m30s", api.ExecResult{TimedOut: true}, []string{"--timeout", "90s"}, 124, "berth: timed out after 1m30s\n"},
		{"truncated", api.ExecResult{StdoutTruncated: true}, nil, 0, "berth: stdout truncated at the daemon's output limit\n"},
		{"both truncated", api.ExecResult{ExitCode: 1, StdoutTruncated: true, StderrTruncated: true}, nil, 1,
			"berth: stdout and stderr truncated at the daemon's output limit\n"},
		{"oom", api.ExecResult{ExitCode: 137, Signal: 9, OOMKilled: true}, nil, 137,
			"berth: killed at the sandbox's memory limit (out of memory)\n"},
		{"no such program", api.ExecResult{ExitCode: 127, Error: `exec "nope": no such file`}, nil, 127,
			"berth: exec \"nope\": no such file\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.events = exitWith(tc.res)
			args := append(append([]string{"exec"}, tc.args...), "sb-1", "--", "x")
			out, errOut, code := f.run(t, "", args...)
			if code != tc.code || out != "out put\n" || errOut != "err\n"+tc.stderr {
				t.Fatalf("stdout %q stderr %q exit %d; want stderr %q exit %d", out, errOut, code, "err\n"+tc.stderr, tc.code)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	f := newFake(t)
	f.events = []api.ExecEvent{{Type: api.EventError, Error: &api.Error{Class: "conflict", Message: "sandbox sb-1 is stopped"}}}
	_, errOut, code := f.run(t, "", "exec", "sb-1", "--", "true")
	if code != 1 || errOut != "berth: sandbox sb-1 is stopped\n" {
		t.Fatalf("error event: stderr %q exit %d", errOut, code)
	}
	f.events = []api.ExecEvent{{Type: api.EventStart, Pid: 1}}
	_, errOut, code = f.run(t, "", "exec", "sb-1", "--", "true")
	if code != 1 || !strings.Contains(errOut, "without a result") {
		t.Fatalf("cut stream: stderr %q exit %d", errOut, code)
	}
}

func TestRunCreatesExecsRemoves(t *testing.T) {
	f := newFake(t)
	f.events = exitWith(api.ExecResult{ExitCode: 7})
	out, errOut, code := f.run(t, "data", "run", "--label", "job=1", "-e", "A=1", "--memory", "1Gi", "-i", "--timeout", "5s",
		"--", "sh", "-c", "exit 7")
	if out != "out put\n" || errOut != "err\n" || code != 7 {
		t.Fatalf("stdout %q stderr %q exit %d", out, errOut, code)
	}
	if f.created.Labels["job"] != "1" || f.created.Env["A"] != "1" || f.created.Limits.MemoryBytes != 1<<30 {
		t.Fatalf("create %+v", *f.created)
	}
	if !reflect.DeepEqual(f.execReq.Cmd, []string{"sh", "-c", "exit 7"}) || string(f.execReq.Stdin) != "data" || f.execReq.TimeoutMs != 5000 {
		t.Fatalf("exec %+v", *f.execReq)
	}
	want := []string{"POST /v1/sandboxes", "POST /v1/sandboxes/sb-new/exec?stream=true", "DELETE /v1/sandboxes/sb-new"}
	if reqs := f.sawRequests(); !reflect.DeepEqual(reqs, want) {
		t.Fatalf("requests %v", reqs)
	}
}

func TestRunKeep(t *testing.T) {
	f := newFake(t)
	f.events = exitWith(api.ExecResult{})
	out, errOut, code := f.run(t, "", "run", "--rm=false", "--", "true")
	if out != "out put\n" || errOut != "berth: sandbox sb-new kept\nerr\n" || code != 0 || len(f.deleted) != 0 {
		t.Fatalf("stdout %q stderr %q exit %d deleted %v", out, errOut, code, f.deleted)
	}
}

func TestRunInterruptedStillRemoves(t *testing.T) {
	f := newFake(t)
	f.execStart = make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-f.execStart
		cancel()
	}()
	_, errOut, code := berth(ctx, "", "--url", f.url, "run", "--", "sleep", "100")
	if code != 130 || errOut != "berth: interrupted\n" {
		t.Fatalf("stderr %q exit %d", errOut, code)
	}
	if !reflect.DeepEqual(f.deleted, []string{"sb-new"}) {
		t.Fatalf("deleted %v", f.deleted)
	}
}

func TestLs(t *testing.T) {
	f := newFake(t)
	now := time.Now()
	f.sandboxes = []api.Sandbox{
		{ID: "sb-aaaaaaaaaaaa", State: "running", Image: "host", CreatedAt: now.Add(-90 * time.Second), Labels: map[string]string{"b": "2", "a": "1"}},
		{ID: "sb-bbbbbbbbbbbb", State: "stopped", Image: "host", CreatedAt: now.Add(-3 * time.Hour)},
		{ID: "sb-cccccccccccc", State: "running", Image: "alpine", CreatedAt: now.Add(-50 * time.Hour), Labels: map[string]string{"k": "v"}},
	}
	out, errOut, code := f.run(t, "", "ls", "--label", "b=2", "-l", "a=1")
	want := "ID               STATE    IMAGE   CREATED  LABELS\n" +
		"sb-aaaaaaaaaaaa  running  host    1m ago   a=1,b=2\n" +
		"sb-bbbbbbbbbbbb  stopped  host    3h ago   \n" +
		"sb-cccccccccccc  running  alpine  2d ago   k=v\n"
	if out != want || errOut != "" || code != 0 {
		t.Fatalf("got\n%s\nwant\n%s\nstderr %q exit %d", out, want, errOut, code)
	}
	out, _, _ = f.run(t, "", "ls", "-q")
	if out != "sb-aaaaaaaaaaaa\nsb-bbbbbbbbbbbb\nsb-cccccccccccc\n" {
		t.Fatalf("ls -q: %q", out)
	}
	f.sandboxes = nil
	if out, _, _ = f.run(t, "", "ls"); out != "ID  STATE  IMAGE  CREATED  LABELS\n" {
		t.Fatalf("empty ls: %q", out)
	}
	f.run(t, "", "ls", "--selector", "team=ml,!archived")
	want2 := []string{
		"GET /v1/sandboxes?label=a%3D1&label=b%3D2",
		"GET /v1/sandboxes",
		"GET /v1/sandboxes",
		"GET /v1/sandboxes?selector=team%3Dml%2C%21archived",
	}
	if reqs := f.sawRequests(); !reflect.DeepEqual(reqs, want2) {
		t.Fatalf("requests %q", reqs)
	}
}

func TestLsTable(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	writeTable(&b, []api.Sandbox{
		{ID: "sb-aaaaaaaaaaaa", State: "running", Image: "host", CreatedAt: now.Add(-90 * time.Second), Labels: map[string]string{"b": "2", "a": "1"}},
		{ID: "sb-bbbbbbbbbbbb", State: "error", Image: "host", CreatedAt: now.Add(-3 * time.Hour)},
		{ID: "sb-cccccccccccc", State: "running", Image: "host", CreatedAt: now.Add(5 * time.Second)},
	}, now)
	want := "ID               STATE    IMAGE  CREATED  LABELS\n" +
		"sb-aaaaaaaaaaaa  running  host   1m ago   a=1,b=2\n" +
		"sb-bbbbbbbbbbbb  error    host   3h ago   \n" +
		"sb-cccccccccccc  running  host   0s ago   \n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestRuntimesTable(t *testing.T) {
	var b bytes.Buffer
	writeRuntimes(&b, []api.Runtime{
		{Name: "native", Default: true, Available: true, Capabilities: &api.RuntimeCapabilities{
			Limits: []string{"cpus", "memory_bytes"}, NetworkModes: []string{"none"}, StopStart: true, Stats: true,
			Missing: map[string]string{"grow_disk": "needs CAP_SYS_RESOURCE", "disk_bytes": "needs mkfs.ext4"}}},
		{Name: "gvisor", Reason: "runsc not found on PATH"},
	})
	want := "NAME    DEFAULT  AVAILABLE  LIMITS             NETWORK  STOP/START  UPDATE  STATS\n" +
		"native  yes      yes        cpus,memory_bytes  none     yes         no      yes\n" +
		"gvisor  no       no         -                  -        -           -       -\n" +
		"native: no disk_bytes: needs mkfs.ext4\n" +
		"native: no grow_disk: needs CAP_SYS_RESOURCE\n" +
		"gvisor: unavailable: runsc not found on PATH\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestInspect(t *testing.T) {
	f := newFake(t)
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.sandboxes = []api.Sandbox{
		{ID: "sb-1", State: "running", Image: "host", Labels: map[string]string{"thread_id": "t1"}, Limits: api.Limits{MemoryBytes: 1 << 28}, CreatedAt: created},
		{ID: "sb-2", State: "stopped", Image: "host", CreatedAt: created},
	}
	out, _, code := f.run(t, "", "inspect", "sb-1")
	var one api.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &one) != nil || !reflect.DeepEqual(one, f.sandboxes[0]) ||
		!strings.Contains(out, "\n  \"labels\": {\n    \"thread_id\": \"t1\"\n  },\n") {
		t.Fatalf("inspect one (exit %d):\n%s", code, out)
	}
	out, _, code = f.run(t, "", "inspect", "sb-1", "sb-2")
	var two []api.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &two) != nil || !reflect.DeepEqual(two, f.sandboxes) {
		t.Fatalf("inspect two (exit %d):\n%s", code, out)
	}
	out, errOut, code := f.run(t, "", "inspect", "sb-1", "sb-gone")
	if code != 1 || out != "" || errOut != "berth: sandbox \"sb-gone\" not found\n" {
		t.Fatalf("inspect missing: stdout %q stderr %q exit %d", out, errOut, code)
	}
}

func TestRm(t *testing.T) {
	f := newFake(t)
	f.sandboxes = []api.Sandbox{{ID: "sb-1"}, {ID: "sb-2"}}
	out, errOut, code := f.run(t, "", "rm", "sb-1", "sb-2")
	if out != "sb-1\nsb-2\n" || errOut != "" || code != 0 {
		t.Fatalf("stdout %q stderr %q exit %d", out, errOut, code)
	}
	out, errOut, code = f.run(t, "", "rm", "sb-gone", "sb-1")
	if out != "sb-1\n" || errOut != "berth: sandbox \"sb-gone\" not found\n" || code != 1 {
		t.Fatalf("missing: stdout %q stderr %q exit %d", out, errOut, code)
	}
	out, errOut, code = f.run(t, "", "rm", "-f", "sb-gone", "sb-2")
	if out != "sb-2\n" || errOut != "" || code != 0 {
		t.Fatalf("-f: stdout %q stderr %q exit %d", out, errOut, code)
	}
	if !reflect.DeepEqual(f.deleted, []string{"sb-1", "sb-2", "sb-1", "sb-2"}) {
		t.Fatalf("deleted %v", f.deleted)
	}
}

func TestPsKillLogs(t *testing.T) {
	f := newFake(t)
	now := time.Now()
	f.processes = []api.Process{
		{Pid: 12, Cmd: []string{"sleep", "100"}, Running: true, StartedAt: now.Add(-2 * time.Minute)},
		{Pid: 345, Cmd: []string{"sh", "-c", "exit 3"}, StartedAt: now.Add(-5 * time.Second), Result: &api.ExecResult{ExitCode: 3}},
		{Pid: 6, Cmd: []string{"sleep", "9"}, StartedAt: now.Add(-time.Hour), Result: &api.ExecResult{ExitCode: 137, TimedOut: true}},
	}
	out, _, code := f.run(t, "", "ps", "sb-1")
	want := "PID  STATUS     STARTED  COMMAND\n" +
		"12   running    2m ago   sleep 100\n" +
		"345  exited 3   5s ago   sh -c exit 3\n" +
		"6    timed out  1h ago   sleep 9\n"
	if code != 0 || out != want {
		t.Fatalf("ps (exit %d): got\n%s\nwant\n%s", code, out, want)
	}

	if out, errOut, code := f.run(t, "", "kill", "sb-1", "12"); out != "" || errOut != "" || code != 0 || f.signal != "KILL" {
		t.Fatalf("kill: %q %q %d signal %q", out, errOut, code, f.signal)
	}
	if _, _, code := f.run(t, "", "kill", "-s", "TERM", "sb-1", "12"); code != 0 || f.signal != "TERM" {
		t.Fatalf("kill -s TERM: %d %q", code, f.signal)
	}

	f.events = exitWith(api.ExecResult{ExitCode: 3})
	out, errOut, code := f.run(t, "", "logs", "-f", "sb-1", "12")
	if out != "out put\n" || errOut != "err\n" || code != 0 {
		t.Fatalf("logs: stdout %q stderr %q exit %d", out, errOut, code)
	}
	f.run(t, "", "logs", "sb-1", "12")
	want2 := []string{
		"GET /v1/sandboxes/sb-1/processes",
		"POST /v1/sandboxes/sb-1/processes/12/signal",
		"POST /v1/sandboxes/sb-1/processes/12/signal",
		"GET /v1/sandboxes/sb-1/processes/12/output?follow=true",
		"GET /v1/sandboxes/sb-1/processes/12/output",
	}
	if reqs := f.sawRequests(); !reflect.DeepEqual(reqs, want2) {
		t.Fatalf("requests %q", reqs)
	}
}

func TestNoDaemon(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	for _, args := range [][]string{{"ls"}, {"create"}, {"rm", "sb-1", "sb-2"}, {"exec", "sb-1", "--", "true"}, {"run", "--", "true"}} {
		out, errOut, code := berth(t.Context(), "", append([]string{"--url", url}, args...)...)
		prefix := "berth: berth daemon not reachable at " + url + ": "
		if code != 1 || out != "" || !strings.HasPrefix(errOut, prefix) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%q: stdout %q stderr %q exit %d", args, out, errOut, code)
		}
	}
}

func TestURLAndKeyFromEnvironment(t *testing.T) {
	f := newFake(t)
	t.Setenv("BERTH_URL", f.url)
	t.Setenv("BERTH_API_KEY", "s3cret")
	if _, errOut, code := berth(t.Context(), "", "ls", "-q"); code != 0 {
		t.Fatalf("BERTH_URL: %q %d", errOut, code)
	}
	if f.auth != "Bearer s3cret" {
		t.Fatalf("Authorization %q", f.auth)
	}
	// --url wins over the environment.
	t.Setenv("BERTH_URL", "http://127.0.0.1:1")
	if _, errOut, code := berth(t.Context(), "", "--url", f.url, "ls"); code != 0 {
		t.Fatalf("--url: %q %d", errOut, code)
	}
	t.Setenv("BERTH_URL", "")
	root := &cobra.Command{Use: "berth"}
	AddCommands(root)
	if def := root.PersistentFlags().Lookup("url").DefValue; def != "http://127.0.0.1:7680" {
		t.Fatalf("default --url %q", def)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1024": 1024, "512b": 512, "10k": 10 << 10, "1K": 1 << 10, "1Ki": 1 << 10, "1KiB": 1 << 10, "1kb": 1 << 10,
		"512M": 512 << 20, "64Mi": 64 << 20, "64MiB": 64 << 20, "128MB": 128 << 20, "2G": 2 << 30, "2Gi": 2 << 30,
		"1.5g": 3 << 29, "0.5M": 512 << 10, " 1 G ": 1 << 30, "1T": 1 << 40, "2.": 2,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", " ", "M", "Mi", "-1G", "12X", "lots", "1.2.3", ".", "NaN", "Inf", "1e3", "1i", "1KX",
		"1KBi", "1MM", "0x10", "1_000", "99999999999T"} {
		if n, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %d, accepted", bad, n)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"0": 0, "90s": 90 * time.Second, "15m": 15 * time.Minute, "7d": 7 * 24 * time.Hour, "1.5d": 36 * time.Hour} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "soon", "-1d", "-5m", "d"} {
		if _, err := ParseDuration(bad); err == nil {
			t.Errorf("ParseDuration(%q) accepted", bad)
		}
	}
}

func TestPairs(t *testing.T) {
	m, err := parsePairs("--env", []string{"A=1", "B=x=y", "C="})
	if err != nil || m["A"] != "1" || m["B"] != "x=y" || m["C"] != "" {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := parsePairs("--label", []string{"novalue"}); err == nil {
		t.Fatal("accepted an entry without =")
	}
}

func TestExitError(t *testing.T) {
	var err error = &ExitError{Code: 3}
	var exit *ExitError
	if !errors.As(fmt.Errorf("wrapped: %w", err), &exit) || exit.Code != 3 || err.Error() != "exit status 3" {
		t.Fatalf("%v", err)
	}
	if errdefs.ClassOf(err) != errdefs.Internal {
		t.Fatal("ExitError is not a classified error")
	}
}

func TestNetworkFlags(t *testing.T) {
	var f networkFlags
	if n, err := f.value(); n != nil || err != nil {
		t.Fatalf("no flags: %+v %v, want the daemon's default", n, err)
	}
	f = networkFlags{allow: []string{"pypi.org"}, secrets: []string{
		"openai=api.openai.com",
		"anthropic=api.anthropic.com,header=x-api-key",
		"gh=api.github.com,env=GH_TOKEN,header=Authorization,format=token {secret}",
	}}
	n, err := f.value()
	if err != nil {
		t.Fatal(err)
	}
	want := []api.SecretBinding{
		{Secret: "openai", Host: "api.openai.com", Header: "Authorization", Format: "Bearer {secret}"},
		{Secret: "anthropic", Host: "api.anthropic.com", Header: "x-api-key"},
		{Secret: "gh", Host: "api.github.com", Header: "Authorization", Format: "token {secret}", Env: "GH_TOKEN"},
	}
	if n.Mode != api.NetworkAllowlist || !reflect.DeepEqual(n.Secrets, want) {
		t.Fatalf("policy %+v", n)
	}
	for _, bad := range []string{"openai", "openai=", "=api.openai.com", "openai=api.openai.com,colour=red", "openai=api.openai.com,header"} {
		f := networkFlags{secrets: []string{bad}}
		if _, err := f.value(); err == nil || !strings.Contains(err.Error(), "--secret") {
			t.Errorf("--secret %q: %v", bad, err)
		}
	}
}

// The host's admin key file goes only to a daemon on this host.
func TestKeyFileOnlyForALocalDaemon(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "admin.key")
	os.WriteFile(file, []byte("berth_key\n"), 0o600)
	t.Setenv("BERTH_API_KEY", "")
	t.Setenv("BERTH_API_KEY_FILE", "")
	for url, local := range map[string]bool{"": true, "http://127.0.0.1:7680": true, "http://localhost:1": true, "http://[::1]:7680": true,
		"unix:///var/lib/berth/berth.sock": true, "127.0.0.1:7680": true, "http://berth.example.com:7680": false, "http://10.0.0.5:7680": false} {
		if got := localDaemon(url); got != local {
			t.Errorf("localDaemon(%q) = %v", url, got)
		}
	}
	if k := apiKey("http://berth.example.com"); k != "" {
		t.Errorf("a remote daemon got a key without being given one: %q", k)
	}
	t.Setenv("BERTH_API_KEY_FILE", file)
	if k := apiKey("http://berth.example.com"); k != "berth_key" {
		t.Errorf("BERTH_API_KEY_FILE named for a remote daemon: %q", k)
	}
	t.Setenv("BERTH_API_KEY", "from-env")
	if k := apiKey("http://127.0.0.1:1"); k != "from-env" {
		t.Errorf("BERTH_API_KEY: %q", k)
	}
}
