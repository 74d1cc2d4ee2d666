package network

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/internal/testnet"
	"github.com/berthsh/berth/internal/testutil"
)

// TestNamespaceUpstream dials from a namespace the test made: its servers
// answer, a closed port refuses at once, a context ends a dial, and the
// host's own namespace does not reach them.
func TestNamespaceUpstream(t *testing.T) {
	testutil.RequireRoot(t)
	inet := testnet.New(t)
	web := netip.MustParseAddrPort("203.0.113.10:80")
	inet.ServeHTTP(t, web, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from the test net\n") }))
	up, err := NewNamespaceUpstream(inet.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	if ok, err := up.DefaultRoute(); err != nil || !ok {
		t.Fatalf("default route in the test net: %v %v", ok, err)
	}
	ctx := t.Context()
	c, err := up.Dial(ctx, web)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	c.Close()
	if string(body) != "from the test net\n" {
		t.Fatalf("body %q", body)
	}
	if _, err := up.Dial(ctx, netip.MustParseAddrPort("203.0.113.10:81")); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a closed port: %v, want ECONNREFUSED", err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := up.Dial(short, netip.MustParseAddrPort("192.0.2.1:80")); err == nil || time.Since(t0) > 3*time.Second {
		t.Fatalf("a dial to nowhere under a 100 ms context: %v after %v", err, time.Since(t0))
	}
	pc, err := up.ListenUDP()
	if err != nil {
		t.Fatal(err)
	}
	pc.Close()
	if c, err := (HostUpstream{}).Dial(short, web); err == nil {
		c.Close()
		t.Fatal("the host's namespace reached the test net")
	}
}
