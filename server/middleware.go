package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/errdefs"
)

// HeaderRequestID carries a request's id: the caller's, when it sends a
// usable one, else one the edge makes; the response always has it.
const HeaderRequestID = "X-Request-Id"

// request is what the edge knows of one request, shared by the middleware
// through its context.
type request struct {
	id        string
	principal auth.Principal
	sandbox   string        // a sandbox the request made (NoteSandbox)
	err       error         // the handler's error, for the access log
	sw        *statusWriter // the response, once the access log wraps it
}

type requestKey struct{}

// info returns the request's edge record (an empty one outside the edge).
func info(r *http.Request) *request {
	if req, ok := r.Context().Value(requestKey{}).(*request); ok {
		return req
	}
	return &request{}
}

// Tenant is the tenant a request acts for, as authentication decided: ""
// for the operator, who sees every tenant's objects.
func Tenant(r *http.Request) string { return info(r).principal.Tenant }

// RequestID is the request's id.
func RequestID(r *http.Request) string { return info(r).id }

// requestIDs gives every request an id and the edge's record, with the
// principal known before any route runs (see principalOf).
func requestIDs(principal func(*http.Request) auth.Principal, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderRequestID)
		if !usableID(id) {
			var b [8]byte
			rand.Read(b[:])
			id = hex.EncodeToString(b[:])
		}
		w.Header().Set(HeaderRequestID, id)
		req := &request{id: id, principal: principal(r)}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestKey{}, req)))
	})
}

// usableID accepts a caller's request id of 1 to 64 characters from
// [A-Za-z0-9._-]: it goes into logs and headers as it is.
func usableID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// accessLog writes one line per request once it is answered: method, path,
// status, duration, request id and the handler's error, at error level for
// internal errors.
func accessLog(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		req := info(r)
		sw := &statusWriter{ResponseWriter: w}
		req.sw = sw
		next.ServeHTTP(sw, r)
		level := slog.LevelInfo
		if req.err != nil && errdefs.ClassOf(req.err) == errdefs.Internal {
			level = slog.LevelError
		}
		// A key pasted into a path (or an error that names the path's
		// id) keeps its secret out of the log.
		args := []any{"method", r.Method, "path", auth.Redact(r.URL.Path), "status", sw.status, "dur", time.Since(start), "id", req.id}
		if req.principal.Tenant != "" {
			args = append(args, "tenant", req.principal.Tenant)
		}
		if req.principal.KeyID != "" {
			args = append(args, "key", req.principal.KeyID)
		}
		if req.err != nil {
			args = append(args, "err", auth.Redact(req.err.Error()))
		}
		log.Log(r.Context(), level, "http", args...)
	})
}

// recoverPanics turns a handler's panic into an internal error (if the
// response has not begun) and a logged stack, instead of a dropped
// connection with nothing said. http.ErrAbortHandler still aborts.
func recoverPanics(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			req := info(r)
			req.err = fmt.Errorf("panic: %v", v)
			log.Error("handler panicked", "method", r.Method, "path", auth.Redact(r.URL.Path), "id", req.id, "panic", v, "stack", string(debug.Stack()))
			if req.sw == nil || req.sw.status == 0 {
				writeError(w, req.err)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// statusWriter remembers the status of a response.
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

// Hijack hands the connection over (a WebSocket, a tunnel); the response
// counts as begun, with status 101.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
