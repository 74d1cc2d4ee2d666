package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/spawn"
)

// v1Manager keeps groups in the v1 hierarchies of cpu, cpuacct, freezer,
// memory and pids; controllers mounted together (cpu,cpuacct) share one
// directory.
type v1Manager struct {
	root   string
	mounts map[string]string // controller -> hierarchy mount dir, symlinks resolved
}

// NewV1 returns a manager over v1 hierarchies given as controller -> mount
// directory. memory, cpu and pids are required; cpuacct and freezer are
// optional and skipped when absent or not mounted (Stats.CPUUsageNs then
// stays 0; groups cannot be frozen). The groups live in <mount>/<root>/<id>
// in each hierarchy.
func NewV1(mounts map[string]string, root string) (Manager, error) {
	if err := validName(root); err != nil {
		return nil, err
	}
	m := &v1Manager{root: root, mounts: map[string]string{}}
	for c, dir := range mounts {
		if !isV1Controller(c) {
			return nil, fmt.Errorf("cgroup v1 controller %q is not supported", c)
		}
		real, err := v1Hierarchy(dir)
		if err != nil {
			if isOptionalV1(c) {
				continue
			}
			return nil, fmt.Errorf("cgroup v1 controller %s: %w", c, err)
		}
		m.mounts[c] = real
	}
	for _, c := range []string{"cpu", "memory", "pids"} {
		if _, ok := m.mounts[c]; !ok {
			return nil, fmt.Errorf("cgroup v1 controller %s is required but not mounted", c)
		}
	}
	for _, dir := range m.group("").all {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("make cgroup root: %w", err)
		}
	}
	return m, nil
}

// v1Hierarchy resolves a v1 mount directory and checks that it is one.
func v1Hierarchy(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("no mount directory: %w", os.ErrNotExist)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("mount %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(real, "tasks")); err != nil {
		return "", fmt.Errorf("%s is not a cgroup v1 hierarchy: %w", dir, err)
	}
	return real, nil
}

func (m *v1Manager) Version() int { return 1 }

// noV1Freezer is why a v1 group cannot be frozen.
const noV1Freezer = "the cgroup v1 freezer hierarchy is not mounted"

func (m *v1Manager) CanFreeze() string {
	if _, ok := m.mounts["freezer"]; ok {
		return ""
	}
	return noV1Freezer
}

// group returns the group id's directories (id "" gives berth's root group).
func (m *v1Manager) group(id string) *v1Group {
	g := &v1Group{dirs: map[string]string{}}
	for c, mount := range m.mounts {
		d := filepath.Join(mount, m.root, id)
		g.dirs[c] = d
		if !slices.Contains(g.all, d) {
			g.all = append(g.all, d)
		}
	}
	slices.Sort(g.all)
	return g
}

func (m *v1Manager) Create(id string) (Group, error) {
	if err := validName(id); err != nil {
		return nil, err
	}
	g := m.group(id)
	for i, d := range g.all {
		if err := os.Mkdir(d, 0o755); err != nil {
			err = fmt.Errorf("create cgroup %s: %w", id, err)
			for _, made := range slices.Backward(g.all[:i]) {
				if rerr := removeTree(made); rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return nil, err
		}
	}
	return g, nil
}

// Load returns the group when its directory exists in any hierarchy (a
// group left half-made by a crash can still be removed).
func (m *v1Manager) Load(id string) (Group, error) {
	if err := validName(id); err != nil {
		return nil, err
	}
	g := m.group(id)
	for _, d := range g.all {
		_, err := os.Stat(d)
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("load cgroup %s: %w", id, err)
		}
	}
	return nil, fmt.Errorf("load cgroup %s: %w", id, os.ErrNotExist)
}

type v1Group struct {
	dirs map[string]string // controller -> group dir
	all  []string          // the distinct group dirs, sorted
}

func (g *v1Group) Path() string { return g.dirs["memory"] }

func (g *v1Group) Set(l Limits) error {
	if err := validLimits(l); err != nil {
		return err
	}
	cpu := g.dirs["cpu"]
	if err := writeFile(cpu, "cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err != nil {
		return err
	}
	if err := writeFile(cpu, "cpu.cfs_quota_us", strconv.FormatInt(cpuQuota(l.CPUs), 10)); err != nil {
		return err
	}
	if err := g.setMemory(l.MemoryBytes); err != nil {
		return err
	}
	pids := "max"
	if l.Pids > 0 {
		pids = strconv.FormatInt(l.Pids, 10)
	}
	return writeFile(g.dirs["pids"], "pids.max", pids)
}

// setMemory sets the memory limit, and the memory+swap limit to the same
// value where the kernel accounts swap, so the group cannot swap.
func (g *v1Group) setMemory(limit int64) error {
	dir := g.dirs["memory"]
	val := "-1"
	if limit > 0 {
		val = strconv.FormatInt(limit, 10)
	}
	memsw := exists(filepath.Join(dir, "memory.memsw.limit_in_bytes"))
	err := writeFile(dir, "memory.limit_in_bytes", val)
	switch {
	case !memsw:
		return err
	case errors.Is(err, unix.EINVAL):
		// Raising the limit: it may not exceed memsw, so memsw goes first.
		if err := writeFile(dir, "memory.memsw.limit_in_bytes", val); err != nil {
			return err
		}
		return writeFile(dir, "memory.limit_in_bytes", val)
	case err != nil:
		return err
	}
	return writeFile(dir, "memory.memsw.limit_in_bytes", val)
}

