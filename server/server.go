// Package server is berth's HTTP edge: it routes the public API to the
// sandbox manager, maps error classes to status codes, and logs every request.
package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/sandbox"
)

// Version is the daemon's version string.
const Version = "0.1.0"

// maxBody bounds a JSON request body (exec stdin is at most 16 MiB, base64 makes it ~22).
const maxBody = 32 << 20

// Route is one operation of the API.
type Route struct {
	Method  string
	Pattern string // Go 1.22 pattern path, e.g. /v1/sandboxes/{id}
}

// Server serves the public API.
type Server struct {
	m      *sandbox.Manager
	log    *slog.Logger
	mux    *http.ServeMux
	routes []Route
}

// handler is an API handler: it writes a success response or returns an error.
type handler func(w http.ResponseWriter, r *http.Request) error

// New returns the API handler over m.
func New(m *sandbox.Manager, log *slog.Logger) *Server {
	s := &Server{m: m, log: log, mux: http.NewServeMux()}
	s.handle("GET /healthz", s.health)
	s.handle("GET /v1/version", s.version)
	s.handle("GET /v1/runtimes", s.runtimes)
	s.handle("POST /v1/sandboxes", s.createSandbox)
	s.handle("GET /v1/sandboxes", s.listSandboxes)
	s.handle("GET /v1/sandboxes/{id}", s.getSandbox)
	s.handle("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	s.handle("PATCH /v1/sandboxes/{id}", s.updateSandbox)
	s.handle("POST /v1/sandboxes/get-or-create", s.getOrCreate)
	s.handle("POST /v1/sandboxes/{id}/stop", s.stopSandbox)
	s.handle("POST /v1/sandboxes/{id}/start", s.startSandbox)
	s.handle("POST /v1/sandboxes/{id}/keepalive", s.keepalive)
	s.handle("GET /v1/sandboxes/{id}/stats", s.stats)
	s.handle("GET /v1/sandboxes/{id}/events", s.events)
	s.handle("GET /metrics", s.metrics)
	s.handle("POST /v1/sandboxes/{id}/exec", s.exec)
	s.handle("POST /v1/sandboxes/{id}/processes", s.startProcess)
	s.handle("GET /v1/sandboxes/{id}/processes", s.listProcesses)
	s.handle("GET /v1/sandboxes/{id}/processes/{pid}", s.getProcess)
	s.handle("DELETE /v1/sandboxes/{id}/processes/{pid}", s.removeProcess)
	s.handle("GET /v1/sandboxes/{id}/processes/{pid}/output", s.processOutput)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/wait", s.waitProcess)
	s.handle("POST /v1/sandboxes/{id}/processes/{pid}/signal", s.signalProcess)
	s.routeFiles()
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errdefs.New(errdefs.NotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	return s
}

// Routes lists the operations the server serves.
func (s *Server) Routes() []Route { return append([]Route(nil), s.routes...) }

func (s *Server) handle(pattern string, h handler) {
	method, path, _ := strings.Cut(pattern, " ")
	s.routes = append(s.routes, Route{Method: method, Pattern: path})
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := &statusWriter{ResponseWriter: w}
		err := h(rw, r)
		if err != nil {
			if rw.status == 0 {
				writeError(rw, err)
			} else {
				// Headers are gone (a stream was under way): the stream carried the error.
				s.log.Debug("error after response started", "err", err)
			}
		}
		level := slog.LevelInfo
		if errdefs.ClassOf(err) == errdefs.Internal {
			level = slog.LevelError
		}
		args := []any{"method", r.Method, "path", r.URL.Path, "status", rw.status, "dur", time.Since(start)}
		if err != nil {
			args = append(args, "err", err)
		}
		s.log.Log(r.Context(), level, "http", args...)
	})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	class := errdefs.ClassOf(err)
	writeJSON(w, errdefs.HTTPStatus(class), api.ErrorResponse{Error: api.Error{
		Class: string(class), Message: errdefs.Message(err), Reason: string(errdefs.ReasonOf(err))}})
}

// decode reads a JSON body strictly: unknown fields are an error naming them.
func decode(r *http.Request, v any) error { return decodeLimit(r, v, maxBody) }

// decodeLimit is decode with a bound of its own.
func decodeLimit(r *http.Request, v any, limit int64) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errdefs.New(errdefs.InvalidArgument, "body: expected a JSON object")
		}
		return errdefs.New(errdefs.InvalidArgument, "body: %s", err.Error())
	}
	return nil
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "text/plain")
	_, err := io.WriteString(w, "ok\n")
	return err
}

