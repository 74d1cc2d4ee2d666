// Package proc is the guest's process table: it starts processes in their own
// process groups, reaps every child (the guest is PID 1), keeps bounded
// output for replay, and enforces timeouts.
package proc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Output bounds per stream.
const (
	DefaultMaxOutput = 4 << 20
	MaxOutput        = 64 << 20
	// exitGrace is how long output is still read after the process exited:
	// a background child may hold the pipes open forever.
	exitGrace = 100 * time.Millisecond
	// maxFinished bounds the finished processes kept for later reads.
	maxFinished = 1024
	readChunk   = 32 << 10
)

// Defaults fill what a spec leaves out.
type Defaults struct {
	Hostname string
	Path     string
}

// Table owns the processes the guest started.
type Table struct {
	log      *slog.Logger
	defaults Defaults

	// mu is held across fork+register and across wait4+lookup, so a child
	// that exits at once is never reaped before it is known.
	mu       sync.Mutex
	procs    map[int]*Process
	finished []int // pids of finished processes, oldest first
	wg       sync.WaitGroup
}

// NewTable returns an empty table.
func NewTable(log *slog.Logger, d Defaults) *Table {
	if d.Path == "" {
		d.Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	return &Table{log: log, defaults: d, procs: map[int]*Process{}}
}

// Run reaps children until ctx ends: the processes the table started get
// their status; orphans re-parented to the guest are just reaped.
func (t *Table) Run(ctx context.Context) error {
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGCHLD)
	defer signal.Stop(sig)
	tick := time.NewTicker(time.Second) // belt and braces: signals coalesce
	defer tick.Stop()
	for {
		t.reap()
		select {
		case <-ctx.Done():
			return nil
		case <-sig:
		case <-tick.C:
		}
	}
}

func (t *Table) reap() {
	for {
		var ws unix.WaitStatus
		t.mu.Lock()
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			t.mu.Unlock()
			return
		}
		p := t.procs[pid]
		t.mu.Unlock()
		if p != nil && p.exit != nil {
			select {
			case p.exit <- ws:
			default:
			}
		}
	}
}

// Close kills every process group the table started and waits for their bookkeeping.
func (t *Table) Close() {
	t.mu.Lock()
	for pid, p := range t.procs {
		if p.Running() {
			unix.Kill(-pid, unix.SIGKILL)
		}
	}
	t.mu.Unlock()
	t.wg.Wait()
}

// Get returns a process by pid.
func (t *Table) Get(pid int) (*Process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "process %d not found", pid)
	}
	return p, nil
}

// List describes every process in the table, by pid.
func (t *Table) List() []guestapi.ProcessInfo {
	t.mu.Lock()
	ps := make([]*Process, 0, len(t.procs))
	for _, p := range t.procs {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	slices.SortFunc(ps, func(a, b *Process) int { return a.pid - b.pid })
	out := make([]guestapi.ProcessInfo, 0, len(ps))
	for _, p := range ps {
		info := p.Info()
		info.Result = nil // the list stays small; output is read per process
		if !p.Running() {
			r := p.Result()
			r.Stdout, r.Stderr = nil, nil
			info.Result = &r
		}
		out = append(out, info)
	}
	return out
}

// Remove forgets a finished process.
func (t *Table) Remove(pid int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok {
		return errdefs.New(errdefs.NotFound, "process %d not found", pid)
	}
	if p.Running() {
		return errdefs.New(errdefs.Conflict, "process %d is still running: signal it first", pid)
	}
	delete(t.procs, pid)
	t.finished = slices.DeleteFunc(t.finished, func(x int) bool { return x == pid })
	return nil
}

// Signal signals a process's group.
func (t *Table) Signal(pid int, sig syscall.Signal) error {
	p, err := t.Get(pid)
	if err != nil {
		return err
	}
	if !p.Running() {
		return errdefs.New(errdefs.Conflict, "process %d has exited", pid)
	}
	if err := unix.Kill(-pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %d: %w", pid, err)
	}
	return nil
}

// markFinished records a finished process and drops the oldest beyond the cap.
func (t *Table) markFinished(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.procs[pid]; !ok {
		return
	}
	t.finished = append(t.finished, pid)
	for len(t.finished) > maxFinished {
		delete(t.procs, t.finished[0])
		t.finished = t.finished[1:]
	}
}

// Start starts a process. A program that cannot be started is not an error:
// the returned process has already ended with exit code 127 or 126.
func (t *Table) Start(spec guestapi.ProcessSpec) (*Process, error) {
	if err := validate(spec); err != nil {
		return nil, err
	}
	u, err := lookupUser(spec.User)
	if err != nil {
		return nil, err
	}
	env := t.environment(spec.Env, u)
	cwd := spec.Cwd
	if cwd == "" {
		cwd = "/"
		if fi, err := os.Stat(u.home); err == nil && fi.IsDir() {
			cwd = u.home
		}
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, errdefs.New(errdefs.InvalidArgument, "cwd: %q is not a directory in the sandbox", cwd)
	}
	limit := spec.MaxOutputBytes
	if limit <= 0 {
		limit = DefaultMaxOutput
	}
	limit = min(limit, MaxOutput)
	p := newProcess(spec.Args, limit)

	path, code, msg := lookPath(spec.Args[0], cwd, envValue(env, "PATH"))
	if code != 0 {
		p.finishWithoutStart(code, msg)
		return p, nil
	}

	var stdin *os.File
	var stdinW *os.File
	if len(spec.Stdin) > 0 {
		if stdin, stdinW, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
	} else if stdin, err = os.Open(os.DevNull); err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		outR.Close()
		outW.Close()
		return nil, err
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{stdin.Fd(), outW.Fd(), errW.Fd()},
		Sys: &syscall.SysProcAttr{
			Setpgid:    true,
			Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups},
		},
	}
	p.exit = make(chan unix.WaitStatus, 1)
	t.mu.Lock()
	pid, err := syscall.ForkExec(path, spec.Args, attr)
	if err == nil {
		p.pid = pid
		t.procs[pid] = p
	}
	t.mu.Unlock()
	stdin.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		code := 126
		if errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		p.finishWithoutStart(code, fmt.Sprintf("exec %q: %v", spec.Args[0], err))
		return p, nil
	}
	p.started = time.Now()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		p.run(outR, errR, stdinW, spec.Stdin, time.Duration(spec.TimeoutMs)*time.Millisecond)
		t.markFinished(pid)
	}()
	return p, nil
}

