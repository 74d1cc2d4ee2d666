package guest

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest/proc"
)

const maxSpecBody = 80 << 20

// Serve serves the guest protocol on l until ctx ends. Every request must
// carry the sandbox's token.
func Serve(ctx context.Context, l net.Listener, token string, table *proc.Table, log *slog.Logger) error {
	s := &server{token: token, table: table, log: log}
	mux := http.NewServeMux()
	mux.Handle("GET "+guestapi.PathHello, s.wrap(s.hello))
	mux.Handle("POST "+guestapi.PathExec, s.wrap(s.exec))
	mux.Handle("POST "+guestapi.PathProcesses, s.wrap(s.start))
	mux.Handle("GET "+guestapi.PathProcesses, s.wrap(s.list))
	mux.Handle("GET "+guestapi.PathProcesses+"/{pid}", s.wrap(s.get))
	mux.Handle("DELETE "+guestapi.PathProcesses+"/{pid}", s.wrap(s.remove))
	mux.Handle("GET "+guestapi.PathProcesses+"/{pid}/output", s.wrap(s.output))
	mux.Handle("POST "+guestapi.PathProcesses+"/{pid}/wait", s.wrap(s.wait))
	mux.Handle("POST "+guestapi.PathProcesses+"/{pid}/signal", s.wrap(s.signal))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		<-errc
		return nil
	case err := <-errc:
		return err
	}
}

type server struct {
	token string
	table *proc.Table
	log   *slog.Logger
}

type handler func(w http.ResponseWriter, r *http.Request) error

func (s *server) wrap(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		if subtle.ConstantTimeCompare([]byte(auth), []byte("Bearer "+s.token)) != 1 {
			writeError(w, errdefs.New(errdefs.Unauthenticated, "missing or wrong token"))
			return
		}
		if err := h(w, r); err != nil {
			if w.Header().Get("Content-Type") == "application/x-ndjson" {
				s.log.Debug("error after stream start", "err", err)
				return
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
	writeJSON(w, errdefs.HTTPStatus(c), guestapi.Error{Class: string(c), Message: errdefs.Message(err)})
}

func decodeSpec(r *http.Request) (guestapi.ProcessSpec, error) {
	var spec guestapi.ProcessSpec
	if err := json.NewDecoder(io.LimitReader(r.Body, maxSpecBody)).Decode(&spec); err != nil {
		return spec, errdefs.New(errdefs.InvalidArgument, "body: %s", err.Error())
	}
	return spec, nil
}

func (s *server) hello(w http.ResponseWriter, r *http.Request) error {
	nonce := r.Header.Get(guestapi.HeaderNonce)
	if len(nonce) < 16 || len(nonce) > 128 {
		return errdefs.New(errdefs.InvalidArgument, "%s: 16..128 characters", guestapi.HeaderNonce)
	}
	return writeJSON(w, http.StatusOK, guestapi.HelloResponse{
		Protocol: guestapi.Protocol, MinProtocol: guestapi.MinProtocol,
		Features: []string{"exec", "processes"}, Proof: guestapi.Proof(s.token, nonce),
	})
}

// stream writes events as NDJSON lines, flushing each.
type stream struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder
}

func newStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &stream{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
}

func (st *stream) send(ev guestapi.Event) error {
	if err := st.enc.Encode(ev); err != nil {
		return err
	}
	return st.rc.Flush()
}

// exec starts a process and streams it to the end; if the caller goes away
// first, the process group is killed. The process is forgotten afterwards.
func (s *server) exec(w http.ResponseWriter, r *http.Request) error {
	spec, err := decodeSpec(r)
	if err != nil {
		return err
	}
	p, err := s.table.Start(spec)
	if err != nil {
		return err
	}
	defer func() {
		if p.Pid() == 0 {
			return
		}
		if p.Running() {
			s.table.Signal(p.Pid(), syscall.SIGKILL)
			<-p.Done()
		}
		s.table.Remove(p.Pid())
	}()
	st := newStream(w)
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
	spec, err := decodeSpec(r)
	if err != nil {
		return err
	}
	p, err := s.table.Start(spec)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, p.Info())
}

func (s *server) list(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, s.table.List())
}

func (s *server) process(r *http.Request) (*proc.Process, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "pid: %q is not a process id", r.PathValue("pid"))
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
	p, err := s.process(r)
	if err != nil {
		return err
	}
	if err := s.table.Remove(p.Pid()); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) output(w http.ResponseWriter, r *http.Request) error {
	p, err := s.process(r)
	if err != nil {
		return err
	}
	follow, _ := strconv.ParseBool(r.URL.Query().Get("follow"))
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
	return nil
}

func (s *server) wait(w http.ResponseWriter, r *http.Request) error {
	p, err := s.process(r)
	if err != nil {
		return err
	}
	var timeout <-chan time.Time
	if v := r.URL.Query().Get("timeout_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			return errdefs.New(errdefs.InvalidArgument, "timeout_ms: %q", v)
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
	p, err := s.process(r)
	if err != nil {
		return err
	}
	var req guestapi.SignalRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "body: %s", err.Error())
	}
	if req.Signal < 1 || req.Signal > 64 {
		return errdefs.New(errdefs.InvalidArgument, "signal: %d is outside 1..64", req.Signal)
	}
	if err := s.table.Signal(p.Pid(), syscall.Signal(req.Signal)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
