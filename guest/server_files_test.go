package guest

import (
	"archive/tar"
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// TestApplyRoute applies a layer tar through the protocol and reads the
// result back through it.
func TestApplyRoute(t *testing.T) {
	g := serve(t)
	layer := func(body string) *bytes.Buffer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755})
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/motd", Mode: 0o600, Size: int64(len(body))})
		tw.Write([]byte(body))
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/.wh.issue"})
		tw.Close()
		return &buf
	}
	var res guestapi.ApplyResult
	decode(t, g.do(t, http.MethodPut, guestapi.PathApply+"?path=/", layer("hello")), http.StatusOK, &res)
	if res != (guestapi.ApplyResult{Entries: 2, Whiteouts: 1, Bytes: 5}) {
		t.Fatalf("result %+v", res)
	}
	var fi guestapi.FileInfo
	decode(t, g.do(t, http.MethodPost, guestapi.PathFS+"/"+guestapi.OpStat, guestapi.StatRequest{Path: "/etc/motd"}), http.StatusOK, &fi)
	if fi.Size != 5 || fi.Mode != 0o600 {
		t.Fatalf("applied file: %+v", fi)
	}
	cut := layer("again").Bytes()
	wantError(t, g.do(t, http.MethodPut, guestapi.PathApply+"?path=/", bytes.NewReader(cut[:len(cut)-1024])), errdefs.InvalidArgument, "end-of-archive")
	wantError(t, g.do(t, http.MethodPut, guestapi.PathApply+"?path=/proc", strings.NewReader("")), errdefs.PermissionDenied, "/proc")
}
