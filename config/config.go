// Package config is berth serve's configuration: one typed struct whose fields are serve's flags and, by the same names, the keys of its YAML file.
package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/cli"
	"github.com/berthsh/berth/daemon"
	"github.com/berthsh/berth/hostcheck"
)

// DefaultPath is the config file serve reads when it exists and --config
// names none.
const DefaultPath = "/etc/berth/config.yaml"

// Config is every setting of `berth serve`. Each field is one flag, and the
// key of the same name (its yaml tag) in the config file; Bind registers
// the flags, Load applies a file under them.
type Config struct {
	// Listen is the TCP address of the API (empty: the unix socket only),
	// loopback unless InsecureRemoteAPI.
	Listen string `yaml:"listen"`
	// InsecureRemoteAPI allows a Listen address other than loopback.
	InsecureRemoteAPI bool `yaml:"insecure-remote-api"`
	// InsecureNoAuth serves the TCP API without API keys (loopback only).
	InsecureNoAuth bool `yaml:"insecure-no-auth"`
	// Domain is the domain of sandboxes' ports in host form,
	// {port}-{id}.DOMAIN.
	Domain string `yaml:"domain"`
	// AllowedHosts are host names clients use to reach the API, besides IP
	// addresses and localhost (a reverse proxy's name).
	AllowedHosts []string `yaml:"allowed-host"`
	// StateDir holds the store, the API socket and sandboxes' state.
	StateDir string `yaml:"state-dir"`
	// DefaultRuntime runs sandboxes whose create names no runtime.
	DefaultRuntime string `yaml:"default-runtime"`
	// Runsc is the gvisor runtime's runsc binary ("" finds it on PATH).
	Runsc string `yaml:"runsc"`
	// RunscPlatform is the gvisor runtime's platform: systrap, kvm or ptrace.
	RunscPlatform string `yaml:"runsc-platform"`
	// DefaultPids is the pids limit of sandboxes that set none (0: none).
	DefaultPids int64 `yaml:"default-pids"`
	// DefaultIdleTimeout stops sandboxes idle this long (0: never).
	DefaultIdleTimeout time.Duration `yaml:"default-idle-timeout"`
	// DefaultDeleteAfter deletes sandboxes this long after they stopped
	// (0: never).
	DefaultDeleteAfter time.Duration `yaml:"default-delete-after"`
	// DefaultArchiveAfter archives stopped sandboxes' files this long after
	// they stopped (0: never).
	DefaultArchiveAfter time.Duration `yaml:"default-archive-after"`
	// DefaultMaxLifetime stops sandboxes this long after creation (0: never).
	DefaultMaxLifetime time.Duration `yaml:"default-max-lifetime"`
	// WarmPool are warm pools: "N" for the default image, "IMAGE=N" for
	// another.
	WarmPool []string `yaml:"warm-pool"`
	// SpareGuests is how many sandbox inits are kept started ahead of time,
	// for any image and spec (0: none).
	SpareGuests int `yaml:"spare-guests"`
	// InsecureRegistries are registries (host[:port]) spoken to over plain
	// HTTP.
	InsecureRegistries []string `yaml:"insecure-registry"`
	// NoSeccomp leaves sandboxes without berth's seccomp profile
	// (debugging only).
	NoSeccomp bool `yaml:"no-seccomp"`
	// NoIDMappedLayers gives sandboxes shifted copies of image layers even
	// where the kernel can idmap them.
	NoIDMappedLayers bool `yaml:"no-idmapped-layers"`
	// ExecOutputBudget is the output plain execs may hold in the daemon
	// together, a size such as 512M.
	ExecOutputBudget string `yaml:"exec-output-budget"`
	// DefaultNetwork is the network mode of sandboxes whose create names
	// none: none, allowlist or open.
	DefaultNetwork string `yaml:"default-network"`
	// EgressNetns is the network namespace (a path such as /run/netns/NAME)
	// that sandboxes' connections leave from ("" is the daemon's own).
	EgressNetns string `yaml:"egress-netns"`
	// EgressDNS are upstream resolvers, ip or ip:port ("" reads
	// /etc/resolv.conf).
	EgressDNS []string `yaml:"egress-dns"`
	// EgressCA is a PEM file of CA certificates to trust, besides the
	// host's, when verifying the hosts secrets are bound to.
	EgressCA string `yaml:"egress-ca"`
	// Debug logs at debug level.
	Debug bool `yaml:"debug"`
}

