package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
)

// Manager is what the /v1 API needs of the sandbox manager
// (sandbox.Manager implements it; tests use it over runtime/fake).
type Manager interface {
	Sandboxes
	Processes
	Files
	Network
	Ports
	Terminals
	Snapshots
}

// Sandboxes is the lifecycle half of the manager.
type Sandboxes interface {
	Create(ctx context.Context, tenant string, req api.CreateSandboxRequest) (api.Sandbox, error)
	Get(ctx context.Context, tenant, id string) (api.Sandbox, error)
	List(ctx context.Context, tenant string, sel labels.Selector) ([]api.Sandbox, error)
	Delete(ctx context.Context, tenant, id string) error
	Update(ctx context.Context, tenant, id string, req api.UpdateSandboxRequest) (api.Sandbox, error)
	GetOrCreate(ctx context.Context, tenant string, req api.CreateSandboxRequest) (api.Sandbox, bool, error)
	Stop(ctx context.Context, tenant, id string) (api.Sandbox, error)
	StartSandbox(ctx context.Context, tenant, id string) (api.Sandbox, error)
	Keepalive(ctx context.Context, tenant, id string) error
	Stats(ctx context.Context, tenant, id string) (api.Usage, error)
	Events(ctx context.Context, tenant, id string, ready func(), emit func(api.SandboxEvent) error) error
	Runtimes() []string
	RuntimeInfo() []api.Runtime
}

// Processes runs processes in sandboxes.
type Processes interface {
	Exec(ctx context.Context, tenant, id string, req api.ExecRequest) (api.ExecResult, error)
	ExecStream(ctx context.Context, tenant, id string, req api.ExecRequest, emit func(api.ExecEvent) error) error
	StartProcess(ctx context.Context, tenant, id string, req api.ExecRequest) (api.Process, error)
	ListProcesses(ctx context.Context, tenant, id string) ([]api.Process, error)
	GetProcess(ctx context.Context, tenant, id string, pid int) (api.Process, error)
	RemoveProcess(ctx context.Context, tenant, id string, pid int) error
	ProcessOutput(ctx context.Context, tenant, id string, pid int, follow bool, emit func(api.ExecEvent) error) error
	WaitProcess(ctx context.Context, tenant, id string, pid int, timeout time.Duration) (api.ExecResult, error)
	SignalProcess(ctx context.Context, tenant, id string, pid int, signal string) error
}

// Files moves files in and out of sandboxes and runs the file operations.
type Files interface {
	// FS runs file operation op (api.Op*): req is a value of the op's
	// request type; the result is its result, or nil when it has none.
	FS(ctx context.Context, tenant, id, op string, req any) (any, error)
	Download(ctx context.Context, tenant, id string, where api.Where, path string, setSize func(int64)) (io.ReadCloser, error)
	Upload(ctx context.Context, tenant, id string, where api.Where, path string, mode *uint32, createOnly bool, body io.Reader, size int64) (api.FileInfo, error)
	Archive(ctx context.Context, tenant, id string, where api.Where, path string) (io.ReadCloser, error)
	Extract(ctx context.Context, tenant, id string, where api.Where, path string, body io.Reader, size int64) (api.ArchiveResult, error)
	Watch(ctx context.Context, tenant, id string, where api.Where, path string, recursive bool, ready func() error, emit func(api.WatchEvent) error) error
}

// apiGroup is berth's own API: /v1, with /healthz and /metrics.
type apiGroup struct {
	m           Manager
	metrics     http.Handler
	portsDomain string
}

// API is the group of berth's own API over m; metrics serves /metrics (the
// Prometheus text format).
func API(m Manager, metrics http.Handler, opts ...APIOption) Group {
	a := &apiGroup{m: m, metrics: metrics}
	for _, o := range opts {
		o(a)
	}
	return a
}

// APIOption tunes the API group.
type APIOption func(*apiGroup)

// WithPortsDomain tells clients (GET /v1/version) the domain of ports in
// host form.
func WithPortsDomain(domain string) APIOption { return func(a *apiGroup) { a.portsDomain = domain } }

