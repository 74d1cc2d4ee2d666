package guestclient_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guest"
	"github.com/berthsh/berth/guest/files"
	"github.com/berthsh/berth/guest/proc"
	"github.com/berthsh/berth/guestclient"
	"github.com/berthsh/berth/internal/testutil"
)

// guestWithProcesses serves the real guest protocol on a unix socket with
// a process table whose reaper runs, and checks when the test ends that
// the guest and its client left no goroutine or descriptor behind.
func guestWithProcesses(t *testing.T) *guestclient.Client {
	t.Helper()
	testutil.NoLeaks(t)

	sock := filepath.Join(t.TempDir(), "guest.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	fs, err := files.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	table := proc.NewTable(log, proc.Defaults{})
	ctx, cancel := context.WithCancel(context.Background())
	served, reaped := make(chan error, 1), make(chan struct{})
	go func() { table.Run(ctx); close(reaped) }()
	go func() { served <- guest.Serve(ctx, l, token, table, fs, nil, nil, log) }()
	c := guestclient.New("sb-term", token, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() {
		c.Close()
		table.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		<-reaped
		fs.Close()
	})
	return c
}

// follower reads an attachment on a goroutine of its own.
type follower struct {
	out  chan []byte
	exit chan *guestapi.Result
	err  chan error
	text strings.Builder
}

func follow(a *guestclient.Attachment) *follower {
	f := &follower{out: make(chan []byte, 64), exit: make(chan *guestapi.Result, 1), err: make(chan error, 1)}
	go func() {
		for {
			kind, data, res, err := a.Next()
			switch {
			case err != nil:
				f.err <- err
				close(f.out)
				return
			case kind == guestapi.FrameExit:
				f.exit <- res
			default:
				f.out <- data
			}
		}
	}()
	return f
}

// waitFor reads output until it has want in it.
func (f *follower) waitFor(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for !strings.Contains(f.text.String(), want) {
		select {
		case b, ok := <-f.out:
			if !ok {
				t.Fatalf("the attachment ended without %q: %q", want, f.text.String())
			}
			f.text.Write(b)
		case <-timeout:
			t.Fatalf("no %q in %q", want, f.text.String())
		}
	}
}

// end reads to the end: the exit, then io.EOF.
func (f *follower) end(t *testing.T) *guestapi.Result {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case b, ok := <-f.out:
			if !ok {
				var res *guestapi.Result
				select {
				case res = <-f.exit:
				default:
				}
				if err := <-f.err; err != io.EOF {
					t.Fatalf("attachment ended with %v (exit %+v)", err, res)
				}
				return res
			}
			f.text.Write(b)
		case <-timeout:
			t.Fatalf("the attachment did not end: %q", f.text.String())
		}
	}
}