// Entry opens the group's tasks file in every hierarchy: a thread that
// writes its id to each and then forks (spawn.StartIn) has its child born
// inside the group, and CLONE_NEWCGROUP roots the child's cgroup namespace
// there. While it forks, the thread counts in the group's pids.current and
// its kernel allocations are charged to the group's memory. A thread that
// joins a frozen freezer group freezes, so Entry refuses a frozen group.
func (g *v1Group) Entry() (spawn.Cgroup, error) {
	if err := checkThawed(g); err != nil {
		return spawn.Cgroup{}, err
	}
	var e spawn.Cgroup
	for _, d := range g.all {
		f, err := os.OpenFile(filepath.Join(d, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			e.Close()
			return spawn.Cgroup{}, fmt.Errorf("open cgroup: %w", err)
		}
		e.Tasks = append(e.Tasks, f)
	}
	return e, nil
}

func (g *v1Group) Start(cmd *exec.Cmd, onThread func() error) error { return startIn(g, cmd, onThread) }

func (g *v1Group) Procs() ([]int, error) { return readProcs(g.dirs["pids"]) }

// Kill kills the group's processes. A frozen task takes SIGKILL only once
// thawed, so in a frozen group Kill first signals every task (none can fork
// while frozen), then thaws the group, so that each dies without running
// again, then kills and waits for whatever is left.
func (g *v1Group) Kill() error {
	pids := g.dirs["pids"]
	frozen, err := g.Frozen()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if frozen {
		if _, err := killAll(pids); err != nil {
			return err
		}
		if err := g.Thaw(); err != nil {
			return err
		}
	}
	return killLoop(pids)
}

// Freeze writes FROZEN to freezer.state and waits until it reads FROZEN
// rather than FREEZING. It writes FROZEN again before each read: each write
// sets freezing every task in the group, which catches a task that an older
// kernel missed as it was forked during the freeze.
func (g *v1Group) Freeze(ctx context.Context) error {
	dir, ok := g.dirs["freezer"]
	if !ok {
		return fmt.Errorf("freeze cgroup %s: %s: %w", g.Path(), noV1Freezer, errors.ErrUnsupported)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("freeze cgroup %s: %w", dir, err)
	}
	state := ""
	err := await(ctx, func() (bool, error) {
		if err := writeFile(dir, "freezer.state", "FROZEN"); err != nil {
			return false, err
		}
		var err error
		if state, err = readWord(dir, "freezer.state"); err != nil {
			return false, err
		}
		switch state {
		case "FROZEN":
			return true, nil
		case "FREEZING":
			return false, nil
		}
		return false, fmt.Errorf("%s/freezer.state reads %q while freezing", dir, state)
	})
	if err == nil {
		return nil
	}
	if state != "" {
		err = fmt.Errorf("freeze cgroup %s: still %s: %w", dir, state, err)
	} else {
		err = fmt.Errorf("freeze cgroup %s: %w", dir, err)
	}
	if terr := g.Thaw(); terr != nil {
		err = errors.Join(err, terr)
	}
	return err
}

// Thaw writes THAWED to freezer.state and waits until it reads THAWED
// (FROZEN stays while an ancestor group is frozen).
func (g *v1Group) Thaw() error {
	dir, ok := g.dirs["freezer"]
	if !ok {
		return nil
	}
	if err := writeFile(dir, "freezer.state", "THAWED"); err != nil {
		return fmt.Errorf("thaw cgroup %s: %w", dir, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), thawWait)
	defer cancel()
	state := ""
	err := await(ctx, func() (bool, error) {
		var err error
		state, err = readWord(dir, "freezer.state")
		return state == "THAWED", err
	})
	if err != nil {
		return fmt.Errorf("thaw cgroup %s: still %s: %w", dir, state, err)
	}
	return nil
}

// Frozen tells whether freezer.state reads FROZEN or FREEZING; a group
// without a freezer is never frozen.
func (g *v1Group) Frozen() (bool, error) {
	dir, ok := g.dirs["freezer"]
	if !ok {
		return false, nil
	}
	state, err := readWord(dir, "freezer.state")
	if err != nil {
		return false, err
	}
	return state != "THAWED", nil
}

func (g *v1Group) Stats() (Stats, error) {
	var s Stats
	if dir, ok := g.dirs["cpuacct"]; ok {
		ns, err := readInt(dir, "cpuacct.usage")
		if err != nil {
			return Stats{}, err
		}
		s.CPUUsageNs = uint64(ns)
	}
	mem := g.dirs["memory"]
	var err error
	if s.MemoryCurrent, err = readInt(mem, "memory.usage_in_bytes"); err != nil {
		return Stats{}, err
	}
	if s.MemoryPeak, err = readInt(mem, "memory.max_usage_in_bytes"); err != nil {
		return Stats{}, err
	}
	if s.Pids, err = readInt(g.dirs["pids"], "pids.current"); err != nil {
		return Stats{}, err
	}
	if s.OOMKills, err = g.OOMKills(); err != nil {
		return Stats{}, err
	}
	return s, nil
}

func (g *v1Group) LimitHits() (LimitHits, error) {
	var h LimitHits
	var err error
	if h.Pids, err = optional(readKeyed(g.dirs["pids"], "pids.events", "max")); err != nil {
		return h, err
	}
	if dir, ok := g.dirs["cpu"]; ok {
		if h.CPUThrottled, err = optional(readKeyed(dir, "cpu.stat", "nr_throttled")); err != nil {
			return h, err
		}
	}
	return h, nil
}

func (g *v1Group) OOMKills() (int64, error) {
	return readKeyed(g.dirs["memory"], "memory.oom_control", "oom_kill")
}

func (g *v1Group) Remove() error {
	var errs []error
	for _, d := range g.all {
		errs = append(errs, removeTree(d))
	}
	return errors.Join(errs...)
}
