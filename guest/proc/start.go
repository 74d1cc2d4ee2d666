package proc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Start starts a process in its own process group (with a terminal, in a
// session of its own, which is its own group too). A program that cannot be
// found or executed is not an error: the returned process has already ended
// with exit code 127 or 126 and says why in StartError and on stderr. Errors
// are invalid specs (errdefs.InvalidArgument naming the field), a table that
// is closed (Unavailable), and a guest out of processes or memory
// (ResourceExhausted).
func (t *Table) Start(spec guestapi.ProcessSpec) (*Process, error) {
	return t.start(spec, false)
}

// StartBackground is Start for a background process: its exit, once it is
// finished, goes to the exits stream (FollowExits). One that never started
// (pid 0) has none: its start already answered how it ended.
func (t *Table) StartBackground(spec guestapi.ProcessSpec) (*Process, error) {
	return t.start(spec, true)
}

func (t *Table) start(spec guestapi.ProcessSpec, background bool) (*Process, error) {
	if err := validate(spec); err != nil {
		return nil, err
	}
	u, err := lookupUser(spec.User)
	if err != nil {
		return nil, err
	}
	env := t.environment(spec.Env, u)
	if spec.TTY != nil && !hasEnv(env, "TERM") {
		env = append(env, "TERM="+defaultTerm)
	}
	cwd, err := workDir(spec.Cwd, u.home)
	if err != nil {
		return nil, err
	}
	limit := spec.MaxOutputBytes
	if limit == 0 {
		limit = DefaultMaxOutput
	}
	p := newProcess(slices.Clone(spec.Args), min(limit, MaxOutput))
	p.background = background
	if spec.TTY != nil {
		p.tty, p.size = true, *spec.TTY
	}

	path, code, msg := lookPath(spec.Args[0], cwd, envValue(env, "PATH"))
	if code != 0 {
		p.failStart(code, msg)
		return p, nil
	}
	if err := t.spawn(p, path, env, cwd, u, spec); err != nil {
		return nil, err
	}
	return p, nil
}

// spawn forks and execs p. Only descriptors 0, 1 and 2 reach the child:
// every other descriptor of the guest is close-on-exec (Go opens all its
// files so; the runtime's inherited ones are marked at start).
func (t *Table) spawn(p *Process, path string, env []string, cwd string, u user, spec guestapi.ProcessSpec) error {
	var s stdio
	var child []*os.File // the child's 0, 1 and 2, closed here once it is forked
	var err error
	if spec.TTY != nil {
		s, child, err = terminalStdio(*spec.TTY, u)
	} else {
		s, child, err = pipeStdio(spec.OpenStdin || len(spec.Stdin) > 0)
	}
	if err != nil {
		return err
	}
	s.initial = spec.Stdin
	s.keepOpen = spec.TTY != nil || spec.OpenStdin
	sys := &syscall.SysProcAttr{Credential: u.cred}
	if spec.TTY != nil {
		// A session of its own with the terminal as its controlling one; a
		// session leader leads its process group too, so timeouts and
		// signals to the group reach its children as without a terminal.
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		sys.Setpgid = true // its own group: timeouts and signals reach its children
	}
	// Set before p is in the table, where requests find it.
	if s.keepOpen {
		if spec.TTY != nil {
			p.term = s.out
		} else {
			p.stdin = s.in
		}
		if len(s.initial) > 0 {
			p.turn <- struct{}{} // Stdin goes first: run gives the turn back once it is written
		}
	}
	// Fd puts the child's ends in blocking mode, as programs expect.
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Files: []uintptr{child[0].Fd(), child[1].Fd(), child[2].Fd()}, Sys: sys}

	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		closeAll(child...)
		closeAll(s.out, s.err, s.in)
		return errdefs.New(errdefs.Unavailable, "the guest is shutting down")
	}
	p.started = time.Now()
	pid, err := syscall.ForkExec(path, p.args, attr)
	if err == nil {
		p.pid = pid
		t.registerLocked(p)
	}
	t.mu.Unlock()
	closeAll(child...)

	if err != nil {
		closeAll(s.out, s.err, s.in)
		if errors.Is(err, syscall.EACCES) && u.cred != nil && !mayEnter(cwd, u.cred) {
			// The child failed at its chdir, not at its exec: say so.
			p.failStart(126, fmt.Sprintf("cwd %q: permission denied: user %s may not enter it (the sandbox's workdir is the default cwd; give one the user can enter)", cwd, u.display()))
			return nil
		}
		return startFailure(p, spec.Args[0], err)
	}
	go func() {
		p.run(s, time.Duration(spec.TimeoutMs)*time.Millisecond)
		t.finish(p)
	}()
	return nil
}

