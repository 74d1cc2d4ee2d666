// Package cgroup gives each sandbox a control group, on cgroup v1 or v2
// behind one interface, with limits, usage, and a way to start a process
// that is born inside its group.
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Limits are a group's ceilings; zero means unlimited.
type Limits struct {
	CPUs        float64
	MemoryBytes int64
	Pids        int64
}

// Stats is a group's usage.
type Stats struct {
	CPUUsageNs    uint64
	MemoryCurrent int64
	MemoryPeak    int64
	Pids          int64
	OOMKills      int64
}

// Manager creates groups under berth's root group.
type Manager interface {
	// Version is 1 or 2.
	Version() int
	// Create makes the group for id; on error nothing is left behind.
	Create(id string) (Group, error)
	// Load returns an existing group; an error wrapping os.ErrNotExist if absent.
	Load(id string) (Group, error)
}

// Group is one sandbox's control group.
type Group interface {
	Path() string
	Set(Limits) error
	// Start starts cmd so that the new process is born inside the group.
	Start(cmd *exec.Cmd) error
	Procs() ([]int, error)
	// Kill sends SIGKILL to every process in the group.
	Kill() error
	Stats() (Stats, error)
	// OOMKills is the group's count of OOM kills (one file read).
	OOMKills() (int64, error)
	// Remove deletes the group; absent is not an error.
	Remove() error
}

const cpuPeriod = 100000

// New detects the host's layout: v2 when /sys/fs/cgroup is a cgroup2 mount,
// otherwise the v1 controllers cpu, cpuacct, memory and pids.
func New(root string) (Manager, error) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return nil, fmt.Errorf("statfs /sys/fs/cgroup: %w", err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return NewV2("/sys/fs/cgroup", root)
	}
	mounts := map[string]string{}
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids"} {
		mounts[c] = filepath.Join("/sys/fs/cgroup", c)
	}
	return NewV1(mounts, root)
}

func validID(id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") || len(id) > 128 {
		return fmt.Errorf("invalid cgroup name %q", id)
	}
	return nil
}

func writeFile(dir, name, val string) error {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(val), 0); err != nil {
		return fmt.Errorf("write %s=%q: %w", filepath.Join(dir, name), val, err)
	}
	return nil
}

func readInt(dir, name string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// keyed reads "key value" lines and returns the value of key.
func keyed(dir, name, key string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == key {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, nil
}

func readProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

// killLoop SIGKILLs the processes in dir until none is left or 2 s pass
// (a fork bomb may add processes while we kill).
func killLoop(dir string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		pids, err := readProcs(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		self := os.Getpid()
		for _, p := range pids {
			if p != self { // never, even if a bug put one of our threads there
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes keep appearing in %s", dir)
		}
		time.Sleep(time.Millisecond)
	}
}

// rmdir removes a group directory, retrying while exiting tasks linger.
func rmdir(dir string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("rmdir %s: %w", dir, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
