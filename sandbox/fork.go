package sandbox

import (
	"context"
	"errors"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
)

// maxForks bounds one fork's copies.
const maxForks = 64

// forkLabel marks a fork's copies with their source.
const forkLabel = "berth.fork_of"

// Fork makes count new running sandboxes whose files are the source's at
// one instant; the source keeps running (frozen for the capture's last
// pass). The copies share one layer of what the source changed, under a
// writable layer each: a fork costs what the source changed, not its
// image. They have the source's settings (image, env, user, limits,
// network, timeouts, start_cmd) but not its processes or labels: each gets
// its labels from the request and berth.fork_of=<source>. A source that
// changed nothing is forked from its image (and its warm pool).
func (m *Manager) Fork(ctx context.Context, tenant, id string, req api.ForkRequest) (api.ForkResponse, error) {
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > maxForks {
		return api.ForkResponse{}, errdefs.New(errdefs.InvalidArgument, "count: %d is outside 1..%d", req.Count, maxForks)
	}
	if len(req.Labels) > req.Count {
		return api.ForkResponse{}, errdefs.New(errdefs.InvalidArgument, "labels: %d label sets for %d copies", len(req.Labels), req.Count)
	}
	for i, l := range req.Labels {
		if err := labels.Validate(l); err != nil {
			return api.ForkResponse{}, errdefs.Wrap(errdefs.InvalidArgument, err, "labels[%d]", i)
		}
	}
	unlock := m.ops.lock(id)
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		unlock()
		return api.ForkResponse{}, err
	}
	if err := snapshottable(rec, "fork"); err != nil {
		unlock()
		return api.ForkResponse{}, err
	}
	spec, err := recordSpec(rec)
	if err != nil {
		unlock()
		return api.ForkResponse{}, err
	}
	sn, err := m.capture(ctx, rec, "", nil, false)
	unlock() // the copies need the source no more
	if err != nil {
		return api.ForkResponse{}, err
	}
	res := api.ForkResponse{Sandboxes: []api.Sandbox{}, FrozenMs: float64(sn.Frozen.Microseconds()) / 1000}
	imageID := rec.ImageID
	if sn.ID != "" {
		imageID, res.Snapshot = sn.ID, sn.ID
	}
	for i := range req.Count {
		copyReq := spec
		copyReq.Labels = map[string]string{forkLabel: id}
		if i < len(req.Labels) {
			for k, v := range req.Labels[i] {
				copyReq.Labels[k] = v
			}
		}
		sb, err := m.create(ctx, tenant, copyReq, imageID)
		if err != nil {
			var errs []error
			for _, made := range res.Sandboxes {
				errs = append(errs, m.Delete(context.WithoutCancel(ctx), tenant, made.ID))
			}
			if derr := errors.Join(errs...); derr != nil {
				m.log.Error("failed fork: delete the copies made", "sandbox", id, "err", derr)
			}
			if res.Snapshot != "" {
				m.releaseSnapshot(ctx, res.Snapshot)
			}
			return api.ForkResponse{}, err
		}
		res.Sandboxes = append(res.Sandboxes, sb)
	}
	return res, nil
}
