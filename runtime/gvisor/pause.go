package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/berthsh/berth/runtime"
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

// Pause implements runtime.Pauser.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.kernel(id).Freeze(ctx)
}

// Resume implements runtime.Pauser. A sandbox paused by a berth from before
// runsc pause is held by its cgroup's freezer instead: that is thawed too.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	if cg, err := r.Cgroups.Load(id); err == nil {
		if err := cg.Thaw(); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	return r.kernel(id).resume(ctx)
}

// Capture implements runtime.Capturer (see layer.Capture) with the sandbox
// paused in its kernel for the last copy pass.
func (r *Runtime) Capture(ctx context.Context, id string, users runtime.IDMap, skip map[string][]byte, dst string) (runtime.Capture, error) {
	var f layer.Freezer
	if _, err := r.Cgroups.Load(id); err == nil {
		f = r.kernel(id)
	} else if !errors.Is(err, os.ErrNotExist) { // not stopped
		return runtime.Capture{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return layer.Capture(ctx, id, r.SandboxDir(id), users, skip, dst, f, "")
}

// kernelFreezer is a layer.Freezer of one sandbox that pauses its tasks in
// gVisor's kernel.
type kernelFreezer struct {
	r  *Runtime
	id string
}

func (r *Runtime) kernel(id string) kernelFreezer { return kernelFreezer{r: r, id: id} }

// Frozen says whether the sandbox is paused: by runsc, or by its cgroup's
// freezer (an older berth's pause).
func (k kernelFreezer) Frozen() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stateTimeout)
	defer cancel()
	return k.paused(ctx)
}

func (k kernelFreezer) paused(ctx context.Context) (bool, error) {
	if cg, err := k.r.Cgroups.Load(k.id); err == nil {
		if frozen, err := cg.Frozen(); err != nil || frozen {
			return frozen, err
		}
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

// Thaw resumes the sandbox; a running one is left as it is.
func (k kernelFreezer) Thaw() error {
	ctx, cancel := context.WithTimeout(context.Background(), stateTimeout)
	defer cancel()
	return k.resume(ctx)
}

// resume resumes what runsc paused (not an older berth's cgroup freeze).
func (k kernelFreezer) resume(ctx context.Context) error {
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
