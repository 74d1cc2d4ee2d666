package native

import (
	"context"
	"fmt"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/tun"
	"github.com/berthsh/berth/runtime"
)

// linkName is the sandbox's one network interface.
const linkName = "eth0"

// Link implements runtime.Linker.
func (r *Runtime) Link(ctx context.Context, id string, n runtime.Network) (*runtime.Link, error) {
	v, ok := r.inits.Load(id)
	if !ok {
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s is not running", id)
	}
	return makeLink(v.(initProc).pid, n)
}

// makeLink creates the sandbox's network interface in the network
// namespace of process pid (its init): a TUN device named eth0 with
// n.Address, a point-to-point route to n.Gateway, the default route through
// it and n.MTU. The daemon does this from a thread of its own moved into
// the namespace (root on the host holds every capability in a sandbox's
// namespaces; nothing inside may change the link, as root inside lacks
// CAP_NET_ADMIN). The device lives as long as the returned descriptor: a
// sandbox whose link is closed is back to loopback only.
func makeLink(pid int, n runtime.Network) (*runtime.Link, error) {
	if !n.Address.Is4() || !n.Gateway.Is4() || n.MTU < 576 || n.MTU > 65535 {
		return nil, errdefs.New(errdefs.InvalidArgument, "network link: address %s, gateway %s, mtu %d", n.Address, n.Gateway, n.MTU)
	}
	f, err := tun.Create(fmt.Sprintf("/proc/%d/ns/net", pid), linkName, n.Address, n.Gateway, n.MTU)
	if err != nil {
		return nil, fmt.Errorf("network link: %w", err)
	}
	return &runtime.Link{File: f, MTU: n.MTU}, nil
}
