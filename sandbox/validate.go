package sandbox

import (
	"context"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/runtime"
)

// Bounds on requests. A limit outside them is refused with the range.
const (
	minMemory      = 32 << 20 // the guest itself needs a few MiB
	minPids        = 32       // the guest's own threads count
	minDisk        = 16 << 20 // an ext4 file system with room for a few files
	minOpenFiles   = 64       // the guest's own sockets and pipes count
	maxPids        = 1 << 22
	defaultOutput  = 4 << 20
	maxOutput      = 64 << 20
	maxStdin       = 16 << 20
	maxEnvEntries  = 512
	maxEnvValue    = 128 << 10
	maxArgs        = 4096
	maxArgBytes    = 1 << 20
	maxTimeoutMs   = 7 * 24 * 3600 * 1000
	defaultWorkdir = "/home/user"
	defaultUser    = "user"
)

// The patterns are compiled on first use, not at start-up: every berth
// process links this package, sandboxes' guests and CLI calls included.
var (
	envKeyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`) })
	userRE   = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^([a-z_][a-z0-9_.-]{0,31}\$?|[0-9]{1,10}(:[0-9]{1,10})?)$`)
	})
)

// normalize validates a create request and fills its defaults, the
// image's (or snapshot's) among them (env, workdir, user): it finds the stored image,
// pulling it if need be, and returns its id ("" for the host image), which
// pins the sandbox to those files.
func (m *Manager) normalize(ctx context.Context, tenant string, req api.CreateSandboxRequest) (api.CreateSandboxRequest, string, error) {
	if req.Image == "" {
		req.Image = m.cfg.DefaultImage
	}
	req, err := m.normalizeRequest(req)
	if err != nil {
		return req, "", err
	}
	if strings.HasPrefix(req.Image, api.SnapshotPrefix) {
		sn, err := m.snapshot(ctx, tenant, req.Image)
		if err != nil {
			return req, "", err
		}
		req, err = m.snapshotDefaults(sn, req)
		return req, sn.ID, err
	}
	if req.Image == image.Host {
		if req.Workdir == "" {
			req.Workdir = defaultWorkdir
		}
		if req.User == "" {
			req.User = defaultUser
		}
		return req, "", nil
	}
	img, err := m.images.Ensure(ctx, tenant, req.Image)
	if err != nil {
		return req, "", err
	}
	c := img.Config
	if req.Workdir == "" {
		req.Workdir = c.WorkingDir
		if req.Workdir == "" {
			req.Workdir = "/"
		}
		if err := validateDir("workdir", req.Workdir); err != nil {
			return req, "", errdefs.New(errdefs.InvalidArgument, "image %s: its config's working dir: %v", req.Image, errdefs.Message(err))
		}
	}
	if req.User == "" {
		req.User = c.User
		if req.User == "" {
			req.User = "root"
		}
		if err := m.checkUser("user", req.User); err != nil {
			return req, "", errdefs.New(errdefs.InvalidArgument, "image %s: its config's user %q: give user at create (a name or uid[:gid]): %v", req.Image, c.User, errdefs.Message(err))
		}
	}
	if len(c.Env) > 0 {
		env := make(map[string]string, len(c.Env)+len(req.Env))
		for _, kv := range c.Env {
			k, v, _ := strings.Cut(kv, "=")
			if envKeyRE().MatchString(k) && strings.IndexByte(v, 0) < 0 {
				env[k] = v
			}
		}
		for k, v := range req.Env {
			env[k] = v
		}
		req.Env = env
	}
	return req, img.ID, nil
}

// normalizeRequest checks and defaults what does not depend on the image.
func (m *Manager) normalizeRequest(req api.CreateSandboxRequest) (api.CreateSandboxRequest, error) {
	if req.Runtime == "" {
		req.Runtime = m.cfg.DefaultRuntime
	}
	t, ok := m.tiers[req.Runtime]
	if !ok {
		if why, known := m.cfg.Unavailable[req.Runtime]; known {
			return req, errdefs.New(errdefs.InvalidArgument, "runtime: %q cannot run on this host: %s (available: %v)", req.Runtime, why, m.Runtimes())
		}
		return req, errdefs.New(errdefs.InvalidArgument, "runtime: %q is not one berth has (available: %v)", req.Runtime, m.Runtimes())
	}
	if err := validateEnv("env", req.Env); err != nil {
		return req, err
	}
	if req.Workdir != "" {
		if err := validateDir("workdir", req.Workdir); err != nil {
			return req, err
		}
	}
	if req.User != "" {
		if err := m.checkUser("user", req.User); err != nil {
			return req, err
		}
	}
	if err := labels.Validate(req.Labels); err != nil {
		return req, err
	}
	if err := m.normalizeTimeouts(&req.Timeouts, req.Runtime); err != nil {
		return req, err
	}
	if strings.IndexByte(req.StartCmd, 0) >= 0 || len(req.StartCmd) > maxArgBytes {
		return req, errdefs.New(errdefs.InvalidArgument, "start_cmd: holds a NUL byte or is over %d bytes", maxArgBytes)
	}
	ports, err := normalizePorts("public_ports", req.PublicPorts)
	if err != nil {
		return req, err
	}
	req.PublicPorts = ports
	l := &req.Limits
	d := m.cfg.DefaultLimits
	if l.CPUs == 0 {
		l.CPUs = d.CPUs
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = d.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = d.DiskBytes
	}
	if l.OpenFiles == 0 {
		l.OpenFiles = d.OpenFiles
	}
	if err := validateLimits(*l, t.caps); err != nil {
		return req, err
	}
	return req, nil
}

