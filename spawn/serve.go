package spawn

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/internal/osthread"
)

// Serve is the spawner: it starts the children the daemon asks for on
// sock, each on its own goroutine, until the daemon closes its end (or
// exits), then waits for the starts in progress. The caller has marked
// every inherited descriptor close-on-exec, sock included, so no child
// inherits it.
func Serve(sock *os.File) error {
	c, err := net.FileConn(sock)
	if err != nil {
		return fmt.Errorf("spawner: %w", err)
	}
	defer c.Close()
	conn, ok := c.(*net.UnixConn)
	if !ok {
		return errors.New("spawner: descriptor 3 is not a unix socket")
	}
	var starts sync.WaitGroup
	defer starts.Wait()
	stopReaping := reap()
	defer stopReaping()
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(maxFiles*4))
	for {
		// Go's ReadMsgUnix receives descriptors close-on-exec (MSG_CMSG_CLOEXEC).
		n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
		if errors.Is(err, io.EOF) {
			return nil // the daemon closed its end
		}
		if err != nil {
			return fmt.Errorf("spawner: %w", err)
		}
		if n == 0 && oobn == 0 {
			return nil // the daemon closed its end
		}
		fds, err := parseRights(oob[:oobn])
		if err != nil {
			return fmt.Errorf("spawner: %w", err)
		}
		msg := append([]byte(nil), buf[:n]...)
		truncated := flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0
		starts.Go(func() { handle(msg, fds, truncated) })
	}
}

// handle starts one request's child and replies on its reply socket (its
// first descriptor), then closes its descriptors.
func handle(msg []byte, fds []int, truncated bool) {
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "passed")
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if len(files) == 0 {
		return // no reply socket: nobody to answer
	}
	var rep reply
	var oob []byte
	pid, pidfd, err := start(msg, files[1:], truncated)
	if err != nil {
		rep.Error = "spawn: " + err.Error()
	} else {
		rep.Pid = pid
		oob = unix.UnixRights(pidfd)
		defer unix.Close(pidfd)
	}
	b, _ := json.Marshal(rep)
	// The daemon may have given up on it: then the child is left to the
	// daemon's cgroup kill, and reap.
	unix.Sendmsg(int(files[0].Fd()), b, oob, nil, 0)
}

// start starts the child a message asks for, with its descriptors.
func start(msg []byte, files []*os.File, truncated bool) (pid, pidfd int, err error) {
	if truncated {
		return 0, -1, errors.New("request truncated")
	}
	var m message
	if err := json.Unmarshal(msg, &m); err != nil {
		return 0, -1, fmt.Errorf("bad request: %w", err)
	}
	want := m.Extra + m.Tasks
	if m.Output {
		want++
	}
	if m.CgroupDir {
		want++
	}
	if m.Extra < 0 || m.Tasks < 0 || want != len(files) {
		return 0, -1, fmt.Errorf("request names %d descriptors, %d came", want, len(files))
	}
	if m.Cloneflags&syscall.CLONE_NEWUSER == 0 {
		return 0, -1, errors.New("request without a user namespace")
	}
	take := func(k int) []*os.File {
		f := files[:k]
		files = files[k:]
		return f
	}
	var out *os.File
	if m.Output {
		out = take(1)[0]
	}
	extra := take(m.Extra)
	cg := Cgroup{Tasks: take(m.Tasks)}
	if m.CgroupDir {
		cg.Dir = take(1)[0]
	}
	c, err := newChild(m.Request, out, extra)
	if err != nil {
		return 0, -1, err
	}
	defer c.close()
	cgroupFD := -1
	if cg.Dir != nil {
		cgroupFD = int(cg.Dir.Fd())
	}
	err = startIn(cg, func() error { return osthread.SetIDs(m.Owner) }, func() (err error) {
		pid, pidfd, err = forkExec(&c.child, m.Cloneflags, m.HostID, m.Size, cgroupFD)
		return err
	})
	if err != nil {
		return 0, -1, fmt.Errorf("start %s: %w", m.Path, err)
	}
	return pid, pidfd, nil
}

// preparedChild is a child with the descriptors it holds open until it is
// started.
type preparedChild struct {
	child
	devNull *os.File
}

func (p *preparedChild) close() {
	if p.devNull != nil {
		p.devNull.Close()
	}
}

// newChild prepares req's child: /dev/null as its standard input (and
// output, without out), extra as descriptors 3, 4, …, and the bounding set
// req asks for.
func newChild(req Request, out *os.File, extra []*os.File) (*preparedChild, error) {
	if req.Path == "" {
		return nil, errors.New("bad request: no path")
	}
	if len(req.Args) == 0 {
		return nil, errors.New("bad request: no arguments")
	}
	path, err := syscall.BytePtrFromString(req.Path)
	if err != nil {
		return nil, fmt.Errorf("bad request: path: %w", err)
	}
	argv, err := syscall.SlicePtrFromStrings(req.Args)
	if err != nil {
		return nil, fmt.Errorf("bad request: args: %w", err)
	}
	envv, err := syscall.SlicePtrFromStrings(req.Env)
	if err != nil {
		return nil, fmt.Errorf("bad request: env: %w", err)
	}
	p := &preparedChild{child: child{path: path, argv: argv, envv: envv, setsid: req.Setsid}}
	if req.Dir != "" {
		if p.dir, err = syscall.BytePtrFromString(req.Dir); err != nil {
			return nil, fmt.Errorf("bad request: dir: %w", err)
		}
	}
	if req.Bounding != nil {
		keep, last, err := capability.Mask(req.Bounding)
		if err != nil {
			return nil, fmt.Errorf("bad request: bounding: %w", err)
		}
		p.drop = []uintptr{}
		for c := 0; c <= last && c < 64; c++ {
			if keep&(1<<uint(c)) == 0 {
				p.drop = append(p.drop, uintptr(c))
			}
		}
	}
	if p.devNull, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
		return nil, err
	}
	stdout := p.devNull
	if out != nil {
		stdout = out
	}
	p.files = []int{int(p.devNull.Fd()), int(stdout.Fd()), int(stdout.Fd())}
	for _, f := range extra {
		p.files = append(p.files, int(f.Fd()))
	}
	return p, nil
}

// reap reaps the spawner's children (all of them started for the daemon,
// whose pidfds the daemon holds) as they exit, until stopped. A start
// whose child failed before its exec waits for that child itself
// (forkExec); if reap took it first, that wait ends at once.
func reap() (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			for {
				var ws unix.WaitStatus
				pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
				if pid <= 0 && !errors.Is(err, unix.EINTR) {
					break
				}
			}
			select {
			case <-sigs:
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
		<-finished
	}
}

// parseRights returns the descriptors passed in oob.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, cm := range msgs {
		if cm.Header.Level != unix.SOL_SOCKET || cm.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		f, err := unix.ParseUnixRights(&cm)
		if err != nil {
			return nil, err
		}
		fds = append(fds, f...)
	}
	return fds, nil
}
