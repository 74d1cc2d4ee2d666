package spawn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The spawner forks its children itself rather than through os/exec, for
// one step the syscall package cannot take: dropping capabilities from the
// child's bounding set after its user namespace is made and before it
// execs. The bounding set is a per-thread attribute that a new user
// namespace resets to full, and a Go program can shrink it for all its
// threads only with syscall.AllThreadsSyscall, a stop-the-world per
// capability: 31 of them, about a millisecond at each guest's start and far
// more under load, where each waits for every thread of the guest to be
// scheduled. The child here is the one thread of a copy of the spawner, so
// it drops them with plain system calls.
//
// What the child does between the fork and the exec is the syscall
// package's order for the attributes the spawner uses: wait for the id
// maps (the parent writes them), setsid, become root of the user
// namespace, narrow the bounding set, chdir, put the descriptors in place,
// reset the signals, exec. It runs on a copy of a multi-threaded Go
// process in which only the forking thread exists, so it makes raw system
// calls only, in functions that cannot grow the stack (go:nosplit), with
// every string made a C string before the fork.

// cloneArgs is the kernel's struct clone_args (clone3), up to its cgroup
// field (CLONE_ARGS_SIZE_VER2).
type cloneArgs struct {
	flags      uint64
	pidfd      uint64
	childTID   uint64
	parentTID  uint64
	exitSignal uint64
	stack      uint64
	stackSize  uint64
	tls        uint64
	setTID     uint64
	setTIDSize uint64
	cgroup     uint64
}

// kernelSigaction is the kernel's struct sigaction on amd64 and arm64.
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// The steps a child can fail in, reported with the errno.
const (
	stepWait = iota + 1
	stepSetsid
	stepIDs
	stepCaps
	stepBounding
	stepChdir
	stepFiles
	stepSignals
	stepExec
)

var stepNames = [...]string{stepWait: "wait for the id maps", stepSetsid: "setsid", stepIDs: "become root of the user namespace",
	stepCaps: "raise the inheritable set", stepBounding: "drop from the bounding set", stepChdir: "chdir",
	stepFiles: "set up descriptors", stepSignals: "reset signals", stepExec: "execve"}

// child is everything a forked child needs, made before the fork.
type child struct {
	path *byte
	argv []*byte // nil-terminated
	envv []*byte // nil-terminated
	dir  *byte   // nil: stay
	// files[i] becomes the child's descriptor i. The child rearranges it
	// (its own copy) on the way.
	files  []int
	setsid bool
	// drop, unless nil, is the bounding set's capabilities to drop, in
	// order; the inheritable set is raised to the permitted set first.
	drop []uintptr
	// The parent writes a byte on wait's other end once the id maps are
	// written; the child reports a failed step on report, which its exec
	// closes (both close-on-exec).
	wait, waitW, report int
	// mask is the signal mask the child execs with; stack, where the
	// child is cloned into the spawner's memory, its stack.
	mask  uint64
	stack []byte
}

