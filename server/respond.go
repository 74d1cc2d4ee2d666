package server

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// Bounds of JSON request bodies, by route: a body over its bound is
// refused with too_large (413) as soon as the bound is passed, never read
// to its end.
const (
	// maxBody bounds an exec or process request: stdin is at most 16 MiB,
	// ~22 MiB in base64.
	maxBody = 32 << 20
	// smallBody bounds the other JSON requests (create, update, signal):
	// labels and an environment of some MiB.
	smallBody = 4 << 20
)

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// writeExecResult writes an exec result whose output may be large: stdout
// and stderr go out in base64 as they are encoded, not as one more copy of
// them (and a third, json's buffer) in the daemon's memory. The rest is
// json.Marshal's own rendering of the result, split around the two fields.
func writeExecResult(w http.ResponseWriter, res api.ExecResult) error {
	stdout, stderr := res.Stdout, res.Stderr
	res.Stdout, res.Stderr = []byte{}, []byte{}
	skeleton, err := json.Marshal(res)
	if err != nil {
		return err
	}
	// Quotes inside JSON strings are escaped, so these occur as keys only.
	out := bytes.Index(skeleton, []byte(`"stdout":""`))
	errs := bytes.Index(skeleton, []byte(`"stderr":""`))
	if out < 0 || errs < out {
		return fmt.Errorf("exec result rendering: no stdout and stderr fields in %s", skeleton)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	field := func(data []byte) {
		enc := base64.NewEncoder(base64.StdEncoding, bw)
		enc.Write(data)
		enc.Close()
	}
	bw.Write(skeleton[:out+len(`"stdout":"`)])
	field(stdout)
	bw.Write(skeleton[out+len(`"stdout":"`) : errs+len(`"stderr":"`)])
	field(stderr)
	bw.Write(skeleton[errs+len(`"stderr":"`):])
	bw.WriteByte('\n')
	return bw.Flush()
}

// writeError writes err as berth's error body with its class's status;
// internals stay in the log.
func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, errdefs.HTTPStatus(errdefs.ClassOf(err)), api.ErrorResponse{Error: *apiError(err)})
}

// Error answers r with err as berth's error body, for a group that serves
// plain http.Handlers (a proxy's failure): with status, or its class's
// status when status is 0. The access log notes err.
func Error(w http.ResponseWriter, r *http.Request, status int, err error) {
	info(r).err = err
	if status == 0 {
		status = errdefs.HTTPStatus(errdefs.ClassOf(err))
	}
	writeJSON(w, status, api.ErrorResponse{Error: *apiError(err)})
}

// decode reads a JSON body of at most limit bytes strictly: unknown fields
// are an error naming them, and so is a Content-Type other than JSON (a
// browser's form or text/plain post, which needs no preflight).
func decode(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return errdefs.New(errdefs.InvalidArgument, "Content-Type: %q: this route takes application/json", ct)
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return errdefs.New(errdefs.TooLarge, "body: larger than this route's %d bytes", limit)
		case errors.Is(err, io.EOF):
			return errdefs.New(errdefs.InvalidArgument, "body: expected a JSON object")
		}
		return errdefs.New(errdefs.InvalidArgument, "body: %s", err.Error())
	}
	return nil
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

// int64Query reads the query parameter name as an integer (0 when absent).
func int64Query(r *http.Request, name string) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errdefs.New(errdefs.InvalidArgument, "%s: %q is not a number", name, v)
	}
	return n, nil
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

func (n *ndjson) send(ev api.ExecEvent) error { return n.write(ev) }

// write sends one line of any event type.
func (n *ndjson) write(v any) error {
	if !n.started {
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.w.Header().Set("X-Content-Type-Options", "nosniff")
		n.w.WriteHeader(http.StatusOK)
		n.started = true
	}
	if err := n.enc.Encode(v); err != nil {
		return err
	}
	return n.rc.Flush()
}

// finish ends the stream: an error after the start becomes an error event.
func (n *ndjson) finish(err error) error {
	if err == nil || !n.started {
		return err
	}
	n.send(api.ExecEvent{Type: api.EventError, Error: apiError(err)})
	return err
}

// NoteError records err as r's outcome for the access log, for a group
// that writes its own error bodies (a compatibility API's shape).
func NoteError(r *http.Request, err error) { info(r).err = err }