// Bind registers serve's flags on fs, each bound to its field of c and
// holding its default.
func (c *Config) Bind(f *pflag.FlagSet) {
	f.StringVar(&c.Listen, "listen", "127.0.0.1:7680", "TCP address of the API (empty: unix socket only); loopback unless --insecure-remote-api")
	f.BoolVar(&c.InsecureRemoteAPI, "insecure-remote-api", false, "allow a --listen address other than loopback, over plain HTTP (API keys travel in clear: put TLS in front)")
	f.BoolVar(&c.InsecureNoAuth, "insecure-no-auth", false, "serve the TCP API without API keys: whoever reaches it controls every sandbox (refused unless --listen is loopback)")
	f.StringVar(&c.Domain, "domain", api.DefaultDomain, "domain of sandboxes' ports in host form, {port}-{id}.DOMAIN (names under .localhost reach loopback in browsers and curl)")
	f.StringArrayVar(&c.AllowedHosts, "allowed-host", nil, "a host name clients use to reach the API, besides IP addresses and localhost (repeatable; others are refused, which stops DNS rebinding)")
	f.StringVar(&c.StateDir, "state-dir", "/var/lib/berth", "directory of the store, the API socket and sandbox state")
	f.StringVar(&c.DefaultRuntime, "default-runtime", "native", "runtime of sandboxes whose create names none: native or gvisor (see berth runtimes)")
	f.StringVar(&c.DefaultRuntime, "runtime", "native", "the old name of --default-runtime")
	f.MarkHidden("runtime")
	f.StringVar(&c.Runsc, "runsc", "", "runsc binary of the gvisor runtime (default: runsc on PATH; make runsc installs a pinned one)")
	f.StringVar(&c.RunscPlatform, "runsc-platform", "systrap", "gVisor platform of the gvisor runtime: systrap, kvm (where /dev/kvm works) or ptrace")
	f.Int64Var(&c.DefaultPids, "default-pids", 4096, "pids limit of sandboxes that set none (0: none)")
	f.DurationVar(&c.DefaultIdleTimeout, "default-idle-timeout", 15*time.Minute, "stop sandboxes idle this long, unless they set their own (0: never)")
	f.DurationVar(&c.DefaultDeleteAfter, "default-delete-after", 0, "delete sandboxes this long after they stopped, unless they set their own (0: never)")
	f.DurationVar(&c.DefaultArchiveAfter, "default-archive-after", 0, "archive sandboxes' files (compressed, their directory freed until start) this long after they stopped, unless they set their own (0: never)")
	f.DurationVar(&c.DefaultMaxLifetime, "default-max-lifetime", 0, "stop sandboxes this long after creation, unless they set their own (0: never)")
	f.StringArrayVar(&c.WarmPool, "warm-pool", []string{"2"}, "N: sandboxes of the default image kept booted ahead of time, so a create is a hand-over (0: none); IMAGE=N: a pool of another image (repeatable)")
	f.IntVar(&c.SpareGuests, "spare-guests", 2, "sandbox inits kept started ahead of time for any image and spec (namespaces, cgroup, runtime; no files): a create without a warm pool skips the spawn (0: none)")
	f.StringArrayVar(&c.InsecureRegistries, "insecure-registry", nil, "a registry (host[:port]) spoken to over plain HTTP (repeatable; loopback ones always are)")
	f.BoolVar(&c.NoSeccomp, "no-seccomp", false, "do not install the seccomp profile in sandboxes (debugging only)")
	f.BoolVar(&c.NoIDMappedLayers, "no-idmapped-layers", false, "give sandboxes shifted copies of image layers (one per id range) even where the kernel can idmap them")
	f.StringVar(&c.ExecOutputBudget, "exec-output-budget", "512M", "output that plain (not streamed) execs may hold in the daemon together; past it they fail with resource_exhausted")
	f.StringVar(&c.DefaultNetwork, "default-network", "none", "network mode of sandboxes whose create names none: none, allowlist (reaches nothing until a policy allows it) or open")
	f.StringVar(&c.EgressNetns, "egress-netns", "", "network namespace (a path such as /run/netns/NAME) that sandboxes' connections leave from (default: the daemon's own)")
	f.StringArrayVar(&c.EgressDNS, "egress-dns", nil, "upstream resolver, ip or ip:port (repeatable; default: the nameservers in /etc/resolv.conf)")
	f.StringVar(&c.EgressCA, "egress-ca", "", "PEM file of CA certificates to trust, besides the host's, when verifying the hosts secrets are bound to")
	f.BoolVar(&c.Debug, "debug", false, "log at debug level")
}

