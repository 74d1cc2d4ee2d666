package main

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// The peers are what a user would pick instead of berth on the same
// machine: the OCI runtimes Docker and Kubernetes use (crun, runc, and
// gVisor's runsc when installed), bubblewrap (Flatpak's sandbox, used by
// coding agents on laptops) and podman (Docker's command line without a
// daemon). Each runs the same programs from the same minimal root file
// system; none is given anything berth is not.

var seq atomic.Int64

func nextID(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
}

// rootfsPrograms are the programs the peers' root file system holds.
var rootfsPrograms = []string{"/usr/bin/true", "/usr/bin/echo", "/usr/bin/sleep"}

// makeRootfs builds dir/rootfs: the programs and their libraries copied
// from the host, and the mount points an OCI runtime needs.
func makeRootfs(dir string) (string, error) {
	root := filepath.Join(dir, "rootfs")
	if err := os.RemoveAll(root); err != nil {
		return "", err
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp", "usr/bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		return "", err
	}
	for _, bin := range rootfsPrograms {
		files := []string{bin}
		out, err := exec.Command("ldd", bin).Output()
		if err != nil {
			return "", fmt.Errorf("ldd %s: %w", bin, err)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
		for _, f := range files {
			real, err := filepath.EvalSymlinks(f)
			if err != nil {
				return "", err
			}
			b, err := os.ReadFile(real)
			if err != nil {
				return "", err
			}
			dst := filepath.Join(root, f)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return "", err
			}
			if err := os.WriteFile(dst, b, 0o755); err != nil {
				return "", err
			}
		}
	}
	return root, nil
}

