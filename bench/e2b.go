package main

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// The E2B bench measures berth as E2B's users meet it: E2B's own Python
// SDK, as installed from PyPI (make compat/e2b/sdktest/.venv/.installed),
// pointed at a daemon of the bench's with E2B_API_URL and E2B_SANDBOX_URL.
// Beside it, the same Python process calls berth's native API with httpx
// for the same work, so that the difference is the protocol (E2B's REST
// and Connect RPC through compat/e2b, against berth's one JSON call) and
// the two HTTP client libraries. The client is
// one program (e2bbench.py) that takes one command a line and answers with
// its own timings, so that the bench can refill the warm pool between
// samples, outside every clock, as it does for its other creates.

//go:embed e2bbench.py
var e2bbenchPy []byte

// e2bWarmUp is how many unmeasured calls of each kind precede the
// measured exec rounds (the connections open, both code paths warm).
const e2bWarmUp = 20

// e2bHostedStart is what E2B's documentation gives for starting one of its
// hosted sandboxes, for the reader to compare with; not measured here.
const e2bHostedStart = "E2B's hosted sandboxes start in about 150–200 ms by E2B's own account; not measured here"

// e2b runs the E2B measurements; the daemon, the client program and every
// sandbox they made are gone when it returns.
func (s *suite) e2b(ctx context.Context) error {
	start, execs, diffs := e2bRows("E2B SDK")
	notMeasured := func(why string, rows ...Metric) {
		for _, m := range rows {
			m.NotMeasured = why
			s.res.Metrics = append(s.res.Metrics, m)
		}
	}
	python := s.cfg.e2bPython
	if _, err := os.Stat(python); err != nil {
		notMeasured("E2B's Python SDK is not installed: no "+python+" (make compat/e2b/sdktest/.venv/.installed)", slices.Concat(start, execs, diffs)...)
		return nil
	}

	d, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-e2b", 2, s.log)
	if err != nil {
		return err
	}
	defer d.close()
	dir, err := os.MkdirTemp(s.cfg.work, "e2b-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "e2bbench.py")
	if err := os.WriteFile(script, e2bbenchPy, 0o644); err != nil {
		return err
	}
	c, version, err := startE2BClient(ctx, python, script, d.url, d.key)
	if err != nil {
		notMeasured("E2B's Python SDK did not start: "+firstLine(err.Error()), slices.Concat(start, execs, diffs)...)
		return nil
	}
	// The client first (it kills the sandbox it holds when its input
	// ends), then whatever it left, which the daemon's close deletes.
	defer func() {
		c.close()
		if left, err := d.client.ListSandboxes(context.Background(), nil); err == nil {
			for _, sb := range left {
				d.track(sb.ID)
			}
		}
	}()
	start, execs, diffs = e2bRows("E2B SDK " + version)

	// Create → first output: one unmeasured round of each, then rounds in
	// alternating order, the warm pool full before every sample.
	var sample struct {
		Ms float64 `json:"ms"`
	}
	kinds := []string{"e2b", "native"} // as e2bbench.py names them, in the order of start
	got := []series{newSeries(s.cfg.e2bRounds), newSeries(s.cfg.e2bRounds)}
	var failures []string
	for r := -1; r < s.cfg.e2bRounds; r++ {
		for i := range kinds {
			k := (max(r, 0) + i) % len(kinds)
			if err := d.settle(ctx); err != nil {
				s.log.Warn("settle", "err", err)
			}
			time.Sleep(5 * time.Millisecond)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := c.ask("create "+kinds[k], &sample); err != nil {
				if len(failures) < 3 {
					failures = append(failures, kinds[k]+": "+firstLine(err.Error()))
				}
				s.log.Warn("sample failed", "subject", start[k].Subject, "round", r, "err", err)
				continue
			}
			if r >= 0 {
				got[k][r] = time.Duration(sample.Ms * float64(time.Millisecond))
			}
		}
	}
	for k, m := range start {
		samples := got[k].ms()
		switch {
		case len(samples) == 0:
			m.NotMeasured = "every sample failed: " + strings.Join(failures, "; ")
		case len(samples) < s.cfg.e2bRounds:
			m.NotMeasured = fmt.Sprintf("%d of %d samples failed", s.cfg.e2bRounds-len(samples), s.cfg.e2bRounds)
		}
		if len(samples) > 0 {
			sum := summarize(samples)
			m.Summary, m.Samples = &sum, samples
		}
		s.res.Metrics = append(s.res.Metrics, m)
	}

	// Round trips: one sandbox made by the SDK, both clients on it,
	// interleaved, once the pool has refilled after its create.
	var trips struct {
		E2B    []float64 `json:"e2b"`
		Native []float64 `json:"native"`
	}
	err = c.ask("open", nil)
	if err == nil {
		if err = d.settle(ctx); err == nil {
			err = c.ask(fmt.Sprintf("exec %d %d", s.cfg.execRounds, e2bWarmUp), &trips)
		}
		if cerr := c.ask("close", nil); err == nil {
			err = cerr
		}
	}
	if err != nil {
		notMeasured(firstLine(err.Error()), slices.Concat(execs, diffs)...)
		return nil
	}
	sdk, native := summarize(trips.E2B), summarize(trips.Native)
	p50, p99 := sdk.P50-native.P50, sdk.P99-native.P99
	execs[0].Summary, execs[0].Samples = &sdk, trips.E2B
	execs[1].Summary, execs[1].Samples = &native, trips.Native
	diffs[0].Value, diffs[1].Value = &p50, &p99
	s.res.Metrics = append(s.res.Metrics, slices.Concat(execs, diffs)...)
	return nil
}

// e2bRows are the step's rows without figures: the creates and the round
// trips, each through the SDK (named sdk) and the native API, and the
// difference of the round trips at p50 (the target) and p99.
func e2bRows(sdk string) (start, execs, diffs []Metric) {
	const (
		startName = "create → first command output (`echo hi` by `/bin/bash -l -c`), sequential"
		execName  = "round trip of `true` by `/bin/bash -l -c` in a running sandbox, one kept-alive connection"
		native    = "native API (httpx)"
	)
	start = []Metric{
		{Group: "e2b", Name: startName, Subject: sdk + ": Sandbox.create(), commands.run()", Unit: "ms", Note: e2bHostedStart},
		{Group: "e2b", Name: startName, Subject: native + ": POST /v1/sandboxes, POST …/exec", Unit: "ms"},
	}
	execs = []Metric{
		{Group: "e2b", Name: execName, Subject: sdk + `: commands.run("true")`, Unit: "ms"},
		{Group: "e2b", Name: execName, Subject: native + ": POST …/exec", Unit: "ms"},
	}
	diffs = []Metric{
		{Group: "e2b", Name: "E2B SDK over the native API at p50 (commands.run − POST …/exec)", Subject: "E2B SDK − native API", Unit: "ms",
			Target: &Target{Stat: "value", AtMost: true, Limit: 2}},
		{Group: "e2b", Name: "E2B SDK over the native API at p99 (commands.run − POST …/exec)", Subject: "E2B SDK − native API", Unit: "ms"},
	}
	return start, execs, diffs
}

// e2bClient is a running e2bbench.py: commands go to its standard input,
// one answer comes back a line.
type e2bClient struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *tailBuffer
}

