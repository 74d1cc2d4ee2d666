package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

// The ports bench measures a server inside a sandbox reached through the
// daemon against the same server program run on the host and called
// directly: internal/testapp, built here, on 127.0.0.1 in both places.
// One client (this process, Go's http and coder/websocket) drives both
// paths in alternating rounds, so that the difference is what berth adds:
// the proxy, the guest's relay and the hops between them.

func (s *suite) ports(ctx context.Context) error {
	app := filepath.Join(s.cfg.work, "testapp")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", app, "github.com/berthsh/berth/internal/testapp").CombinedOutput(); err != nil {
		return fmt.Errorf("build internal/testapp: %v: %s", err, out)
	}
	// The direct path: the program on the host.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hostAddr := l.Addr().String()
	l.Close()
	host := exec.Command(app, "-listen", hostAddr)
	if err := host.Start(); err != nil {
		return err
	}
	defer func() { host.Process.Kill(); host.Wait() }()

	d, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-ports", 0, s.log)
	if err != nil {
		return err
	}
	defer d.close()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		return err
	}
	d.track(sb.ID)
	defer d.remove(sb.ID)
	f, err := os.Open(app)
	if err != nil {
		return err
	}
	mode := uint32(0o755)
	_, err = d.client.Upload(ctx, sb.ID, "/tmp/testapp", f, client.FileOptions{Mode: &mode})
	f.Close()
	if err != nil {
		return err
	}
	if _, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"/tmp/testapp", "-listen", "127.0.0.1:8000"}}); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := d.client.WaitPort(wctx, sb.ID, 8000); err != nil {
		return err
	}
	if err := waitListen(ctx, hostAddr); err != nil {
		return err
	}
	through, err := d.client.PortURL(sb.ID, 8000, "")
	if err != nil {
		return err
	}
	through = strings.TrimSuffix(through, "/")
	token := http.Header{api.HeaderAccessToken: {sb.AccessToken}}
	paths := []struct {
		name string
		base string
		hdr  http.Header
	}{{"berth: through the daemon to a port inside", through, token}, {"host: the same server, called directly", "http://" + hostAddr, nil}}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	defer hc.CloseIdleConnections()

	// HTTP round trip on a kept-alive connection.
	get := func(ctx context.Context, url string, hdr http.Header) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header = hdr.Clone()
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		return err
	}
	rtt := [2][]float64{}
	for side := range 2 { // warm both paths' connections
		if err := get(ctx, paths[side].base+"/echo/", paths[side].hdr); err != nil {
			return err
		}
	}
	for r := range s.cfg.portsRounds {
		for i := range 2 {
			side := (r + i) % 2
			for range s.cfg.portsRequests {
				t0 := time.Now()
				if err := get(ctx, paths[side].base+"/echo/", paths[side].hdr); err != nil {
					return err
				}
				rtt[side] = append(rtt[side], ms(time.Since(t0)))
			}
		}
	}
	s.addPair("HTTP GET round trip, a kept-alive connection", paths[0].name, paths[1].name, "ms", rtt, 0.5)

	// WebSocket message round trip: 64 bytes out and back.
	wsRTT := [2][]float64{}
	var conns [2]*websocket.Conn
	for side := range 2 {
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(paths[side].base, "http")+"/ws", &websocket.DialOptions{HTTPHeader: paths[side].hdr})
		if err != nil {
			return fmt.Errorf("WebSocket, %s: %w", paths[side].name, err)
		}
		defer c.CloseNow()
		conns[side] = c
	}
	msg := make([]byte, 64)
	for r := range s.cfg.portsRounds {
		for i := range 2 {
			side := (r + i) % 2
			for range s.cfg.portsRequests {
				t0 := time.Now()
				if err := conns[side].Write(ctx, websocket.MessageBinary, msg); err != nil {
					return err
				}
				if _, _, err := conns[side].Read(ctx); err != nil {
					return err
				}
				wsRTT[side] = append(wsRTT[side], ms(time.Since(t0)))
			}
		}
	}
	s.addPair("WebSocket message round trip, 64 bytes", paths[0].name, paths[1].name, "ms", wsRTT, 0.5)

	// Throughput: a large answer and a large request body, each path.
	if size := s.cfg.bigBytes; size > 0 {
		down, up := [2][]float64{}, [2][]float64{}
		for r := range 3 {
			for i := range 2 {
				side := (r + i) % 2
				t0 := time.Now()
				if err := get(ctx, paths[side].base+"/zeros?n="+strconv.FormatInt(size, 10), paths[side].hdr); err != nil {
					return err
				}
				down[side] = append(down[side], float64(size)/time.Since(t0).Seconds()/1e9)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, paths[side].base+"/discard", &zeros{n: size})
				req.ContentLength = size
				req.Header = paths[side].hdr.Clone()
				t0 = time.Now()
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				up[side] = append(up[side], float64(size)/time.Since(t0).Seconds()/1e9)
			}
		}
		for _, c := range []struct {
			what string
			v    [2][]float64
		}{{"download of " + sizeLabel(size) + " from a port, one connection", down}, {"upload of " + sizeLabel(size) + " to a port, one connection", up}} {
			b, h := summarize(c.v[0]), summarize(c.v[1])
			s.res.Metrics = append(s.res.Metrics,
				Metric{Group: "ports", Name: c.what, Subject: paths[0].name, Unit: "GB/s", Summary: &b, Samples: c.v[0],
					Target: &Target{Stat: "p50", AtMost: false, Limit: 1}},
				Metric{Group: "ports", Name: c.what, Subject: paths[1].name, Unit: "GB/s", Summary: &h, Samples: c.v[1]},
			)
		}
	}

	// Idle WebSockets: the daemon's memory for each one held open.
	hc.CloseIdleConnections()
	time.Sleep(time.Second)
	before := rss(d.cmd.Process.Pid)
	idle := make([]*websocket.Conn, 0, s.cfg.portsIdle)
	defer func() {
		for _, c := range idle {
			c.CloseNow()
		}
	}()
	for i := range s.cfg.portsIdle {
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(through, "http")+"/ws", &websocket.DialOptions{HTTPHeader: token})
		if err != nil {
			return fmt.Errorf("idle WebSocket %d: %w", i+1, err)
		}
		idle = append(idle, c)
	}
	time.Sleep(2 * time.Second)
	after := rss(d.cmd.Process.Pid)
	total := float64(after-before) / (1 << 20)
	per := float64(after-before) / float64(s.cfg.portsIdle) / 1024
	s.res.Metrics = append(s.res.Metrics,
		Metric{Group: "ports", Name: fmt.Sprintf("daemon memory for %d idle WebSockets to a port (RSS growth)", s.cfg.portsIdle), Subject: "berth", Unit: "MiB", Value: &total},
		Metric{Group: "ports", Name: "of which per WebSocket", Subject: "berth", Unit: "KiB", Value: &per},
	)
	return nil
}

// addPair records a latency measured on berth's path and the direct one,
// and what berth adds at p50 against limit (ms).
func (s *suite) addPair(name, berthName, hostName, unit string, v [2][]float64, limit float64) {
	b, h := summarize(v[0]), summarize(v[1])
	added := b.P50 - h.P50
	s.res.Metrics = append(s.res.Metrics,
		Metric{Group: "ports", Name: name, Subject: berthName, Unit: unit, Summary: &b, Samples: v[0]},
		Metric{Group: "ports", Name: name, Subject: hostName, Unit: unit, Summary: &h, Samples: v[1]},
		Metric{Group: "ports", Name: name + ": added by berth at p50", Subject: "berth", Unit: unit, Value: &added,
			Target: &Target{Stat: "value", AtMost: true, Limit: limit}},
	)
}

// waitListen waits until something accepts connections at addr.
func waitListen(ctx context.Context, addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("nothing listens at %s: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
