package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/capability"
	"github.com/berthsh/berth/internal/fds"
	"github.com/berthsh/berth/seccomp"
	"github.com/berthsh/berth/spawn"
)

// maxBootstrap bounds a Bootstrap document.
const maxBootstrap = 1 << 20

// Main is `berth guest`, the sandbox's init: it boots in the mode args name
// (guestapi.BootPipe with no arguments, guestapi.BootFile with
// "--bootstrap FILE"), then runs the core. It returns only on failure.
func Main(ctx context.Context, args []string, log *slog.Logger) error {
	// Nothing the runtime handed us beyond stdio may reach the workload.
	if err := fds.CloseOnExecFrom(3); err != nil {
		return fmt.Errorf("mark descriptors close-on-exec: %w", err)
	}
	switch {
	case len(args) == 0:
		return bootPipe(ctx, log)
	case len(args) == 1 && args[0] == guestapi.CheckFlag:
		return check()
	case len(args) == 1 && args[0] == guestapi.ProbeLayersFlag:
		return probeLayers()
	case len(args) == 1 && args[0] == guestapi.SpawnerFlag:
		return spawn.Serve(os.NewFile(3, "spawner"))
	case len(args) == 2 && args[0] == guestapi.BootFlagFile:
		return bootFile(ctx, args[1], log)
	case len(args) == 1 && strings.HasPrefix(args[0], guestapi.BootFlagFile+"="):
		return bootFile(ctx, strings.TrimPrefix(args[0], guestapi.BootFlagFile+"="), log)
	}
	return fmt.Errorf("usage: berth guest [%s FILE | %s | %s]", guestapi.BootFlagFile, guestapi.CheckFlag, guestapi.ProbeLayersFlag)
}

// check says whether this binary can be a guest at all: it hardens every
// thread at once (syscall.AllThreadsSyscall), which a build with cgo
// cannot do. Runtimes run it when they start, so that such a build fails
// there, with the fix, rather than at every create.
func check() error {
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_GET_DUMPABLE, 0, 0); e != 0 {
		return fmt.Errorf("this binary cannot harden a sandbox (changing every thread's credentials at once: %v); "+
			"it was built with cgo: build berth with CGO_ENABLED=0 (make build does)", e)
	}
	return nil
}

// bootPipe receives the Bootstrap, and the mounts it passes, on
// PipeBootstrapFD and reports readiness, or why it failed, on PipeStatusFD.
func bootPipe(ctx context.Context, log *slog.Logger) error {
	status := os.NewFile(guestapi.PipeStatusFD, "status")
	// The native runtime's spawner drops the bounding set before the exec
	// (spawn.Request.Bounding), so this finds the drops made; a guest
	// started another way makes them here, before the bootstrap is read,
	// overlapping the runtime's filling of the sandbox's directory.
	if err := capability.DropBounding(capability.Default()); err != nil {
		return reportFailure(status, fmt.Errorf("drop capabilities: %w", err))
	}
	prefault() // a spare does it while it waits
	b, passed, err := receiveBootstrap(guestapi.PipeBootstrapFD)
	if err != nil {
		return reportFailure(status, fmt.Errorf("read bootstrap: %w", err))
	}
	ln, relisten, err := prepare(b, passed, log)
	closeAll(passed) // mounted by now, or not at all
	if err != nil {
		return reportFailure(status, err)
	}
	hello, err := json.Marshal(guestapi.HelloResponse{Protocol: guestapi.Protocol, MinProtocol: guestapi.MinProtocol, Features: features(relisten != nil)})
	if err != nil {
		return reportFailure(status, err)
	}
	if _, err := status.WriteString(guestapi.StatusReady + " " + string(hello) + "\n"); err != nil {
		return fmt.Errorf("report ready: %w", err)
	}
	status.Close()
	return runCore(ctx, ln, relisten, b, log)
}

