package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/osthread"
	"github.com/berthsh/berth/internal/tun"
	"github.com/berthsh/berth/runtime"
)

// A linked gvisor sandbox runs in a network namespace of its own, made by
// the runtime and pinned at netnsFile in its directory, holding one
// interface: a TUN device named linkName with the sandbox's address and a
// default route through the gateway. runsc (--network=sandbox) copies that
// configuration into gVisor's own network stack and moves the device's
// packets with a packet socket, raw IP (the device has no MAC). The far
// end of the TUN is the daemon's, as on native: every packet the sandbox
// sends reaches berth's user-space stack and its policy. The device is
// persistent, so that a daemon restart (which closes its descriptor) keeps
// the interface gVisor bound to; Link attaches to it again.
const (
	netnsFile = "netns"
	linkName  = "eth0"
)

// linked says whether sandbox dir runs with a network link.
func linked(dir string) bool { return exists(filepath.Join(dir, netnsFile)) }

// makeNetns makes sandbox dir's network namespace with its link, and
// returns the link's far end. On error nothing is left.
func makeNetns(dir string, n runtime.Network) (_ *runtime.Link, err error) {
	if !n.Address.Is4() || !n.Gateway.Is4() || n.MTU < 576 || n.MTU > 65535 {
		return nil, errdefs.New(errdefs.InvalidArgument, "network link: address %s, gateway %s, mtu %d", n.Address, n.Gateway, n.MTU)
	}
	pin := filepath.Join(dir, netnsFile)
	f, err := os.OpenFile(pin, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	f.Close()
	defer func() {
		if err != nil {
			if rerr := removeNetns(dir); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	// A thread of its own enters a new namespace, which a bind mount keeps
	// once the thread is gone.
	if _, err := osthread.Discarded(func(tid int) error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("new network namespace: %w", err)
		}
		// runsc copies only the interfaces that are up, loopback too.
		if err := loopbackUp(); err != nil {
			return err
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), tid)
		if err := unix.Mount(src, pin, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("pin the network namespace: %w", err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	t, err := tun.CreateOnSubnet(pin, linkName, n.Address, n.Gateway, n.MTU)
	if err != nil {
		return nil, fmt.Errorf("network link: %w", err)
	}
	if err := tun.Persist(t); err != nil {
		t.Close()
		return nil, err
	}
	return &runtime.Link{File: t, MTU: n.MTU}, nil
}

// loopbackUp brings up lo in the calling thread's network namespace.
func loopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for lo: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_LOOPBACK | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}

// removeNetns unpins sandbox dir's network namespace: with the sandbox
// gone, the namespace and its device go too.
func removeNetns(dir string) error {
	pin := filepath.Join(dir, netnsFile)
	if err := unix.Unmount(pin, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpin the network namespace: %w", err)
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network namespace: %w", err)
	}
	return nil
}

// Link implements runtime.Linker: it attaches again to the link a sandbox
// booted with (after a daemon restart, or a network set to none and back).
// gVisor takes its interfaces when it boots, so a sandbox booted without
// a link cannot get one.
func (r *Runtime) Link(ctx context.Context, id string, n runtime.Network) (*runtime.Link, error) {
	dir := r.SandboxDir(id)
	if !linked(dir) {
		return nil, errdefs.New(errdefs.NotImplemented,
			"network: gvisor sandbox %s booted without a network link, and gVisor takes its interfaces only when it boots: create the sandbox with the network it needs", id)
	}
	f, err := tun.Attach(filepath.Join(dir, netnsFile), linkName)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: network link: %w", id, err)
	}
	return &runtime.Link{File: f, MTU: n.MTU}, nil
}