// ociSpec is a runtime spec like `runc spec` writes (namespaces pid,
// network, ipc, uts, mount and cgroup; the default capability set; masked
// and read-only /proc paths), running args in rootfs, read-only.
func ociSpec(rootfs string, args ...string) map[string]any {
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}
	ns := []map[string]string{}
	for _, t := range []string{"pid", "network", "ipc", "uts", "mount", "cgroup"} {
		ns = append(ns, map[string]string{"type": t})
	}
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]int{"uid": 0, "gid": 0},
			"args":     args,
			"env":      []string{"PATH=/usr/bin:/bin"},
			"cwd":      "/",
			"capabilities": map[string][]string{
				"bounding": caps, "effective": caps, "permitted": caps,
			},
			"rlimits":         []map[string]any{{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}},
			"noNewPrivileges": true,
		},
		"root":     map[string]any{"path": rootfs, "readonly": true},
		"hostname": "bench",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777"}},
		},
		"linux": map[string]any{
			"namespaces": ns,
			"maskedPaths": []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"},
			"readonlyPaths": []string{"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// writeBundle writes dir/name/config.json for args in rootfs.
func writeBundle(dir, name, rootfs string, args ...string) (string, error) {
	b := filepath.Join(dir, name)
	if err := os.RemoveAll(b); err != nil {
		return "", err
	}
	if err := os.MkdirAll(b, 0o755); err != nil {
		return "", err
	}
	raw, err := json.MarshalIndent(ociSpec(rootfs, args...), "", "  ")
	if err != nil {
		return "", err
	}
	return b, os.WriteFile(filepath.Join(b, "config.json"), raw, 0o644)
}

// ociRuntime is how the bench drives one OCI runtime's command line.
type ociRuntime struct {
	name    string   // program
	path    string   // the binary ("": name on PATH)
	global  []string // flags before the command
	detach  string   // run's flag to return once the container runs
	install string   // how to get it, for "not measured"
}

var ociRuntimes = []ociRuntime{
	{name: "crun", detach: "-d", install: "scripts/bench-deps.sh installs it with apt"},
	{name: "runc", detach: "-d", install: "scripts/bench-deps.sh installs it with apt"},
	// systrap is the platform that runs without KVM and in VMs; no network
	// stack, like the others' empty network namespace.
	{name: "runsc", global: []string{"--platform=systrap", "--network=none"}, detach: "--detach",
		install: "not installed; `CGO_ENABLED=0 go install gvisor.dev/gvisor/runsc@latest` builds it"},
}

// dynamicELF says whether the program at path asks for an ELF interpreter
// (it is dynamically linked).
func dynamicELF(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// ociSubject measures `R run` of a bundle and `R exec` into a detached one.
func ociSubject(rt ociRuntime, work, rootfs string) subject {
	s := subject{name: rt.name + " run", execName: rt.name + " exec"}
	bin := rt.path
	if bin == "" {
		bin = rt.name
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		s.why = rt.name + " " + rt.install
		return s
	}
	if rt.name == "runsc" && dynamicELF(path) {
		// Its sandbox and gofer re-execute themselves inside an empty root,
		// where a dynamic binary's interpreter does not exist.
		s.why = path + " is dynamically linked (a cgo build), which cannot start its sandbox; `CGO_ENABLED=0 go install gvisor.dev/gvisor/runsc@latest` builds a static one"
		return s
	}
	dir := filepath.Join(work, rt.name)
	echo, err := writeBundle(dir, "echo", rootfs, "/usr/bin/echo", "hi")
	if err == nil {
		_, err = writeBundle(dir, "sleep", rootfs, "/usr/bin/sleep", "3600")
	}
	if err != nil {
		s.why = err.Error()
		return s
	}
	cli := func(args ...string) []string { return append(append([]string{}, rt.global...), args...) }
	s.once = func(ctx context.Context) (func(), error) {
		return nil, wantHi(command(ctx, path, cli("run", "--bundle", echo, nextID("bench"))...))
	}
	s.boot = func(ctx context.Context) (*running, error) {
		id := nextID("bench-long")
		// Detached, with its output to /dev/null (command's pipes would stay
		// open for as long as the container runs).
		if err := detached(ctx, path, cli("run", rt.detach, "--bundle", filepath.Join(dir, "sleep"), id)...); err != nil {
			return nil, err
		}
		return &running{
			exec: func(ctx context.Context) error {
				_, err := command(ctx, path, cli("exec", id, "/usr/bin/true")...)
				return err
			},
			stop: func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				command(ctx, path, cli("delete", "--force", id)...)
			},
		}, nil
	}
	return s
}

// bwrapSubject measures bubblewrap with every namespace it can unshare and
// the host's /usr read-only, like berth's host image. bwrap has no exec
// into a running sandbox.
func bwrapSubject() subject {
	s := subject{name: "bwrap", noExec: "bwrap has no exec into a running sandbox"}
	path, err := exec.LookPath("bwrap")
	if err != nil {
		s.why = "bwrap is not installed (scripts/bench-deps.sh installs bubblewrap with apt)"
		return s
	}
	args := []string{"--unshare-all", "--die-with-parent", "--new-session",
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
		"/usr/bin/echo", "hi"}
	s.once = func(ctx context.Context) (func(), error) { return nil, wantHi(command(ctx, path, args...)) }
	return s
}

// podmanImage is the bench's image: the peers' root file system, imported
// (no registry is needed).
const podmanImage = "localhost/berth-bench:latest"

// podmanRunFlags are the flags of every podman run of the bench. This
// host's limits need explicit ulimits (podman's defaults exceed the hard
// limits); cgroupfs because there is no systemd to ask.
var podmanRunFlags = []string{"--network", "none", "--cgroup-manager", "cgroupfs",
	"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}

// podmanSubject measures `podman run --rm` and `podman exec`.
func podmanSubject(ctx context.Context, rootfs string) (subject, func()) {
	s := subject{name: "podman run --rm", execName: "podman exec"}
	path, err := exec.LookPath("podman")
	if err != nil {
		s.why = "podman is not installed (scripts/bench-deps.sh installs it with apt)"
		return s, func() {}
	}
	imp := exec.CommandContext(ctx, "sh", "-c", `tar -C "$1" -c . | "$2" import -q - "$3"`, "sh", rootfs, path, podmanImage)
	if out, err := imp.CombinedOutput(); err != nil {
		s.why = "podman import: " + firstLine(string(out))
		return s, func() {}
	}
	cleanup := func() { command(context.Background(), path, "rmi", "-f", podmanImage) }
	s.once = func(ctx context.Context) (func(), error) {
		return nil, wantHi(command(ctx, path, append(append([]string{"run", "--rm"}, podmanRunFlags...), podmanImage, "/usr/bin/echo", "hi")...))
	}
	s.boot = func(ctx context.Context) (*running, error) {
		id := nextID("bench-long")
		if err := detached(ctx, path, append(append([]string{"run", "-d", "--name", id}, podmanRunFlags...), podmanImage, "/usr/bin/sleep", "3600")...); err != nil {
			return nil, err
		}
		return &running{
			exec: func(ctx context.Context) error {
				_, err := command(ctx, path, "exec", id, "/usr/bin/true")
				return err
			},
			stop: func() { command(context.Background(), path, "rm", "-f", "-t", "0", id) },
		}, nil
	}
	return s, cleanup
}

// detached runs a command that leaves a container running, with its output
// in a file: a container that inherited a pipe would keep it open, and a
// reader waiting for the end of its output would wait for the container.
func detached(ctx context.Context, name string, args ...string) error {
	logf, err := os.CreateTemp("", "berth-bench-*.log")
	if err != nil {
		return err
	}
	defer os.Remove(logf.Name())
	defer logf.Close()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logf.Name())
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, firstLine(string(out)))
	}
	return nil
}

// floorName is the subject of no isolation at all: the machine's floor.
const floorName = "no isolation (fork+exec from Go)"

// bareSubject is the floor under every subject: fork and exec from Go, no
// isolation at all. It is no sandbox; it says what the machine's process
// creation costs in the same run.
func bareSubject() subject {
	return subject{
		name:     floorName,
		execName: floorName,
		once: func(ctx context.Context) (func(), error) {
			return nil, wantHi(command(ctx, "/usr/bin/echo", "hi"))
		},
		boot: func(context.Context) (*running, error) {
			return &running{
				exec: func(ctx context.Context) error {
					_, err := command(ctx, "/usr/bin/true")
					return err
				},
				stop: func() {},
			}, nil
		},
	}
}
