package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

type v1Manager struct {
	mounts map[string]string // controller -> mount dir
	root   string
}

// NewV1 returns a manager over v1 hierarchies; memory, cpu and pids are required.
func NewV1(mounts map[string]string, root string) (Manager, error) {
	if err := validID(root); err != nil {
		return nil, err
	}
	m := &v1Manager{mounts: map[string]string{}, root: root}
	for c, dir := range mounts {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
			if c == "cpuacct" {
				continue // optional: usage is also in cpu on some hosts
			}
			return nil, fmt.Errorf("cgroup v1 controller %s not mounted at %s: %w", c, dir, err)
		}
		m.mounts[c] = dir
		if err := os.MkdirAll(filepath.Join(dir, root), 0o755); err != nil {
			return nil, fmt.Errorf("make %s: %w", filepath.Join(dir, root), err)
		}
	}
	for _, c := range []string{"memory", "cpu", "pids"} {
		if _, ok := m.mounts[c]; !ok {
			return nil, fmt.Errorf("cgroup v1 controller %s is required", c)
		}
	}
	return m, nil
}

func (m *v1Manager) Version() int { return 1 }

func (m *v1Manager) controllers() []string {
	cs := make([]string, 0, len(m.mounts))
	for c := range m.mounts {
		cs = append(cs, c)
	}
	sort.Strings(cs)
	return cs
}

func (m *v1Manager) group(id string) *v1Group {
	g := &v1Group{id: id, mounts: m.mounts, dirs: map[string]string{}}
	for c, dir := range m.mounts {
		g.dirs[c] = filepath.Join(dir, m.root, id)
	}
	g.order = m.controllers()
	return g
}

func (m *v1Manager) Create(id string) (Group, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	g := m.group(id)
	for _, c := range g.order {
		if err := os.Mkdir(g.dirs[c], 0o755); err != nil {
			g.Remove()
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
	}
	return g, nil
}

func (m *v1Manager) Load(id string) (Group, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	g := m.group(id)
	found := false
	for _, d := range g.dirs {
		if _, err := os.Stat(d); err == nil {
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("cgroup %s: %w", id, os.ErrNotExist)
	}
	return g, nil
}

type v1Group struct {
	id     string
	mounts map[string]string
	dirs   map[string]string
	order  []string
}

func (g *v1Group) Path() string { return g.dirs["memory"] }

func (g *v1Group) Set(l Limits) error {
	quota := "-1"
	if l.CPUs > 0 {
		quota = strconv.FormatInt(int64(l.CPUs*cpuPeriod), 10)
	}
	if err := writeFile(g.dirs["cpu"], "cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err != nil {
		return err
	}
	if err := writeFile(g.dirs["cpu"], "cpu.cfs_quota_us", quota); err != nil {
		return err
	}
	mem := "-1"
	if l.MemoryBytes > 0 {
		mem = strconv.FormatInt(l.MemoryBytes, 10)
	}
	if err := writeFile(g.dirs["memory"], "memory.limit_in_bytes", mem); err != nil {
		return err
	}
	// No swap beyond the limit, where the kernel accounts swap.
	if _, err := os.Stat(filepath.Join(g.dirs["memory"], "memory.memsw.limit_in_bytes")); err == nil {
		if err := writeFile(g.dirs["memory"], "memory.memsw.limit_in_bytes", mem); err != nil {
			return err
		}
	}
	pids := "max"
	if l.Pids > 0 {
		pids = strconv.FormatInt(l.Pids, 10)
	}
	return writeFile(g.dirs["pids"], "pids.max", pids)
}

// Start forks cmd from an OS thread that first moved itself into the group,
// so the child is born inside it (and CLONE_NEWCGROUP roots the child's
// cgroup namespace at the group). The thread moves back to where it was
// right after the fork: the daemon must never be a member of a sandbox's
// group, or killing the group would kill the daemon.
func (g *v1Group) Start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tid := unix.Gettid()
		home, err := threadGroups(tid)
		if err != nil {
			errc <- err
			return
		}
		back := func() error {
			for _, c := range g.order {
				if err := writeFile(filepath.Join(g.mounts[c], home[c]), "tasks", strconv.Itoa(tid)); err != nil {
					return err
				}
			}
			return nil
		}
		for _, c := range g.order {
			if err := writeFile(g.dirs[c], "tasks", strconv.Itoa(tid)); err != nil {
				back()
				errc <- err
				return
			}
		}
		startErr := cmd.Start()
		if err := back(); err != nil {
			// Leave the thread locked: the runtime then retires it instead
			// of running other goroutines in the sandbox's group.
			errc <- errors.Join(startErr, fmt.Errorf("move thread out of the sandbox cgroup: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- startErr
	}()
	return <-errc
}

// threadGroups reads a thread's cgroup path per v1 controller.
func threadGroups(tid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/cgroup", tid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

func (g *v1Group) Procs() ([]int, error) { return readProcs(g.dirs["pids"]) }

func (g *v1Group) Kill() error {
	// Freeze-free kill: the pids controller sees every task of the group.
	return killLoop(g.dirs["pids"])
}

func (g *v1Group) Stats() (Stats, error) {
	var s Stats
	var err error
	if d, ok := g.dirs["cpuacct"]; ok {
		var v int64
		if v, err = readInt(d, "cpuacct.usage"); err != nil {
			return s, err
		}
		s.CPUUsageNs = uint64(v)
	}
	if s.MemoryCurrent, err = readInt(g.dirs["memory"], "memory.usage_in_bytes"); err != nil {
		return s, err
	}
	if s.MemoryPeak, err = readInt(g.dirs["memory"], "memory.max_usage_in_bytes"); err != nil {
		return s, err
	}
	if s.Pids, err = readInt(g.dirs["pids"], "pids.current"); err != nil {
		return s, err
	}
	if s.OOMKills, err = keyed(g.dirs["memory"], "memory.oom_control", "oom_kill"); err != nil {
		return s, err
	}
	return s, nil
}

func (g *v1Group) OOMKills() (int64, error) {
	return keyed(g.dirs["memory"], "memory.oom_control", "oom_kill")
}

func (g *v1Group) Remove() error {
	var errs []error
	for _, c := range g.order {
		errs = append(errs, rmdir(g.dirs[c]))
	}
	return errors.Join(errs...)
}
