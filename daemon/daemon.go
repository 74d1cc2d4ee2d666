// Package daemon assembles berth's subsystems (store, images, runtimes,
// sandbox manager, HTTP edge) into one value and runs it until its context
// ends.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/audit"
	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/compat/e2b"
	"github.com/berthsh/berth/dashboard"
	"github.com/berthsh/berth/hostcheck"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/internal/guestbin"
	"github.com/berthsh/berth/ports"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/gvisor"
	"github.com/berthsh/berth/runtime/native"
	"github.com/berthsh/berth/sandbox"
	"github.com/berthsh/berth/server"
	"github.com/berthsh/berth/store"
	"github.com/berthsh/berth/template"
)

// Config is the daemon's typed configuration.
type Config struct {
	// Listen is the TCP address of the API (empty: unix socket only). It
	// must be a loopback address unless RemoteAPI is set: the API is plain
	// HTTP, and its keys would travel in clear.
	Listen string
	// RemoteAPI allows a Listen address other than loopback.
	RemoteAPI bool
	// NoAuth serves the TCP API without API keys, every request acting for
	// the operator; refused unless Listen is loopback.
	NoAuth bool
	// AuditKeep bounds the audit table (audit.DefaultKeep when 0).
	AuditKeep int64
	// AllowedHosts are host names, beyond IP addresses and localhost, by
	// which clients reach the API (a reverse proxy's name).
	AllowedHosts []string
	// Domain is the domain of sandboxes' ports in host form,
	// {port}-{id}.{Domain} (api.DefaultDomain when empty).
	Domain string
	// StateDir holds the store, the unix socket and every runtime's state.
	StateDir string
	// GuestBinary is the binary run as each sandbox's init (`GuestBinary
	// guest`). Default: the lean guest embedded in this berth (make build),
	// else this executable.
	GuestBinary string
	// DefaultRuntime is the runtime used when a request names none.
	DefaultRuntime string
	// DefaultLimits apply where a create request leaves a limit at zero.
	DefaultLimits api.Limits
	// DefaultTimeouts apply where a create request leaves a timeout out.
	DefaultTimeouts sandbox.TimeoutDefaults
	// WarmPool is how many default sandboxes are kept booted ahead of time.
	WarmPool int
	// WarmPools are pools of other images, by image reference.
	WarmPools map[string]int
	// SpareGuests is how many inits are kept started ahead of their
	// sandboxes (sandbox.Config.SpareGuests).
	SpareGuests int
	// InsecureRegistries are registries (host[:port]) spoken to over plain
	// HTTP. Credentials for private ones come from the daemon's Docker
	// configuration ($DOCKER_CONFIG/config.json and credential helpers).
	InsecureRegistries []string
	// ExecOutputBudget bounds the output plain execs hold in the daemon
	// together (sandbox.DefaultExecOutputBudget when zero).
	ExecOutputBudget int64
	// IDMap maps sandboxes' user and group ids to the host's
	// (runtime.DefaultIDMap when zero).
	IDMap runtime.IDMap
	// Native tunes the native runtime.
	Native native.Options
	// Gvisor tunes the gvisor runtime.
	Gvisor gvisor.Options
	// Network is the daemon's egress.
	Network NetworkConfig
}

// SocketName is the API's unix socket in the state dir.
const SocketName = "berth.sock"

// Daemon is every subsystem of a running berth, by name.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	Store    *store.Store
	Images   *image.Store
	Runtimes map[string]runtime.Runtime
	Manager  *sandbox.Manager
	Server   *server.Server
	closers  []func() error
}

