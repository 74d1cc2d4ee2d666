package guest

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// TestParseProcNetTCP reads fixed /proc/net/tcp and tcp6 lines, as a
// little-endian kernel prints them: only listening sockets count, and what
// does not parse is skipped.
func TestParseProcNetTCP(t *testing.T) {
	const tcp = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 170 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F40 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000  1000        0 4243 1 0000000000000000 20 4 30 10 -1
   3: 0F00020A:0050 00000000:0000 0A
   4: 0100007F:GGGG 00000000:0000 0A 00000000:00000000
   5: 0100007Z:0050 00000000:0000 0A 00000000:00000000
   6: 0100007F 00000000:0000 0A 00000000:00000000
   7: 0100007F:0000 00000000:0000 0A 00000000:00000000
   8: 01007F:0050 00000000:0000 0A 00000000:00000000
   9: 0100007F:1F40
garbage
`
	const tcp6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 5151 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5152 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5153 1 0000000000000000 100 0 0 10 0
   3: 000080FE000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5154 1 0000000000000000 100 0 0 10 0
   4: 0100007F:0050 00000000:0000 0A 00000000:00000000
   5: 00000000000000000000000001000000:1F41 00000000000000000000000000000000:0000 06 00000000:00000000
   6: 0000000000000000000000000100000:1F40 00000000000000000000000000000000:0000 0A
`
	var got []listener
	add := func(l listener) { got = append(got, l) }
	if err := parseProcNetTCP(strings.NewReader(tcp), guestapi.ProtoTCP, binary.LittleEndian, add); err != nil {
		t.Fatal(err)
	}
	if err := parseProcNetTCP(strings.NewReader(tcp6), guestapi.ProtoTCP6, binary.LittleEndian, add); err != nil {
		t.Fatal(err)
	}
	l := func(port uint16, addr, proto string) listener {
		return listener{port: port, addr: netip.MustParseAddr(addr), proto: proto}
	}
	want := []listener{
		l(8000, "127.0.0.1", "tcp"),
		l(22, "0.0.0.0", "tcp"),
		l(80, "10.2.0.15", "tcp"),
		l(8000, "::1", "tcp6"),
		l(80, "::", "tcp6"),
		l(3000, "::ffff:127.0.0.1", "tcp6"),
		l(22, "fe80::1", "tcp6"),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("parsed\n%s\nwant\n%s", listeners(got), listeners(want))
	}
}

func listeners(ls []listener) string {
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "%s %s:%d\n", l.proto, l.addr, l.port)
	}
	return b.String()
}

// TestListenerSetIsBounded: however many sockets the kernel lists, the set
// keeps the first ones in order, once each, in bounded memory.
func TestListenerSetIsBounded(t *testing.T) {
	set := listenerSet{max: 10}
	lo := netip.MustParseAddr("127.0.0.1")
	for i := 5000; i > 0; i-- {
		set.add(listener{port: uint16(i), addr: lo, proto: "tcp"})
		set.add(listener{port: uint16(i), addr: lo, proto: "tcp"}) // SO_REUSEPORT: the same twice
		if len(set.list) >= 2*set.max {
			t.Fatalf("set grew to %d", len(set.list))
		}
	}
	set.compact()
	if len(set.list) != 10 || set.list[0].port != 1 || set.list[9].port != 10 {
		t.Fatalf("kept %v", set.list)
	}
}

// TestPortsListsListeners: the guest lists a listener of this process (the
// test shares the guest's network namespace), and not a closed one.
func TestPortsListsListeners(t *testing.T) {
	g := serve(t)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	var res guestapi.PortsResult
	decode(t, g.do(t, "GET", guestapi.PathPorts, nil), http.StatusOK, &res)
	if !slices.Contains(res.Ports, guestapi.ListeningPort{Port: port, Address: "127.0.0.1", Proto: "tcp"}) {
		t.Fatalf("listener on port %d not listed: %+v", port, res.Ports)
	}
	if !slices.IsSortedFunc(res.Ports, func(a, b guestapi.ListeningPort) int { return a.Port - b.Port }) {
		t.Fatalf("not sorted by port: %+v", res.Ports)
	}
	l.Close()
	decode(t, g.do(t, "GET", guestapi.PathPorts, nil), http.StatusOK, &res)
	for _, p := range res.Ports {
		if p.Port == port && p.Address == "127.0.0.1" {
			t.Fatalf("closed listener still listed: %+v", p)
		}
	}
}

// dialRequest asks the guest for a stream to port (a raw query value).
func (g *guestConn) dialRequest(t *testing.T, port string, upgrade bool) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", "http://guest"+guestapi.PathDial+"?port="+port, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	if upgrade {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", guestapi.UpgradeProtocol)
	}
	resp, err := g.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestDialRefusals: a bad port is invalid, a closed one unavailable with
// reason port_closed, and a request without the upgrade connects nowhere.
func TestDialRefusals(t *testing.T) {
	g := serve(t)
	for _, port := range []string{"0", "70000", "-1", "abc", "", "80.5", strings.Repeat("9", 100)} {
		wantError(t, g.dialRequest(t, port, true), errdefs.InvalidArgument, "port")
	}

	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	accepted := make(chan bool, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err == nil
	}()
	wantError(t, g.dialRequest(t, strconv.Itoa(port), false), errdefs.InvalidArgument, "Upgrade")
	l.Close()
	if <-accepted {
		t.Fatal("a request without the upgrade connected to the port")
	}

	// Nothing listens on the port now, on 127.0.0.1 or ::1.
	resp := g.dialRequest(t, strconv.Itoa(port), true)
	var e guestapi.Error
	decode(t, resp, http.StatusServiceUnavailable, &e)
	want := "nothing listens on port " + strconv.Itoa(port) + " in the sandbox"
	if e.Class != string(errdefs.Unavailable) || e.Reason != string(errdefs.PortClosed) || e.Message != want {
		t.Fatalf("closed port: %+v", e)
	}
}
