package client

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// The real server is exercised end to end in e2e; these tests pin the
// client's own behaviour against a scripted HTTP server.

func TestErrorClassesComeBack(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" {
			w.WriteHeader(401)
			return
		}
		w.WriteHeader(404)
		json.NewEncoder(w).Encode(api.ErrorResponse{Error: api.Error{Class: "not_found", Message: `sandbox "sb-x" not found`}})
	}))
	defer srv.Close()
	c, err := New(srv.URL, WithAPIKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSandbox(context.Background(), "sb-x")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "sb-x") {
		t.Fatalf("%v", err)
	}
	c2, _ := New(srv.URL)
	if err := c2.Health(context.Background()); errdefs.ClassOf(err) != errdefs.Unauthenticated {
		t.Fatalf("bodyless 401: %v", err)
	}
}

func TestUnixSocketAndRequestShape(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "b.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var got api.ExecRequest
	var path string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.String()
		json.NewDecoder(r.Body).Decode(&got)
		json.NewEncoder(w).Encode(api.ExecResult{ExitCode: 3, Stdout: []byte{0, 1}})
	})}
	go srv.Serve(l)
	defer srv.Close()
	c, err := New("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(context.Background(), "sb-1", api.ExecRequest{Cmd: []string{"x"}, Stdin: []byte("in")})
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "\x00\x01" {
		t.Fatalf("%+v %v", res, err)
	}
	if path != "/v1/sandboxes/sb-1/exec" || string(got.Stdin) != "in" || got.Cmd[0] != "x" {
		t.Fatalf("request %s %+v", path, got)
	}
}

func TestUnreachableNamesTheURL(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	c, _ := New("http://" + addr)
	err := c.Health(context.Background())
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "http://"+addr) {
		t.Fatalf("%v", err)
	}
	for _, bad := range []string{"ftp://x", "unix://", "http://[::1"} {
		if _, err := New(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("New(%q): %v", bad, err)
		}
	}
}
