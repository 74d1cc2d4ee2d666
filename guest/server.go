package guest

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest/files"
	"github.com/berthsh/berth/guest/proc"
)

const (
	maxSpecBody   = 80 << 20 // a ProcessSpec, stdin included
	maxSmallBody  = 4 << 10  // a SignalRequest
	shutdownGrace = time.Second
	ndjson        = "application/x-ndjson"
)

// Serve serves the guest protocol on l until ctx ends; every request must
// carry "Authorization: Bearer <token>" (401 otherwise). When ctx ends it
// shuts the server down, giving open requests a short grace before their
// connections are closed (an exec whose connection closes kills its process).
// With relisten, it can be suspended (guestapi.PathSuspend): it closes l
// and every connection, removes the socket file (unlisten: the runtime
// waits for that), and serves again on relisten's listener once
// guestapi.RelistenSignal arrives.
func Serve(ctx context.Context, l net.Listener, token string, table *proc.Table, fs *files.Service, relisten func() (net.Listener, error), unlisten func() error, log *slog.Logger) error {
	s := &server{auth: []byte("Bearer " + token), token: token, table: table, log: log, life: ctx}
	var wake chan os.Signal
	if relisten != nil {
		s.suspend = make(chan struct{}, 1)
		wake = make(chan os.Signal, 1)
		signal.Notify(wake, syscall.Signal(guestapi.RelistenSignal))
		defer signal.Stop(wake)
	}
	mux := http.NewServeMux()
	route := func(pattern string, h handler) { mux.Handle(pattern, s.wrap(h)) }
	route("GET "+guestapi.PathHello, s.hello)
	route("POST "+guestapi.PathExec, s.exec)
	route("POST "+guestapi.PathProcesses, s.start)
	route("GET "+guestapi.PathProcesses, s.list)
	route("GET "+guestapi.PathProcesses+"/{pid}", s.get)
	route("DELETE "+guestapi.PathProcesses+"/{pid}", s.remove)
	route("GET "+guestapi.PathProcesses+"/{pid}/output", s.output)
	route("POST "+guestapi.PathProcesses+"/{pid}/wait", s.wait)
	route("POST "+guestapi.PathProcesses+"/{pid}/signal", s.signal)
	route("POST "+guestapi.PathProcesses+"/{pid}"+guestapi.PathProcessStdinSuffix, s.stdin)
	route("GET "+guestapi.PathProcesses+"/{pid}"+guestapi.PathProcessAttachSuffix, s.attach)
	route("GET "+guestapi.PathEcho, s.echo)
	route("GET "+guestapi.PathDial, s.dial)
	route("GET "+guestapi.PathPorts, s.ports)
	route("GET "+guestapi.PathExits, s.exits)
	route("POST "+guestapi.PathSuspend, s.suspendServing)
	routeFiles(route, fs)
	route("/", s.noRoute)
	for {
		srv := &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		select {
		case err := <-served:
			return fmt.Errorf("serve guest protocol: %w", err)
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				srv.Close() // streams still open: cut them
			}
			<-served // http.ErrServerClosed
			s.streams.closeAll()
			return nil
		case <-s.suspend:
		}
		// Suspended: nothing of the host's stays open in here. A wake
		// that came before (sent from inside) does not count.
		select {
		case <-wake:
		default:
		}
		srv.Close()
		<-served
		s.streams.closeAll()
		if unlisten != nil {
			if err := unlisten(); err != nil {
				log.Warn("remove the control socket", "err", err)
			}
		}
		log.Info("guest suspended; waiting for the signal to listen again")
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		}
		var err error
		if l, err = relisten(); err != nil {
			return fmt.Errorf("listen again: %w", err)
		}
		log.Info("guest listening again")
	}
}

// suspendServing answers, then has Serve close everything (see Serve).
func (s *server) suspendServing(w http.ResponseWriter, r *http.Request) error {
	if s.suspend == nil {
		return errdefs.New(errdefs.NotImplemented, "this guest was not booted to be suspended")
	}
	w.WriteHeader(http.StatusNoContent)
	http.NewResponseController(w).Flush()
	select {
	case s.suspend <- struct{}{}:
	default:
	}
	return nil
}