// receiveBootstrap reads the one message on socket fd, a Bootstrap with the
// descriptors passed along, and closes fd.
func receiveBootstrap(fd int) (guestapi.Bootstrap, []int, error) {
	defer unix.Close(fd)
	buf := make([]byte, maxBootstrap)
	oob := make([]byte, unix.CmsgSpace(4*guestapi.MaxPassed))
	var (
		n, oobn, flags int
		err            error
	)
	for {
		n, oobn, flags, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return guestapi.Bootstrap{}, nil, err
	}
	var passed []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return guestapi.Bootstrap{}, nil, fmt.Errorf("passed descriptors: %w", err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				closeAll(passed)
				return guestapi.Bootstrap{}, nil, fmt.Errorf("passed descriptors: %w", err)
			}
			passed = append(passed, fds...)
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll(passed)
		return guestapi.Bootstrap{}, nil, fmt.Errorf("the bootstrap is over %d bytes or passes over %d descriptors", maxBootstrap, guestapi.MaxPassed)
	}
	var b guestapi.Bootstrap
	if err := json.Unmarshal(buf[:n], &b); err != nil {
		closeAll(passed)
		return guestapi.Bootstrap{}, nil, err
	}
	return b, passed, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// probeLayers is `guest --probe-layers` (see guestapi): it mounts the root
// it receives on a private tmpfs, as a boot would, and checks the probe
// file through it.
func probeLayers() error {
	b, passed, err := receiveBootstrap(guestapi.PipeBootstrapFD)
	if err != nil {
		return fmt.Errorf("read bootstrap: %w", err)
	}
	defer closeAll(passed)
	if b.Root == nil {
		return errors.New("probe: no root")
	}
	dir, err := mountRoot(*b.Root, passed)
	if err != nil {
		return err
	}
	p := filepath.Join(dir, guestapi.ProbeFile)
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	if st.Uid != 0 || st.Gid != 0 {
		return fmt.Errorf("a root-owned file of an idmapped layer shows as %d:%d, not 0:0", st.Uid, st.Gid)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("copy up from an idmapped layer: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString("x"); err != nil {
		return fmt.Errorf("copy up from an idmapped layer: %w", err)
	}
	return nil
}

// bootFile reads the Bootstrap from a file and removes it: the token in it
// is for the guest alone. Readiness is the listener accepting.
func bootFile(ctx context.Context, path string, log *slog.Logger) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read bootstrap: %w", err)
	}
	var b guestapi.Bootstrap
	err = json.NewDecoder(io.LimitReader(f, maxBootstrap)).Decode(&b)
	f.Close()
	if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		log.Warn("bootstrap file not removed", "path", path, "err", rmErr)
	}
	if err != nil {
		return fmt.Errorf("read bootstrap %s: %w", path, err)
	}
	ln, relisten, err := prepare(b, nil, log)
	if err != nil {
		return err
	}
	return runCore(ctx, ln, relisten, b, log)
}

func runCore(ctx context.Context, ln net.Listener, relisten *relistener, b guestapi.Bootstrap, log *slog.Logger) error {
	log.Info("guest ready", "id", b.ID)
	// Off the create's critical path; new threads inherit the seccomp filter
	// and the reduced capabilities of the thread that clones them.
	go reserveThreads(threadReserve)
	cfg := Config{Token: b.Token, Hostname: b.Hostname, FilesRoot: "/"}
	if relisten != nil {
		cfg.Relisten, cfg.Unlisten = relisten.listen, relisten.remove
	}
	return Run(ctx, ln, cfg, log)
}

func reportFailure(status *os.File, err error) error {
	b, _ := json.Marshal(guestapi.Error{Class: "internal", Message: err.Error()})
	status.Write(append(b, '\n'))
	status.Close()
	return err
}