// pipeStdio makes the pipes of a process without a terminal: stdout,
// stderr, and stdin if wanted (else it reads /dev/null). child is the
// child's 0, 1 and 2.
func pipeStdio(stdin bool) (s stdio, child []*os.File, err error) {
	var stdinR *os.File
	if stdin {
		stdinR, s.in, err = os.Pipe()
	} else {
		stdinR, err = os.Open(os.DevNull)
	}
	if err != nil {
		return s, nil, fmt.Errorf("stdin: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, s.in)
		return s, nil, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, s.in, outR, outW)
		return s, nil, fmt.Errorf("stderr pipe: %w", err)
	}
	s.out, s.err = outR, errR
	return s, []*os.File{stdinR, outW, errW}, nil
}

// terminalStdio allocates a pseudo-terminal of size for a process that
// runs as u: the master reads its output and writes its input; the slave
// is the child's 0, 1 and 2.
func terminalStdio(size guestapi.TTY, u user) (s stdio, child []*os.File, err error) {
	master, slave, err := openPTY(size)
	if err != nil {
		return s, nil, err
	}
	if u.cred != nil {
		// The terminal belongs to its user, as login programs arrange: some
		// programs open it again by its name. Not essential: the child holds
		// it open either way.
		slave.Chown(int(u.cred.Uid), -1)
	}
	s.out, s.in = master, master
	return s, []*os.File{slave, slave, slave}, nil
}

// startFailure sorts out a failed fork or exec: a guest short of resources
// or an argument list too long is an error; anything else ends p like a
// shell would (127 for a missing file or interpreter, else 126).
func startFailure(p *Process, name string, err error) error {
	switch {
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.ENOMEM):
		return errdefs.Wrap(errdefs.ResourceExhausted, err, "start %q: %v", name, err)
	case errors.Is(err, syscall.E2BIG):
		return errdefs.Wrap(errdefs.InvalidArgument, err, "args: %v", err)
	}
	code := 126
	if errors.Is(err, syscall.ENOENT) {
		code = 127
	}
	p.failStart(code, fmt.Sprintf("exec: %q: %v", name, err))
	return nil
}

// display names the user for a message: the name, else the uid.
func (u user) display() string {
	if u.name != "" {
		return strconv.Quote(u.name)
	}
	return strconv.FormatUint(uint64(u.cred.Uid), 10)
}

// mayEnter says whether a process with cred may search every directory on
// the way to dir, by their permission bits (the kernel's own check, short
// of ACLs, which a sandbox's image does not use).
func mayEnter(dir string, cred *syscall.Credential) bool {
	p := "/"
	for _, part := range append([]string{""}, strings.Split(strings.Trim(dir, "/"), "/")...) {
		p = path.Join(p, part)
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil {
			return false
		}
		var bit uint32 = 0o001
		switch {
		case st.Uid == cred.Uid:
			bit = 0o100
		case st.Gid == cred.Gid || slices.Contains(cred.Groups, st.Gid):
			bit = 0o010
		}
		if st.Mode&bit == 0 {
			return false
		}
	}
	return true
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// validate rejects specs that cannot be started, naming the field.
func validate(spec guestapi.ProcessSpec) error {
	if len(spec.Args) == 0 {
		return errdefs.New(errdefs.InvalidArgument, "args: empty; give at least the program")
	}
	if spec.Args[0] == "" {
		return errdefs.New(errdefs.InvalidArgument, "args[0]: empty program name")
	}
	for i, a := range spec.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.New(errdefs.InvalidArgument, "args[%d]: contains a NUL byte", i)
		}
	}
	for i, e := range spec.Env {
		if strings.IndexByte(e, 0) >= 0 {
			return errdefs.New(errdefs.InvalidArgument, "env[%d]: contains a NUL byte", i)
		}
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return errdefs.New(errdefs.InvalidArgument, "env[%d]: not KEY=VALUE", i)
		}
	}
	if strings.IndexByte(spec.Cwd, 0) >= 0 {
		return errdefs.New(errdefs.InvalidArgument, "cwd: contains a NUL byte")
	}
	if spec.Cwd != "" && !filepath.IsAbs(spec.Cwd) {
		return errdefs.New(errdefs.InvalidArgument, "cwd: %q is not an absolute path", spec.Cwd)
	}
	if strings.IndexByte(spec.User, 0) >= 0 {
		return errdefs.New(errdefs.InvalidArgument, "user: contains a NUL byte")
	}
	if spec.TimeoutMs < 0 || spec.TimeoutMs > int64(time.Duration(1<<63-1)/time.Millisecond) {
		return errdefs.New(errdefs.InvalidArgument, "timeout_ms: %d is out of range", spec.TimeoutMs)
	}
	if spec.MaxOutputBytes < 0 {
		return errdefs.New(errdefs.InvalidArgument, "max_output_bytes: %d is negative", spec.MaxOutputBytes)
	}
	if spec.TTY != nil {
		return validTTY(*spec.TTY)
	}
	return nil
}