// Name implements Group.
func (a *apiGroup) Name() string { return "api" }

// Routes implements Group.
func (a *apiGroup) Routes(r *Router) {
	r.Public().Handle("GET /healthz", a.health)
	r.Admin().Handle("GET /metrics", a.metricsRoute)
	r.Handle("GET /v1/version", a.version)
	r.Handle("GET /v1/runtimes", a.runtimes)
	r.Handle("POST /v1/sandboxes", a.createSandbox)
	r.Handle("GET /v1/sandboxes", a.listSandboxes)
	r.Handle("GET /v1/sandboxes/{id}", a.getSandbox)
	r.Handle("DELETE /v1/sandboxes/{id}", a.deleteSandbox)
	r.Handle("PATCH /v1/sandboxes/{id}", a.updateSandbox)
	r.Handle("POST /v1/sandboxes/get-or-create", a.getOrCreate)
	r.Handle("POST /v1/sandboxes/{id}/stop", a.stopSandbox)
	r.Handle("POST /v1/sandboxes/{id}/start", a.startSandbox)
	r.Handle("POST /v1/sandboxes/{id}/keepalive", a.keepalive)
	r.Handle("GET /v1/sandboxes/{id}/stats", a.stats)
	r.Handle("GET /v1/sandboxes/{id}/events", a.events)
	r.Handle("POST /v1/sandboxes/{id}/exec", a.exec)
	r.Handle("POST /v1/sandboxes/{id}/processes", a.startProcess)
	r.Handle("GET /v1/sandboxes/{id}/processes", a.listProcesses)
	r.Handle("GET /v1/sandboxes/{id}/processes/{pid}", a.getProcess)
	r.Handle("DELETE /v1/sandboxes/{id}/processes/{pid}", a.removeProcess)
	r.Handle("GET /v1/sandboxes/{id}/processes/{pid}/output", a.processOutput)
	r.Handle("POST /v1/sandboxes/{id}/processes/{pid}/wait", a.waitProcess)
	r.Handle("POST /v1/sandboxes/{id}/processes/{pid}/signal", a.signalProcess)
	a.routeFiles(r)
	a.routeNetwork(r)
	a.routePorts(r)
	a.routeTerminals(r)
	a.routeSnapshots(r)
}

// metricsRoute serves the Prometheus text exposition format.
func (a *apiGroup) metricsRoute(w http.ResponseWriter, r *http.Request) error {
	if a.metrics == nil {
		return errdefs.New(errdefs.NotFound, "no metrics in this daemon")
	}
	a.metrics.ServeHTTP(w, r)
	return nil
}

func (a *apiGroup) health(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "text/plain")
	_, err := io.WriteString(w, "ok\n")
	return err
}

func (a *apiGroup) version(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.VersionResponse{Version: Version, API: api.Version, Runtimes: a.m.Runtimes(), PortsDomain: a.portsDomain})
}

func (a *apiGroup) runtimes(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.ListRuntimesResponse{Runtimes: a.m.RuntimeInfo()})
}

func (a *apiGroup) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decode(w, r, &req, smallBody); err != nil {
		return err
	}
	sb, err := a.m.Create(r.Context(), Tenant(r), req)
	if err != nil {
		return err
	}
	NoteSandbox(r, sb.ID)
	return writeJSON(w, http.StatusCreated, sb)
}

func (a *apiGroup) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	parts := q["label"]
	if sel := q.Get("selector"); sel != "" {
		parts = append(parts, sel)
	}
	sel, err := labels.ParseSelector(strings.Join(parts, ","))
	if err != nil {
		return err
	}
	list, err := a.m.List(r.Context(), Tenant(r), sel)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ListSandboxesResponse{Sandboxes: list})
}