// prepare makes the sandbox the Bootstrap describes around the guest: the
// control listener, the root file system (when asked; passed are the
// mounts its layers may name), the hostname and loopback, and finally the
// guest's own hardening. The guest expects its own mount, UTS and network
// namespaces (the runtime made them).
func prepare(b guestapi.Bootstrap, passed []int, log *slog.Logger) (net.Listener, *relistener, error) {
	if b.Token == "" {
		return nil, nil, errors.New("bootstrap: no token")
	}
	t := time.Now()
	lap := func(phase string) {
		log.Debug("setup", "phase", phase, "took", time.Since(t))
		t = time.Now()
	}
	// The bounding set goes first (if it was not dropped before the exec),
	// while the guest has the fewest threads: each drop stops every
	// thread, and the effective capabilities the setup below needs stay
	// until Restrict, which then skips the drops.
	if err := capability.DropBounding(capability.Default()); err != nil {
		return nil, nil, fmt.Errorf("drop capabilities: %w", err)
	}
	lap("bounding")
	// Bound before the pivot (or the cover of Hide) makes its path
	// unreachable from inside; a guest whose runtime hides it can be
	// suspended and listen there again.
	ln, relisten, err := listen(b.Listen, len(b.Hide) > 0)
	if err != nil {
		return nil, nil, err
	}
	lap("listen")
	// The signals are set up beside the root's mounts: each is a round
	// trip with Go's signal thread, mostly waiting. Nothing runs inside
	// the sandbox before prepare returns, so nothing can signal it sooner.
	signals := make(chan error, 1)
	go func() { signals <- ignoreSignalsFromInside() }()
	var signalsErr error
	joined := false
	join := func() error { // the signals' setup is over (once)
		if !joined {
			joined, signalsErr = true, <-signals
		}
		return signalsErr
	}
	fail := func(err error) (net.Listener, *relistener, error) {
		join() // a failed prepare leaves no goroutine behind
		ln.Close()
		return nil, nil, err
	}
	if b.Root != nil {
		if err := assembleRoot(*b.Root, passed); err != nil {
			return fail(err)
		}
		lap("root")
	}
	for _, dir := range b.Hide {
		if err := hide(dir); err != nil {
			return fail(err)
		}
	}
	if b.Hostname != "" {
		if err := unix.Sethostname([]byte(b.Hostname)); err != nil {
			return fail(fmt.Errorf("sethostname: %w", err))
		}
	}
	if err := loopbackUp(); err != nil {
		return fail(err)
	}
	if err := join(); err != nil {
		return fail(err)
	}
	// The guest holds the control listener: nothing inside may read its memory
	// or descriptors (ptrace and /proc/1/fd need it dumpable).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail(fmt.Errorf("set not dumpable: %w", err))
	}
	lap("identity")
	if err := capability.Restrict(capability.Default()); err != nil {
		return fail(fmt.Errorf("drop capabilities: %w", err))
	}
	if b.Seccomp {
		prog, err := seccomp.Default().Assemble()
		if err != nil {
			return fail(fmt.Errorf("assemble seccomp profile: %w", err))
		}
		if err := seccomp.Install(prog); err != nil {
			return fail(fmt.Errorf("install seccomp profile: %w", err))
		}
	}
	lap("harden")
	return ln, relisten, nil
}

