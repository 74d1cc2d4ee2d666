package native

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/local"
)

// This file gives each sandbox what its own range of host ids needs: a user
// namespace owned by the range, and its image layers mounted through the
// range (idmapped) instead of copied and chowned for it.

// idmapLayers opens each layer as a detached mount idmapped through the
// user namespace of process pid (a sandbox's init): a file owned by id N
// on disk shows as N inside the sandbox, and is host id HostID+N to the
// kernel. The mounts are read-only and without devices. The caller closes
// the descriptors.
func idmapLayers(pid int, layers []string) ([]int, error) {
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the sandbox's user namespace: %w", err)
	}
	defer unix.Close(userns)
	fds := make([]int, 0, len(layers))
	for _, l := range layers {
		fd, err := unix.OpenTree(unix.AT_FDCWD, l, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("open layer %s as a mount: %w", l, err)
		}
		fds = append(fds, fd)
		attr := unix.MountAttr{
			Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV,
			Userns_fd: uint64(userns),
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("idmap layer %s: %w", l, err)
		}
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// sendBootstrap sends b, with fds passed along, as the one message on sock
// (guestapi.BootPipe).
func sendBootstrap(sock *os.File, b guestapi.Bootstrap, fds []int) error {
	msg, err := json.Marshal(b)
	if err != nil {
		return err
	}
	var rights []byte
	if len(fds) > 0 {
		rights = unix.UnixRights(fds...)
	}
	return unix.Sendmsg(int(sock.Fd()), msg, rights, nil, 0)
}

// bootSocket is a socket pair for guestapi.BootPipe: the daemon's end and
// the guest's.
func bootSocket() (daemon, guest *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("bootstrap socket: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "bootstrap"), os.NewFile(uintptr(fds[1]), "bootstrap"), nil
}

// ProbeIDMappedLayers says why this host cannot build a sandbox's root from
// idmapped layers, or "" when it can. It idmaps a layer holding one
// root-owned file through the user namespace of `guest --probe-layers`,
// which mounts a root on it as a boot would and writes the file (a copy-up):
// what fails depends on the kernel (idmapped mounts came in Linux 5.12, an
// overlay on them in 5.19) and on the state dir's file system.
func ProbeIDMappedLayers(guestBin, dir string) string {
	why, err := probeLayers(guestBin, dir)
	if err != nil {
		return "the probe of idmapped layers failed: " + err.Error()
	}
	return why
}

func probeLayers(guestBin, dir string) (string, error) {
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	// The probe's root is the host id of range 0's root: no host user's.
	owner := int(runtime.DefaultIDMap.HostID)
	layer, upper, work := filepath.Join(dir, "layer"), filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	if err := os.Mkdir(dir, 0o711); err != nil {
		return "", err
	}
	if err := os.Mkdir(layer, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(layer, guestapi.ProbeFile), nil, 0o644); err != nil {
		return "", err
	}
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return "", err
		}
		if err := os.Chown(d, owner, owner); err != nil {
			return "", err
		}
	}
	daemonEnd, guestEnd, err := bootSocket()
	if err != nil {
		return "", err
	}
	defer daemonEnd.Close()
	var stderr bytes.Buffer
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: owner, Size: 1}}
	cmd := &exec.Cmd{
		Path: guestBin, Args: []string{"berth-guest", "guest", guestapi.ProbeLayersFlag},
		Env: local.GuestEnv(), Dir: "/", Stderr: &stderr, ExtraFiles: []*os.File{guestEnd},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: ids, GidMappings: ids, GidMappingsEnableSetgroups: true,
			Credential: &syscall.Credential{Uid: 0, Gid: 0},
		},
	}
	err = cmd.Start()
	guestEnd.Close()
	if err != nil {
		return "", err
	}
	kill := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
	defer kill.Stop()
	fds, err := idmapLayers(cmd.Process.Pid, []string{layer})
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err.Error(), nil
	}
	err = sendBootstrap(daemonEnd, guestapi.Bootstrap{
		Root: &guestapi.Root{Layers: []string{guestapi.PassedLayer(0)}, Upper: upper, Work: work}}, fds)
	closeAll(fds)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return "", fmt.Errorf("send the probe: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Sprintf("a root on an idmapped layer: %s (%v)", strings.TrimSpace(stderr.String()), err), nil
	}
	return "", nil
}