// forkExec starts c in the namespaces of cloneflags, whose user namespace
// maps 0…size-1 (uids and gids) to hostID…, born in the cgroup v2
// directory cgroupFD (or, at -1, in the calling thread's cgroups), and
// returns its pid and a pidfd (close-on-exec). A child that fails before
// its exec is waited for, and its step and errno returned. A child killed
// before its exec (by its cgroup's kill, say) reads as started, as with
// os/exec: its pidfd then reports its exit.
func forkExec(c *child, cloneflags uintptr, hostID, size uint32, cgroupFD int) (pid, pidfd int, err error) {
	var wait, report [2]int
	if err := unix.Pipe2(wait[:], unix.O_CLOEXEC); err != nil {
		return 0, -1, fmt.Errorf("pipe: %w", err)
	}
	defer unix.Close(wait[1])
	if err := unix.Pipe2(report[:], unix.O_CLOEXEC); err != nil {
		unix.Close(wait[0])
		return 0, -1, fmt.Errorf("pipe: %w", err)
	}
	reportR := os.NewFile(uintptr(report[0]), "report")
	defer reportR.Close()
	// The child's own copy of c, which it changes on the way (its
	// descriptors' places); one cloned into the spawner's memory (cloneVM)
	// runs on it and its stack until its exec or exit, which the report's
	// end below waits for.
	cc := new(child)
	*cc = *c
	cc.files = slices.Clone(c.files)
	if sharesMemory() {
		cc.stack = make([]byte, childStack)
	}
	defer runtime.KeepAlive(cc)
	cc.wait, cc.waitW, cc.report = wait[0], wait[1], report[1]
	args := &cloneArgs{flags: uint64(cloneflags) | unix.CLONE_PIDFD, exitSignal: uint64(unix.SIGCHLD)}
	if cgroupFD >= 0 {
		args.flags |= unix.CLONE_INTO_CGROUP
		args.cgroup = uint64(cgroupFD)
	}
	fd := new(int32)
	// ForkLock keeps out code that makes a descriptor and marks it
	// close-on-exec in two steps.
	syscall.ForkLock.Lock()
	var p uintptr
	var errno syscall.Errno
	if cc.stack != nil {
		p, errno = forkShared(args, fd, cc)
	} else {
		p, errno = forkCopy(args, fd, cc)
	}
	syscall.ForkLock.Unlock()
	unix.Close(wait[0])
	unix.Close(report[1])
	if errno != 0 {
		return 0, -1, fmt.Errorf("clone3: %w", errno)
	}
	pid, pidfd = int(p), int(*fd)
	// A child that failed is waited for here (if the caller's reaper took
	// it first, the wait ends at once).
	fail := func(err error) (int, int, error) {
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		unix.Waitid(unix.P_PIDFD, pidfd, nil, unix.WEXITED, nil)
		unix.Close(pidfd)
		return 0, -1, err
	}
	m := []byte(fmt.Sprintf("0 %d %d\n", hostID, size))
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := writeMap("/proc/"+strconv.Itoa(pid)+"/"+f, m); err != nil {
			return fail(fmt.Errorf("write the child's %s: %w", f, err))
		}
	}
	if _, err := unix.Write(wait[1], []byte{0}); err != nil {
		return fail(fmt.Errorf("release the child: %w", err))
	}
	// The report's end in the child closes at its exec: EOF is success.
	var rep [8]byte
	switch _, err := io.ReadFull(reportR, rep[:]); {
	case errors.Is(err, io.EOF):
		return pid, pidfd, nil
	case err != nil:
		return fail(fmt.Errorf("read the child's report: %w", err))
	}
	step, e := binary.NativeEndian.Uint32(rep[:4]), syscall.Errno(binary.NativeEndian.Uint32(rep[4:]))
	name := "step " + strconv.Itoa(int(step))
	if int(step) < len(stepNames) && stepNames[step] != "" {
		name = stepNames[step]
	}
	return fail(fmt.Errorf("%s: %w", name, e))
}

// writeMap writes an id map in one write, as the kernel takes it.
func writeMap(path string, m []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(m)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// forkCopy forks c's child as a copy of the spawner, with every signal
// blocked across the clone (so no Go handler runs in the child), and
// returns the child's pid, its pidfd in *pidfd.
//
//go:nosplit
//go:norace
func forkCopy(args *cloneArgs, pidfd *int32, c *child) (uintptr, syscall.Errno) {
	// Set here, where the stack cannot move: the kernel writes through it.
	args.pidfd = uint64(uintptr(unsafe.Pointer(pidfd)))
	all := ^uint64(0)
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&all)), uintptr(unsafe.Pointer(&c.mask)), 8, 0, 0)
	pid, _, errno := syscall.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(args)), unsafe.Sizeof(*args), 0)
	if errno == 0 && pid == 0 {
		c.run(c.mask) // does not return
	}
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&c.mask)), 0, 8, 0, 0)
	return pid, errno
}

// sharesMemory says whether the next child is cloned into the spawner's
// memory (clone_vm.go) rather than forked. Between that clone and its exec
// the child's memory is the spawner's, and the child's user namespace
// gives its owner (the sandbox's host uid) every capability over it: what
// keeps such a process from tracing the child, or writing its memory
// through /proc, is that the memory is not dumpable (ptrace then needs
// CAP_SYS_PTRACE where the spawner runs). The spawner is made not
// dumpable by its threads' change of ids (osthread.SetIDs), unless the
// host's fs.suid_dumpable is 1, a debugging setting: then every child is
// a copy.
func sharesMemory() bool {
	if !cloneVM {
		return false
	}
	d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	return err == nil && d != 1 // SUID_DUMP_USER
}

