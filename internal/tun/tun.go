// Package tun creates a TUN device in a network namespace, configured as a
// point-to-point IPv4 link with a default route through its peer: the
// sandbox side of berth's network link. The device lives as long as the
// descriptor Create returns.
package tun

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/osthread"
)

// Create makes device name in the network namespace at nsPath, with
// address addr, peer gateway (the default route goes through it) and mtu,
// up. It works from a thread of its own moved into the namespace and
// thrown away after. The device takes IP packets without a packet
// information header (IFF_TUN | IFF_NO_PI).
func Create(nsPath, name string, addr, gateway netip.Addr, mtu int) (*os.File, error) {
	return createIn(nsPath, name, addr, gateway, mtu, 0)
}

// CreateOnSubnet is Create with the gateway on the device's subnet (the
// narrowest of at most /30 that holds both addresses) instead of as its
// point-to-point peer: what gVisor's runsc can copy into its own stack
// (it removes the addresses it copied by address and prefix alone).
func CreateOnSubnet(nsPath, name string, addr, gateway netip.Addr, mtu int) (*os.File, error) {
	bits := 30
	for bits > 0 {
		p, _ := addr.Prefix(bits)
		if p.Contains(gateway) {
			break
		}
		bits--
	}
	return createIn(nsPath, name, addr, gateway, mtu, bits)
}

// createIn is Create; subnet, when not 0, is the prefix length of a
// subnet that holds the gateway instead of a point-to-point peer.
func createIn(nsPath, name string, addr, gateway netip.Addr, mtu, subnet int) (*os.File, error) {
	ns, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer unix.Close(ns)
	var fd int
	_, err = osthread.Discarded(func(int) error {
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		var err error
		fd, err = create(name, addr, gateway, mtu, subnet)
		return err
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "tun"), nil
}

// create runs in the namespace.
func create(linkName string, addr, gateway netip.Addr, mtu, subnet int) (int, error) {
	tun, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(tun)
		}
	}()
	ifr, err := unix.NewIfreq(linkName)
	if err != nil {
		return -1, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(tun, unix.TUNSETIFF, ifr); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return -1, fmt.Errorf("the sandbox already has a %s", linkName)
		}
		return -1, fmt.Errorf("create %s: %w", linkName, err)
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(s)
	if err := setAddr(s, linkName, unix.SIOCSIFADDR, addr); err != nil {
		return -1, fmt.Errorf("address %s: %w", addr, err)
	}
	flags := uint16(unix.IFF_UP | unix.IFF_RUNNING | unix.IFF_NOARP)
	if subnet == 0 {
		if err := setAddr(s, linkName, unix.SIOCSIFDSTADDR, gateway); err != nil {
			return -1, fmt.Errorf("peer %s: %w", gateway, err)
		}
		flags |= unix.IFF_POINTOPOINT
	} else {
		mask := netip.AddrFrom4([4]byte(net.CIDRMask(subnet, 32)))
		if err := setAddr(s, linkName, unix.SIOCSIFNETMASK, mask); err != nil {
			return -1, fmt.Errorf("netmask /%d: %w", subnet, err)
		}
	}
	mtuReq, _ := unix.NewIfreq(linkName)
	mtuReq.SetUint32(uint32(mtu))
	if err := unix.IoctlIfreq(s, unix.SIOCSIFMTU, mtuReq); err != nil {
		return -1, fmt.Errorf("mtu %d: %w", mtu, err)
	}
	up, _ := unix.NewIfreq(linkName)
	up.SetUint16(flags)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, up); err != nil {
		return -1, fmt.Errorf("bring %s up: %w", linkName, err)
	}
	dev := append([]byte(linkName), 0)
	rt := rtentry{Dst: sockaddr4(netip.IPv4Unspecified()), Gateway: sockaddr4(gateway), Genmask: sockaddr4(netip.IPv4Unspecified()),
		Flags: unix.RTF_UP | unix.RTF_GATEWAY, Dev: &dev[0]}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(s), unix.SIOCADDRT, uintptr(unsafe.Pointer(&rt)))
	goruntime.KeepAlive(dev)
	if e != 0 {
		return -1, fmt.Errorf("default route via %s: %w", gateway, e)
	}
	ok = true
	return tun, nil
}

// ifreqAddr is struct ifreq holding an IPv4 sockaddr.
type ifreqAddr struct {
	Name [unix.IFNAMSIZ]byte
	Addr unix.RawSockaddrInet4
	_    [8]byte
}

func setAddr(s int, linkName string, req uint, a netip.Addr) error {
	var r ifreqAddr
	copy(r.Name[:], linkName)
	r.Addr = sockaddr4(a)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(s), uintptr(req), uintptr(unsafe.Pointer(&r))); e != 0 {
		return e
	}
	return nil
}