// ignoreSignalsFromInside makes the guest take no action on any signal a
// process inside could send it: Go's default for many (exit, a goroutine
// dump into the guest's log, a crash) would let root inside stop its own
// sandbox with `kill -TERM 1` or write to the host-side log. The standard
// signals (1 to 31) are caught into a channel nobody reads (os/signal drops
// what does not fit); the real-time ones (32 to 64) need not be: Go's
// handler ignores one sent to it that nobody asked for, and each signal
// asked for costs a round trip with the runtime's signal thread (60 of
// them were 1 to 3 ms of every create). Go has no handler on 32 and 34;
// those get one that does nothing (catchSignal), since gVisor, unlike
// Linux, lets a default action sent from inside end a namespace's init.
// None is set to SIG_IGN: an ignored disposition is inherited by every
// process the guest starts (a handler is not), and a workload must get
// SIGPIPE, SIGINT, SIGTERM and the real-time signals as usual. For the same
// reason a disposition ignored when the guest started (make, for one,
// starts its children with the real-time signals 32 and 33 ignored) is set
// back to the default, or caught: once nothing may pass an ignored signal
// on. A synchronous signal the guest causes itself
// (a real SIGSEGV) still crashes it, as Go handles those apart from sent
// ones; SIGKILL and SIGSTOP cannot reach a PID namespace's init from
// inside, and the runtime's SIGKILL from outside still ends it.
func ignoreSignalsFromInside() error {
	var sigs []os.Signal
	for sig := unix.Signal(1); sig <= 31; sig++ {
		switch sig {
		case unix.SIGKILL, unix.SIGSTOP, unix.SIGURG, unix.SIGCHLD: // the kernel's, Go's preemption, the reaper's
			continue
		}
		sigs = append(sigs, sig)
	}
	signal.Notify(make(chan os.Signal, 1), sigs...)
	for sig := unix.Signal(1); sig <= 64; sig++ {
		if sig == unix.SIGKILL || sig == unix.SIGSTOP {
			continue
		}
		var old sigaction
		s := uintptr(sig)
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, s, 0, uintptr(unsafe.Pointer(&old)), 8, 0, 0); e != 0 {
			continue // a number this kernel does not have
		}
		switch {
		case sig >= 32 && (old.handler == sigDfl || old.handler == sigIgn):
			// 32 and 34, which Go does not handle, and any inherited
			// ignored: a handler that does nothing (catchSignal).
			if err := catchSignal(sig); err != nil {
				return err
			}
		case old.handler == sigIgn:
			dfl := sigaction{}
			if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, s, uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0); e != 0 {
				return fmt.Errorf("reset signal %d: %w", s, e)
			}
		}
	}
	return nil
}

// sigaction is the kernel's struct sigaction on amd64 and arm64.
type sigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

const (
	sigDfl = 0 // SIG_DFL
	sigIgn = 1 // SIG_IGN
)

// hide covers directory dir with an empty read-only tmpfs. Unmounting what
// is there would not do: a socket bound on it stops working (gVisor ends
// its host-backed listener with EIO), so it is covered instead, and the
// cover cannot be lifted from inside (unmounting takes CAP_SYS_ADMIN, which
// the guest drops for good).
func hide(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) == "/" {
		return fmt.Errorf("bootstrap: hide %q: want an absolute directory other than /", dir)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0"); err != nil {
		return fmt.Errorf("hide %s: %w", dir, err)
	}
	return nil
}

// listen opens the control listener at addr ("unix:PATH"). The socket is
// bound through a descriptor of its directory, so that a long path cannot
// overflow sun_path, and a stale socket file is replaced. With keep, it
// also returns a relistener over a descriptor of the directory kept open
// (the guest may hide the path meanwhile).
func listen(addr string, keep bool) (net.Listener, *relistener, error) {
	path, ok := strings.CutPrefix(addr, guestapi.ListenUnix)
	if !ok || path == "" || !strings.HasPrefix(path, "/") {
		return nil, nil, fmt.Errorf("bootstrap: listen address %q: want %sABSOLUTE-PATH", addr, guestapi.ListenUnix)
	}
	dir, name := path[:strings.LastIndexByte(path, '/')+1], path[strings.LastIndexByte(path, '/')+1:]
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open control dir: %w", err)
	}
	at := func() (net.Listener, error) {
		sock := fmt.Sprintf("/proc/self/fd/%d/%s", fd, name)
		os.Remove(sock)
		ln, err := net.Listen("unix", sock)
		if err != nil {
			return nil, fmt.Errorf("listen on control socket: %w", err)
		}
		// Go would unlink the path on Close; once pivoted it is not ours to unlink.
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		return ln, nil
	}
	ln, err := at()
	if err != nil || !keep {
		unix.Close(fd)
		return ln, nil, err
	}
	return ln, &relistener{listen: at, remove: func() error { return unix.Unlinkat(fd, name, 0) }}, nil
}

// relistener listens again where the guest first listened, and removes
// the socket file there (the runtime's sign that the guest let go of it).
type relistener struct {
	listen func() (net.Listener, error)
	remove func() error
}
