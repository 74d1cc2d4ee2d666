package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/berthsh/berth/cgroup"
	"github.com/berthsh/berth/runtime/layer"
)

// A gvisor sandbox is paused inside gVisor's kernel (runsc pause): its
// tasks stop where they are and its asynchronous I/O drains, while the
// host processes that carry them (the sentry, the gofer and the systrap
// stubs) stay schedulable and idle. The host's cgroup freezer is not used:
// a host freeze interrupts the stubs' pending seccomp notifications, and
// gVisor's systrap platform then ends applications with SIGSEGV or SIGKILL
// (google/gvisor#14429 after host suspends; here about one process in
// twenty freeze cycles, see TestGvisorPausesKillNothing). Forks and
// snapshots of a running sandbox pause it the same way for their last copy
// pass.

// stateTimeout bounds the runsc runs of layer.Freezer's Frozen and Thaw,
// whose callers give no context.
const stateTimeout = 30 * time.Second

// kernelFreezer is a layer.Freezer of one sandbox that pauses its tasks in
// gVisor's kernel; it is local.Host's Freezer here, so Pause, Resume and
// Capture use it.
type kernelFreezer struct {
	r  *Runtime
	id string
	g  cgroup.Group // the sandbox's group, which an older berth's pause froze
}

func (r *Runtime) kernel(id string, g cgroup.Group) layer.Freezer {
	return kernelFreezer{r: r, id: id, g: g}
}

// Frozen says whether the sandbox is paused: by runsc, or by its cgroup's
// freezer (an older berth's pause).
func (k kernelFreezer) Frozen() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stateTimeout)
	defer cancel()
	return k.paused(ctx)
}

func (k kernelFreezer) paused(ctx context.Context) (bool, error) {
	if frozen, err := k.g.Frozen(); err != nil || frozen {
		return frozen, err
	}
	return k.inKernel(ctx)
}

// inKernel says whether runsc paused the sandbox: as this daemon's last
// runsc pause or resume left it, else as runsc state says (once after a
// daemon restart). Every pause, resume and capture of a sandbox holds its
// operation lock, so nothing else changes it meanwhile.
func (k kernelFreezer) inKernel(ctx context.Context) (bool, error) {
	if v, ok := k.r.paused.Load(k.id); ok {
		return v.(bool), nil
	}
	out, err := k.r.output(ctx, k.id, "state", k.id)
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", k.id, err)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return false, fmt.Errorf("sandbox %s: runsc state: %w", k.id, err)
	}
	paused := st.Status == "paused"
	k.r.paused.Store(k.id, paused)
	return paused, nil
}

// Freeze pauses the sandbox; a paused one is left as it is.
func (k kernelFreezer) Freeze(ctx context.Context) error {
	paused, err := k.paused(ctx)
	if err != nil || paused {
		return err
	}
	return k.turn(ctx, "pause", true)
}

// Thaw resumes the sandbox, from runsc's pause and from an older berth's
// cgroup freeze; a running one is left as it is.
func (k kernelFreezer) Thaw() error {
	if err := k.g.Thaw(); err != nil {
		return fmt.Errorf("sandbox %s: %w", k.id, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateTimeout)
	defer cancel()
	paused, err := k.inKernel(ctx)
	if err != nil || !paused {
		return err
	}
	return k.turn(ctx, "resume", false)
}

// turn runs runsc pause or resume. Where it fails, runsc state says again
// what it left.
func (k kernelFreezer) turn(ctx context.Context, verb string, paused bool) error {
	if err := k.r.run(ctx, k.id, verb, k.id); err != nil {
		k.r.paused.Delete(k.id)
		return fmt.Errorf("sandbox %s: %w", k.id, err)
	}
	k.r.paused.Store(k.id, paused)
	return nil
}