func sockaddr4(a netip.Addr) unix.RawSockaddrInet4 {
	return unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
}

// rtentry is the kernel's struct rtentry (SIOCADDRT) on 64-bit Linux.
type rtentry struct {
	_       uint64
	Dst     unix.RawSockaddrInet4
	Gateway unix.RawSockaddrInet4
	Genmask unix.RawSockaddrInet4
	Flags   uint16
	_       int16
	_       uint64
	Tos     uint8
	Class   uint8
	_       [3]int16
	Metric  int16
	Dev     *byte
	MTU     uint64
	Window  uint64
	IRTT    uint16
}

// Persist makes the device of f outlive its descriptor (TUNSETPERSIST): a
// daemon that restarts finds it again with Attach.
func Persist(f *os.File) error {
	if err := unix.IoctlSetInt(int(f.Fd()), unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("keep the link: %w", err)
	}
	return nil
}

// Attach opens existing device name in the network namespace at nsPath
// (a persistent one whose descriptor was closed) without changing it, and
// returns once the device passes packets again (at most activeWait).
//
// The kernel turns a TUN device's carrier off when its last descriptor
// closes and on when one attaches; its transmit queue is switched back on
// later, in a kernel worker (linkwatch), and until then a packet sent into
// the device is dropped. Under load that took long enough to lose a packet
// sent right after the attach (1 of 200 once in CI), and a lost DNS query
// costs a resolver 5 s. The worker announces the device's state on
// rtnetlink after the queue is on, so Attach listens for that announcement.
func Attach(nsPath, name string) (*os.File, error) {
	ns, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer unix.Close(ns)
	fd := -1
	_, err = osthread.Discarded(func(int) error {
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		tun, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(tun)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		// Listening before the attach, so the announcement cannot be missed.
		nl, err := linkEvents()
		if err != nil {
			unix.Close(tun)
			return err
		}
		defer unix.Close(nl)
		if err := unix.IoctlIfreq(tun, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(tun)
			return fmt.Errorf("attach to %s: %w", name, err)
		}
		fd = tun
		return waitOperUp(nl, name, activeWait)
	})
	if err != nil && fd >= 0 {
		unix.Close(fd)
		fd = -1
	}
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "tun"), nil
}

// activeWait bounds Attach's wait for the device's transmit queue. A
// device that is down gets no announcement; it is returned after the wait.
const activeWait = 2 * time.Second

// operUp is IF_OPER_UP (linux/if.h), the operational state linkwatch sets
// just before it switches the transmit queue on.
const operUp = 6

// linkEvents opens a socket for the link announcements (RTM_NEWLINK) of
// the calling thread's network namespace.
func linkEvents() (int, error) {
	nl, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("link events: %w", err)
	}
	if err := unix.Bind(nl, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_LINK}); err != nil {
		unix.Close(nl)
		return -1, fmt.Errorf("link events: %w", err)
	}
	return nl, nil
}

// waitOperUp reads announcements on nl until one says device name is
// operationally up, which the kernel sends once its transmit queue is on,
// or until wait has passed (then nil: the device passes packets once the
// kernel gets to it, as before).
func waitOperUp(nl int, name string, wait time.Duration) error {
	buf := make([]byte, 64<<10)
	for deadline := time.Now().Add(wait); ; {
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		fds := []unix.PollFd{{Fd: int32(nl), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("link events: %w", err)
		}
		if n == 0 {
			continue
		}
		k, _, err := unix.Recvfrom(nl, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOBUFS) {
			continue // announcements were dropped: the next one still says
		}
		if err != nil {
			return fmt.Errorf("link events: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:k])
		if err != nil {
			continue
		}
		for i := range msgs {
			if msgs[i].Header.Type == unix.RTM_NEWLINK && operUpNamed(&msgs[i], name) {
				return nil
			}
		}
	}
}

// operUpNamed says whether link announcement m is device name's, up.
func operUpNamed(m *syscall.NetlinkMessage, name string) bool {
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return false
	}
	named, up := false, false
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFLA_IFNAME:
			named = string(bytes.TrimRight(a.Value, "\x00")) == name
		case unix.IFLA_OPERSTATE:
			up = len(a.Value) == 1 && a.Value[0] == operUp
		}
	}
	return named && up
}

// Support says why this host cannot make TUN devices, or "".
func Support() string {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Sprintf("a sandbox's network link is a TUN device, and /dev/net/tun cannot be opened here: %v", err)
	}
	unix.Close(fd)
	return ""
}