// run is the child, from the clone to the exec; mask is the signal mask
// it execs with.
//
//go:nosplit
//go:norace
func (c *child) run(mask uint64) {
	var b [1]byte
	var n uintptr
	errno := syscall.Errno(0)
	step := stepWait
	syscall.RawSyscall(unix.SYS_CLOSE, uintptr(c.waitW), 0, 0) // or the read below never ends
	n, _, errno = syscall.RawSyscall(unix.SYS_READ, uintptr(c.wait), uintptr(unsafe.Pointer(&b[0])), 1)
	if errno != 0 || n != 1 {
		if errno == 0 {
			errno = unix.EPIPE
		}
		goto fail
	}
	if c.setsid {
		step = stepSetsid
		if _, _, errno = syscall.RawSyscall(unix.SYS_SETSID, 0, 0, 0); errno != 0 {
			goto fail
		}
	}
	// Root of the user namespace in every id, so that none is left
	// mapped to the spawner's own (host root, as the saved uid).
	step = stepIDs
	if _, _, errno = syscall.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); errno != 0 {
		goto fail
	}
	if _, _, errno = syscall.RawSyscall(unix.SYS_SETRESGID, 0, 0, 0); errno != 0 {
		goto fail
	}
	if _, _, errno = syscall.RawSyscall(unix.SYS_SETRESUID, 0, 0, 0); errno != 0 {
		goto fail
	}
	if c.drop != nil {
		// Root's permitted set after execve is its bounding set and its
		// inheritable set together: raised to the permitted set (which
		// needs the capabilities still in the bounding set), the
		// inheritable set carries every capability across the exec.
		step = stepCaps
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if _, _, errno = syscall.RawSyscall(unix.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
			goto fail
		}
		data[0].Inheritable, data[1].Inheritable = data[0].Permitted, data[1].Permitted
		if _, _, errno = syscall.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
			goto fail
		}
		step = stepBounding
		for _, cp := range c.drop {
			if _, _, errno = syscall.RawSyscall6(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, cp, 0, 0, 0, 0); errno != 0 {
				goto fail
			}
		}
	}
	if c.dir != nil {
		step = stepChdir
		if _, _, errno = syscall.RawSyscall(unix.SYS_CHDIR, uintptr(unsafe.Pointer(c.dir)), 0, 0); errno != 0 {
			goto fail
		}
	}
	step = stepFiles
	if errno = c.placeFiles(); errno != 0 {
		goto fail
	}
	// Every disposition to the default: Go's handlers are the spawner's
	// (a signal that came between the mask's restore and the exec would
	// run one in this copy), and a signal the spawner was started with
	// ignored (make ignores 32 and 33 for its children) is no sandbox's.
	step = stepSignals
	for sig := uintptr(1); sig <= 64; sig++ {
		if sig == uintptr(unix.SIGKILL) || sig == uintptr(unix.SIGSTOP) {
			continue
		}
		var dfl kernelSigaction
		syscall.RawSyscall6(unix.SYS_RT_SIGACTION, sig, uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0) // EINVAL: a number this kernel lacks
	}
	if _, _, errno = syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&mask)), 0, 8, 0, 0); errno != 0 {
		goto fail
	}
	step = stepExec
	_, _, errno = syscall.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(c.path)),
		uintptr(unsafe.Pointer(&c.argv[0])), uintptr(unsafe.Pointer(&c.envv[0])))
fail:
	rep := [2]uint32{uint32(step), uint32(errno)}
	syscall.RawSyscall(unix.SYS_WRITE, uintptr(c.report), uintptr(unsafe.Pointer(&rep[0])), unsafe.Sizeof(rep))
	for {
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, 253, 0, 0)
	}
}

// placeFiles makes each c.files[i] the descriptor i (not close-on-exec),
// moving first, above every target, each source a lower target would
// overwrite, and the report pipe.
//
//go:nosplit
//go:norace
func (c *child) placeFiles() syscall.Errno {
	next := uintptr(len(c.files))
	if uintptr(c.report) < next {
		r, _, e := syscall.RawSyscall(unix.SYS_FCNTL, uintptr(c.report), unix.F_DUPFD_CLOEXEC, next)
		if e != 0 {
			return e
		}
		c.report = int(r)
	}
	for i := range c.files {
		if c.files[i] < i { // a lower target, placed first, would have replaced it
			r, _, e := syscall.RawSyscall(unix.SYS_FCNTL, uintptr(c.files[i]), unix.F_DUPFD_CLOEXEC, next)
			if e != 0 {
				return e
			}
			c.files[i] = int(r)
		}
	}
	for i, fd := range c.files {
		if fd == i {
			if _, _, e := syscall.RawSyscall(unix.SYS_FCNTL, uintptr(fd), unix.F_SETFD, 0); e != 0 {
				return e
			}
			continue
		}
		if _, _, e := syscall.RawSyscall(unix.SYS_DUP3, uintptr(fd), uintptr(i), 0); e != 0 {
			return e
		}
	}
	return 0
}
