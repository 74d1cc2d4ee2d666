// Package hostcheck tells what of berth works on this host, what does not, and the fix for each: `berth doctor` shows every check, and `berth serve` refuses to start when a check that every create needs fails.
package hostcheck

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berthsh/berth/internal/guestbin"
	"github.com/berthsh/berth/runtime"
)

// Status is a check's verdict.
type Status string

const (
	// OK: the host does what berth needs.
	OK Status = "ok"
	// Warn: something optional is missing; berth works without it.
	Warn Status = "warn"
	// Fail: berth (or the part the check names) cannot work here.
	Fail Status = "fail"
)

// Result is one check's answer.
type Result struct {
	// Name is the check's short name ("cgroups", "user_namespaces", …).
	Name string `json:"name"`
	// Status is ok, warn or fail.
	Status Status `json:"status"`
	// Detail says what works and what does not.
	Detail string `json:"detail"`
	// Fix is the command or setting that repairs a warn or fail; empty
	// when ok.
	Fix string `json:"fix,omitempty"`
	// Required is true when every create needs the check to pass: serve
	// refuses to start when it fails.
	Required bool `json:"required"`
	// Duration is how long the check took.
	Duration time.Duration `json:"duration_ns"`
}

// Error is a Result that failed, as an error: "NAME: DETAIL; fix: FIX".
func (r Result) Error() string {
	s := r.Name + ": " + r.Detail
	if r.Fix != "" {
		s += "; fix: " + r.Fix
	}
	return s
}

// Options are what the checks look at: the daemon's settings that change
// their answer.
type Options struct {
	// StateDir is the daemon's state directory (it need not exist yet).
	StateDir string
	// GuestBinary is the binary sandboxes run as init; "" is the lean guest
	// embedded in this berth, else this executable.
	GuestBinary string
	// Runsc is the gvisor runtime's runsc ("" finds it on PATH).
	Runsc string
	// RunscPlatform is the gvisor runtime's platform ("" is systrap).
	RunscPlatform string
	// NoSeccomp and NoIDMappedLayers are serve's flags of those names.
	NoSeccomp        bool
	NoIDMappedLayers bool
	// CgroupRoot names berth's group in each hierarchy ("" is berth).
	CgroupRoot string
}

// check is one named check; required ones run at serve's start too.
type check struct {
	name     string
	required bool
	run      func(ctx context.Context, o *Options) (Status, string, string)
}

// checks are every check, in the order doctor shows them.
func checks() []check {
	return []check{
		{"root", true, checkRoot},
		{"static_binary", true, checkStatic},
		{"state_dir", true, checkStateDir},
		{"state_fs", false, checkStateFS},
		{"cgroups", true, checkCgroups},
		{"cgroup_moves", false, checkCgroupMoves},
		{"user_namespaces", true, checkUserNS},
		{"overlayfs", true, checkOverlay},
		{"seccomp", true, checkSeccomp},
		{"idmapped_mounts", false, checkIDMapped},
		{"disk", false, checkDisk},
		{"runsc", false, checkRunsc},
		{"kvm", false, checkKVM},
	}
}

// Names are the checks' names, in doctor's order.
func Names() []string {
	var names []string
	for _, c := range checks() {
		names = append(names, c.name)
	}
	return names
}

// All runs every check.
func All(ctx context.Context, o Options) []Result {
	return run(ctx, o, false)
}

// Startup runs the checks that every create needs (Result.Required), fast
// ones all: serve runs them before anything else.
func Startup(ctx context.Context, o Options) []Result {
	return run(ctx, o, true)
}

// Failed returns the results that failed.
func Failed(rs []Result) []Result {
	var out []Result
	for _, r := range rs {
		if r.Status == Fail {
			out = append(out, r)
		}
	}
	return out
}

func run(ctx context.Context, o Options, requiredOnly bool) []Result {
	if o.StateDir != "" {
		if abs, err := filepath.Abs(o.StateDir); err == nil {
			o.StateDir = abs
		}
	}
	var out []Result
	for _, c := range checks() {
		if requiredOnly && (!c.required || (c.name == "seccomp" && o.NoSeccomp)) {
			continue
		}
		start := time.Now()
		st, detail, fix := c.run(ctx, &o)
		if st == OK {
			fix = ""
		}
		req := c.required && !(c.name == "seccomp" && o.NoSeccomp)
		out = append(out, Result{Name: c.name, Status: st, Detail: detail, Fix: fix, Required: req, Duration: time.Since(start)})
	}
	return out
}

// guestBinary returns the binary sandboxes run as init, as the daemon picks
// it (the configured one, else the embedded lean guest, else this
// executable), copied into tmp as the runtimes copy it into their state
// dir: sandboxes' uids must reach it wherever berth itself lives.
func guestBinary(o *Options, tmp string) (string, error) {
	dir := filepath.Join(tmp, "bin")
	if o.GuestBinary == "" && guestbin.Embedded() {
		return guestbin.Install(dir)
	}
	src := o.GuestBinary
	if src == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", err
		}
		src = exe
	}
	return runtime.InstallGuest(src, dir)
}

// scratchDir makes a private directory for a check's probe: in the state
// dir when it exists (its file system is the one that matters), else in
// the system's temporary directory. The caller removes it.
func scratchDir(o *Options) (string, error) {
	base := os.TempDir()
	if fi, err := os.Stat(o.StateDir); err == nil && fi.IsDir() {
		base = o.StateDir
	}
	d, err := os.MkdirTemp(base, ".doctor-")
	if err != nil {
		return "", err
	}
	// Sandboxes' ids must reach the probe's layers, as they reach a state
	// dir's (0711, like the runtimes' directories).
	if err := os.Chmod(d, 0o711); err != nil {
		os.RemoveAll(d)
		return "", err
	}
	return d, nil
}

// existingAncestor is dir, or its nearest parent that exists.
func existingAncestor(dir string) string {
	for p := dir; ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil || p == "/" || p == "." {
			return p
		}
	}
}

// humanBytes formats n in binary units (12.3 GiB).
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// firstLine trims s to its first line.
func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
