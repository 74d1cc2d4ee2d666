package server

import (
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/berthsh/berth/api"
)

// TestExecResultStreamsAsJSON: the streamed rendering of an exec result is
// the JSON encoding/json makes of it, for binary output, empty output and a
// message that holds the field names themselves.
func TestExecResultStreamsAsJSON(t *testing.T) {
	big := make([]byte, 3<<20+7)
	for i := range big {
		big[i] = byte(i * 31)
	}
	for _, res := range []api.ExecResult{
		{Pid: 7, ExitCode: 3, Stdout: []byte("out\n"), Stderr: []byte{0, 0xff}, DurationMs: 12},
		{Stdout: []byte{}, Stderr: []byte{}, Error: `exec: "stdout":"" and "stderr":"" in a message`},
		{Pid: 1, Signal: 9, TimedOut: true, OOMKilled: true, Stdout: big, Stderr: big[:5], StdoutTruncated: true},
	} {
		rec := httptest.NewRecorder()
		if err := writeExecResult(rec, res); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(res)
		var got, exp map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("streamed result is not JSON: %v", err)
		}
		json.Unmarshal(want, &exp)
		if !reflect.DeepEqual(got, exp) {
			t.Errorf("streamed %.200s\nwant     %.200s", rec.Body.String(), want)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("content type %q", ct)
		}
	}
}
