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
	"strings"

	"github.com/berthsh/berth/spawn"
)

// v2Manager keeps groups in <mount>/<root> of a cgroup2 hierarchy.
type v2Manager struct {
	dir string // <mount>/<root>
}

// needV2 are the controllers berth's v2 groups use.
func needV2() []string { return []string{"cpu", "memory", "pids"} }

// NewV2 returns a manager over the cgroup2 hierarchy mounted at mountDir.
// The groups live in <mountDir>/<root>, a child of the hierarchy's root
// group: NewV2 makes it and enables cpu, memory and pids in the
// cgroup.subtree_control of mountDir and of <root>, each one that mountDir
// has. A hybrid host's unified mount may have none: groups, Start, Procs,
// Kill, Remove and (Linux 5.2+) Freeze work there, and Set fails naming the
// missing controller.
func NewV2(mountDir, root string) (Manager, error) {
	return newV2(mountDir, root)
}

func newV2(mountDir, root string) (*v2Manager, error) {
	if err := validName(root); err != nil {
		return nil, err
	}
	dir := filepath.Join(mountDir, root)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("make cgroup root: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(mountDir, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("cgroup v2 controllers: %w", err)
	}
	have := strings.Fields(string(b))
	for _, c := range needV2() {
		if !slices.Contains(have, c) {
			continue
		}
		for _, d := range []string{mountDir, dir} {
			if err := writeFile(d, "cgroup.subtree_control", "+"+c); err != nil {
				return nil, fmt.Errorf("enable cgroup v2 controller %s: %w", c, err)
			}
		}
	}
	return &v2Manager{dir: dir}, nil
}

// missing lists the needed controllers not enabled for the groups.
func (m *v2Manager) missing() []string {
	b, _ := os.ReadFile(filepath.Join(m.dir, "cgroup.subtree_control"))
	on := strings.Fields(string(b))
	var out []string
	for _, c := range needV2() {
		if !slices.Contains(on, c) {
			out = append(out, c)
		}
	}
	return out
}

func (m *v2Manager) Version() int { return 2 }

// noV2Freezer is why a v2 group cannot be frozen.
const noV2Freezer = "the cgroup v2 freezer needs Linux 5.2 or later (no cgroup.freeze)"

func (m *v2Manager) CanFreeze() string {
	if exists(filepath.Join(m.dir, "cgroup.freeze")) {
		return ""
	}
	return noV2Freezer
}

func (m *v2Manager) Create(id string) (Group, error) {
	if err := validName(id); err != nil {
		return nil, err
	}
	g := &v2Group{dir: filepath.Join(m.dir, id)}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", id, err)
	}
	return g, nil
}

func (m *v2Manager) Load(id string) (Group, error) {
	if err := validName(id); err != nil {
		return nil, err
	}
	g := &v2Group{dir: filepath.Join(m.dir, id)}
	if _, err := os.Stat(g.dir); err != nil {
		return nil, fmt.Errorf("load cgroup %s: %w", id, err)
	}
	return g, nil
}

type v2Group struct{ dir string }

func (g *v2Group) Path() string { return g.dir }

func (g *v2Group) Set(l Limits) error {
	if err := validLimits(l); err != nil {
		return err
	}
	cpu, mem, pids := "max", "max", "max"
	if q := cpuQuota(l.CPUs); q > 0 {
		cpu = strconv.FormatInt(q, 10)
	}
	if l.MemoryBytes > 0 {
		mem = strconv.FormatInt(l.MemoryBytes, 10)
	}
	if l.Pids > 0 {
		pids = strconv.FormatInt(l.Pids, 10)
	}
	for _, w := range []struct{ controller, file, val string }{
		{"cpu", "cpu.max", cpu + " " + strconv.Itoa(cpuPeriod)},
		{"memory", "memory.max", mem},
		{"memory", "memory.swap.max", "0"},
		{"pids", "pids.max", pids},
	} {
		if w.file == "memory.swap.max" && !exists(filepath.Join(g.dir, w.file)) {
			continue // a kernel without swap accounting
		}
		if err := writeFile(g.dir, w.file, w.val); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("cgroup v2 controller %s is not enabled for %s: %w", w.controller, g.dir, err)
			}
			return err
		}
	}
	return nil
}

// Entry opens the group's directory, for clone3's CLONE_INTO_CGROUP
// (spawn.StartIn sets cmd's UseCgroupFD and CgroupFD): the child is born in
// the group, and with CLONE_NEWCGROUP its cgroup namespace is rooted there.
// The kernel would start the child frozen in a frozen group, but Entry
// refuses one, as on v1.
func (g *v2Group) Entry() (spawn.Cgroup, error) {
	if err := checkThawed(g); err != nil {
		return spawn.Cgroup{}, err
	}
	f, err := os.Open(g.dir)
	if err != nil {
		return spawn.Cgroup{}, fmt.Errorf("open cgroup: %w", err)
	}
	return spawn.Cgroup{Dir: f}, nil
}