func (s *Server) version(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.VersionResponse{Version: Version, API: api.Version, Runtimes: s.m.Runtimes()})
}

func (s *Server) runtimes(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.ListRuntimesResponse{Runtimes: s.m.RuntimeInfo()})
}

// tenant is the caller's tenant; authentication is not built yet, so every
// caller is the default tenant "".
func tenant(r *http.Request) string { return "" }

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, err := s.m.Create(r.Context(), tenant(r), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, sb)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	parts := q["label"]
	if sel := q.Get("selector"); sel != "" {
		parts = append(parts, sel)
	}
	sel, err := labels.ParseSelector(strings.Join(parts, ","))
	if err != nil {
		return err
	}
	list, err := s.m.List(r.Context(), tenant(r), sel)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ListSandboxesResponse{Sandboxes: list})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.m.Get(r.Context(), tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := s.m.Delete(r.Context(), tenant(r), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) updateSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.UpdateSandboxRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, err := s.m.Update(r.Context(), tenant(r), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

// getOrCreate answers 200 with an existing sandbox or 201 with a new one.
func (s *Server) getOrCreate(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, created, err := s.m.GetOrCreate(r.Context(), tenant(r), req)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return writeJSON(w, status, sb)
}

func (s *Server) stopSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.m.Stop(r.Context(), tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (s *Server) startSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.m.StartSandbox(r.Context(), tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (s *Server) keepalive(w http.ResponseWriter, r *http.Request) error {
	if err := s.m.Keepalive(r.Context(), tenant(r), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) error {
	u, err := s.m.Stats(r.Context(), tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, u)
}

// events serves a sandbox's events as Server-Sent Events, from the moment
// the response headers are sent until the sandbox is deleted or the client
// leaves.
func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	ready := func() {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		rc.Flush()
	}
	return s.m.Events(r.Context(), tenant(r), r.PathValue("id"), ready, func(ev api.SandboxEvent) error {
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

// metrics serves the Prometheus text exposition format (version 0.0.4).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	return s.m.WriteMetrics(r.Context(), w)
}

func boolQuery(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.New(errdefs.InvalidArgument, "%s: %q is not a boolean", name, v)
	}
	return b, nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	stream, err := boolQuery(r, "stream")
	if err != nil {
		return err
	}
	var req api.ExecRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	if !stream {
		res, err := s.m.Exec(r.Context(), tenant(r), id, req)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, res)
	}
	nd := newNDJSON(w)
	err = s.m.ExecStream(r.Context(), tenant(r), id, req, nd.send)
	return nd.finish(err)
}

// ndjson writes a stream of events; headers go out with the first event, so
// an error before it still gets a proper status code.
type ndjson struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	started bool
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	return &ndjson{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
}

func (n *ndjson) send(ev api.ExecEvent) error {
	if !n.started {
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.w.Header().Set("X-Content-Type-Options", "nosniff")
		n.w.WriteHeader(http.StatusOK)
		n.started = true
	}
	if err := n.enc.Encode(ev); err != nil {
		return err
	}
	return n.rc.Flush()
}

// finish ends the stream: an error after the start becomes an error event.
func (n *ndjson) finish(err error) error {
	if err == nil || !n.started {
		return err
	}
	class := errdefs.ClassOf(err)
	n.send(api.ExecEvent{Type: api.EventError, Error: &api.Error{Class: string(class), Message: errdefs.Message(err)}})
	return err
}

func pidParam(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return 0, errdefs.New(errdefs.InvalidArgument, "pid: %q is not a process id", r.PathValue("pid"))
	}
	return pid, nil
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) error {
	var req api.ExecRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	p, err := s.m.StartProcess(r.Context(), tenant(r), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, p)
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) error {
	list, err := s.m.ListProcesses(r.Context(), tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ListProcessesResponse{Processes: list})
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	p, err := s.m.GetProcess(r.Context(), tenant(r), r.PathValue("id"), pid)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}

func (s *Server) removeProcess(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	if err := s.m.RemoveProcess(r.Context(), tenant(r), r.PathValue("id"), pid); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	follow, err := boolQuery(r, "follow")
	if err != nil {
		return err
	}
	nd := newNDJSON(w)
	err = s.m.ProcessOutput(r.Context(), tenant(r), r.PathValue("id"), pid, follow, nd.send)
	return nd.finish(err)
}

func (s *Server) waitProcess(w http.ResponseWriter, r *http.Request) error {
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
	res, err := s.m.WaitProcess(r.Context(), tenant(r), r.PathValue("id"), pid, timeout)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	var req api.SignalRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if err := s.m.SignalProcess(r.Context(), tenant(r), r.PathValue("id"), pid, req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
