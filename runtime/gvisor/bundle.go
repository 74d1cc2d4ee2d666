package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/berthsh/berth/runtime"
)

// The OCI runtime spec's config.json, as far as berth writes it: a
// standard document that any OCI runtime reads, kept to the fields used
// here rather than importing the whole spec's types.
type ociSpec struct {
	Version  string     `json:"ociVersion"`
	Process  ociProcess `json:"process"`
	Root     ociRoot    `json:"root"`
	Hostname string     `json:"hostname"`
	Mounts   []ociMount `json:"mounts"`
	Linux    ociLinux   `json:"linux"`
}

type ociProcess struct {
	User         ociUser         `json:"user"`
	Args         []string        `json:"args"`
	Env          []string        `json:"env"`
	Cwd          string          `json:"cwd"`
	Capabilities ociCapabilities `json:"capabilities"`
	Rlimits      []ociRlimit     `json:"rlimits,omitempty"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNamespace `json:"namespaces"`
	UIDMappings []ociIDMapping `json:"uidMappings"`
	GIDMappings []ociIDMapping `json:"gidMappings"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

type ociIDMapping struct {
	ContainerID uint32 `json:"containerID"`
	HostID      uint32 `json:"hostID"`
	Size        uint32 `json:"size"`
}

// allCapabilities is every capability the guest starts with: it needs
// CAP_SYS_ADMIN to hide its own directory, then drops to berth's set
// (capability.Default) for good, as on every runtime.
var allCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
	"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
	"CAP_SETFCAP",
}

// Inside the sandbox, berth's own directory: the control socket and the
// bootstrap in ctlDir (the sandbox's ctl directory on the host, writable so
// that the guest can bind its socket there), the guest binary in binDir
// (the runtime's bin directory, read-only). The guest covers ctlDir once
// it listens (guestapi.Bootstrap.Hide).
const (
	ctlDir        = "/.berth"
	binDir        = ctlDir + "/bin"
	bootstrapFile = "bootstrap.json"
)

// bundleSpec is the OCI config of sandbox spec: the guest as init on the
// root file system at rootfs, the host's directories ctl and bin at ctlDir
// and binDir, tmp (unless nil) and the spec's mounts, as the sandbox's ids
// map; in network namespace netns ("": a new, empty one).
func bundleSpec(spec runtime.Spec, rootfs string, tmp *runtime.Mount, ctl, bin, netns, guest string, env []string) ociSpec {
	caps := ociCapabilities{Bounding: allCapabilities, Effective: allCapabilities, Permitted: allCapabilities}
	p := ociProcess{
		Args:         []string{binDir + "/" + guest, "guest", "--bootstrap", ctlDir + "/" + bootstrapFile},
		Env:          env,
		Cwd:          "/",
		Capabilities: caps,
	}
	if n := spec.Limits.OpenFiles; n > 0 {
		p.Rlimits = append(p.Rlimits, ociRlimit{Type: "RLIMIT_NOFILE", Hard: uint64(n), Soft: uint64(n)})
	}
	// gVisor's kernel counts tasks per user against RLIMIT_NPROC, for root
	// too once the guest has dropped its capabilities: the pids limit,
	// inside, where a fork refused is EAGAIN and not the host refusing
	// gVisor a thread (which would end the whole sandbox).
	if n := spec.Limits.Pids; n > 0 {
		p.Rlimits = append(p.Rlimits, ociRlimit{Type: "RLIMIT_NPROC", Hard: uint64(n), Soft: uint64(n)})
	}
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: ctlDir, Type: "bind", Source: ctl, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		{Destination: binDir, Type: "bind", Source: bin, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
	}
	binds := spec.Mounts
	if tmp != nil {
		binds = append([]runtime.Mount{*tmp}, binds...)
	}
	for _, m := range binds {
		o := []string{"rbind", "rw", "nosuid", "nodev"}
		if m.ReadOnly {
			o[1] = "ro"
		}
		mounts = append(mounts, ociMount{Destination: m.Target, Type: "bind", Source: m.Source, Options: o})
	}
	ids := []ociIDMapping{{ContainerID: 0, HostID: spec.Users.HostID, Size: spec.Users.Size}}
	var ns []ociNamespace
	for _, t := range []string{"pid", "network", "ipc", "uts", "mount", "user"} {
		n := ociNamespace{Type: t}
		if t == "network" {
			n.Path = netns
		}
		ns = append(ns, n)
	}
	return ociSpec{
		Version:  "1.0.2",
		Process:  p,
		Root:     ociRoot{Path: rootfs},
		Hostname: spec.Hostname,
		Mounts:   mounts,
		Linux:    ociLinux{Namespaces: ns, UIDMappings: ids, GIDMappings: ids},
	}
}

// writeJSON writes v to path (mode 0600) through a temporary file.
func writeJSON(path string, v any, uid, gid int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path))
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := os.Chown(tmp, uid, gid); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("chown %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}