func (g *v2Group) Start(cmd *exec.Cmd, onThread func() error) error { return startIn(g, cmd, onThread) }

func (g *v2Group) Procs() ([]int, error) { return readProcs(g.dir) }

// Kill writes cgroup.kill (Linux 5.14+) and then kills and waits for what
// is left, process by process. SIGKILL ends a frozen process as it does any
// other; once the group is empty Kill thaws it, if frozen.
func (g *v2Group) Kill() error {
	err := writeFile(g.dir, "cgroup.kill", "1")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := killLoop(g.dir); err != nil {
		return err
	}
	frozen, err := g.Frozen()
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || !frozen {
		return err
	}
	return g.Thaw()
}

// Freeze writes 1 to cgroup.freeze and waits until cgroup.events reads
// "frozen 1".
func (g *v2Group) Freeze(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("freeze cgroup %s: %w", g.dir, err)
	}
	if err := writeFile(g.dir, "cgroup.freeze", "1"); err != nil {
		if errors.Is(err, os.ErrNotExist) && exists(g.dir) {
			return fmt.Errorf("freeze cgroup %s: %s: %w", g.dir, noV2Freezer, errors.ErrUnsupported)
		}
		return fmt.Errorf("freeze cgroup: %w", err)
	}
	err := await(ctx, g.eventsFrozen(1))
	if err == nil {
		return nil
	}
	err = fmt.Errorf("freeze cgroup %s: not frozen yet: %w", g.dir, err)
	if terr := g.Thaw(); terr != nil {
		err = errors.Join(err, terr)
	}
	return err
}

// Thaw writes 0 to cgroup.freeze and waits until cgroup.events reads
// "frozen 0" (1 stays while an ancestor group is frozen).
func (g *v2Group) Thaw() error {
	err := writeFile(g.dir, "cgroup.freeze", "0")
	if errors.Is(err, os.ErrNotExist) && exists(g.dir) {
		return nil // a kernel without the freezer
	}
	if err != nil {
		return fmt.Errorf("thaw cgroup: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), thawWait)
	defer cancel()
	if err := await(ctx, g.eventsFrozen(0)); err != nil {
		return fmt.Errorf("thaw cgroup %s: still frozen: %w", g.dir, err)
	}
	return nil
}

// eventsFrozen returns a check for await that cgroup.events reads
// "frozen <want>".
func (g *v2Group) eventsFrozen(want int64) func() (bool, error) {
	return func() (bool, error) {
		n, err := readKeyed(g.dir, "cgroup.events", "frozen")
		return n == want, err
	}
}

// Frozen tells whether cgroup.freeze reads 1: the group is frozen, or is
// being frozen (cgroup.events tells which). A kernel without the freezer
// has no cgroup.freeze, and its groups are never frozen.
func (g *v2Group) Frozen() (bool, error) {
	n, err := readInt(g.dir, "cgroup.freeze")
	if errors.Is(err, os.ErrNotExist) && exists(g.dir) {
		return false, nil
	}
	return n == 1, err
}

func (g *v2Group) Stats() (Stats, error) {
	var s Stats
	usec, err := readKeyed(g.dir, "cpu.stat", "usage_usec")
	if err != nil {
		return Stats{}, err
	}
	s.CPUUsageNs = uint64(usec) * 1000
	if s.MemoryCurrent, err = optional(readInt(g.dir, "memory.current")); err != nil {
		return Stats{}, err
	}
	if s.MemoryPeak, err = optional(readInt(g.dir, "memory.peak")); err != nil { // Linux 5.19+
		return Stats{}, err
	}
	if s.Pids, err = optional(readInt(g.dir, "pids.current")); err != nil {
		return Stats{}, err
	}
	if s.OOMKills, err = optional(g.OOMKills()); err != nil {
		return Stats{}, err
	}
	return s, nil
}

func (g *v2Group) LimitHits() (LimitHits, error) {
	var h LimitHits
	var err error
	if h.Pids, err = optional(readKeyed(g.dir, "pids.events", "max")); err != nil {
		return h, err
	}
	if h.CPUThrottled, err = optional(readKeyed(g.dir, "cpu.stat", "nr_throttled")); err != nil {
		return h, err
	}
	return h, nil
}

func (g *v2Group) OOMKills() (int64, error) {
	return readKeyed(g.dir, "memory.events", "oom_kill")
}

func (g *v2Group) Remove() error { return removeTree(g.dir) }

// optional reads a file that a controller not enabled leaves out as 0.
func optional(n int64, err error) (int64, error) {
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	return n, err
}
