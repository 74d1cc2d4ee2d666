// Package cgroup gives each sandbox a Linux control group, on cgroup v1 or v2 behind one interface.
package cgroup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/spawn"
)

// Limits are a group's ceilings; zero means unlimited.
type Limits struct {
	CPUs        float64
	MemoryBytes int64
	Pids        int64
}

// LimitHits are a group's counts of limits met: forks refused at the pids
// limit (pids.events "max") and CPU periods throttled (cpu.stat
// "nr_throttled"). A controller not in use counts 0.
type LimitHits struct {
	Pids         int64
	CPUThrottled int64
}

// Stats is a group's usage.
type Stats struct {
	CPUUsageNs    uint64
	MemoryCurrent int64
	MemoryPeak    int64
	Pids          int64
	OOMKills      int64
}

// Manager creates and finds the groups under berth's root group.
type Manager interface {
	// Version is 1 or 2.
	Version() int
	// Create makes the group <root>/<id> (in every used v1 controller);
	// on error it leaves nothing behind.
	Create(id string) (Group, error)
	// Load returns an existing group, or an error wrapping os.ErrNotExist.
	Load(id string) (Group, error)
	// CanFreeze is "" when the groups can be frozen, else the reason they
	// cannot (for a report of the host's capabilities).
	CanFreeze() string
}

// Group is one sandbox's control group.
type Group interface {
	// Path is the group's directory (v1: the one in the memory hierarchy).
	Path() string
	// Set applies limits; memory limits include swap.
	Set(Limits) error
	// Start starts cmd (not yet started) so that the new process is born
	// inside the group, never briefly outside it. With CLONE_NEWCGROUP in
	// cmd's Cloneflags the child's cgroup namespace is rooted at the group.
	// onThread, unless nil, runs on the OS thread that forks, just before
	// the fork: it may change that thread's credentials, which the child
	// (and a user namespace it creates) is born with; the thread ends after
	// the fork, so no other goroutine ever runs with them. Start fails on a
	// group that Frozen reports frozen, and must not run at the same time as
	// Freeze of the group.
	Start(cmd *exec.Cmd, onThread func() error) error
	// Entry opens the group for a child to be born in it, by this process
	// or another (a spawner): spawn.StartIn with it is Start. It fails on a
	// group that Frozen reports frozen. The caller closes it.
	Entry() (spawn.Cgroup, error)
	// Procs lists the pids in the group.
	Procs() ([]int, error)
	// Kill sends SIGKILL to every process in the group, frozen or not, and
	// waits (up to 2 s) until none is left. It leaves the group thawed.
	Kill() error
	// Freeze stops every process in the group and returns once the kernel
	// reports the group frozen. If ctx ends first, it thaws the group again
	// and returns an error wrapping ctx's: it never leaves the group half
	// frozen. A group that cannot be frozen (Manager.CanFreeze says why)
	// fails with an error wrapping errors.ErrUnsupported. Freezing a frozen
	// group does nothing.
	Freeze(ctx context.Context) error
	// Thaw resumes the group's processes and returns once the kernel reports
	// the group thawed (waiting up to 1 s). Thawing a group that is not
	// frozen, or cannot be, does nothing.
	Thaw() error
	// Frozen tells whether the group is frozen or being frozen: it is also
	// true after a Freeze that did not finish because its daemon died, whose
	// processes may be partly stopped; Thaw resumes them.
	Frozen() (bool, error)
	// Stats reads the group's usage.
	Stats() (Stats, error)
	// OOMKills is the group's count of OOM kills (one file read).
	OOMKills() (int64, error)
	// LimitHits counts the times the group met its pids and CPU limits.
	LimitHits() (LimitHits, error)
	// Remove deletes the group (and any subgroups); absent is not an error.
	Remove() error
}

const (
	cgroupRoot = "/sys/fs/cgroup"
	cpuPeriod  = 100000 // µs
	minQuota   = 1000   // µs, the kernel's smallest CFS quota
	rmdirWait  = time.Second
	killWait   = 2 * time.Second
	thawWait   = time.Second
	// Freeze and Thaw check the kernel's report at once, again after
	// pollFirst (about an idle group's time to freeze), then with the pause
	// doubling each time up to pollMax.
	pollFirst = 50 * time.Microsecond
	pollMax   = 10 * time.Millisecond
)

// isV1Controller tells whether c is one of the v1 controllers berth uses:
// cpu, memory and pids, and the optional cpuacct and freezer.
func isV1Controller(c string) bool {
	switch c {
	case "cpu", "cpuacct", "freezer", "memory", "pids":
		return true
	}
	return false
}

// isOptionalV1 tells whether berth does without v1 controller c: without
// cpuacct Stats.CPUUsageNs stays 0, without freezer groups cannot be frozen.
func isOptionalV1(c string) bool { return c == "cpuacct" || c == "freezer" }

// New detects the host's layout. It is v2 when /sys/fs/cgroup is a cgroup2
// filesystem: the groups then live in /sys/fs/cgroup/<root> (a child of the
// hierarchy root, not of the daemon's own cgroup, so that the daemon never
// sits above its sandboxes), and New fails unless cpu, memory and pids can
// be enabled there. Otherwise it is v1, with the cpu, cpuacct, freezer,
// memory and pids hierarchies found in /proc/self/mountinfo.
func New(root string) (Manager, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", cgroupRoot, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		m, err := newV2(cgroupRoot, root)
		if err != nil {
			return nil, err
		}
		if missing := m.missing(); len(missing) > 0 {
			return nil, fmt.Errorf("cgroup v2 controllers %s are not available in %s", strings.Join(missing, ", "), cgroupRoot)
		}
		return m, nil
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("find cgroup v1 mounts: %w", err)
	}
	defer f.Close()
	mounts, err := v1Mounts(f)
	if err != nil {
		return nil, fmt.Errorf("find cgroup v1 mounts: %w", err)
	}
	return NewV1(mounts, root)
}