// New builds the daemon: it opens the store, starts every runtime that can
// work on this host (saying why the others cannot), and re-attaches sandboxes.
func New(ctx context.Context, cfg Config, log *slog.Logger) (_ *Daemon, err error) {
	if cfg.StateDir == "" {
		return nil, errors.New("no state dir")
	}
	if cfg.DefaultRuntime == "" {
		cfg.DefaultRuntime = native.Name
	}
	if err := checkListen(cfg.Listen, cfg.RemoteAPI); err != nil {
		return nil, err
	}
	if cfg.NoAuth && cfg.Listen != "" && !isLoopback(cfg.Listen) {
		return nil, fmt.Errorf("--insecure-no-auth with --listen %q: a daemon without API keys listens on loopback only", cfg.Listen)
	}
	if err := checkHost(ctx, cfg); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if cfg.GuestBinary == "" {
		guest, err := guestbin.Install(filepath.Join(cfg.StateDir, "bin"))
		if err != nil {
			return nil, err
		}
		if guest == "" {
			if guest, err = os.Executable(); err != nil {
				return nil, fmt.Errorf("find own executable: %w", err)
			}
			log.Info("sandboxes run this executable as their guest (built without the lean guest; make build embeds it)")
		}
		cfg.GuestBinary = guest
	}
	d := &Daemon{cfg: cfg, log: log, Runtimes: map[string]runtime.Runtime{}}
	lock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, lock.Close)
	defer func() {
		if err != nil {
			if cerr := d.Close(); cerr != nil {
				log.Error("failed start: close what was opened", "err", cerr)
			}
		}
	}()
	st, err := store.Open(ctx, filepath.Join(cfg.StateDir, "berth.db"))
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	d.Store = st
	d.closers = append(d.closers, st.Close)

	images, err := image.New(filepath.Join(cfg.StateDir, "images"), log.With("subsystem", "image"),
		image.WithCatalog(st), image.WithInsecureRegistries(cfg.InsecureRegistries))
	if err != nil {
		return nil, err
	}
	d.Images = images

	var reg runtime.Registry
	reg.Register(native.Name, native.Factory(cfg.Native))
	reg.Register(gvisor.Name, gvisor.Factory(cfg.Gvisor))
	unavailable := map[string]string{}
	for _, name := range reg.Names() {
		f, _ := reg.Factory(name)
		rt, err := f(runtime.Config{
			StateDir:    filepath.Join(cfg.StateDir, "runtimes", name),
			GuestBinary: cfg.GuestBinary,
			Log:         log.With("runtime", name),
		})
		if err != nil {
			log.Warn("runtime unavailable", "runtime", name, "why", err)
			unavailable[name] = err.Error()
			continue
		}
		d.Runtimes[name] = rt
		if c, ok := rt.(interface{ Close() error }); ok {
			d.closers = append(d.closers, c.Close)
		}
	}
	if _, ok := d.Runtimes[cfg.DefaultRuntime]; !ok {
		if why, known := unavailable[cfg.DefaultRuntime]; known {
			return nil, fmt.Errorf("default runtime %q cannot run on this host: %s", cfg.DefaultRuntime, why)
		}
		return nil, fmt.Errorf("default runtime %q is not one berth has (have %v)", cfg.DefaultRuntime, reg.Names())
	}
	// Plain execs hold output up to the budget; a soft memory limit a little
	// above it makes the collector return what finished execs held, instead
	// of letting the heap grow to twice its peak first. GOMEMLIMIT wins.
	if os.Getenv("GOMEMLIMIT") == "" {
		budget := cfg.ExecOutputBudget
		if budget == 0 {
			budget = sandbox.DefaultExecOutputBudget
		}
		debug.SetMemoryLimit(budget + 256<<20)
	}
	var m *sandbox.Manager
	netSvc, closeNet, noNet, err := startNetwork(cfg.Network, cfg.Listen, st,
		func(id string, rec api.EgressRecord) { m.RecordEgress(id, rec) }, log.With("subsystem", "network"))
	if err != nil {
		return nil, err
	}
	if closeNet != nil {
		d.closers = append(d.closers, closeNet)
	}
	if noNet != "" {
		log.Warn("sandboxes get no network here: creates that ask for one fail", "why", noNet)
		if cfg.Network.Default != "" && cfg.Network.Default != api.NetworkNone {
			return nil, fmt.Errorf("--default-network %s: this daemon gives sandboxes no network: %s", cfg.Network.Default, noNet)
		}
	}
	m, err = sandbox.New(sandbox.Config{DefaultRuntime: cfg.DefaultRuntime, Unavailable: unavailable, IDMap: cfg.IDMap,
		DefaultLimits: cfg.DefaultLimits, DefaultTimeouts: cfg.DefaultTimeouts, WarmPool: cfg.WarmPool, WarmPools: cfg.WarmPools, SpareGuests: cfg.SpareGuests,
		ExecOutputBudget: cfg.ExecOutputBudget, DefaultNetwork: cfg.Network.Default,
		Network: netSvc, NetworkUnavailable: noNet}, st, d.Runtimes, images, log)
	if err != nil {
		return nil, err
	}
	d.Manager = m
	d.closers = append(d.closers, func() error { m.Close(); return nil })
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	// Metrics: the manager's sandboxes and the daemon process's own.
	metricsReg := prometheus.NewRegistry()
	metricsReg.MustRegister(m.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := promhttp.HandlerFor(metricsReg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)})
	if cfg.Domain == "" {
		cfg.Domain = api.DefaultDomain
	}
	proxy := ports.New(ports.Config{Domain: cfg.Domain, Log: log, TokenHeaders: []string{e2b.HeaderTrafficToken}}, m)
	d.closers = append(d.closers, func() error { proxy.Close(); return nil })
	e2bGroup := e2b.New(e2b.Config{Domain: e2bDomain(cfg.Domain, cfg.Listen), Log: log.With("subsystem", "e2b")}, m, images)
	d.closers = append(d.closers, func() error { e2bGroup.Close(); return nil })
	builder, err := template.New(images, st, m, filepath.Join(cfg.StateDir, "builds"), log.With("subsystem", "template"))
	if err != nil {
		return nil, err
	}
	if err := builder.Sweep(ctx); err != nil {
		log.Warn("template builds: the sandboxes of interrupted builds", "err", err)
	}
	keys, err := auth.NewKeyring(ctx, st, nil)
	if err != nil {
		return nil, err
	}
	var authn func(string) (auth.Principal, error)
	if !cfg.NoAuth {
		authn = keys.Authenticate
		if err := firstKey(ctx, keys, filepath.Join(cfg.StateDir, AdminKeyName), log); err != nil {
			return nil, err
		}
	} else {
		log.Warn("the TCP API takes requests without API keys (--insecure-no-auth): every local process controls every sandbox", "listen", cfg.Listen)
	}
	auditLog := audit.New(st, log.With("subsystem", "audit"), cfg.AuditKeep)
	d.closers = append(d.closers, func() error { auditLog.Close(); return nil })
	d.Server = server.New(server.Config{Log: log, Hosts: cfg.AllowedHosts, Authenticate: authn, Auditor: auditLog},
		server.API(m, metrics, server.WithPortsDomain(cfg.Domain)),
		server.ImagesAPI(images, m), server.TemplatesAPI(builder, images), server.KeysAPI(keys, auditLog), server.TenantsAPI(m), e2bGroup, proxy, dashboard.New())
	return d, nil
}