// validateLimits checks limits against what works, what the runtime
// enforces and what its host has.
func validateLimits(l api.Limits, caps runtime.Capabilities) error {
	h := caps.Host
	if l.CPUs < 0 || (l.CPUs > 0 && l.CPUs < 0.01) || (h.CPUs > 0 && l.CPUs > h.CPUs) {
		return errdefs.New(errdefs.InvalidArgument, "limits.cpus: %g is outside 0.01..%g (0 in a create: the daemon's default)", l.CPUs, h.CPUs)
	}
	if l.MemoryBytes < 0 || (l.MemoryBytes > 0 && l.MemoryBytes < minMemory) || (h.MemoryBytes > 0 && l.MemoryBytes > h.MemoryBytes) {
		return errdefs.New(errdefs.InvalidArgument, "limits.memory_bytes: %d is outside %d..%d (0 in a create: the daemon's default)", l.MemoryBytes, minMemory, h.MemoryBytes)
	}
	if l.Pids < 0 || (l.Pids > 0 && l.Pids < minPids) || l.Pids > maxPids {
		return errdefs.New(errdefs.InvalidArgument, "limits.pids: %d is outside %d..%d (0 in a create: the daemon's default)", l.Pids, minPids, maxPids)
	}
	if l.OpenFiles < 0 || (l.OpenFiles > 0 && l.OpenFiles < minOpenFiles) || (h.OpenFiles > 0 && l.OpenFiles > h.OpenFiles) {
		return errdefs.New(errdefs.InvalidArgument, "limits.open_files: %d is outside %d..%d (0 = the daemon's own)", l.OpenFiles, minOpenFiles, h.OpenFiles)
	}
	if l.DiskBytes < 0 || (l.DiskBytes > 0 && l.DiskBytes < minDisk) || (h.DiskBytes > 0 && l.DiskBytes > h.DiskBytes) {
		return errdefs.New(errdefs.InvalidArgument, "limits.disk_bytes: %d is outside %d..%d (0 in a create: the daemon's default)", l.DiskBytes, minDisk, h.DiskBytes)
	}
	s := caps.Limits
	for _, lim := range []struct {
		name string
		set  bool
		ok   bool
	}{
		{"cpus", l.CPUs > 0, s.CPUs}, {"memory_bytes", l.MemoryBytes > 0, s.Memory}, {"pids", l.Pids > 0, s.Pids},
		{"disk_bytes", l.DiskBytes > 0, s.Disk}, {"open_files", l.OpenFiles > 0, s.OpenFiles},
	} {
		if lim.set && !lim.ok {
			if why := caps.Missing[lim.name]; why != "" {
				return errdefs.New(errdefs.NotImplemented, "limits.%s: %s", lim.name, why)
			}
			return errdefs.New(errdefs.NotImplemented, "limits.%s: this runtime does not enforce it", lim.name)
		}
	}
	return nil
}

// maxTimeout bounds every timeout (ten years: "never" is 0).
const maxTimeout = 10 * 365 * 24 * 3600

// timeoutField is one timeout of a request, by its wire name.
type timeoutField struct {
	name string
	p    **int64
}

// timeoutFields are t's timeouts, in one order for every caller.
func timeoutFields(t *api.Timeouts) []timeoutField {
	return []timeoutField{
		{"timeouts.idle_timeout_s", &t.IdleSeconds},
		{"timeouts.delete_after_s", &t.DeleteAfterSeconds},
		{"timeouts.archive_after_s", &t.ArchiveAfterSeconds},
		{"timeouts.max_lifetime_s", &t.MaxLifetimeSeconds},
	}
}

// checkTimeouts checks the timeouts a request gives (absent ones are not
// checked), and that runtime rt can archive if archive_after_s asks it to.
func (m *Manager) checkTimeouts(t api.Timeouts, rt string) error {
	for _, f := range timeoutFields(&t) {
		if *f.p == nil {
			continue
		}
		if v := **f.p; v < 0 || v > maxTimeout {
			return errdefs.New(errdefs.InvalidArgument, "%s: %d is outside 0..%d seconds (0 = never)", f.name, v, maxTimeout)
		}
	}
	if a := t.ArchiveAfterSeconds; a != nil && *a > 0 {
		if tr, err := m.tier(rt); err == nil {
			if _, _, _, err := m.archiver(tr); err != nil {
				return errdefs.Wrap(errdefs.NotImplemented, err, "timeouts.archive_after_s")
			}
		}
	}
	return nil
}

