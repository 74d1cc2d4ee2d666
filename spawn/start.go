// Package spawn starts sandboxes' inits from a small helper process, the
// spawner, instead of from the daemon.
//
// An init is born in new namespaces, a user namespace among them, and Go
// cannot start such a child with vfork: the parent writes the child's id
// maps while the child waits, so every start is a full fork of the parent.
// Forking the daemon copies its page tables, and afterwards each page the
// daemon writes takes a copy-on-write fault, with TLB shootdowns on the
// other CPUs: under a loop of creates that was about 15% of the machine's
// CPU. The spawner is the guest binary in another mode, a process of a few
// MiB whose fork copies almost nothing.
//
// The spawner is each init's parent, and reaps it; the daemon holds each
// init by a pidfd the spawner passes back, which names it for good (its
// pid may name another process once it exited) and tells when it exits.
// A guest outlives the spawner as it outlives the daemon: the spawner ends
// when the daemon's end of their socketpair closes, and its children pass
// to init.
//
// The spawner forks and execs each child itself (fork.go) rather than
// through os/exec, so that it can narrow the child's bounding set between
// the namespaces' creation and the exec, while the child is a single
// thread (Request.Bounding).
//
// The daemon and its spawner share one socketpair that no one else holds.
// Each request carries its own reply socket and the descriptors the child
// gets, so requests run side by side. StartIn starts an os/exec child born
// inside a cgroup given as open files; the spawner's children are born the
// same way.
package spawn

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/berthsh/berth/internal/osthread"
)

// Cgroup is where a child is born, as files another process can use: a
// cgroup v1 group's tasks files (one per hierarchy) or a cgroup v2 group's
// directory. The zero Cgroup is the starter's own cgroup.
type Cgroup struct {
	// Tasks (v1) are written with the forking thread's id before it forks,
	// so the child is born in each hierarchy's group.
	Tasks []*os.File
	// Dir (v2) is the group the child is born in (clone3's CLONE_INTO_CGROUP).
	Dir *os.File
}

// Close closes the files.
func (c Cgroup) Close() {
	for _, f := range c.Tasks {
		f.Close()
	}
	if c.Dir != nil {
		c.Dir.Close()
	}
}

// StartIn starts cmd (not yet started) so that the child is born inside cg,
// never briefly outside it; with CLONE_NEWCGROUP in cmd's Cloneflags its
// cgroup namespace is rooted there. onThread, unless nil, runs on the OS
// thread that forks, just before the fork: it may change that thread's
// credentials, which the child (and a user namespace it creates) is born
// with. A thread that forks after joining cg's tasks or running onThread
// ends with the fork (osthread.Discarded), so no other goroutine runs in
// the group or with those credentials; StartIn returns once it is gone.
func StartIn(cmd *exec.Cmd, cg Cgroup, onThread func() error) error {
	if cg.Dir != nil {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cg.Dir.Fd())
	}
	return startIn(cg, onThread, cmd.Start)
}

// startIn runs start, which forks, on a thread in cg's v1 groups and
// after onThread, as StartIn describes; a v2 group is start's to use.
func startIn(cg Cgroup, onThread func() error, start func() error) error {
	if len(cg.Tasks) == 0 && onThread == nil {
		return start()
	}
	tid, err := osthread.Discarded(func(int) error {
		for _, f := range cg.Tasks {
			// "0" is the writing thread. Named so, rather than by its id,
			// the kernel moves it without its global threadgroup lock,
			// whose writer waits for an RCU grace period (5.5 ms per move,
			// against 0.3 ms, on this project's VM; each start makes one
			// per hierarchy).
			if _, err := f.Write([]byte("0")); err != nil {
				return fmt.Errorf("move forking thread into cgroup: %w", err)
			}
		}
		if onThread != nil {
			if err := onThread(); err != nil {
				return err
			}
		}
		return start()
	})
	// An exited thread has left its cgroups: then the group holds only the
	// child, and can be removed once the child is gone.
	osthread.WaitGone(tid)
	return err
}
