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
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/berthsh/berth/cli"
	"github.com/berthsh/berth/config"
	"github.com/berthsh/berth/daemon"
	"github.com/berthsh/berth/guest"
	"github.com/berthsh/berth/hostcheck"
	"github.com/berthsh/berth/internal/fds"
	"github.com/berthsh/berth/internal/sdnotify"
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
	root.AddCommand(serveCommand(), doctorCommand())
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
		var host *daemon.HostError
		var conf *configError
		if errors.As(err, &host) || errors.As(err, &conf) {
			// EX_CONFIG: the systemd unit does not restart on it.
			os.Exit(exitConfig)
		}
		os.Exit(1)
	}
}

// exitConfig (78, EX_CONFIG in sysexits.h) is serve's exit status when the
// host or the configuration cannot work: restarting will not help.
const exitConfig = 78

// configError is a config file or setting that cannot work.
type configError struct{ error }

func (e *configError) Unwrap() error { return e.error }

func serveCommand() *cobra.Command {
	var cfg config.Config
	var printConfig bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the berth daemon",
		Long: "serve runs the berth daemon. Every flag can be set in a YAML config file, under the flag's name: " +
			config.DefaultPath + " when it exists, or the file --config names. A flag given on the command line wins over " +
			"the file, the file over the default. It refuses to start where berth doctor finds a check that every create needs failing.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadConfig(cmd); err != nil {
				return err
			}
			if printConfig {
				out, err := config.Print(cmd.Flags(), false)
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(out)
				return err
			}
			dcfg, err := cfg.Daemon()
			if err != nil {
				return &configError{err}
			}
			systemd := sdnotify.FromEnv()
			// Whatever started the daemon may have left descriptors open;
			// none of them may reach a sandbox.
			if err := fds.CloseOnExecFrom(3); err != nil {
				return fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
			}
			level := slog.LevelInfo
			if cfg.Debug {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			d, err := daemon.New(cmd.Context(), dcfg, log)
			if err != nil {
				return err
			}
			defer d.Close()
			return d.Serve(cmd.Context(), func() {
				log.Info("berth ready", "listen", dcfg.Listen, "state_dir", dcfg.StateDir)
				if err := systemd.Notify(sdnotify.Ready); err != nil {
					log.Warn("tell systemd the daemon is ready", "err", err)
				}
			})
		},
	}
	cfg.Bind(cmd.Flags())
	addConfigFlag(cmd)
	cmd.Flags().BoolVar(&printConfig, config.PrintFlag, false, "print the effective configuration (flags over config file over defaults) as a config file, and exit")
	return cmd
}

// doctorCommand is berth doctor with serve's flags and config file.
func doctorCommand() *cobra.Command {
	return cli.DoctorCommand(func(cmd *cobra.Command) func() (hostcheck.Options, error) {
		var cfg config.Config
		cfg.Bind(cmd.Flags())
		addConfigFlag(cmd)
		// It takes every serve flag (a command line copied from serve
		// works); its help shows those that change a check.
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			switch f.Name {
			case "state-dir", "runsc", "runsc-platform", "no-seccomp", "no-idmapped-layers", config.FileFlag:
			default:
				f.Hidden = true
			}
		})
		return func() (hostcheck.Options, error) {
			if err := loadConfig(cmd); err != nil {
				return hostcheck.Options{}, errors.Unwrap(err) // doctor exits 1, not serve's 78
			}
			return cfg.HostCheck(), nil
		}
	})
}

func addConfigFlag(cmd *cobra.Command) {
	cmd.Flags().String(config.FileFlag, config.DefaultPath, "YAML file of settings, keyed by these flags' names (the default is read when it exists; \"\" reads none; flags given here win)")
}

// loadConfig applies the config file, if any, under cmd's flags.
func loadConfig(cmd *cobra.Command) error {
	path, err := config.Path(cmd.Flags())
	if err == nil && path != "" {
		err = config.Load(path, cmd.Flags())
	}
	if err != nil {
		return &configError{err}
	}
	return nil
}
