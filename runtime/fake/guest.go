package fake

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// The fake guest's programs. Anything else exits 127 with a start error,
// like a missing program. Arguments are not run through a shell: "sh -c S"
// runs the words of S as one of these programs.
//
//	echo ARGS…   prints ARGS and a newline
//	true, false  exit 0, 1
//	exit N       exits N
//	cat          prints its stdin
//	env, pwd, whoami  print the environment, working directory, user
//	sleep S      sleeps S seconds (a timeout or a signal ends it)
//	yes N        prints N bytes of "y\n"
func run(ctx context.Context, spec guestapi.ProcessSpec, kill <-chan int) (stdout []byte, code, signal int, timedOut bool, startErr string) {
	args := spec.Args
	if len(args) == 3 && (args[0] == "/bin/sh" || args[0] == "sh") && args[1] == "-c" {
		args = strings.Fields(args[2])
	}
	if len(args) == 0 {
		return nil, 127, 0, false, "fake guest: empty command"
	}
	switch args[0] {
	case "echo":
		return []byte(strings.Join(args[1:], " ") + "\n"), 0, 0, false, ""
	case "true":
		return nil, 0, 0, false, ""
	case "false":
		return nil, 1, 0, false, ""
	case "exit":
		n := 0
		if len(args) > 1 {
			n, _ = strconv.Atoi(args[1])
		}
		return nil, n, 0, false, ""
	case "cat":
		return spec.Stdin, 0, 0, false, ""
	case "env":
		return []byte(strings.Join(spec.Env, "\n") + "\n"), 0, 0, false, ""
	case "pwd":
		return []byte(spec.Cwd + "\n"), 0, 0, false, ""
	case "whoami":
		return []byte(spec.User + "\n"), 0, 0, false, ""
	case "yes":
		n := 0
		if len(args) > 1 {
			n, _ = strconv.Atoi(args[1])
		}
		return []byte(strings.Repeat("y\n", n/2)), 0, 0, false, ""
	case "sleep":
		secs := 0.0
		if len(args) > 1 {
			secs, _ = strconv.ParseFloat(args[1], 64)
		}
		timer := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer timer.Stop()
		var timeout <-chan time.Time
		if spec.TimeoutMs > 0 {
			t := time.NewTimer(time.Duration(spec.TimeoutMs) * time.Millisecond)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-timer.C:
			return nil, 0, 0, false, ""
		case <-timeout:
			return nil, 128 + 9, 9, true, ""
		case sig := <-kill:
			return nil, 128 + sig, sig, false, ""
		case <-ctx.Done():
			return nil, 128 + 9, 9, false, ""
		}
	}
	return nil, 127, 0, false, "fake guest: no program " + strconv.Quote(args[0])
}

// proc is one fake process.
type proc struct {
	pid     int
	args    []string
	started time.Time
	kill    chan int
	done    chan struct{}
	result  guestapi.Result // set before done closes
}

func (p *proc) info() guestapi.ProcessInfo {
	pi := guestapi.ProcessInfo{Pid: p.pid, Args: p.args, StartedUnixMs: p.started.UnixMilli()}
	select {
	case <-p.done:
		r := p.result
		pi.Result = &r
	default:
		pi.Running = true
	}
	return pi
}

// procTable holds a guest's processes.
type procTable struct {
	mu     sync.Mutex
	next   int
	procs  map[int]*proc
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newProcTable() *procTable {
	ctx, cancel := context.WithCancel(context.Background())
	return &procTable{next: 100, procs: map[int]*proc{}, ctx: ctx, cancel: cancel}
}

// start runs spec in a goroutine the table owns.
func (t *procTable) start(spec guestapi.ProcessSpec) *proc {
	t.mu.Lock()
	t.next++
	p := &proc{pid: t.next, args: spec.Args, started: time.Now(), kill: make(chan int, 1), done: make(chan struct{})}
	t.procs[p.pid] = p
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		out, code, sig, timedOut, startErr := run(t.ctx, spec, p.kill)
		limit := spec.MaxOutputBytes
		if limit <= 0 {
			limit = 4 << 20
		}
		r := guestapi.Result{Pid: p.pid, ExitCode: code, Signal: sig, TimedOut: timedOut, StartError: startErr,
			DurationMs: time.Since(p.started).Milliseconds(), Stdout: out}
		if int64(len(out)) > limit {
			r.Stdout, r.StdoutTruncated = out[:limit], true
		}
		p.result = r
		close(p.done)
	}()
	return p
}

func (t *procTable) get(pid int) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "process %d not found", pid)
	}
	return p, nil
}

func (t *procTable) forget(pid int) {
	t.mu.Lock()
	delete(t.procs, pid)
	t.mu.Unlock()
}