// TestAttachTerminalThroughClient: a terminal of the spec's size, resized,
// typed into (Ctrl-C included), through the client's attachment.
func TestAttachTerminalThroughClient(t *testing.T) {
	c := guestWithProcesses(t)
	info, err := c.Start(t.Context(), guestapi.ProcessSpec{
		Args: []string{"sh", "-c", `tty; stty size; read x; stty size; trap 'echo INT; exit 3' INT; echo waiting; sleep 100 & wait`},
		TTY:  &guestapi.TTY{Rows: 24, Cols: 80},
	})
	if err != nil {
		t.Fatal(err)
	}
	if info.TTY == nil || *info.TTY != (guestapi.TTY{Rows: 24, Cols: 80}) || !info.OpenStdin {
		t.Fatalf("start: %+v", info)
	}
	a, err := c.Attach(t.Context(), info.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	f := follow(a)
	f.waitFor(t, "24 80\r\n")
	if !strings.HasPrefix(f.text.String(), "/dev/pts/") {
		t.Fatalf("tty: %q", f.text.String())
	}
	if err := a.Resize(0, 80); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "tty.rows") {
		t.Fatalf("resize to 0 rows: %v", err)
	}
	if err := a.Resize(40, 10001); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "tty.cols") {
		t.Fatalf("resize to 10001 cols: %v", err)
	}
	if err := a.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	if err := a.Stdin([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	f.waitFor(t, "40 120\r\n")
	f.waitFor(t, "waiting") // the terminal's echo of the input may come before
	if got, err := c.Get(t.Context(), info.Pid); err != nil || *got.TTY != (guestapi.TTY{Rows: 40, Cols: 120}) {
		t.Fatalf("info after resize: %+v %v", got, err)
	}
	if err := a.Stdin([]byte{0x03}); err != nil {
		t.Fatal(err)
	}
	if r := f.end(t); r == nil || r.ExitCode != 3 || r.Pid != info.Pid || !strings.Contains(f.text.String(), "INT") {
		t.Fatalf("^C: %q %+v", f.text.String(), r)
	}
	if err := a.Stdin([]byte("x")); err != nil && !errdefs.IsUnavailable(err) {
		t.Fatalf("input after the exit: %v", err)
	}
}

// TestAttachScrollbackThroughClient: an attachment made after a terminal
// wrote 1 MiB gets exactly its last ScrollbackBytes, then the exit.
func TestAttachScrollbackThroughClient(t *testing.T) {
	c := guestWithProcesses(t)
	info, err := c.Start(t.Context(), guestapi.ProcessSpec{Args: []string{"seq", "1", "200000"}, TTY: &guestapi.TTY{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Wait(t.Context(), info.Pid, 0)
	if err != nil || len(r.Stdout) < 1<<20 || r.StdoutTruncated {
		t.Fatalf("wait: %d bytes %v", len(r.Stdout), err)
	}
	a, err := c.Attach(t.Context(), info.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	f := follow(a)
	if res := f.end(t); res == nil || res.ExitCode != 0 || res.Stdout != nil {
		t.Fatalf("exit: %+v", res)
	}
	if got, want := f.text.String(), string(r.Stdout[len(r.Stdout)-guestapi.ScrollbackBytes:]); got != want {
		t.Fatalf("scrollback: %d bytes, want the last %d", len(got), len(want))
	}
}

// TestAttachOpenStdin: two attachments to cat both see what WriteStdin
// wrote; closing one leaves cat running; closing its input ends it.
func TestAttachOpenStdin(t *testing.T) {
	c := guestWithProcesses(t)
	info, err := c.Start(t.Context(), guestapi.ProcessSpec{Args: []string{"cat"}, OpenStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if !info.OpenStdin || info.TTY != nil {
		t.Fatalf("start: %+v", info)
	}
	a1, err := c.Attach(t.Context(), info.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer a1.Close()
	a2, err := c.Attach(t.Context(), info.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	f1, f2 := follow(a1), follow(a2)
	if err := c.WriteStdin(t.Context(), info.Pid, []byte("a"), false); err != nil {
		t.Fatal(err)
	}
	f1.waitFor(t, "a")
	f2.waitFor(t, "a")
	if err := a2.Close(); err != nil {
		t.Fatal(err)
	}
	for range f2.out {
	}
	if err := <-f2.err; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a closed attachment's Next: %v", err)
	}
	if got, err := c.Get(t.Context(), info.Pid); err != nil || !got.Running {
		t.Fatalf("after closing an attachment: %+v %v", got, err)
	}
	// Input through the attachment, in frames; then the end of input.
	big := strings.Repeat("0123456789abcdef", (guestapi.MaxFrame+100)/16)
	if err := a1.Stdin([]byte(big)); err != nil {
		t.Fatal(err)
	}
	f1.waitFor(t, big) // the attachment's input is not ordered with WriteStdin's
	if err := c.WriteStdin(t.Context(), info.Pid, []byte("b"), true); err != nil {
		t.Fatal(err)
	}
	if r := f1.end(t); r == nil || r.ExitCode != 0 || f1.text.String() != "a"+big+"b" {
		t.Fatalf("cat: %d bytes, %+v", f1.text.Len(), r)
	}
	if err := c.WriteStdin(t.Context(), info.Pid, []byte("late"), false); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("input after the exit: %v", err)
	}
}

// TestStdinRefusals: a process without open input, an unknown one, and
// too much at once.
func TestStdinRefusals(t *testing.T) {
	c := guestWithProcesses(t)
	info, err := c.Start(t.Context(), guestapi.ProcessSpec{Args: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Signal(context.Background(), info.Pid, 9)
	err = c.WriteStdin(t.Context(), info.Pid, []byte("x"), false)
	if !errdefs.IsConflict(err) || errdefs.Message(err) != fmt.Sprintf("process %d was not started with open stdin (open_stdin or tty)", info.Pid) {
		t.Fatalf("stdin without open_stdin: %v", err)
	}
	if err := c.WriteStdin(t.Context(), 999999999, []byte("x"), false); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown process: %v", err)
	}
	if _, err := c.Attach(t.Context(), 999999999); !errdefs.IsNotFound(err) {
		t.Fatalf("attach to an unknown process: %v", err)
	}
	if err := c.WriteStdin(t.Context(), info.Pid, make([]byte, guestapi.MaxStdinWrite+1), false); errdefs.ClassOf(err) != errdefs.TooLarge {
		t.Fatalf("too much: %v", err)
	}
	for _, pid := range []int{0, -1} {
		if _, err := c.Attach(t.Context(), pid); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("attach to %d: %v", pid, err)
		}
	}
}

// upgradeGuest serves, in place of a guest, an attachment whose bytes are
// frames.
func upgradeGuest(t *testing.T, frames []byte) *guestclient.Client {
	return hostileGuest(t, func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + guestapi.UpgradeProtocol + "\r\n\r\n")
		brw.Write(frames)
		brw.Flush()
		conn.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, conn)
	})
}

func rawFrame(typ byte, payload string) string {
	head := make([]byte, guestapi.FrameHead)
	head[0] = typ
	binary.BigEndian.PutUint32(head[1:], uint32(len(payload)))
	return string(head) + payload
}

// TestAttachDistrustsTheGuest: frames that cannot be are errors, and the
// attachment reads no further.
func TestAttachDistrustsTheGuest(t *testing.T) {
	const pid = 42
	exit := rawFrame(guestapi.FrameExit, `{"pid":42,"exit_code":0,"duration_ms":1}`)
	huge := string([]byte{guestapi.FrameStdout, 0, 0x10, 0, 1}) // MaxFrame+1
	for name, frames := range map[string]string{
		"unknown type":         rawFrame(9, "x"),
		"stdin from the guest": rawFrame(guestapi.FrameStdin, "x"),
		"resize from guest":    rawFrame(guestapi.FrameResize, `{"rows":1,"cols":1}`),
		"too long":             huge + strings.Repeat("x", 100),
		"exit not json":        rawFrame(guestapi.FrameExit, `exit 0`),
		"exit null":            rawFrame(guestapi.FrameExit, `null`),
		"exit empty":           rawFrame(guestapi.FrameExit, ``),
		"exit trailing":        rawFrame(guestapi.FrameExit, `{"pid":42}{"pid":42}`),
		"exit too long":        rawFrame(guestapi.FrameExit, `{"pid":42,"start_error":"`+strings.Repeat("e", 64<<10)+`"}`),
		"exit of another":      rawFrame(guestapi.FrameExit, `{"pid":43}`),
		"after the exit":       exit + rawFrame(guestapi.FrameStdout, "more"),
		"byte after the exit":  exit + "x",
		"no exit":              rawFrame(guestapi.FrameStdout, "out"),
		"ends inside a head":   rawFrame(guestapi.FrameStdout, "out") + "\x02\x00",
		"ends inside a frame":  rawFrame(guestapi.FrameStdout, "out")[:7],
	} {
		t.Run(name, func(t *testing.T) {
			c := upgradeGuest(t, []byte(frames))
			a, err := c.Attach(t.Context(), pid)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			var last error
			for range 10 {
				if _, _, _, err := a.Next(); err != nil {
					last = err
					break
				}
			}
			if !errdefs.IsUnavailable(last) {
				t.Fatalf("believed the guest: %v", last)
			}
			if _, _, _, err := a.Next(); err != last {
				t.Fatalf("after an error: %v", err)
			}
		})
	}
	// A sane stream: output, the exit without output, then EOF.
	c := upgradeGuest(t, []byte(rawFrame(guestapi.FrameStdout, "out")+rawFrame(guestapi.FrameStderr, "")+
		rawFrame(guestapi.FrameExit, `{"pid":42,"exit_code":2,"stdout":"aGk=","future_field":1}`)))
	a, err := c.Attach(t.Context(), pid)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var got []string
	for {
		kind, data, res, err := a.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if res != nil {
			got = append(got, fmt.Sprintf("%d:%d:%q", kind, res.ExitCode, res.Stdout))
		} else {
			got = append(got, fmt.Sprintf("%d:%s", kind, data))
		}
	}
	if strings.Join(got, " ") != `2:out 3: 5:2:""` {
		t.Fatalf("sane stream: %q", got)
	}
}

// TestAttachWritesFrames: what the daemon sends arrives as frames: input
// split at MaxFrame, a resize as JSON, the end of input empty; one Stdin's
// frames stay together when several goroutines write at once.
func TestAttachWritesFrames(t *testing.T) {
	got := make(chan []string, 1)
	c := hostileGuest(t, func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + guestapi.UpgradeProtocol + "\r\n\r\n")
		brw.Flush()
		var frames []string
		for {
			head := make([]byte, guestapi.FrameHead)
			if _, err := io.ReadFull(brw.Reader, head); err != nil {
				break
			}
			payload := make([]byte, binary.BigEndian.Uint32(head[1:]))
			if _, err := io.ReadFull(brw.Reader, payload); err != nil {
				break
			}
			switch {
			case head[0] != guestapi.FrameStdin:
				frames = append(frames, fmt.Sprintf("%d:%s", head[0], payload))
			case strings.Trim(string(payload), string(payload[:1])) != "":
				frames = append(frames, "mixed")
			default:
				frames = append(frames, fmt.Sprintf("%d:%d%c", head[0], len(payload), payload[0]))
			}
		}
		got <- frames
	})
	a, err := c.Attach(t.Context(), 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Stdin([]byte(strings.Repeat("a", 2*guestapi.MaxFrame+3))); err != nil {
		t.Fatal(err)
	}
	if err := a.Resize(30, 100); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 4 {
				if err := a.Stdin([]byte(strings.Repeat(string(rune('b'+i)), guestapi.MaxFrame+10))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	a.Close()
	frames := <-got
	want := fmt.Sprintf(`1:%[1]da 1:%[1]da 1:3a 4:{"rows":30,"cols":100} 6:`, guestapi.MaxFrame)
	if first := strings.Join(frames[:min(5, len(frames))], " "); first != want {
		t.Fatalf("frames %q, want %q", first, want)
	}
	rest := frames[5:]
	if len(rest) != 8*4*2 {
		t.Fatalf("%d input frames from the goroutines, want %d", len(rest), 8*4*2)
	}
	for i := 0; i < len(rest); i += 2 {
		c := rest[i][len(rest[i])-1:]
		if rest[i] != fmt.Sprintf("1:%d%s", guestapi.MaxFrame, c) || rest[i+1] != "1:10"+c {
			t.Fatalf("frames %d and %d: %q %q", i, i+1, rest[i], rest[i+1])
		}
	}
}

// TestTerminalsOnAnOlderGuest: a guest without the routes answers
// not_found for them; for a process it knows, that is not implemented.
func TestTerminalsOnAnOlderGuest(t *testing.T) {
	c := hostileGuest(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == guestapi.PathProcesses+"/7" {
			fmt.Fprint(w, `{"pid":7,"args":["sh"],"running":true,"started_unix_ms":1}`)
			return
		}
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"class":"not_found","message":"no route for %s %s"}`, r.Method, r.URL.Path)
	})
	if _, err := c.Attach(t.Context(), 7); !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "predates terminals") {
		t.Fatalf("attach: %v", err)
	}
	if err := c.WriteStdin(t.Context(), 7, []byte("x"), false); !errdefs.IsNotImplemented(err) {
		t.Fatalf("stdin: %v", err)
	}
	if _, err := c.Attach(t.Context(), 8); !errdefs.IsNotFound(err) {
		t.Fatalf("attach to an unknown process: %v", err)
	}
}
