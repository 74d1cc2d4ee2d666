// Command testapp is the server the tests run inside sandboxes to check
// what reaches a port through berth: an echo of the request, bodies of any
// size both ways, server-sent events paced by the test, a WebSocket echo,
// and answers that misbehave (endless, malformed, a huge head).
//
//	testapp -listen 127.0.0.1:8000 [-listen [::1]:8001 ...]
//
// Routes:
//
//	ANY  /echo/...        the request as JSON (Echo)
//	POST /sink            reads the body: {"bytes":N,"crc32":C} (Sink)
//	GET  /source?n=N      N bytes of Pattern, with a Content-Length
//	GET  /zeros?n=N       N zero bytes, with a Content-Length (cheap to make: benchmarks)
//	POST /discard         reads the body: {"bytes":N} (cheap: benchmarks)
//	GET  /sse             "data: 0", then one event per POST /sse/next
//	POST /sse/next        lets the next event go
//	POST /duplex          sends each piece of the body back as it arrives, full duplex
//	GET  /ws              a WebSocket that echoes every message
//	GET  /endless         a chunked answer that never ends
//	GET  /malformed       a status line that is not HTTP
//	GET  /hugehead        a 4 MiB header
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/coder/websocket"
)

// Echo is the answer of /echo/.
type Echo struct {
	Method   string      `json:"method"`
	Path     string      `json:"path"`
	RawQuery string      `json:"raw_query"`
	Host     string      `json:"host"`
	Remote   string      `json:"remote"`
	Header   http.Header `json:"header"`
	BodyLen  int64       `json:"body_len"`
}

// Sink is the answer of /sink.
type Sink struct {
	Bytes int64  `json:"bytes"`
	CRC32 uint32 `json:"crc32"`
}

// Pattern is the byte at offset i of /source's answer.
func Pattern(i int64) byte { return byte(i*7 + i>>13) }

type listenFlags []string

func (l *listenFlags) String() string     { return strings.Join(*l, ",") }
func (l *listenFlags) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var listen listenFlags
	flag.Var(&listen, "listen", "an address to listen on (repeatable)")
	flag.Parse()
	if len(listen) == 0 {
		listen = listenFlags{"127.0.0.1:8000"}
	}
	app := &app{next: make(chan struct{})}
	srv := &http.Server{Handler: app.routes()}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	errs := make(chan error, len(listen))
	for _, addr := range listen {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			log.Fatal(err)
		}
		go func() { errs <- srv.Serve(l) }()
	}
	fmt.Println("listening on", listen.String())
	select {
	case <-ctx.Done():
		srv.Close()
	case err := <-errs:
		log.Fatal(err)
	}
}

type app struct {
	next chan struct{}
}

func (a *app) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/echo/", echo)
	mux.HandleFunc("POST /sink", sink)
	mux.HandleFunc("GET /source", source)
	mux.HandleFunc("GET /zeros", zeros)
	mux.HandleFunc("POST /discard", discard)
	mux.HandleFunc("GET /sse", a.sse)
	mux.HandleFunc("POST /sse/next", a.sseNext)
	mux.HandleFunc("POST /duplex", duplex)
	mux.HandleFunc("GET /ws", wsEcho)
	mux.HandleFunc("GET /endless", endless)
	mux.HandleFunc("GET /malformed", malformed)
	mux.HandleFunc("GET /hugehead", hugeHead)
	return mux
}

func echo(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Method", r.Method)
	if r.Method == http.MethodHead {
		return
	}
	json.NewEncoder(w).Encode(Echo{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Host: r.Host,
		Remote: r.RemoteAddr, Header: r.Header, BodyLen: n})
}

func sink(w http.ResponseWriter, r *http.Request) {
	h := crc32.NewIEEE()
	n, err := io.CopyBuffer(h, r.Body, make([]byte, 256<<10))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	json.NewEncoder(w).Encode(Sink{Bytes: n, CRC32: h.Sum32()})
}

func source(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 0 {
		http.Error(w, "n: a byte count", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, 256<<10)
	for off := int64(0); off < n; {
		m := min(int64(len(buf)), n-off)
		for i := range m {
			buf[i] = Pattern(off + i)
		}
		if _, err := w.Write(buf[:m]); err != nil {
			return
		}
		off += m
	}
}

func zeros(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 0 {
		http.Error(w, "n: a byte count", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, 256<<10)
	for n > 0 {
		k, err := w.Write(buf[:min(int64(len(buf)), n)])
		if err != nil {
			return
		}
		n -= int64(k)
	}
}

func discard(w http.ResponseWriter, r *http.Request) {
	n, err := io.CopyBuffer(io.Discard, r.Body, make([]byte, 256<<10))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	json.NewEncoder(w).Encode(Sink{Bytes: n})
}

// sse sends event 0 at once and each next one when the test asks for it:
// a proxy that held the answer back would keep the test waiting.
func (a *app) sse(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	for i := 0; ; i++ {
		if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-a.next:
		case <-r.Context().Done():
			return
		}
	}
}

func (a *app) sseNext(w http.ResponseWriter, r *http.Request) {
	select {
	case a.next <- struct{}{}:
		w.WriteHeader(http.StatusNoContent)
	case <-r.Context().Done():
	}
}

// duplex answers while its request is still arriving: each piece read is
// written back and flushed at once.
func duplex(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil || rc.Flush() != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func wsEcho(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(64 << 20)
	for {
		typ, msg, err := c.Read(r.Context())
		if err != nil {
			return
		}
		if err := c.Write(r.Context(), typ, msg); err != nil {
			return
		}
	}
}

// endless streams chunks until the client goes.
func endless(w http.ResponseWriter, r *http.Request) {
	buf := make([]byte, 64<<10)
	for {
		if _, err := w.Write(buf); err != nil {
			return
		}
	}
}

// malformed answers with bytes that are not an HTTP response.
func malformed(w http.ResponseWriter, r *http.Request) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	brw.WriteString("SMTP ready, not HTTP\r\n\r\n")
	brw.Flush()
}

// hugeHead answers with a header too large for any proxy to keep.
func hugeHead(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	bw := bufio.NewWriterSize(conn, 64<<10)
	bw.WriteString("HTTP/1.1 200 OK\r\nX-Big: ")
	chunk := strings.Repeat("a", 64<<10)
	for range 64 {
		if _, err := bw.WriteString(chunk); err != nil {
			return
		}
	}
	bw.WriteString("\r\n\r\n")
	bw.Flush()
}
