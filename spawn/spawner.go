package spawn

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/capability"
)

// Request is a child for the spawner to start: it runs Path with Args, Env
// and Dir, as root (uid and gid 0) in the new namespaces of Cloneflags,
// whose user namespace maps ids 0…Size-1 (uids and gids alike) to HostID….
type Request struct {
	Path       string   `json:"path"`
	Args       []string `json:"args"`
	Env        []string `json:"env"`
	Dir        string   `json:"dir"`
	Cloneflags uintptr  `json:"cloneflags"` // must include CLONE_NEWUSER
	HostID     uint32   `json:"host_id"`
	Size       uint32   `json:"size"`
	// Owner is the uid and gid of the forking thread (osthread.SetIDs,
	// capabilities kept), so that the user namespace is owned by it.
	Owner  uint32 `json:"owner"`
	Setsid bool   `json:"setsid"`
	// Bounding, unless nil, is the bounding set the child execs with: the
	// spawner drops every other capability while the child is a single
	// thread (a Go program can drop them from all its threads only by
	// stopping the world once per capability). The child's inheritable
	// set is raised to its permitted set first, so that the program, root
	// of the user namespace, still starts with every capability (root's
	// permitted set after execve is its bounding set and its inheritable
	// set together); it must empty its inheritable set once it needs them
	// no longer, or its children keep them (capability.Restrict does).
	Bounding []capability.Cap `json:"bounding"`
}

// Files are the descriptors a Request passes. The spawner closes its copies
// once the child is started; the caller keeps and closes its own.
type Files struct {
	Output *os.File   // stdout and stderr; nil is /dev/null
	Extra  []*os.File // descriptors 3, 4, …
	Cgroup Cgroup     // where the child is born
}

// maxFiles bounds the descriptors of one request (the kernel's limit per
// message is 253).
const maxFiles = 64

// message is a request on the wire. Its descriptors follow in order: the
// reply socket, Output (if there is one), Extra, Cgroup.Tasks, Cgroup.Dir
// (if there is one).
type message struct {
	Request
	Output    bool `json:"output"`
	Extra     int  `json:"extra"`
	Tasks     int  `json:"tasks"`
	CgroupDir bool `json:"cgroup_dir"`
}

// reply is the spawner's answer, on the request's reply socket.
type reply struct {
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}

// replyWait bounds the wait for a reply: a start takes milliseconds (a
// cgroup v1 move waits for an RCU grace period, up to tens of them).
const replyWait = 30 * time.Second

// Spawner is the daemon's side of a spawner process: it starts the process
// on first use, and again after it died.
type Spawner struct {
	path string
	args []string
	env  []string
	log  *slog.Logger

	mu     sync.Mutex
	conn   *net.UnixConn // nil until started
	proc   *os.Process
	exited chan struct{} // closed once proc is reaped
	closed bool
}

// New returns a Spawner that runs path with args and env as the spawner
// (a program that calls Serve on descriptor 3).
func New(path string, args, env []string, log *slog.Logger) *Spawner {
	return &Spawner{path: path, args: args, env: env, log: log}
}

