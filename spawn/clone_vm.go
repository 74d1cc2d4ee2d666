//go:build amd64 && !race && !msan && !asan

package spawn

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// On amd64 the child is cloned into the spawner's address space
// (CLONE_VM) on a stack of its own, and runs there until its exec: the
// kernel copies no page tables for it and the exec unmaps no copy, and the
// spawner's pages are not made copy-on-write (each later write a fault).
// A fork copied them: in a 32-client create loop the copy, the faults
// after it and their TLB shootdowns were about 5% of the host's CPU. The
// child writes only its own copy of the child struct and its stack, both
// kept alive by the parent until the child has exec'd or exited. Without
// CLONE_VFORK the parent goes on at once, to write the id maps the child
// waits for. The child enters Go through childMain's ABI wrapper, which
// the race, memory and address sanitizers instrument: their builds fork
// (clone_fork.go).
const cloneVM = true

// childStack is the size of a cloned child's stack: the child runs
// go:nosplit functions only, which the linker bounds to well under 1 KiB.
const childStack = 64 << 10

//go:noescape
func clone3VM(args *cloneArgs, size uintptr, c *child) (pid uintptr, errno syscall.Errno)

// forkShared starts c's child cloned into the spawner's memory, on c's
// stack, with every signal blocked across the clone (so no Go handler runs
// in it), and returns its pid, its pidfd in *pidfd. c is the child's own
// copy; it and the stack stay alive until the child has exec'd or exited.
//
//go:nosplit
//go:norace
func forkShared(args *cloneArgs, pidfd *int32, c *child) (uintptr, syscall.Errno) {
	args.pidfd = uint64(uintptr(unsafe.Pointer(pidfd)))
	args.flags |= unix.CLONE_VM
	args.stack, args.stackSize = uint64(uintptr(unsafe.Pointer(&c.stack[0]))), uint64(len(c.stack))
	all := ^uint64(0)
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&all)), uintptr(unsafe.Pointer(&c.mask)), 8, 0, 0)
	pid, errno := clone3VM(args, unsafe.Sizeof(*args), c)
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&c.mask)), 0, 8, 0, 0)
	return pid, errno
}

// childMain is the cloned child, on its own stack.
//
//go:nosplit
//go:norace
func childMain(c *child) { c.run(c.mask) }
