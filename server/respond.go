package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// maxBody bounds a JSON request body (exec stdin is at most 16 MiB, base64 makes it ~22).
const maxBody = 32 << 20

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// writeError writes err as berth's error body with its class's status;
// internals stay in the log.
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
