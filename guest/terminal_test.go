package guest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// startProcess starts spec in the background through the protocol.
func (g *guestConn) startProcess(t *testing.T, spec guestapi.ProcessSpec) guestapi.ProcessInfo {
	t.Helper()
	var info guestapi.ProcessInfo
	decode(t, g.do(t, "POST", guestapi.PathProcesses, spec), http.StatusCreated, &info)
	return info
}

// attach opens an attachment to pid as a raw stream.
func (g *guestConn) attach(t *testing.T, pid int) io.ReadWriteCloser {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", fmt.Sprintf("http://guest%s/%d%s", guestapi.PathProcesses, pid, guestapi.PathProcessAttachSuffix), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", guestapi.UpgradeProtocol)
	resp, err := g.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("attach: %s %s", resp.Status, b)
	}
	rw := resp.Body.(io.ReadWriteCloser)
	t.Cleanup(func() { rw.Close() })
	return rw
}

func writeFrame(t *testing.T, w io.Writer, typ byte, payload []byte) {
	t.Helper()
	head := make([]byte, guestapi.FrameHead)
	head[0] = typ
	binary.BigEndian.PutUint32(head[1:], uint32(len(payload)))
	if _, err := w.Write(append(head, payload...)); err != nil {
		t.Fatal(err)
	}
}

// readAttachment reads an attachment to its end: the output and the exit
// (nil if none came). It may run on a goroutine of its own.
func readAttachment(t *testing.T, r io.Reader) (out string, exit *guestapi.Result) {
	t.Helper()
	var b strings.Builder
	for {
		head := make([]byte, guestapi.FrameHead)
		if _, err := io.ReadFull(r, head); err != nil {
			return b.String(), exit
		}
		payload := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(r, payload); err != nil {
			t.Errorf("stream ended inside a frame: %v", err)
			return b.String(), exit
		}
		if exit != nil {
			t.Errorf("frame %d after the exit", head[0])
		}
		switch head[0] {
		case guestapi.FrameStdout, guestapi.FrameStderr:
			b.Write(payload)
		case guestapi.FrameExit:
			exit = new(guestapi.Result)
			if err := json.Unmarshal(payload, exit); err != nil {
				t.Errorf("exit frame %q: %v", payload, err)
			}
		default:
			t.Errorf("frame type %d from the guest", head[0])
		}
	}
}

func TestStdinRoute(t *testing.T) {
	g := serve(t)
	info := g.startProcess(t, guestapi.ProcessSpec{Args: []string{"cat"}, OpenStdin: true})
	if !info.OpenStdin || info.TTY != nil {
		t.Fatalf("start: %+v", info)
	}
	path := fmt.Sprintf("%s/%d", guestapi.PathProcesses, info.Pid)
	decode(t, g.do(t, "POST", path+"/stdin", "hello "), http.StatusNoContent, nil)
	decode(t, g.do(t, "POST", path+"/stdin", ""), http.StatusNoContent, nil)
	wantError(t, g.do(t, "POST", path+"/stdin?close=maybe", "x"), errdefs.InvalidArgument, "close")
	// Too much at once: none of it is written.
	wantError(t, g.do(t, "POST", path+"/stdin", strings.NewReader(strings.Repeat("x", guestapi.MaxStdinWrite+1))), errdefs.TooLarge, "larger")
	wantError(t, g.do(t, "POST", path+"/stdin", io.MultiReader(strings.NewReader(strings.Repeat("x", guestapi.MaxStdinWrite+1)))), errdefs.TooLarge, "larger")
	decode(t, g.do(t, "POST", path+"/stdin?close=true", "world"), http.StatusNoContent, nil)
	wantError(t, g.do(t, "POST", path+"/stdin", "late"), errdefs.Conflict, "") // closed, or exited already
	var r guestapi.Result
	decode(t, g.do(t, "POST", path+"/wait", nil), http.StatusOK, &r)
	if string(r.Stdout) != "hello world" || r.ExitCode != 0 {
		t.Fatalf("cat: %+v", r)
	}
	wantError(t, g.do(t, "POST", path+"/stdin", "late"), errdefs.Conflict, "exited")

	info = g.startProcess(t, guestapi.ProcessSpec{Args: []string{"sleep", "10"}})
	path = fmt.Sprintf("%s/%d", guestapi.PathProcesses, info.Pid)
	wantError(t, g.do(t, "POST", path+"/stdin", "x"), errdefs.Conflict, "was not started with open stdin (open_stdin or tty)")
	decode(t, g.do(t, "POST", path+"/signal", guestapi.SignalRequest{Signal: 9}), http.StatusNoContent, nil)
	wantError(t, g.do(t, "POST", guestapi.PathProcesses+"/999999999/stdin", "x"), errdefs.NotFound, "999999999")
	wantError(t, g.do(t, "GET", guestapi.PathProcesses+"/999999999/attach", nil), errdefs.NotFound, "999999999")
	wantError(t, g.do(t, "GET", path+"/attach", nil), errdefs.InvalidArgument, "Upgrade")
}

