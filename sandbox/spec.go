package sandbox

import (
	"context"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/runtime"
)

// resolve turns a normalized request into the one runtime.Spec its runtime
// realizes: the image's layers and mounts prepared for the sandbox's user
// mapping, the network attachment and the limits. Create, start and the
// warm pool all come through here, so what a sandbox is made of is decided
// in this one place; the network and snapshot subsystems add their parts
// here too.
func (m *Manager) resolve(ctx context.Context, id string, req api.CreateSandboxRequest) (runtime.Spec, error) {
	img, err := m.images.Resolve(ctx, req.Image, m.cfg.IDMap)
	if err != nil {
		return runtime.Spec{}, err
	}
	return runtime.Spec{
		ID:       id,
		Hostname: id,
		Root:     img.Root,
		Mounts:   img.Mounts,
		Users:    m.cfg.IDMap,
		Network:  runtime.Network{Mode: runtime.NetworkNone},
		Limits:   runtime.Limits(req.Limits),
	}, nil
}