// Daemon turns c into the daemon's configuration, checking the values that
// flags take as text (sizes, pools).
func (c *Config) Daemon() (daemon.Config, error) {
	d := daemon.Config{
		Listen: c.Listen, RemoteAPI: c.InsecureRemoteAPI, NoAuth: c.InsecureNoAuth, Domain: c.Domain, AllowedHosts: c.AllowedHosts,
		StateDir: c.StateDir, DefaultRuntime: c.DefaultRuntime, InsecureRegistries: c.InsecureRegistries,
	}
	d.Gvisor.Runsc, d.Gvisor.Platform = c.Runsc, c.RunscPlatform
	d.DefaultLimits.Pids = c.DefaultPids
	d.DefaultTimeouts.Idle = c.DefaultIdleTimeout
	d.DefaultTimeouts.DeleteAfter = c.DefaultDeleteAfter
	d.DefaultTimeouts.ArchiveAfter = c.DefaultArchiveAfter
	d.DefaultTimeouts.MaxLifetime = c.DefaultMaxLifetime
	d.Native.NoSeccomp, d.Native.NoIDMappedLayers = c.NoSeccomp, c.NoIDMappedLayers
	d.Network.Default, d.Network.Netns, d.Network.DNS, d.Network.CAFile = c.DefaultNetwork, c.EgressNetns, c.EgressDNS, c.EgressCA
	if c.ExecOutputBudget != "" {
		n, err := cli.ParseSize(c.ExecOutputBudget)
		if err != nil || n <= 0 {
			return daemon.Config{}, fmt.Errorf("exec-output-budget %q: want a size such as 512M", c.ExecOutputBudget)
		}
		d.ExecOutputBudget = n
	}
	if c.SpareGuests < 0 {
		return daemon.Config{}, fmt.Errorf("spare-guests %d: want 0 or more", c.SpareGuests)
	}
	d.SpareGuests = c.SpareGuests
	for _, p := range c.WarmPool {
		img, size, named := strings.Cut(p, "=")
		if !named {
			img, size = "", p
		}
		n, err := strconv.Atoi(size)
		if err != nil || n < 0 {
			return daemon.Config{}, fmt.Errorf("warm-pool %q: want N or IMAGE=N", p)
		}
		if !named {
			d.WarmPool = n
			continue
		}
		if d.WarmPools == nil {
			d.WarmPools = map[string]int{}
		}
		d.WarmPools[img] = n
	}
	return d, nil
}

// HostCheck is what berth doctor (and serve's start-up check) looks at.
func (c *Config) HostCheck() hostcheck.Options {
	return hostcheck.Options{StateDir: c.StateDir, Runsc: c.Runsc, RunscPlatform: c.RunscPlatform,
		NoSeccomp: c.NoSeccomp, NoIDMappedLayers: c.NoIDMappedLayers}
}