// TestAttachTerminal drives a shell on a terminal through one attachment:
// what it printed before, a resize, input, the exit.
func TestAttachTerminal(t *testing.T) {
	g := serve(t)
	info := g.startProcess(t, guestapi.ProcessSpec{
		Args: []string{"sh", "-c", `stty size; read x; stty size; exit 4`}, TTY: &guestapi.TTY{Rows: 24, Cols: 80},
	})
	if info.TTY == nil || *info.TTY != (guestapi.TTY{Rows: 24, Cols: 80}) || !info.OpenStdin {
		t.Fatalf("start: %+v", info)
	}
	if !eventually(5*time.Second, func() bool {
		out, _, _ := split(events(t, g.do(t, "GET", fmt.Sprintf("%s/%d/output", guestapi.PathProcesses, info.Pid), nil)))
		return out == "24 80\r\n"
	}) {
		t.Fatal("no stty output")
	}
	a := g.attach(t, info.Pid)
	resize, _ := json.Marshal(guestapi.TTY{Rows: 50, Cols: 132})
	writeFrame(t, a, guestapi.FrameResize, resize)
	writeFrame(t, a, guestapi.FrameStdin, []byte("go\n"))
	out, exit := readAttachment(t, a)
	// The terminal's echo of the input may come before or after the second size.
	if (out != "24 80\r\ngo\r\n50 132\r\n" && out != "24 80\r\n50 132\r\ngo\r\n") || exit == nil || exit.ExitCode != 4 || exit.Pid != info.Pid || exit.Stdout != nil {
		t.Fatalf("attachment: %q %+v", out, exit)
	}
}

// TestAttachBadFrames: a frame the guest cannot take ends that attachment,
// not the process; another attachment goes on.
func TestAttachBadFrames(t *testing.T) {
	g := serve(t)
	info := g.startProcess(t, guestapi.ProcessSpec{
		Args: []string{"sh", "-c", `echo ready; read x; echo "got $x"`}, TTY: &guestapi.TTY{Rows: 24, Cols: 80},
	})
	if !eventually(5*time.Second, func() bool {
		out, _, _ := split(events(t, g.do(t, "GET", fmt.Sprintf("%s/%d/output", guestapi.PathProcesses, info.Pid), nil)))
		return out == "ready\r\n"
	}) {
		t.Fatal("no output")
	}
	head := func(typ byte, n uint32) []byte {
		b := make([]byte, guestapi.FrameHead)
		b[0] = typ
		binary.BigEndian.PutUint32(b[1:], n)
		return b
	}
	for name, bad := range map[string][]byte{
		"unknown type":       head(99, 0),
		"output type":        append(head(guestapi.FrameStdout, 2), "hi"...),
		"exit type":          append(head(guestapi.FrameExit, 2), "{}"...),
		"too long":           head(guestapi.FrameStdin, guestapi.MaxFrame+1),
		"close with payload": append(head(guestapi.FrameCloseStdin, 1), 'x'),
		"resize not json":    append(head(guestapi.FrameResize, 3), "big"...),
		"resize to zero":     append(head(guestapi.FrameResize, 19), `{"rows":0,"cols":0}`...),
		"ends inside":        append(head(guestapi.FrameStdin, 10), "abc"...),
	} {
		a := g.attach(t, info.Pid)
		if _, err := a.Write(bad); err != nil {
			t.Fatal(err)
		}
		if name == "ends inside" {
			a.(interface{ CloseWrite() error }).CloseWrite()
		}
		done := make(chan string, 1)
		go func() {
			out, exit := readAttachment(t, a)
			if exit != nil {
				out += "(exit)"
			}
			done <- out
		}()
		select {
		case out := <-done:
			// Ended, with or without the scrollback first, and no exit.
			if strings.Contains(out, "(exit)") {
				t.Fatalf("%s: %q", name, out)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the attachment went on", name)
		}
	}
	var now guestapi.ProcessInfo
	decode(t, g.do(t, "GET", fmt.Sprintf("%s/%d", guestapi.PathProcesses, info.Pid), nil), http.StatusOK, &now)
	if !now.Running || *now.TTY != (guestapi.TTY{Rows: 24, Cols: 80}) {
		t.Fatalf("after bad frames: %+v", now)
	}
	// Input through a good attachment still reaches the process.
	a := g.attach(t, info.Pid)
	writeFrame(t, a, guestapi.FrameStdin, []byte("fine\n"))
	if out, exit := readAttachment(t, a); !strings.Contains(out, "got fine\r\n") || exit == nil || exit.ExitCode != 0 {
		t.Fatalf("good attachment: %q %+v", out, exit)
	}
}

// TestAttachPipes: a process without a terminal replays its kept output
// from the start as stdout and stderr frames; input to one without open
// stdin is dropped, and a closed attachment leaves the process running.
func TestAttachPipes(t *testing.T) {
	g := serve(t)
	info := g.startProcess(t, guestapi.ProcessSpec{Args: []string{"sh", "-c", `echo out; echo err >&2; read x; echo "$x"`}, OpenStdin: true})
	a := g.attach(t, info.Pid)
	a.Close()
	a = g.attach(t, info.Pid)
	writeFrame(t, a, guestapi.FrameStdin, []byte("in"))
	writeFrame(t, a, guestapi.FrameCloseStdin, nil)
	writeFrame(t, a, guestapi.FrameResize, []byte(`{"rows":1,"cols":1}`)) // no terminal: dropped
	var stdout, stderr bytes.Buffer
	var exit *guestapi.Result
	for exit == nil {
		head := make([]byte, guestapi.FrameHead)
		if _, err := io.ReadFull(a, head); err != nil {
			t.Fatalf("stdout %q stderr %q: %v", stdout.String(), stderr.String(), err)
		}
		payload := make([]byte, binary.BigEndian.Uint32(head[1:]))
		io.ReadFull(a, payload)
		switch head[0] {
		case guestapi.FrameStdout:
			stdout.Write(payload)
		case guestapi.FrameStderr:
			stderr.Write(payload)
		case guestapi.FrameExit:
			exit = new(guestapi.Result)
			json.Unmarshal(payload, exit)
		}
	}
	if stdout.String() != "out\nin\n" || stderr.String() != "err\n" || exit.ExitCode != 0 {
		t.Fatalf("stdout %q stderr %q exit %+v", stdout.String(), stderr.String(), exit)
	}
	if n, err := a.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the exit frame: %d %v", n, err)
	}
}
