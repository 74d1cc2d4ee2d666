// Command berth is the berth daemon (`berth serve`), its CLI, and the guest
// agent that runs as every sandbox's init (`berth guest`, hidden).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/cli"
	"github.com/berthsh/berth/daemon"
	"github.com/berthsh/berth/guest"
	"github.com/berthsh/berth/internal/fds"
)

func main() {
	// The guest is every sandbox's init: start it before building the CLI,
	// since each millisecond here is a millisecond of every create.
	if len(os.Args) >= 2 && os.Args[1] == "guest" {
		if err := guest.Command(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "berth guest:", err)
			os.Exit(1)
		}
		return
	}
	root := &cobra.Command{
		Use:           "berth",
		Short:         "berth gives every AI agent its own disposable, isolated computer",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCommand())
	cli.AddCommands(root)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		var exit *cli.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.Code)
		}
		fmt.Fprintln(os.Stderr, "berth:", err)
		os.Exit(1)
	}
}

func serveCommand() *cobra.Command {
	var cfg daemon.Config
	var debug bool
	var outputBudget string
	var pools []string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the berth daemon",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if outputBudget != "" {
				n, err := cli.ParseSize(outputBudget)
				if err != nil || n <= 0 {
					return fmt.Errorf("--exec-output-budget %q: want a size such as 512M", outputBudget)
				}
				cfg.ExecOutputBudget = n
			}
			for _, p := range pools {
				img, size, named := strings.Cut(p, "=")
				if !named {
					img, size = "", p
				}
				n, err := strconv.Atoi(size)
				if err != nil || n < 0 {
					return fmt.Errorf("--warm-pool %q: want N or IMAGE=N", p)
				}
				if !named {
					cfg.WarmPool = n
					continue
				}
				if cfg.WarmPools == nil {
					cfg.WarmPools = map[string]int{}
				}
				cfg.WarmPools[img] = n
			}
			// Whatever started the daemon may have left descriptors open;
			// none of them may reach a sandbox.
			if err := fds.CloseOnExecFrom(3); err != nil {
				return fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
			}
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			d, err := daemon.New(cmd.Context(), cfg, log)
			if err != nil {
				return err
			}
			defer d.Close()
			return d.Serve(cmd.Context(), func() { log.Info("berth ready", "listen", cfg.Listen, "state_dir", cfg.StateDir) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7680", "TCP address of the API (empty: unix socket only); loopback unless --insecure-remote-api")
	f.BoolVar(&cfg.RemoteAPI, "insecure-remote-api", false, "allow a --listen address other than loopback (there are no API keys yet: whoever reaches it controls every sandbox)")
	f.StringVar(&cfg.Domain, "domain", api.DefaultDomain, "domain of sandboxes' ports in host form, {port}-{id}.DOMAIN (names under .localhost reach loopback in browsers and curl)")
	f.StringArrayVar(&cfg.AllowedHosts, "allowed-host", nil, "a host name clients use to reach the API, besides IP addresses and localhost (repeatable; others are refused, which stops DNS rebinding)")
	f.StringVar(&cfg.StateDir, "state-dir", "/var/lib/berth", "directory of the store, the API socket and sandbox state")
	f.StringVar(&cfg.DefaultRuntime, "default-runtime", "native", "runtime of sandboxes whose create names none: native or gvisor (see berth runtimes)")
	f.StringVar(&cfg.DefaultRuntime, "runtime", "native", "the old name of --default-runtime")
	f.MarkHidden("runtime")
	f.StringVar(&cfg.Gvisor.Runsc, "runsc", "", "runsc binary of the gvisor runtime (default: runsc on PATH; make runsc installs a pinned one)")
	f.StringVar(&cfg.Gvisor.Platform, "runsc-platform", "systrap", "gVisor platform of the gvisor runtime: systrap, kvm (where /dev/kvm works) or ptrace")
	f.Int64Var(&cfg.DefaultLimits.Pids, "default-pids", 4096, "pids limit of sandboxes that set none (0: none)")
	f.DurationVar(&cfg.DefaultTimeouts.Idle, "default-idle-timeout", 15*time.Minute, "stop sandboxes idle this long, unless they set their own (0: never)")
	f.DurationVar(&cfg.DefaultTimeouts.DeleteAfter, "default-delete-after", 0, "delete sandboxes this long after they stopped, unless they set their own (0: never)")
	f.DurationVar(&cfg.DefaultTimeouts.ArchiveAfter, "default-archive-after", 0, "archive sandboxes' files (compressed, their directory freed until start) this long after they stopped, unless they set their own (0: never)")
	f.DurationVar(&cfg.DefaultTimeouts.MaxLifetime, "default-max-lifetime", 0, "stop sandboxes this long after creation, unless they set their own (0: never)")
	f.StringArrayVar(&pools, "warm-pool", []string{"2"}, "N: sandboxes of the default image kept booted ahead of time, so a create is a hand-over (0: none); IMAGE=N: a pool of another image (repeatable)")
	f.StringArrayVar(&cfg.InsecureRegistries, "insecure-registry", nil, "a registry (host[:port]) spoken to over plain HTTP (repeatable; loopback ones always are)")
	f.BoolVar(&cfg.Native.NoSeccomp, "no-seccomp", false, "do not install the seccomp profile in sandboxes (debugging only)")
	f.BoolVar(&cfg.Native.NoIDMappedLayers, "no-idmapped-layers", false, "give sandboxes shifted copies of image layers (one per id range) even where the kernel can idmap them")
	f.StringVar(&outputBudget, "exec-output-budget", "512M", "output that plain (not streamed) execs may hold in the daemon together; past it they fail with resource_exhausted")
	f.StringVar(&cfg.Network.Default, "default-network", "none", "network mode of sandboxes whose create names none: none, allowlist (reaches nothing until a policy allows it) or open")
	f.StringVar(&cfg.Network.Netns, "egress-netns", "", "network namespace (a path such as /run/netns/NAME) that sandboxes' connections leave from (default: the daemon's own)")
	f.StringArrayVar(&cfg.Network.DNS, "egress-dns", nil, "upstream resolver, ip or ip:port (repeatable; default: the nameservers in /etc/resolv.conf)")
	f.StringVar(&cfg.Network.CAFile, "egress-ca", "", "PEM file of CA certificates to trust, besides the host's, when verifying the hosts secrets are bound to")
	f.BoolVar(&debug, "debug", false, "log at debug level")
	return cmd
}