type server struct {
	auth    []byte
	token   string
	table   *proc.Table
	log     *slog.Logger
	streams streams // two-way streams, which net/http no longer tracks
	// life is Serve's: streams that never end by themselves (exits) end
	// with it, rather than holding a shutdown for its whole grace.
	life context.Context
	// suspend asks Serve to suspend (nil: this guest cannot be).
	suspend chan struct{}
}

// handler serves one route; a returned error becomes the response, unless
// the handler has begun one (then the error is only logged).
type handler func(w http.ResponseWriter, r *http.Request) error

// tracker notes whether a response has begun.
type tracker struct {
	http.ResponseWriter
	begun bool
}

func (t *tracker) WriteHeader(code int) { t.begun = true; t.ResponseWriter.WriteHeader(code) }
func (t *tracker) Write(b []byte) (int, error) {
	t.begun = true
	return t.ResponseWriter.Write(b)
}
func (t *tracker) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// Hijack takes the connection over for a two-way stream; from then on no
// error response can be written.
func (t *tracker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	t.begun = true
	return http.NewResponseController(t.ResponseWriter).Hijack()
}

func (s *server) wrap(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), s.auth) != 1 {
			writeError(w, errdefs.New(errdefs.Unauthenticated, "missing or wrong token"))
			return
		}
		tw := &tracker{ResponseWriter: w}
		err := h(tw, r)
		switch {
		case err == nil:
		case tw.begun:
			s.log.Debug("guest request ended early", "method", r.Method, "path", r.URL.Path, "err", err)
		default:
			if errdefs.ClassOf(err) == errdefs.Internal {
				s.log.Warn("guest request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeError(w, err)
		}
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	c := errdefs.ClassOf(err)
	writeJSON(w, errdefs.HTTPStatus(c), guestapi.Error{Class: string(c), Message: errdefs.Message(err), Reason: string(errdefs.ReasonOf(err))})
}

// decodeBody reads a JSON body of at most limit bytes into v, to its end:
// net/http notices a client that goes away only once the body is consumed.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body := http.MaxBytesReader(w, r.Body, limit)
	err := json.NewDecoder(body).Decode(v)
	if err == nil {
		_, err = io.Copy(io.Discard, body)
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return errdefs.New(errdefs.InvalidArgument, "body: larger than %d bytes", limit)
	case err != nil:
		return errdefs.New(errdefs.InvalidArgument, "body: %v", err)
	}
	return nil
}

func (s *server) noRoute(w http.ResponseWriter, r *http.Request) error {
	return errdefs.New(errdefs.NotFound, "no route for %s %s", r.Method, r.URL.Path)
}

func (s *server) hello(w http.ResponseWriter, r *http.Request) error {
	nonce := r.Header.Get(guestapi.HeaderNonce)
	if len(nonce) < 16 || len(nonce) > 128 {
		return errdefs.New(errdefs.InvalidArgument, "%s header: want 16 to 128 characters, got %d", guestapi.HeaderNonce, len(nonce))
	}
	return writeJSON(w, http.StatusOK, guestapi.HelloResponse{
		Protocol:    guestapi.Protocol,
		MinProtocol: guestapi.MinProtocol,
		Features:    s.features(),
		Proof:       guestapi.Proof(s.token, nonce),
	})
}

// stream writes events as NDJSON lines, flushing after each unless batch
// (then the response goes out as its buffer fills, and whole at the end).
type stream struct {
	rc    *http.ResponseController
	enc   *json.Encoder
	batch bool
}

func newStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", ndjson)
	w.WriteHeader(http.StatusOK)
	return &stream{rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
}

func (st *stream) send(ev guestapi.Event) error {
	if err := st.enc.Encode(ev); err != nil {
		return err
	}
	if st.batch {
		return nil
	}
	return st.rc.Flush()
}

// exec starts a process and streams it to its exit. If the client goes
// away first, the process group is killed; either way the process leaves
// the table once the stream is over.
func (s *server) exec(w http.ResponseWriter, r *http.Request) error {
	var spec guestapi.ProcessSpec
	if err := decodeBody(w, r, maxSpecBody, &spec); err != nil {
		return err
	}
	p, err := s.table.Start(spec)
	if err != nil {
		return err
	}
	defer func() {
		if p.Running() {
			p.Signal(syscall.SIGKILL)
			<-p.Done()
		}
		s.table.Forget(p)
	}()
	st := newStream(w)
	st.batch = spec.Batch
	if err := st.send(guestapi.Event{Type: guestapi.EventStart, Pid: p.Pid()}); err != nil {
		return err
	}
	for ev := range p.Subscribe(r.Context()) {
		if err := st.send(ev); err != nil {
			return err
		}
	}
	return r.Context().Err()
}