// workDir is the spec's cwd, which must be a directory, or else the user's
// home if it is one, or else "/".
func workDir(cwd, home string) (string, error) {
	if cwd == "" {
		if isDir(home) {
			return home, nil
		}
		return "/", nil
	}
	if !isDir(cwd) {
		return "", errdefs.New(errdefs.InvalidArgument, "cwd: %q is not a directory in the sandbox", cwd)
	}
	return cwd, nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// environment is env with duplicate keys resolved (the last wins) and HOME,
// USER, LOGNAME, PATH and HOSTNAME added where absent.
func (t *Table) environment(env []string, u user) []string {
	seen := make(map[string]bool, len(env)+5)
	out := make([]string, 0, len(env)+5)
	for _, e := range slices.Backward(env) {
		k, _, _ := strings.Cut(e, "=")
		if !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	slices.Reverse(out)
	for _, kv := range [][2]string{
		{"HOME", u.home}, {"USER", u.name}, {"LOGNAME", u.name},
		{"PATH", t.defaults.Path}, {"HOSTNAME", t.defaults.Hostname},
	} {
		if kv[1] != "" && !seen[kv[0]] {
			out = append(out, kv[0]+"="+kv[1])
		}
	}
	return out
}

func hasEnv(env []string, key string) bool {
	return slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, key+"=") })
}

func envValue(env []string, key string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds the program like a shell does: a name with a slash is
// taken as a path (relative to cwd), any other is searched in pathEnv
// (relative entries, too, against cwd). When the program cannot run it
// returns the exit code, 127 (not found) or 126 (not executable), and why.
func lookPath(name, cwd, pathEnv string) (path string, code int, msg string) {
	if strings.Contains(name, "/") {
		path = name
		if !filepath.IsAbs(path) {
			path = filepath.Join(cwd, path)
		}
		if code, why := runnable(path); code != 0 {
			return "", code, fmt.Sprintf("exec: %q: %s", name, why)
		}
		return path, 0, ""
	}
	denied := ""
	for _, dir := range filepath.SplitList(pathEnv) {
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir) // "" is the current directory
		}
		p := filepath.Join(dir, name)
		switch code, why := runnable(p); code {
		case 0:
			return p, 0, ""
		case 126:
			if denied == "" {
				denied = why
			}
		}
	}
	if denied != "" {
		return "", 126, fmt.Sprintf("exec: %q: %s", name, denied)
	}
	return "", 127, fmt.Sprintf("exec: %q: executable file not found in $PATH", name)
}

// runnable says whether path is an executable file: 0, 127 when there is
// no such file, 126 when there is one that cannot be executed.
func runnable(path string) (int, string) {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return 127, "no such file or directory"
	case err != nil:
		return 126, err.Error()
	case fi.IsDir():
		return 126, "is a directory"
	case fi.Mode()&0o111 == 0:
		return 126, "permission denied"
	}
	return 0, ""
}
