package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

type v2Manager struct {
	dir string // <mount>/<root>
}

// NewV2 returns a manager over the unified hierarchy mounted at mountDir.
// berth's groups live in <mountDir>/<root>, a group of the hierarchy root
// whose subtree_control enables cpu, memory and pids (where the mount has
// them: a hybrid host's unified mount may have none, and then limits fail
// with a clear error).
func NewV2(mountDir, root string) (Manager, error) {
	if err := validID(root); err != nil {
		return nil, err
	}
	dir := filepath.Join(mountDir, root)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("make %s: %w", dir, err)
	}
	avail, _ := os.ReadFile(filepath.Join(mountDir, "cgroup.controllers"))
	var enable []string
	for _, c := range []string{"cpu", "memory", "pids"} {
		if strings.Contains(" "+strings.TrimSpace(string(avail))+" ", " "+c+" ") {
			enable = append(enable, "+"+c)
		}
	}
	for _, d := range []string{mountDir, dir} {
		if len(enable) == 0 {
			break
		}
		if err := writeFile(d, "cgroup.subtree_control", strings.Join(enable, " ")); err != nil {
			return nil, err
		}
	}
	return &v2Manager{dir: dir}, nil
}

func (m *v2Manager) Version() int { return 2 }

func (m *v2Manager) Create(id string) (Group, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	g := &v2Group{dir: filepath.Join(m.dir, id)}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	return g, nil
}

func (m *v2Manager) Load(id string) (Group, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	g := &v2Group{dir: filepath.Join(m.dir, id)}
	if _, err := os.Stat(g.dir); err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", id, os.ErrNotExist)
	}
	return g, nil
}

type v2Group struct{ dir string }

func (g *v2Group) Path() string { return g.dir }

func (g *v2Group) Set(l Limits) error {
	cpu := "max " + strconv.Itoa(cpuPeriod)
	if l.CPUs > 0 {
		cpu = strconv.FormatInt(int64(l.CPUs*cpuPeriod), 10) + " " + strconv.Itoa(cpuPeriod)
	}
	mem, pids := "max", "max"
	if l.MemoryBytes > 0 {
		mem = strconv.FormatInt(l.MemoryBytes, 10)
	}
	if l.Pids > 0 {
		pids = strconv.FormatInt(l.Pids, 10)
	}
	for _, kv := range [][2]string{{"cpu.max", cpu}, {"memory.max", mem}, {"memory.swap.max", "0"}, {"pids.max", pids}} {
		if kv[0] == "memory.swap.max" {
			if _, err := os.Stat(filepath.Join(g.dir, kv[0])); err != nil {
				continue // no swap accounting on this kernel
			}
		}
		if err := writeFile(g.dir, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

// Start uses clone3's CLONE_INTO_CGROUP, so the child is born in the group.
func (g *v2Group) Start(cmd *exec.Cmd) error {
	f, err := os.Open(g.dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(f.Fd())
	return cmd.Start()
}

func (g *v2Group) Procs() ([]int, error) { return readProcs(g.dir) }

func (g *v2Group) Kill() error {
	if _, err := os.Stat(filepath.Join(g.dir, "cgroup.kill")); err == nil {
		if err := writeFile(g.dir, "cgroup.kill", "1"); err != nil {
			return err
		}
	}
	return killLoop(g.dir)
}

func (g *v2Group) Stats() (Stats, error) {
	var s Stats
	usec, err := keyed(g.dir, "cpu.stat", "usage_usec")
	if err != nil {
		return s, err
	}
	s.CPUUsageNs = uint64(usec) * 1000
	s.MemoryCurrent, _ = readInt(g.dir, "memory.current")
	s.MemoryPeak, _ = readInt(g.dir, "memory.peak")
	s.Pids, _ = readInt(g.dir, "pids.current")
	s.OOMKills, _ = keyed(g.dir, "memory.events", "oom_kill")
	return s, nil
}

func (g *v2Group) OOMKills() (int64, error) { return keyed(g.dir, "memory.events", "oom_kill") }

func (g *v2Group) Remove() error { return rmdir(g.dir) }