func (s *server) start(w http.ResponseWriter, r *http.Request) error {
	var spec guestapi.ProcessSpec
	if err := decodeBody(w, r, maxSpecBody, &spec); err != nil {
		return err
	}
	p, err := s.table.StartBackground(spec)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, p.Info())
}

// exits streams the exits of background processes (guestapi.PathExits)
// until the client goes away.
func (s *server) exits(w http.ResponseWriter, r *http.Request) error {
	st := newStream(w)
	st.batch = true                       // flushed once per batch
	if err := st.rc.Flush(); err != nil { // the headers: the client knows the stream is open
		return err
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	err := s.table.FollowExits(ctx, func(res guestapi.Result) error {
		return st.send(guestapi.Event{Type: guestapi.EventExit, Pid: res.Pid, Result: &res})
	}, st.rc.Flush)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (s *server) list(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, s.table.List())
}

func pidParam(r *http.Request) (int, error) {
	v := r.PathValue("pid")
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 {
		return 0, errdefs.New(errdefs.InvalidArgument, "pid: %q is not a process id", v)
	}
	return pid, nil
}

func (s *server) process(r *http.Request) (*proc.Process, error) {
	pid, err := pidParam(r)
	if err != nil {
		return nil, err
	}
	return s.table.Get(pid)
}

func (s *server) get(w http.ResponseWriter, r *http.Request) error {
	p, err := s.process(r)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p.Info())
}

func (s *server) remove(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	if err := s.table.Remove(pid); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// output replays a process's kept output; with follow=true it goes on with
// live output up to the exit event, else it ends with what is there now
// (and the exit event if the process is finished).
func (s *server) output(w http.ResponseWriter, r *http.Request) error {
	p, err := s.process(r)
	if err != nil {
		return err
	}
	follow := false
	if v := r.URL.Query().Get("follow"); v != "" {
		if follow, err = strconv.ParseBool(v); err != nil {
			return errdefs.New(errdefs.InvalidArgument, "follow: %q is not a boolean", v)
		}
	}
	st := newStream(w)
	if !follow {
		for _, ev := range p.Snapshot() {
			if err := st.send(ev); err != nil {
				return err
			}
		}
		return nil
	}
	for ev := range p.Subscribe(r.Context()) {
		if err := st.send(ev); err != nil {
			return err
		}
	}
	return r.Context().Err()
}

// wait answers with the Result (output included) once the process is
// finished; with timeout_ms=N (N > 0) it gives up after N ms.
func (s *server) wait(w http.ResponseWriter, r *http.Request) error {
	p, err := s.process(r)
	if err != nil {
		return err
	}
	var timeout <-chan time.Time
	if v := r.URL.Query().Get("timeout_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
			return errdefs.New(errdefs.InvalidArgument, "timeout_ms: %q is not a number of milliseconds", v)
		}
		if ms > 0 {
			t := time.NewTimer(time.Duration(ms) * time.Millisecond)
			defer t.Stop()
			timeout = t.C
		}
	}
	select {
	case <-p.Done():
		return writeJSON(w, http.StatusOK, p.Result())
	case <-timeout:
		return errdefs.New(errdefs.DeadlineExceeded, "process %d still running after %s ms", p.Pid(), r.URL.Query().Get("timeout_ms"))
	case <-r.Context().Done():
		return r.Context().Err()
	}
}

func (s *server) signal(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	var req guestapi.SignalRequest
	if err := decodeBody(w, r, maxSmallBody, &req); err != nil {
		return err
	}
	if req.Signal < 1 || req.Signal > 64 {
		return errdefs.New(errdefs.InvalidArgument, "signal: %d is outside 1..64", req.Signal)
	}
	if err := s.table.Signal(pid, syscall.Signal(req.Signal)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) features() []string { return features(s.suspend != nil) }

// features are what this guest serves (suspend: it can be suspended).
func features(suspend bool) []string {
	f := []string{"exec", "processes", "files", guestapi.FeatureStream, guestapi.FeaturePorts, guestapi.FeatureTerminals, guestapi.FeatureApply, guestapi.FeatureExits}
	if suspend {
		f = append(f, guestapi.FeatureSuspend)
	}
	return f
}
