package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

// daemon is a `berth serve` of the bench's own, on loopback, with its state
// under the bench's scratch directory. It remembers every sandbox the bench
// made through it, so that close deletes whatever a failed or interrupted
// run left behind.
type daemon struct {
	bin    string
	url    string
	pool   int
	spares int // guests started ahead (serve --spare-guests, default 2)
	state  string
	cmd    *exec.Cmd
	client *client.Client
	key    string // the admin key the daemon made (admin.key)
	http   *http.Client
	log    *slog.Logger

	mu  sync.Mutex
	ids map[string]bool
	// deleted are the sandboxes the bench deleted, for the leak check.
	deleted []string
}

// startDaemon starts berth serve with a warm pool of the given size (and
// any further flags) and waits until it answers.
func startDaemon(ctx context.Context, bin, work, name string, pool int, log *slog.Logger, flags ...string) (*daemon, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	state := filepath.Join(work, name)
	if err := os.RemoveAll(state); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(state, 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(work, name+".log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, append([]string{"serve", "--listen", addr, "--state-dir", state, "--warm-pool", strconv.Itoa(pool)}, flags...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	url := "http://" + addr
	c, err := client.New(url)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	spares := 2
	if i := slices.Index(flags, "--spare-guests"); i >= 0 && i+1 < len(flags) {
		spares, _ = strconv.Atoi(flags[i+1])
	}
	d := &daemon{bin: bin, url: url, pool: pool, spares: spares, state: state, cmd: cmd, client: c,
		http: &http.Client{Timeout: 10 * time.Second}, log: log.With("daemon", name), ids: map[string]bool{}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := c.Health(ctx); err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			d.close()
			return nil, fmt.Errorf("berth serve did not answer within 30 s (log %s)", logFile.Name())
		}
	}
	key, err := os.ReadFile(filepath.Join(state, "admin.key"))
	if err != nil {
		d.close()
		return nil, fmt.Errorf("the daemon's first admin key: %w", err)
	}
	d.key = strings.TrimSpace(string(key))
	if d.client, err = client.New(url, client.WithAPIKey(d.key)); err != nil {
		d.close()
		return nil, err
	}
	return d, d.settle(ctx)
}

// create makes a sandbox with the daemon's defaults and remembers it.
func (d *daemon) create(ctx context.Context) (api.Sandbox, error) {
	return d.createFrom(ctx, api.CreateSandboxRequest{})
}

// createFrom makes a sandbox of req and remembers it.
func (d *daemon) createFrom(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	sb, err := d.client.CreateSandbox(ctx, req)
	if err == nil {
		d.mu.Lock()
		d.ids[sb.ID] = true
		d.mu.Unlock()
	}
	return sb, err
}

// track remembers a sandbox made other than by create, for close.
func (d *daemon) track(id string) {
	d.mu.Lock()
	d.ids[id] = true
	d.mu.Unlock()
}

// remove deletes a sandbox the bench made.
func (d *daemon) remove(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.client.DeleteSandbox(ctx, id); err != nil {
		d.log.Warn("delete", "sandbox", id, "err", err)
		return
	}
	d.untrack(id)
}

// untrack forgets a sandbox the bench deleted, and notes it for the leak
// check.
func (d *daemon) untrack(id string) {
	d.mu.Lock()
	delete(d.ids, id)
	d.deleted = append(d.deleted, id)
	d.mu.Unlock()
}

// close deletes every sandbox the bench made and left, stops the daemon
// (a graceful stop deletes its warm pool) and removes its state.
func (d *daemon) close() {
	d.mu.Lock()
	var left []string
	for id := range d.ids {
		left = append(left, id)
	}
	d.mu.Unlock()
	for _, id := range left {
		d.remove(id)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		d.log.Warn("berth serve did not stop in 30 s; killing it")
		d.cmd.Process.Kill()
		<-done
	}
	if len(left) == 0 {
		os.RemoveAll(d.state)
	}
}

// settle waits, outside any clock, until the warm pool is full, so that no
// refill runs during another subject's sample.
func (d *daemon) settle(ctx context.Context) error {
	if d.pool == 0 && d.spares == 0 {
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pooled, spares, err := d.ready(ctx)
		if err == nil && pooled >= d.pool && spares >= d.spares {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warm pool and spares not refilled in 30 s (pooled %d of %d, spares %d of %d; %v)", pooled, d.pool, spares, d.spares, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ready reads the number of warm sandboxes and of spare guests from the
// daemon's metrics.
func (d *daemon) ready(ctx context.Context) (pooled, spares int, err error) {
	req, err := http.NewRequestWithContext(ctx, "GET", d.url+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	resp, err := d.http.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	found := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `berth_sandboxes{state="pooled"} `); ok {
			pooled, err = strconv.Atoi(strings.TrimSpace(v))
			found++
		}
		if v, ok := strings.CutPrefix(sc.Text(), `berth_spare_guests{runtime="native"} `); ok {
			spares, err = strconv.Atoi(strings.TrimSpace(v))
			found++
		}
		if err != nil {
			return 0, 0, err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if found < 2 {
		return 0, 0, errors.New(`no berth_sandboxes{state="pooled"} or berth_spare_guests{runtime="native"} in /metrics`)
	}
	return pooled, spares, nil
}

// createEcho is berth's "start isolated, print hi": a create (of image;
// "": the daemon's default) and the first exec's output, checked.
func (d *daemon) createEcho(ctx context.Context, image string) (string, error) {
	sb, err := d.createFrom(ctx, api.CreateSandboxRequest{Image: image})
	if err != nil {
		return "", err
	}
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"/usr/bin/echo", "hi"}})
	if err == nil {
		err = wantHi(string(r.Stdout), nil)
	}
	return sb.ID, err
}

// execTrue runs true in a sandbox through the API.
func (d *daemon) execTrue(ctx context.Context, id string) error {
	r, err := d.client.Exec(ctx, id, api.ExecRequest{Cmd: []string{"/usr/bin/true"}})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("true exited %d: %s", r.ExitCode, r.Error)
	}
	return err
}

// apiSubject measures berth through its HTTP API and Go client. With
// full, the sandbox's delete is inside the clock too.
func apiSubject(name string, d *daemon, full bool) subject {
	boot := func(ctx context.Context) (*running, error) {
		sb, err := d.create(ctx)
		if err != nil {
			return nil, err
		}
		return &running{
			exec: func(ctx context.Context) error { return d.execTrue(ctx, sb.ID) },
			stop: func() { d.remove(sb.ID) },
			d:    d,
			id:   sb.ID,
		}, nil
	}
	return subject{
		name: name,
		once: func(ctx context.Context) (func(), error) {
			id, err := d.createEcho(ctx, "")
			if id == "" {
				return nil, err
			}
			if full && err == nil {
				d.remove(id)
				return nil, nil
			}
			return func() { d.remove(id) }, err
		},
		boot: boot,
	}
}

// keyEnv is the environment that gives the CLI the daemon's key.
func (d *daemon) keyEnv() []string { return []string{"BERTH_API_KEY=" + d.key} }

// cliSubject measures berth the way a shell user meets it: `berth run`
// (create, exec, remove) and `berth exec`, each a new process, like the
// peers' command lines.
func cliSubject(d *daemon) subject {
	return subject{
		name:     "berth run (CLI)",
		execName: "berth exec (CLI)",
		once: func(ctx context.Context) (func(), error) {
			return nil, wantHi(commandEnv(ctx, d.keyEnv(), d.bin, "--url", d.url, "run", "--", "/usr/bin/echo", "hi"))
		},
		boot: func(ctx context.Context) (*running, error) {
			sb, err := d.create(ctx)
			if err != nil {
				return nil, err
			}
			return &running{
				exec: func(ctx context.Context) error {
					_, err := commandEnv(ctx, d.keyEnv(), d.bin, "--url", d.url, "exec", sb.ID, "--", "/usr/bin/true")
					return err
				},
				stop: func() { d.remove(sb.ID) },
			}, nil
		},
	}
}