// normalizeTimeouts checks the timeouts of a create for runtime rt and
// fills the absent ones with the daemon's defaults.
func (m *Manager) normalizeTimeouts(t *api.Timeouts, rt string) error {
	if err := m.checkTimeouts(*t, rt); err != nil {
		return err
	}
	d := m.cfg.DefaultTimeouts
	defs := []time.Duration{d.Idle, d.DeleteAfter, d.ArchiveAfter, d.MaxLifetime}
	for i, f := range timeoutFields(t) {
		if *f.p == nil {
			v := int64(defs[i].Seconds())
			*f.p = &v
		}
	}
	return nil
}

func validateEnv(field string, env map[string]string) error {
	if len(env) > maxEnvEntries {
		return errdefs.New(errdefs.InvalidArgument, "%s: %d entries, at most %d", field, len(env), maxEnvEntries)
	}
	for k, v := range env {
		if !envKeyRE().MatchString(k) {
			return errdefs.New(errdefs.InvalidArgument, "%s: invalid variable name %q", field, k)
		}
		if strings.IndexByte(v, 0) >= 0 || len(v) > maxEnvValue {
			return errdefs.New(errdefs.InvalidArgument, "%s.%s: value holds a NUL byte or is over %d bytes", field, k, maxEnvValue)
		}
	}
	return nil
}

func validateDir(field, dir string) error {
	if !path.IsAbs(dir) || strings.IndexByte(dir, 0) >= 0 || len(dir) > 4096 {
		return errdefs.New(errdefs.InvalidArgument, "%s: %q must be an absolute path without NUL bytes", field, dir)
	}
	return nil
}

// checkUser checks a user given as a name or uid[:gid]: numeric ids must be
// mapped into the sandbox (0 to the mapping's size), else no process or
// file operation could act as them.
func (m *Manager) checkUser(field, user string) error {
	if !userRE().MatchString(user) {
		return errdefs.New(errdefs.InvalidArgument, "%s: %q is neither a user name nor uid[:gid]", field, user)
	}
	if user[0] < '0' || user[0] > '9' {
		return nil
	}
	for _, part := range strings.Split(user, ":") {
		id, err := strconv.ParseUint(part, 10, 32)
		if err != nil || id >= uint64(m.cfg.IDMap.Size) {
			return errdefs.New(errdefs.InvalidArgument, "%s: %q: id %s is not mapped in the sandbox (ids are 0..%d)", field, user, part, m.cfg.IDMap.Size-1)
		}
	}
	return nil
}

// validateExec checks an exec request on its own.
func (m *Manager) validateExec(req api.ExecRequest) error {
	if (len(req.Cmd) == 0) == (req.Shell == "") {
		return errdefs.New(errdefs.InvalidArgument, "cmd, shell: give exactly one of them")
	}
	if len(req.Cmd) > maxArgs {
		return errdefs.New(errdefs.InvalidArgument, "cmd: %d arguments, at most %d", len(req.Cmd), maxArgs)
	}
	total := len(req.Shell)
	for i, a := range req.Cmd {
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.New(errdefs.InvalidArgument, "cmd[%d]: holds a NUL byte", i)
		}
		total += len(a)
	}
	if req.Cmd != nil && req.Cmd[0] == "" {
		return errdefs.New(errdefs.InvalidArgument, "cmd[0]: empty program name")
	}
	if strings.IndexByte(req.Shell, 0) >= 0 {
		return errdefs.New(errdefs.InvalidArgument, "shell: holds a NUL byte")
	}
	if total > maxArgBytes {
		return errdefs.New(errdefs.InvalidArgument, "cmd: %d bytes of arguments, at most %d", total, maxArgBytes)
	}
	if err := validateEnv("env", req.Env); err != nil {
		return err
	}
	if t := req.TTY; t != nil {
		if t.Rows < 1 || t.Rows > api.MaxTTY {
			return errdefs.New(errdefs.InvalidArgument, "tty.rows: %d, want 1 to %d", t.Rows, api.MaxTTY)
		}
		if t.Cols < 1 || t.Cols > api.MaxTTY {
			return errdefs.New(errdefs.InvalidArgument, "tty.cols: %d, want 1 to %d", t.Cols, api.MaxTTY)
		}
	}
	if req.Cwd != "" {
		if err := validateDir("cwd", req.Cwd); err != nil {
			return err
		}
	}
	if req.User != "" {
		if err := m.checkUser("user", req.User); err != nil {
			return err
		}
	}
	if len(req.Stdin) > maxStdin {
		return errdefs.New(errdefs.InvalidArgument, "stdin: %d bytes, at most %d", len(req.Stdin), maxStdin)
	}
	if req.TimeoutMs < 0 || req.TimeoutMs > maxTimeoutMs {
		return errdefs.New(errdefs.InvalidArgument, "timeout_ms: %d is outside 0..%d", req.TimeoutMs, maxTimeoutMs)
	}
	if req.MaxOutputBytes < 0 || req.MaxOutputBytes > maxOutput {
		return errdefs.New(errdefs.InvalidArgument, "max_output_bytes: %d is outside 0..%d", req.MaxOutputBytes, maxOutput)
	}
	return nil
}
