package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/guest/proc"
)

// serve starts the guest protocol on a real unix socket.
func serve(t *testing.T, token string) *http.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "g.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tb := proc.NewTable(slog.New(slog.DiscardHandler), proc.Defaults{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { tb.Run(ctx); done <- struct{}{} }()
	go func() { Serve(ctx, l, token, tb, slog.New(slog.DiscardHandler)); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done; tb.Close() })
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

func TestTokenRequired(t *testing.T) {
	c := serve(t, "secret-token")
	for _, auth := range []string{"", "Bearer wrong", "Bearer secret-token-longer", "secret-token"} {
		req, _ := http.NewRequest("POST", "http://g"+guestapi.PathExec, bytes.NewReader([]byte(`{"args":["true"]}`)))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("auth %q: status %d, want 401", auth, resp.StatusCode)
		}
	}
}

func TestHelloProofAndExecStream(t *testing.T) {
	c := serve(t, "tok")
	req, _ := http.NewRequest("GET", "http://g"+guestapi.PathHello, nil)
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Set(guestapi.HeaderNonce, "0123456789abcdef0123")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var h guestapi.HelloResponse
	json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if h.Proof != guestapi.Proof("tok", "0123456789abcdef0123") || h.Protocol != guestapi.Protocol {
		t.Fatalf("hello: %+v", h)
	}
	req, _ = http.NewRequest("POST", "http://g"+guestapi.PathExec, bytes.NewReader([]byte(`{"args":["sh","-c","echo hi; exit 2"]}`)))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var types []string
	var last guestapi.Event
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev guestapi.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
		last = ev
	}
	if len(types) != 3 || types[0] != "start" || types[1] != "stdout" || last.Type != "exit" || last.Result.ExitCode != 2 {
		t.Fatalf("events %v last %+v", types, last)
	}
}