func (a *apiGroup) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := a.m.Get(r.Context(), Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (a *apiGroup) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := a.m.Delete(r.Context(), Tenant(r), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *apiGroup) updateSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.UpdateSandboxRequest
	if err := decode(w, r, &req, smallBody); err != nil {
		return err
	}
	sb, err := a.m.Update(r.Context(), Tenant(r), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

// getOrCreate answers 200 with an existing sandbox or 201 with a new one.
func (a *apiGroup) getOrCreate(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decode(w, r, &req, smallBody); err != nil {
		return err
	}
	sb, created, err := a.m.GetOrCreate(r.Context(), Tenant(r), req)
	if err != nil {
		return err
	}
	NoteSandbox(r, sb.ID)
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return writeJSON(w, status, sb)
}

func (a *apiGroup) stopSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := a.m.Stop(r.Context(), Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (a *apiGroup) startSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := a.m.StartSandbox(r.Context(), Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (a *apiGroup) keepalive(w http.ResponseWriter, r *http.Request) error {
	if err := a.m.Keepalive(r.Context(), Tenant(r), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *apiGroup) stats(w http.ResponseWriter, r *http.Request) error {
	u, err := a.m.Stats(r.Context(), Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, u)
}

// events serves a sandbox's events as Server-Sent Events, from the moment
// the response headers are sent until the sandbox is deleted or the client
// leaves.
func (a *apiGroup) events(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	ready := func() {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		rc.Flush()
	}
	return a.m.Events(r.Context(), Tenant(r), r.PathValue("id"), ready, func(ev api.SandboxEvent) error {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Type, b); err != nil {
			return err
		}
		return rc.Flush()
	})
}

func (a *apiGroup) exec(w http.ResponseWriter, r *http.Request) error {
	stream, err := boolQuery(r, "stream")
	if err != nil {
		return err
	}
	var req api.ExecRequest
	if err := decode(w, r, &req, maxBody); err != nil {
		return err
	}
	id := r.PathValue("id")
	if !stream {
		res, err := a.m.Exec(r.Context(), Tenant(r), id, req)
		if err != nil {
			return err
		}
		return writeExecResult(w, res)
	}
	nd := newNDJSON(w)
	err = a.m.ExecStream(r.Context(), Tenant(r), id, req, nd.send)
	return nd.finish(err)
}

func pidParam(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return 0, errdefs.New(errdefs.InvalidArgument, "pid: %q is not a process id", r.PathValue("pid"))
	}
	return pid, nil
}

func (a *apiGroup) startProcess(w http.ResponseWriter, r *http.Request) error {
	var req api.ExecRequest
	if err := decode(w, r, &req, maxBody); err != nil {
		return err
	}
	p, err := a.m.StartProcess(r.Context(), Tenant(r), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, p)
}

func (a *apiGroup) listProcesses(w http.ResponseWriter, r *http.Request) error {
	list, err := a.m.ListProcesses(r.Context(), Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ListProcessesResponse{Processes: list})
}

func (a *apiGroup) getProcess(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	p, err := a.m.GetProcess(r.Context(), Tenant(r), r.PathValue("id"), pid)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}

func (a *apiGroup) removeProcess(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	if err := a.m.RemoveProcess(r.Context(), Tenant(r), r.PathValue("id"), pid); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *apiGroup) processOutput(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	follow, err := boolQuery(r, "follow")
	if err != nil {
		return err
	}
	nd := newNDJSON(w)
	err = a.m.ProcessOutput(r.Context(), Tenant(r), r.PathValue("id"), pid, follow, nd.send)
	return nd.finish(err)
}

func (a *apiGroup) waitProcess(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	var timeout time.Duration
	if v := r.URL.Query().Get("timeout_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			return errdefs.New(errdefs.InvalidArgument, "timeout_ms: %q is not a non-negative integer", v)
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	res, err := a.m.WaitProcess(r.Context(), Tenant(r), r.PathValue("id"), pid, timeout)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (a *apiGroup) signalProcess(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	var req api.SignalRequest
	if err := decode(w, r, &req, smallBody); err != nil {
		return err
	}
	if err := a.m.SignalProcess(r.Context(), Tenant(r), r.PathValue("id"), pid, req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