// Start has the spawner start req's child with files, and returns its pid
// and a pidfd of it (close-on-exec), which names it for good: the spawner
// is the child's parent and reaps it when it exits, after which its pid may
// name another process. The caller closes the pidfd.
func (s *Spawner) Start(req Request, files Files) (pid int, pidfd *os.File, err error) {
	if req.Cloneflags&syscall.CLONE_NEWUSER == 0 {
		return 0, nil, errors.New("spawn: a request without a user namespace")
	}
	n := 1 + len(files.Extra) + len(files.Cgroup.Tasks)
	if files.Output != nil {
		n++
	}
	if files.Cgroup.Dir != nil {
		n++
	}
	if n > maxFiles {
		return 0, nil, fmt.Errorf("spawn: %d descriptors, over %d", n, maxFiles)
	}
	mine, theirs, err := socketpair()
	if err != nil {
		return 0, nil, fmt.Errorf("spawn: reply socket: %w", err)
	}
	defer mine.Close()
	fds := make([]int, 0, n)
	fds = append(fds, int(theirs.Fd()))
	if files.Output != nil {
		fds = append(fds, int(files.Output.Fd()))
	}
	for _, f := range files.Extra {
		fds = append(fds, int(f.Fd()))
	}
	for _, f := range files.Cgroup.Tasks {
		fds = append(fds, int(f.Fd()))
	}
	if files.Cgroup.Dir != nil {
		fds = append(fds, int(files.Cgroup.Dir.Fd()))
	}
	msg, err := json.Marshal(message{Request: req, Output: files.Output != nil, Extra: len(files.Extra),
		Tasks: len(files.Cgroup.Tasks), CgroupDir: files.Cgroup.Dir != nil})
	if err != nil {
		theirs.Close()
		return 0, nil, err
	}
	err = s.send(msg, unix.UnixRights(fds...))
	theirs.Close() // the spawner has its copy, or none: then the reply ends at once
	if err != nil {
		return 0, nil, err
	}
	c, err := net.FileConn(mine)
	if err != nil {
		return 0, nil, fmt.Errorf("spawn: reply socket: %w", err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(replyWait))
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*4))
	k, oobn, _, _, err := c.(*net.UnixConn).ReadMsgUnix(buf, oob)
	if err != nil || k == 0 {
		return 0, nil, fmt.Errorf("spawn: no reply from the spawner (it ended?): %v", err)
	}
	fds, perr := parseRights(oob[:oobn])
	if perr != nil {
		return 0, nil, fmt.Errorf("spawn: bad reply: %w", perr)
	}
	var rep reply
	if err := json.Unmarshal(buf[:k], &rep); err != nil || (rep.Error == "" && len(fds) != 1) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return 0, nil, fmt.Errorf("spawn: bad reply %q with %d descriptors", buf[:k], len(fds))
	}
	if rep.Error != "" {
		return 0, nil, errors.New(rep.Error)
	}
	return rep.Pid, os.NewFile(uintptr(fds[0]), "pidfd"), nil
}

// send sends one request, starting the spawner first if it is not running.
// A send that fails on a spawner that ended is tried once more on a new
// one: the request did not reach the old one.
func (s *Spawner) send(msg, oob []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for try := 0; ; try++ {
		if s.closed {
			return errors.New("spawn: the spawner is closed")
		}
		if s.conn != nil {
			select {
			case <-s.exited:
				s.log.Warn("the spawner ended; starting it again")
				s.conn.Close()
				s.conn = nil
			default:
			}
		}
		if s.conn == nil {
			if err := s.startLocked(); err != nil {
				return err
			}
		}
		_, _, err := s.conn.WriteMsgUnix(msg, oob, nil)
		if err == nil {
			return nil
		}
		if try > 0 {
			return fmt.Errorf("spawn: send to the spawner: %w", err)
		}
		s.conn.Close()
		s.conn = nil
		s.proc.Kill()
		<-s.exited
	}
}

// startLocked starts the spawner process.
func (s *Spawner) startLocked() error {
	mine, theirs, err := socketpair()
	if err != nil {
		return fmt.Errorf("spawn: %w", err)
	}
	defer theirs.Close()
	cmd := &exec.Cmd{
		Path: s.path, Args: s.args, Env: s.env, Dir: "/",
		Stderr: os.Stderr, ExtraFiles: []*os.File{theirs},
	}
	if err := cmd.Start(); err != nil {
		mine.Close()
		return fmt.Errorf("spawn: start the spawner: %w", err)
	}
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("spawn: %w", err)
	}
	exited := make(chan struct{})
	// Owned by the Spawner: reaps the spawner, which ends when its socket
	// closes (Close, or this process's exit).
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.conn, s.proc, s.exited = c.(*net.UnixConn), cmd.Process, exited
	return nil
}

// Pid is the spawner's pid, 0 when it is not running.
func (s *Spawner) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return 0
	}
	select {
	case <-s.exited:
		return 0
	default:
		return s.proc.Pid
	}
}

// Close ends the spawner (its socket closes, and it exits once its starts
// in progress end) and waits for it. Children it started live on.
func (s *Spawner) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.conn == nil {
		return nil
	}
	err := s.conn.Close()
	s.conn = nil
	select {
	case <-s.exited:
	case <-time.After(replyWait):
		s.proc.Kill()
		<-s.exited
	}
	return err
}

// socketpair returns a connected pair of close-on-exec SOCK_SEQPACKET
// sockets: each write is one message, read whole.
func socketpair() (a, b *os.File, err error) {
	fd, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd[0]), "spawn"), os.NewFile(uintptr(fd[1]), "spawn"), nil
}