// startE2BClient starts e2bbench.py with python, E2B's SDK pointed at url,
// with berth's key as its E2B_API_KEY, and reads its first line: the
// SDK's version.
func startE2BClient(ctx context.Context, python, script, url, key string) (*e2bClient, string, error) {
	cmd := exec.CommandContext(ctx, python, script)
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key, "PYTHONUNBUFFERED=1")
	cmd.WaitDelay = 30 * time.Second
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	c := &e2bClient{cmd: cmd, in: in, out: bufio.NewScanner(out), stderr: &tailBuffer{max: 4096}}
	c.out.Buffer(make([]byte, 64<<10), 16<<20)
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	var hello struct {
		E2B string `json:"e2b"`
	}
	if err := c.read(&hello); err != nil {
		c.close()
		return nil, "", err
	}
	return c, hello.E2B, nil
}

// ask sends one command and decodes its answer into v (nil: ignored).
func (c *e2bClient) ask(command string, v any) error {
	if _, err := io.WriteString(c.in, command+"\n"); err != nil {
		return fmt.Errorf("e2bbench.py: %w: %s", err, c.stderr.last())
	}
	return c.read(v)
}

func (c *e2bClient) read(v any) error {
	if !c.out.Scan() {
		err := c.out.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("e2bbench.py ended: %w: %s", err, c.stderr.last())
	}
	line := c.out.Bytes()
	var failed struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(line, &failed); err != nil {
		return fmt.Errorf("e2bbench.py printed %q: %w", firstLine(string(line)), err)
	}
	if failed.Error != "" {
		return errors.New(failed.Error)
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(line, v)
}

// close ends the program's input, which has it kill its open sandbox and
// exit, and waits for it (killed after cmd.WaitDelay).
func (c *e2bClient) close() {
	c.in.Close()
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = t.b[over:]
	}
	return len(p), nil
}

// last is the last non-empty line written (a Python traceback's error).
func (t *tailBuffer) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := bytes.Split(bytes.TrimSpace(t.b), []byte("\n"))
	return string(lines[len(lines)-1])
}