func (t *procTable) list() []guestapi.ProcessInfo {
	t.mu.Lock()
	ps := slices.Collect(func(yield func(*proc) bool) {
		for _, p := range t.procs {
			if !yield(p) {
				return
			}
		}
	})
	t.mu.Unlock()
	slices.SortFunc(ps, func(a, b *proc) int { return a.pid - b.pid })
	out := make([]guestapi.ProcessInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info())
	}
	return out
}

// killAll ends every process and waits for them.
func (t *procTable) killAll() {
	t.cancel()
	t.wg.Wait()
}

// tree is an in-memory file tree: path -> content.
type tree struct {
	mu    sync.Mutex
	files map[string][]byte
}

func newTree() *tree { return &tree{files: map[string][]byte{}} }

func (tr *tree) abs(w guestapi.Where, p string) string {
	if !strings.HasPrefix(p, "/") {
		p = strings.TrimSuffix(w.Cwd, "/") + "/" + p
	}
	return p
}

func (tr *tree) get(p string) ([]byte, error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	b, ok := tr.files[p]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "%s: no such file or directory", p)
	}
	return b, nil
}

func (tr *tree) put(p string, b []byte) guestapi.FileInfo {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.files[p] = b
	return fileInfo(p, b)
}

func fileInfo(p string, b []byte) guestapi.FileInfo {
	return guestapi.FileInfo{Path: p, Name: p[strings.LastIndexByte(p, '/')+1:], Type: guestapi.TypeFile,
		Size: int64(len(b)), Mode: 0o644, ModifiedAt: time.Unix(0, 0).UTC()}
}

// handler serves the guest protocol, or the part of it the fake has.
func (g *guest) handler() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern string, h func(w http.ResponseWriter, r *http.Request) error) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+g.token)) != 1 {
				writeError(w, errdefs.New(errdefs.Unauthenticated, "missing or wrong token"))
				return
			}
			if err := h(w, r); err != nil {
				writeError(w, err)
			}
		})
	}
	route("GET "+guestapi.PathHello, g.hello)
	route("POST "+guestapi.PathExec, g.exec)
	route("POST "+guestapi.PathProcesses, g.startProc)
	route("GET "+guestapi.PathProcesses, func(w http.ResponseWriter, r *http.Request) error {
		return writeJSON(w, http.StatusOK, g.procs.list())
	})
	route("GET "+guestapi.PathProcesses+"/{pid}", g.withProc(func(w http.ResponseWriter, r *http.Request, p *proc) error {
		return writeJSON(w, http.StatusOK, p.info())
	}))
	route("POST "+guestapi.PathProcesses+"/{pid}/wait", g.withProc(g.wait))
	route("POST "+guestapi.PathProcesses+"/{pid}/signal", g.withProc(g.signal))
	route("GET "+guestapi.PathProcesses+"/{pid}/output", g.withProc(g.output))
	route("DELETE "+guestapi.PathProcesses+"/{pid}", g.withProc(func(w http.ResponseWriter, r *http.Request, p *proc) error {
		if p.info().Running {
			return errdefs.New(errdefs.Conflict, "process %d is still running; signal it first", p.pid)
		}
		g.procs.forget(p.pid)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}))
	route("GET "+guestapi.PathFiles, g.download)
	route("PUT "+guestapi.PathFiles, g.upload)
	route("POST "+guestapi.PathFS+"/{op}", g.fs)
	route("/", func(w http.ResponseWriter, r *http.Request) error {
		return errdefs.New(errdefs.NotImplemented, "the fake guest does not serve %s %s", r.Method, r.URL.Path)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	c := errdefs.ClassOf(err)
	writeJSON(w, errdefs.HTTPStatus(c), guestapi.Error{Class: string(c), Message: errdefs.Message(err)})
}

func decode(r *http.Request, v any) error {
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(v); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "body: %v", err)
	}
	return nil
}

func (g *guest) hello(w http.ResponseWriter, r *http.Request) error {
	if err := g.helloErr(); err != nil {
		return err
	}
	nonce := r.Header.Get(guestapi.HeaderNonce)
	return writeJSON(w, http.StatusOK, guestapi.HelloResponse{Protocol: guestapi.Protocol, MinProtocol: guestapi.MinProtocol,
		Features: []string{"exec", "processes", "files"}, Proof: guestapi.Proof(g.token, nonce)})
}