func validate(spec guestapi.ProcessSpec) error {
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return errdefs.New(errdefs.InvalidArgument, "args: empty command")
	}
	for i, a := range spec.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.New(errdefs.InvalidArgument, "args[%d]: holds a NUL byte", i)
		}
	}
	for i, e := range spec.Env {
		if strings.IndexByte(e, 0) >= 0 || !strings.Contains(e, "=") || strings.HasPrefix(e, "=") {
			return errdefs.New(errdefs.InvalidArgument, "env[%d]: %q is not KEY=VALUE", i, e)
		}
	}
	if strings.IndexByte(spec.Cwd, 0) >= 0 {
		return errdefs.New(errdefs.InvalidArgument, "cwd: holds a NUL byte")
	}
	if spec.TimeoutMs < 0 {
		return errdefs.New(errdefs.InvalidArgument, "timeout_ms: negative")
	}
	return nil
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// environment adds HOME, USER, LOGNAME, PATH and HOSTNAME where absent.
func (t *Table) environment(env []string, u user) []string {
	out := slices.Clone(env)
	has := func(k string) bool {
		for _, e := range out {
			if strings.HasPrefix(e, k+"=") {
				return true
			}
		}
		return false
	}
	for _, kv := range [][2]string{{"HOME", u.home}, {"USER", u.name}, {"LOGNAME", u.name}, {"PATH", t.defaults.Path}, {"HOSTNAME", t.defaults.Hostname}} {
		if kv[1] != "" && !has(kv[0]) {
			out = append(out, kv[0]+"="+kv[1])
		}
	}
	return out
}

// lookPath resolves the program like a shell: a name with a slash is used
// as is, anything else is searched in PATH. It returns the exit code and a
// message when the program cannot run: 127 not found, 126 not executable.
func lookPath(name, cwd, pathEnv string) (string, int, string) {
	check := func(p string) int {
		fi, err := os.Stat(p)
		if err != nil {
			return 127
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return 126
		}
		return 0
	}
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		switch check(p) {
		case 127:
			return "", 127, fmt.Sprintf("exec %q: no such file or directory", name)
		case 126:
			return "", 126, fmt.Sprintf("exec %q: permission denied (not an executable file)", name)
		}
		return p, 0, ""
	}
	denied := ""
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		switch check(p) {
		case 0:
			return p, 0, ""
		case 126:
			if denied == "" {
				denied = p
			}
		}
	}
	if denied != "" {
		return "", 126, fmt.Sprintf("exec %q: permission denied (%s is not executable)", name, denied)
	}
	return "", 127, fmt.Sprintf("exec %q: executable file not found in $PATH", name)
}