// AdminKeyName is the file in the state dir that holds the admin key the
// daemon made on its first start (mode 0600: root's), for the operator's
// clients on this host (export BERTH_API_KEY=$(cat …)).
const AdminKeyName = "admin.key"

// firstKey makes an admin key and writes it to path when path does not
// exist: a daemon's first start, or an operator who removed the file to
// get a new key (the old one works until revoked). The key is never
// logged; the path is.
func firstKey(ctx context.Context, keys *auth.Keyring, path string, log *slog.Logger) error {
	if _, err := os.Lstat(path); err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	k, err := keys.Create(ctx, api.CreateAPIKeyRequest{Scope: api.ScopeAdmin, Name: "made on first start (" + AdminKeyName + ")"})
	if err != nil {
		return fmt.Errorf("first admin key: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(k.Key+"\n"), 0o600); err != nil {
		return fmt.Errorf("first admin key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("first admin key: %w", err)
	}
	log.Info("made an admin API key: clients on this host use it with export BERTH_API_KEY=$(cat "+path+")", "key", k.ID, "file", path)
	return nil
}

// HostError is a start refused because checks that every create needs
// failed on this host.
type HostError struct {
	Failed []hostcheck.Result
}

func (e *HostError) Error() string {
	msgs := make([]string, len(e.Failed))
	for i, r := range e.Failed {
		msgs[i] = r.Error()
	}
	return "this host cannot run sandboxes (berth doctor checks it all):\n  " + strings.Join(msgs, "\n  ")
}

// checkHost runs berth doctor's checks that every create needs, and refuses
// to start, with each failure's fix, where one fails (a *HostError).
func checkHost(ctx context.Context, cfg Config) error {
	failed := hostcheck.Failed(hostcheck.Startup(ctx, hostcheck.Options{StateDir: cfg.StateDir, GuestBinary: cfg.GuestBinary,
		NoSeccomp: cfg.Native.NoSeccomp, CgroupRoot: cfg.Native.CgroupRoot}))
	if len(failed) == 0 {
		return nil
	}
	return &HostError{Failed: failed}
}

// Close releases the daemon's resources in reverse order. Sandboxes keep running.
func (d *Daemon) Close() error {
	var errs []error
	for i := len(d.closers) - 1; i >= 0; i-- {
		errs = append(errs, d.closers[i]())
	}
	d.closers = nil
	return errors.Join(errs...)
}

// Serve serves the API on the configured TCP address and on the unix socket
// until ctx ends, then shuts the listeners down gracefully.
func (d *Daemon) Serve(ctx context.Context, ready func()) error {
	var listeners []net.Listener
	sock := filepath.Join(d.cfg.StateDir, SocketName)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	ul, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	// The socket is the root-only way in: it must not stay open to others.
	if err := os.Chmod(sock, 0o600); err != nil {
		ul.Close()
		return fmt.Errorf("restrict %s: %w", sock, err)
	}
	listeners = append(listeners, ul)
	if d.cfg.Listen != "" {
		tl, err := net.Listen("tcp", d.cfg.Listen)
		if err != nil {
			ul.Close()
			return fmt.Errorf("listen on %s: %w", d.cfg.Listen, err)
		}
		listeners = append(listeners, tl)
	}
	srv := newHTTPServer(d.Server, server.IdleTimeout)
	errc := make(chan error, len(listeners))
	for _, l := range listeners {
		d.log.Info("serving", "addr", l.Addr().String())
		go func() { errc <- srv.Serve(l) }()
	}
	if ready != nil {
		ready()
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		d.log.Warn("requests still open after 5s; closing them", "err", err)
		srv.Close()
	}
	for range len(listeners) - boolInt(serveErr != nil) {
		<-errc
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}

// LockName is the lock file in the state dir; it holds the pid of the
// daemon that owns the dir.
const LockName = "berth.lock"

// newHTTPServer is the daemon's HTTP server for h: HTTP/1.1 and HTTP/2
// without TLS (prior knowledge), since E2B's SDKs speak it by default and
// Connect's streams ride it; a request's headers must arrive within 10s,
// and a connection with no request open is closed after idle. Open
// streams, WebSockets and other hijacked connections are not idle.
func newHTTPServer(h http.Handler, idle time.Duration) *http.Server {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idle, Protocols: protocols}
}

// lockStateDir takes the state dir for this daemon alone (an flock that the
// kernel drops when the daemon exits, kill -9 included): a second daemon
// would re-attach the first one's sandboxes, delete its warm pool and
// remove the socket it serves.
func lockStateDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		owner, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("state dir %s is in use by another berth daemon (pid %s, lock %s): stop it, or give this one another --state-dir",
				dir, strings.TrimSpace(string(owner)), path)
		}
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	return f, nil
}

// checkListen refuses a TCP address that is not loopback unless remote is
// set: anyone who reaches the API controls every sandbox.
func checkListen(addr string, remote bool) error {
	if addr == "" || remote {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	if isLoopback(addr) {
		return nil
	}
	return fmt.Errorf("--listen %q is not a loopback address: the API is plain HTTP, so its API keys would travel in clear; "+
		"listen on 127.0.0.1 behind a TLS proxy, or pass --insecure-remote-api if the network is trusted", addr)
}

// isLoopback says whether the TCP address addr is on loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// e2bDomain is the sandbox domain E2B's SDKs build hosts from: the ports'
// domain and the port the daemon listens on (none for 80), so that
// {port}-{id}.{domain} reaches the daemon.
func e2bDomain(domain, listen string) string {
	_, port, err := net.SplitHostPort(listen)
	if err != nil || port == "" || port == "80" {
		return domain
	}
	return domain + ":" + port
}
