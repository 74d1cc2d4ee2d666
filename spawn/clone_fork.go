//go:build !amd64 || race || msan || asan

package spawn

import "syscall"

// Elsewhere, and in builds with a sanitizer, the child is a fork, a copy
// of the spawner (clone_vm.go says what a clone into its address space
// saves).
const cloneVM = false

const childStack = 0

// forkShared forks: sharesMemory is false in this build, so it is never
// asked for a clone into the spawner's memory.
func forkShared(args *cloneArgs, pidfd *int32, c *child) (uintptr, syscall.Errno) {
	return forkCopy(args, pidfd, c)
}