// exec streams a process: start, its output, its exit. A client that goes
// away kills it.
func (g *guest) exec(w http.ResponseWriter, r *http.Request) error {
	var spec guestapi.ProcessSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	p := g.procs.start(spec)
	defer g.procs.forget(p.pid)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	enc.Encode(guestapi.Event{Type: guestapi.EventStart, Pid: p.pid})
	rc.Flush()
	select {
	case <-p.done:
	case <-r.Context().Done():
		select {
		case p.kill <- 9:
		default:
		}
		<-p.done
		return nil
	}
	return sendEnd(enc, rc, p)
}

// sendEnd sends a finished process's output and exit.
func sendEnd(enc *json.Encoder, rc *http.ResponseController, p *proc) error {
	res := p.result
	if len(res.Stdout) > 0 {
		enc.Encode(guestapi.Event{Type: guestapi.EventStdout, Data: res.Stdout})
	}
	res.Stdout = nil
	if err := enc.Encode(guestapi.Event{Type: guestapi.EventExit, Result: &res}); err != nil {
		return err
	}
	return rc.Flush()
}

func (g *guest) startProc(w http.ResponseWriter, r *http.Request) error {
	var spec guestapi.ProcessSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, g.procs.start(spec).info())
}

func (g *guest) withProc(h func(w http.ResponseWriter, r *http.Request, p *proc) error) func(w http.ResponseWriter, r *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		pid, err := strconv.Atoi(r.PathValue("pid"))
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "pid: %q is not a process id", r.PathValue("pid"))
		}
		p, err := g.procs.get(pid)
		if err != nil {
			return err
		}
		return h(w, r, p)
	}
}

func (g *guest) wait(w http.ResponseWriter, r *http.Request, p *proc) error {
	var timeout <-chan time.Time
	if ms, _ := strconv.Atoi(r.URL.Query().Get("timeout_ms")); ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-p.done:
		return writeJSON(w, http.StatusOK, p.result)
	case <-timeout:
		return errdefs.New(errdefs.DeadlineExceeded, "process %d still running after %s ms", p.pid, r.URL.Query().Get("timeout_ms"))
	case <-r.Context().Done():
		return r.Context().Err()
	}
}

func (g *guest) signal(w http.ResponseWriter, r *http.Request, p *proc) error {
	var req guestapi.SignalRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	select {
	case p.kill <- req.Signal:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (g *guest) output(w http.ResponseWriter, r *http.Request, p *proc) error {
	follow := r.URL.Query().Get("follow") == "true"
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	if follow {
		select {
		case <-p.done:
		case <-r.Context().Done():
			return nil
		}
	}
	select {
	case <-p.done:
		return sendEnd(enc, rc, p)
	default:
		return rc.Flush()
	}
}

func (g *guest) download(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	b, err := g.files.get(g.files.abs(guestapi.Where{Cwd: q.Get("cwd")}, q.Get("path")))
	if err != nil {
		return err
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, err = w.Write(b)
	return err
}

func (g *guest) upload(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	b, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, g.files.put(g.files.abs(guestapi.Where{Cwd: q.Get("cwd")}, q.Get("path")), b))
}

// fs serves stat, exists, read (whole lines), write and remove; the other
// operations answer not_implemented.
func (g *guest) fs(w http.ResponseWriter, r *http.Request) error {
	switch op := r.PathValue("op"); op {
	case guestapi.OpStat, guestapi.OpExists:
		var req guestapi.StatRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		p := g.files.abs(req.Where, req.Path)
		b, err := g.files.get(p)
		if op == guestapi.OpExists {
			return writeJSON(w, http.StatusOK, guestapi.ExistsResult{Exists: err == nil, Type: map[bool]string{true: guestapi.TypeFile}[err == nil]})
		}
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, fileInfo(p, b))
	case guestapi.OpWrite:
		var req guestapi.WriteRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, g.files.put(g.files.abs(req.Where, req.Path), []byte(req.Content)))
	case guestapi.OpRead:
		var req guestapi.ReadRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		p := g.files.abs(req.Where, req.Path)
		b, err := g.files.get(p)
		if err != nil {
			return err
		}
		res := guestapi.ReadResult{Path: p, Size: int64(len(b)), Lines: []guestapi.Line{}}
		for i, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			res.Lines = append(res.Lines, guestapi.Line{Number: i + 1, Text: l})
		}
		res.TotalLines = len(res.Lines)
		return writeJSON(w, http.StatusOK, res)
	case guestapi.OpRemove:
		var req guestapi.RemoveRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		p := g.files.abs(req.Where, req.Path)
		if _, err := g.files.get(p); err != nil && !req.Force {
			return err
		}
		g.files.mu.Lock()
		delete(g.files.files, p)
		g.files.mu.Unlock()
		return writeJSON(w, http.StatusOK, struct{}{})
	default:
		return errdefs.New(errdefs.NotImplemented, "the fake guest has no file operation %q", op)
	}
}