// v1Mounts reads a mountinfo file and returns where each of berth's v1
// controllers is mounted (the first mount of its hierarchy).
func v1Mounts(r io.Reader) (map[string]string, error) {
	mounts := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+4 || fields[sep+1] != "cgroup" {
			continue
		}
		dir := unescapeMount(fields[4])
		for _, c := range strings.Split(fields[sep+3], ",") {
			if _, seen := mounts[c]; isV1Controller(c) && !seen {
				mounts[c] = dir
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return mounts, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// validName checks a group or root name, which becomes one directory name.
func validName(id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") || len(id) > 255 {
		return fmt.Errorf("invalid cgroup name %q", id)
	}
	return nil
}

// validLimits rejects negative or non-finite limits.
func validLimits(l Limits) error {
	if l.CPUs < 0 || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) || l.MemoryBytes < 0 || l.Pids < 0 {
		return fmt.Errorf("invalid cgroup limits %+v", l)
	}
	return nil
}

// cpuQuota is the CFS quota in µs per cpuPeriod for cpus, or -1 for none.
func cpuQuota(cpus float64) int64 {
	if cpus == 0 {
		return -1
	}
	q := int64(math.Round(cpus * cpuPeriod))
	return max(q, minQuota)
}

// writeFile writes val to an existing control file (never creating one).
func writeFile(dir, name, val string) error {
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err // names the file
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("set %q: %w", val, err) // err names the file
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readInt reads a file holding one number ("max" reads as -1).
func readInt(dir, name string) (int64, error) {
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err // names the file
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", p, err)
	}
	return n, nil
}

// readKeyed reads the value of key in a file of "key value" lines; a key
// that is absent reads as 0.
func readKeyed(dir, name, key string) (int64, error) {
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err // names the file
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s in %s: %w", key, p, err)
			}
			return n, nil
		}
	}
	return 0, nil
}

// readProcs lists the pids in a group directory's cgroup.procs.
func readProcs(dir string) ([]int, error) {
	p := filepath.Join(dir, "cgroup.procs")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err // names the file
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", p, err)
		}
		pids = append(pids, n)
	}
	return pids, nil
}

// killAll sends SIGKILL once to each process in dir and returns how many
// it signalled. An absent group has nothing to kill.
func killAll(dir string) (int, error) {
	pids, err := readProcs(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	self := os.Getpid()
	n := 0
	for _, p := range pids {
		// Never ourselves: on v1 a forking thread of ours sits in the
		// group for the few microseconds of Start.
		if p != self {
			n++
			if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return n, fmt.Errorf("kill %d in %s: %w", p, dir, err)
			}
		}
	}
	return n, nil
}

// killLoop SIGKILLs the processes in dir until none is left, for up to
// killWait (a fork bomb may add processes while we kill).
func killLoop(dir string) error {
	deadline := time.Now().Add(killWait)
	for {
		n, err := killAll(dir)
		if err != nil || n == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill %s: %d processes still there after %v", dir, n, killWait)
		}
		time.Sleep(time.Millisecond)
	}
}

// await calls done until it reports true, pausing between calls for
// pollFirst, then twice as long each time up to pollMax, until ctx ends.
func await(ctx context.Context, done func() (bool, error)) error {
	for d := pollFirst; ; d = min(2*d, pollMax) {
		if ok, err := done(); ok || err != nil {
			return err
		}
		if err := pause(ctx, d); err != nil {
			return err
		}
	}
}

// pause waits for d or until ctx ends, and returns ctx's error if it has.
// On Linux a runtime timer shorter than 1 ms takes about 1 ms when the
// runtime is idle (its poller sleeps in whole milliseconds), so a shorter
// pause is a nanosleep, which holds this goroutine's thread that long.
func pause(ctx context.Context, d time.Duration) error {
	if d < time.Millisecond {
		ts := unix.NsecToTimespec(d.Nanoseconds())
		_ = unix.Nanosleep(&ts, nil) // EINTR ends it early: the caller just polls sooner
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// checkThawed is Start's check that g is not frozen.
// startIn is every Group's Start: spawn.StartIn with its Entry.
func startIn(g Group, cmd *exec.Cmd, onThread func() error) error {
	e, err := g.Entry()
	if err != nil {
		return err
	}
	defer e.Close()
	return spawn.StartIn(cmd, e, onThread)
}

func checkThawed(g Group) error {
	frozen, err := g.Frozen()
	if err != nil {
		return fmt.Errorf("start in cgroup: %w", err)
	}
	if frozen {
		return fmt.Errorf("start in cgroup %s: the group is frozen", g.Path())
	}
	return nil
}

// readWord reads a file holding one word, such as freezer.state.
func readWord(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", err // names the file
	}
	return strings.TrimSpace(string(b)), nil
}

// removeTree removes a group directory and its subgroups, deepest first,
// retrying EBUSY for up to rmdirWait while exiting tasks linger. An absent
// directory is not an error.
func removeTree(dir string) error {
	// A sandbox's group mostly has no child groups: one rmdir, without
	// listing the directory first.
	if err := unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(rmdirWait)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
