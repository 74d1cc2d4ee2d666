// Package cli holds berth's user commands (create, exec, run, ls, inspect,
// rm, ps, kill, logs), thin over the Go client and shaped like docker's.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

// ExitError carries a command's exit code to main. A command returns it,
// after writing whatever it had to say to stderr, to end berth with Code;
// main must check for it with errors.As(err, new(*ExitError)) and call
// os.Exit(Code) without printing anything, and print every other error as
// "berth: <err>" before exiting 1.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return "exit status " + strconv.Itoa(e.Code) }

// AddCommands adds the user commands and the --url flag to root.
func AddCommands(root *cobra.Command) {
	def := os.Getenv("BERTH_URL")
	if def == "" {
		def = client.DefaultURL
	}
	url := root.PersistentFlags().String("url", def, "berth daemon URL: http://host:port or unix:///path (env BERTH_URL); the API key is $BERTH_API_KEY, else the file $BERTH_API_KEY_FILE or "+DefaultKeyFile+" when readable")
	connect := func() (*client.Client, error) {
		return client.New(*url, client.WithAPIKey(apiKey(*url)))
	}
	root.AddCommand(
		createCommand(connect), execCommand(connect), runCommand(connect), lsCommand(connect),
		inspectCommand(connect), rmCommand(connect), psCommand(connect), killCommand(connect), logsCommand(connect),
		stopCommand(connect), startCommand(connect), labelCommand(connect), getOrCreateCommand(connect),
		statsCommand(connect), updateCommand(connect), eventsCommand(connect),
		cpCommand(connect), fsCommand(connect), runtimesCommand(connect),
		networkCommand(connect), secretCommand(connect), egressCommand(connect),
		portsCommand(connect), portForwardCommand(connect), shellCommand(connect), attachCommand(connect), accessTokenCommand(connect),
		imageCommand(connect), poolCommand(connect), templateCommand(connect),
		snapshotCommand(connect), forkCommand(connect), diffCommand(connect), applyCommand(connect),
		pauseCommand(connect), resumeCommand(connect), mcpCommand(connect),
		keyCommand(connect), auditCommand(connect), quotaCommand(connect), usageCommand(connect),
	)
}

type connector func() (*client.Client, error)

// createFlags are the flags of create and run.
type createFlags struct {
	image, runtime string
	workdir, user  string
	labels, env    []string
	limits         limitFlags
	net            networkFlags
	timeouts       timeoutFlags
	publicPorts    []int
	public         bool
	startCmd       string
	autoResume     bool
}

func (f *createFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", "", "image: host (the default), an OCI reference such as python:3.12-slim (pulled if need be), or an image id")
	fl.StringVar(&f.runtime, "runtime", "", "runtime, the isolation tier (default: the daemon's; see berth runtimes)")
	fl.StringArrayVarP(&f.labels, "label", "l", nil, "label k=v (repeatable)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable K=V (repeatable)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "default working directory")
	fl.StringVarP(&f.user, "user", "u", "", "default user (name or uid[:gid])")
	f.limits.add(cmd)
	f.net.add(cmd)
	f.timeouts.add(cmd)
	fl.IntSliceVar(&f.publicPorts, "public-port", nil, "a port inside served without the access token (repeatable)")
	fl.BoolVar(&f.public, "public", false, "serve every port inside without the access token")
	fl.StringVar(&f.startCmd, "start-cmd", "", "a command line started in the background each time the sandbox starts (a server)")
	fl.BoolVar(&f.autoResume, "auto-resume", false, "start the sandbox again when a request comes for one of its ports")
}

// ParseDuration reads a duration like time.ParseDuration, plus a "d" (day)
// unit, with "0" meaning never.
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a duration like 90s, 15m, 24h or 7d", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration like 90s, 15m, 24h or 7d", s)
	}
	return d, nil
}

func (f *createFlags) request() (api.CreateSandboxRequest, error) {
	req := api.CreateSandboxRequest{Image: f.image, Runtime: f.runtime, Workdir: f.workdir, User: f.user, PublicPorts: f.publicPorts,
		Public: f.public, StartCmd: f.startCmd}
	req.Timeouts.AutoResume = f.autoResume
	var err error
	if req.Labels, err = parsePairs("--label", f.labels); err != nil {
		return req, err
	}
	if req.Env, err = parsePairs("--env", f.env); err != nil {
		return req, err
	}
	if req.Limits, err = f.limits.value(); err != nil {
		return req, err
	}
	if req.Network, err = f.net.value(); err != nil {
		return req, err
	}
	_, err = f.timeouts.apply(&req.Timeouts)
	return req, err
}

// timeoutFlags are the lifetime flags of create, run and update.
type timeoutFlags struct{ idle, deleteAfter, archiveAfter, maxLifetime string }

func (f *timeoutFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.idle, "idle-timeout", "", "stop after this long without activity, e.g. 15m (0: never; default: the daemon's)")
	fl.StringVar(&f.deleteAfter, "delete-after", "", "delete this long after stopping, e.g. 24h (0: never)")
	fl.StringVar(&f.archiveAfter, "archive-after", "", "archive the files (compressed, restored at start) this long after stopping, e.g. 1h (0: never)")
	fl.StringVar(&f.maxLifetime, "max-lifetime", "", "stop this long after creation, e.g. 7d (0: never)")
}

// apply sets the timeouts the flags give in t; changed says whether any did.
func (f *timeoutFlags) apply(t *api.Timeouts) (changed bool, err error) {
	for _, x := range []struct {
		flag, val string
		dst       **int64
	}{
		{"--idle-timeout", f.idle, &t.IdleSeconds},
		{"--delete-after", f.deleteAfter, &t.DeleteAfterSeconds},
		{"--archive-after", f.archiveAfter, &t.ArchiveAfterSeconds},
		{"--max-lifetime", f.maxLifetime, &t.MaxLifetimeSeconds},
	} {
		if x.val == "" {
			continue
		}
		d, err := ParseDuration(x.val)
		if err != nil {
			return changed, fmt.Errorf("%s: %w", x.flag, err)
		}
		secs := int64(d / time.Second)
		*x.dst = &secs
		changed = true
	}
	return changed, nil
}

func parsePairs(flag string, items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", flag, it)
		}
		m[k] = v
	}
	return m, nil
}

// limitFlags are --memory, --cpus, --pids and --disk, for create, run and update.
type limitFlags struct {
	memory string
	cpus   float64
	pids   int64
	disk   string
	files  int64
}

func (f *limitFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.memory, "memory", "m", "", "memory limit, e.g. 512M or 2G")
	fl.Float64Var(&f.cpus, "cpus", 0, "CPU limit in cores, e.g. 0.5")
	fl.Int64Var(&f.pids, "pids", 0, "maximum number of processes and threads")
	fl.StringVar(&f.disk, "disk", "", "size of the writable layer's own disk, e.g. 1G (grows only)")
	fl.Int64Var(&f.files, "open-files", 0, "most open files per process (RLIMIT_NOFILE)")
}

func (f *limitFlags) value() (api.Limits, error) {
	l := api.Limits{CPUs: f.cpus, Pids: f.pids, OpenFiles: f.files}
	if f.cpus < 0 {
		return l, fmt.Errorf("--cpus: %g is negative", f.cpus)
	}
	if f.pids < 0 {
		return l, fmt.Errorf("--pids: %d is negative", f.pids)
	}
	if f.files < 0 {
		return l, fmt.Errorf("--open-files: %d is negative", f.files)
	}
	if f.memory != "" {
		var err error
		if l.MemoryBytes, err = ParseSize(f.memory); err != nil {
			return l, fmt.Errorf("--memory: %w", err)
		}
	}
	if f.disk != "" {
		var err error
		if l.DiskBytes, err = ParseSize(f.disk); err != nil {
			return l, fmt.Errorf("--disk: %w", err)
		}
	}
	return l, nil
}

// printJSON writes v indented, as inspect and stats show it.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ParseSize reads a byte size: a number (decimals allowed) with an optional
// K, M, G or T suffix, powers of 1024 like docker; "Ki", "KB" and "KiB"
// spellings mean the same, in any case, and a lone "B" means bytes.
func ParseSize(s string) (int64, error) {
	bad := fmt.Errorf("%q is not a size like 512M, 2G or 1.5Gi", s)
	t := strings.ToUpper(strings.TrimSpace(s))
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	if num == "" || strings.Count(num, ".") > 1 || num == "." {
		return 0, bad
	}
	mult := int64(1)
	if unit != "" && unit != "B" {
		shift := strings.IndexByte("KMGT", unit[0])
		rest := unit[1:]
		if shift < 0 || (rest != "" && rest != "I" && rest != "B" && rest != "IB") {
			return 0, bad
		}
		mult = 1 << (10 * (shift + 1))
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f*float64(mult) > 1<<62 {
		return 0, bad
	}
	return int64(f * float64(mult)), nil
}

// execFlags are the flags of exec and run.
type execFlags struct {
	interactive bool
	env         []string
	workdir     string
	user        string
	timeout     time.Duration
}

func (f *execFlags) add(cmd *cobra.Command, withEnv bool) {
	fl := cmd.Flags()
	fl.BoolVarP(&f.interactive, "interactive", "i", false, "send the CLI's standard input to the command")
	if withEnv {
		fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable K=V (repeatable)")
		fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory")
		fl.StringVarP(&f.user, "user", "u", "", "user (name or uid[:gid])")
	}
	fl.DurationVar(&f.timeout, "timeout", 0, "kill the command after this long (e.g. 30s; 0: never)")
}

func (f *execFlags) request(cmd *cobra.Command, argv []string) (api.ExecRequest, error) {
	req := api.ExecRequest{Cmd: argv, Cwd: f.workdir, User: f.user, TimeoutMs: f.timeout.Milliseconds()}
	if f.timeout < 0 {
		return req, fmt.Errorf("--timeout: %s is negative", f.timeout)
	}
	if f.timeout > 0 && req.TimeoutMs == 0 {
		req.TimeoutMs = 1
	}
	var err error
	if req.Env, err = parsePairs("--env", f.env); err != nil {
		return req, err
	}
	if f.interactive {
		if req.Stdin, err = io.ReadAll(cmd.InOrStdin()); err != nil {
			return req, fmt.Errorf("read stdin: %w", err)
		}
	}
	return req, nil
}

// streamExec runs req with live output and turns the result into an exit
// code; an interrupted exec (ctx cancelled: Ctrl-C) ends with 130.
func streamExec(ctx context.Context, cmd *cobra.Command, c *client.Client, id string, req api.ExecRequest) error {
	st, err := c.ExecStream(ctx, id, req)
	if err != nil {
		if ctx.Err() != nil {
			return interrupted(cmd)
		}
		return err
	}
	defer st.Close()
	res, err := st.Copy(cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		if ctx.Err() != nil {
			return interrupted(cmd)
		}
		return err
	}
	return exitFor(cmd.ErrOrStderr(), res, time.Duration(req.TimeoutMs)*time.Millisecond)
}

// interrupted says so on stderr and exits like a shell after SIGINT.
func interrupted(cmd *cobra.Command) error {
	fmt.Fprintln(cmd.ErrOrStderr(), "berth: interrupted")
	return &ExitError{Code: 130}
}

// exitFor reports on stderr what the exit code alone does not say (a start
// failure, truncated output, an OOM kill, a timeout) and returns the code:
// the command's own, 128+signal when a signal ended it, 124 on timeout.
func exitFor(stderr io.Writer, res api.ExecResult, timeout time.Duration) error {
	if res.Error != "" {
		fmt.Fprintf(stderr, "berth: %s\n", res.Error)
	}
	var truncated []string
	if res.StdoutTruncated {
		truncated = append(truncated, "stdout")
	}
	if res.StderrTruncated {
		truncated = append(truncated, "stderr")
	}
	if len(truncated) > 0 {
		fmt.Fprintf(stderr, "berth: %s truncated at the daemon's output limit\n", strings.Join(truncated, " and "))
	}
	if res.OOMKilled {
		fmt.Fprintln(stderr, "berth: killed at the sandbox's memory limit (out of memory)")
	}
	if res.TimedOut {
		if timeout > 0 {
			fmt.Fprintf(stderr, "berth: timed out after %s\n", timeout)
		} else {
			fmt.Fprintln(stderr, "berth: timed out")
		}
		return &ExitError{Code: 124}
	}
	code := res.ExitCode
	if code == 0 && res.Signal != 0 {
		code = 128 + res.Signal
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

// argvAfterDash splits "ID -- CMD ARGS" style arguments.
func argvAfterDash(cmd *cobra.Command, args []string, before int) ([]string, []string, error) {
	dash := cmd.ArgsLenAtDash()
	if dash < 0 {
		dash = before
	}
	if dash != before || len(args) <= before {
		return nil, nil, fmt.Errorf("usage: %s", cmd.UseLine())
	}
	return args[:before], args[before:], nil
}

func createCommand(connect connector) *cobra.Command {
	return createLike(connect, "create [flags]", "Create a sandbox and print its id",
		func(ctx context.Context, c *client.Client, req api.CreateSandboxRequest) (api.Sandbox, error) {
			return c.CreateSandbox(ctx, req)
		})
}

func getOrCreateCommand(connect connector) *cobra.Command {
	return createLike(connect, "get-or-create --label k=v [create flags]",
		"Print the id of the sandbox with these labels, creating (or starting) it if needed",
		func(ctx context.Context, c *client.Client, req api.CreateSandboxRequest) (api.Sandbox, error) {
			sb, _, err := c.GetOrCreate(ctx, req)
			return sb, err
		})
}

// createLike is a command that takes the create flags, makes one call, and
// prints the sandbox's id alone.
func createLike(connect connector, use, short string, call func(context.Context, *client.Client, api.CreateSandboxRequest) (api.Sandbox, error)) *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request()
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			sb, err := call(cmd.Context(), c, req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func execCommand(connect connector) *cobra.Command {
	var f execFlags
	var detach, tty bool
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- CMD [ARG...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its code",
		Long: "Run a command in a sandbox, streaming its output; exits with its code.\n" +
			"With -d it starts in the background instead and its PID is printed: berth ps, logs, kill act on it.\n" +
			"With -t (-it) it runs on a terminal, interactively, like berth shell.",
		Args: cobra.ArbitraryArgs, // argvAfterDash checks them, with the usage line
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, argv, err := argvAfterDash(cmd, args, 1)
			if err != nil {
				return err
			}
			if tty {
				if detach || f.timeout != 0 {
					return fmt.Errorf("-t: a terminal is interactive; it goes with neither -d nor --timeout")
				}
				env, err := parsePairs("--env", f.env)
				if err != nil {
					return err
				}
				c, err := connect()
				if err != nil {
					return err
				}
				return openTerminal(cmd, c, ids[0], client.TerminalOptions{Cmd: argv, User: f.user, Cwd: f.workdir, Env: env})
			}
			req, err := f.request(cmd, argv)
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			if detach {
				p, err := c.StartProcess(cmd.Context(), ids[0], req)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), p.Pid)
				return nil
			}
			return streamExec(cmd.Context(), cmd, c, ids[0], req)
		},
	}
	f.add(cmd, true)
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "start in the background and print the PID")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run on a terminal, interactively (with -i: -it)")
	return cmd
}

func runCommand(connect connector) *cobra.Command {
	var cf createFlags
	var ef execFlags
	remove := true
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "Create a sandbox, run one command in it, remove it; exits with the command's code",
		Args:  cobra.ArbitraryArgs, // argvAfterDash checks them, with the usage line
		RunE: func(cmd *cobra.Command, args []string) error {
			_, argv, err := argvAfterDash(cmd, args, 0)
			if err != nil {
				return err
			}
			creq, err := cf.request()
			if err != nil {
				return err
			}
			ereq, err := ef.request(cmd, argv)
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sb, err := c.CreateSandbox(ctx, creq)
			if err != nil {
				if ctx.Err() != nil {
					return interrupted(cmd)
				}
				return err
			}
			if remove {
				defer func() {
					// Remove after Ctrl-C too: ctx is gone by then, so a fresh one.
					dctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 30*time.Second)
					defer cancel()
					if err := c.DeleteSandbox(dctx, sb.ID); err != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "berth: remove %s: %v\n", sb.ID, err)
					}
				}()
			} else {
				fmt.Fprintf(cmd.ErrOrStderr(), "berth: sandbox %s kept\n", sb.ID)
			}
			return streamExec(ctx, cmd, c, sb.ID, ereq)
		},
	}
	cf.add(cmd)
	ef.add(cmd, false)
	cmd.Flags().BoolVar(&remove, "rm", true, "remove the sandbox when the command ends (--rm=false keeps it and names it on stderr)")
	return cmd
}

func lsCommand(connect connector) *cobra.Command {
	var labels []string
	var selector string
	var quiet bool
	cmd := &cobra.Command{
		Use:   "ls [--label k=v]... [--selector 'a=b,c!=d,e,!f']",
		Short: "List sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := parsePairs("--label", labels)
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			var list []api.Sandbox
			if selector != "" {
				for k, v := range sel {
					selector += "," + k + "=" + v
				}
				list, err = c.ListSandboxesSelector(cmd.Context(), selector)
			} else {
				list, err = c.ListSandboxes(cmd.Context(), sel)
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if quiet {
				for _, sb := range list {
					fmt.Fprintln(out, sb.ID)
				}
				return nil
			}
			writeTable(out, list, time.Now())
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label k=v (repeatable, ANDed)")
	cmd.Flags().StringVarP(&selector, "selector", "s", "", "label selector: k=v, k!=v, k (exists), !k (absent), comma-separated, ANDed")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print ids only")
	return cmd
}

func runtimesCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "runtimes",
		Short: "List the daemon's runtimes (isolation tiers) and what each can do here",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			list, err := c.Runtimes(cmd.Context())
			if err != nil {
				return err
			}
			writeRuntimes(cmd.OutOrStdout(), list)
			return nil
		},
	}
}

// writeRuntimes prints one line per runtime, then why each lacks what it lacks.
func writeRuntimes(out io.Writer, list []api.Runtime) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDEFAULT\tAVAILABLE\tLIMITS\tNETWORK\tSTOP/START\tUPDATE\tSTATS")
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	var notes []string
	for _, r := range list {
		if r.Capabilities == nil {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\n", r.Name, yes(r.Default), yes(r.Available))
			notes = append(notes, fmt.Sprintf("%s: unavailable: %s", r.Name, r.Reason))
			continue
		}
		c := r.Capabilities
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, yes(r.Default), yes(r.Available),
			strings.Join(c.Limits, ","), strings.Join(c.NetworkModes, ","), yes(c.StopStart), yes(c.UpdateLimits), yes(c.Stats))
		keys := make([]string, 0, len(c.Missing))
		for k := range c.Missing {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			notes = append(notes, fmt.Sprintf("%s: no %s: %s", r.Name, k, c.Missing[k]))
		}
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(out, n)
	}
}

func writeTable(out io.Writer, list []api.Sandbox, now time.Time) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tIMAGE\tCREATED\tLABELS")
	for _, sb := range list {
		keys := make([]string, 0, len(sb.Labels))
		for k := range sb.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + sb.Labels[k]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Image, ago(now.Sub(sb.CreatedAt)), strings.Join(parts, ","))
	}
	tw.Flush()
}

func ago(d time.Duration) string {
	switch {
	case d < 0: // the daemon's clock is ahead of ours
		return "0s ago"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd ago", int(d.Hours()/24))
	}
}

func inspectCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID...",
		Short: "Show sandboxes as JSON",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			var out []api.Sandbox
			for _, id := range args {
				sb, err := c.GetSandbox(cmd.Context(), id)
				if err != nil {
					return err
				}
				out = append(out, sb)
			}
			if len(out) == 1 {
				return printJSON(cmd.OutOrStdout(), out[0])
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
}

func rmCommand(connect connector) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm [-f] ID...",
		Short: "Remove sandboxes (every process, file and cgroup)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachSandbox(cmd, connect, args, func(c *client.Client, id string) (bool, error) {
				err := c.DeleteSandbox(cmd.Context(), id)
				if force && errdefs.IsNotFound(err) {
					return false, nil
				}
				return err == nil, err
			})
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "ignore sandboxes that do not exist")
	return cmd
}

func stopCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "stop ID...",
		Short: "Stop sandboxes: end their processes, keep their files",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachSandbox(cmd, connect, args, func(c *client.Client, id string) (bool, error) {
				_, err := c.StopSandbox(cmd.Context(), id)
				return err == nil, err
			})
		},
	}
}

func startCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "start ID...",
		Short: "Start stopped sandboxes again, with their files",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachSandbox(cmd, connect, args, func(c *client.Client, id string) (bool, error) {
				_, err := c.StartSandbox(cmd.Context(), id)
				return err == nil, err
			})
		},
	}
}

// eachSandbox runs fn for every id, printing the ids fn says to print and
// the errors of the others, and fails (exit 1) if any failed. A daemon that
// does not answer ends it at once, with that error.
func eachSandbox(cmd *cobra.Command, connect connector, ids []string, fn func(*client.Client, string) (bool, error)) error {
	c, err := connect()
	if err != nil {
		return err
	}
	var failed error
	for _, id := range ids {
		show, err := fn(c, id)
		if err != nil {
			if errdefs.IsUnavailable(err) {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "berth: %v\n", err)
			failed = &ExitError{Code: 1}
			continue
		}
		if show {
			fmt.Fprintln(cmd.OutOrStdout(), id)
		}
	}
	return failed
}

func labelCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "label ID k=v... k-...",
		Short: "Set (k=v) or remove (k-) labels of a sandbox",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			patch := map[string]*string{}
			for _, a := range args[1:] {
				if k, ok := strings.CutSuffix(a, "-"); ok && !strings.Contains(a, "=") {
					patch[k] = nil
					continue
				}
				k, v, ok := strings.Cut(a, "=")
				if !ok || k == "" {
					return fmt.Errorf("label %q: want k=v to set or k- to remove", a)
				}
				patch[k] = &v
			}
			c, err := connect()
			if err != nil {
				return err
			}
			sb, err := c.UpdateLabels(cmd.Context(), args[0], patch)
			if err != nil {
				return err
			}
			keys := make([]string, 0, len(sb.Labels))
			for k := range sb.Labels {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(cmd.OutOrStdout(), "%s=%s\n", k, sb.Labels[k])
			}
			return nil
		},
	}
}

func statsCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "stats ID",
		Short: "Show what a running sandbox uses now (JSON)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			u, err := c.Stats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), u)
		},
	}
}

func eventsCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "events ID",
		Short: "Follow a sandbox's events (one JSON object a line) until it is deleted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			st, err := c.Events(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer st.Close()
			enc := json.NewEncoder(cmd.OutOrStdout())
			for {
				ev, err := st.Next()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if err := enc.Encode(ev); err != nil {
					return err
				}
			}
		},
	}
}

func updateCommand(connect connector) *cobra.Command {
	var (
		f      limitFlags
		t      timeoutFlags
		public bool
	)
	cmd := &cobra.Command{
		Use:   "update [--memory 1G] [--cpus 2] [--pids 512] [--max-lifetime 2h] [--public=true|false] ID",
		Short: "Change a sandbox's limits (a running one's apply at once), timeouts or public ports",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req api.UpdateSandboxRequest
			l, err := f.value()
			if err != nil {
				return err
			}
			if l != (api.Limits{}) {
				req.Limits = &l
			}
			var to api.Timeouts
			changed, err := t.apply(&to)
			if err != nil {
				return err
			}
			if changed {
				req.Timeouts = &to
			}
			if cmd.Flags().Changed("public") {
				req.Public = &public
			}
			if req.Limits == nil && req.Timeouts == nil && req.Public == nil {
				return fmt.Errorf("nothing to change: give --memory, --cpus, --pids, a timeout (--max-lifetime, --idle-timeout, --delete-after, --archive-after) or --public")
			}
			c, err := connect()
			if err != nil {
				return err
			}
			sb, err := c.UpdateSandbox(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if req.Limits != nil {
				fmt.Fprintf(out, "cpus=%g memory_bytes=%d pids=%d\n", sb.Limits.CPUs, sb.Limits.MemoryBytes, sb.Limits.Pids)
			}
			if req.Timeouts != nil {
				secs := func(p *int64) int64 {
					if p == nil {
						return 0
					}
					return *p
				}
				tt := sb.Timeouts
				fmt.Fprintf(out, "idle_timeout_s=%d delete_after_s=%d archive_after_s=%d max_lifetime_s=%d\n",
					secs(tt.IdleSeconds), secs(tt.DeleteAfterSeconds), secs(tt.ArchiveAfterSeconds), secs(tt.MaxLifetimeSeconds))
			}
			if req.Public != nil {
				fmt.Fprintf(out, "public=%t\n", sb.Public)
			}
			return nil
		},
	}
	f.add(cmd)
	t.add(cmd)
	cmd.Flags().BoolVar(&public, "public", false, "serve every port inside without the access token (--public=false: only the public ports)")
	return cmd
}

func psCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "ps ID",
		Short: "List a sandbox's processes started through the API",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			list, err := c.ListProcesses(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return writeProcesses(cmd.OutOrStdout(), list, time.Now())
		},
	}
}

// writeProcesses is ps's table.
func writeProcesses(out io.Writer, list []api.Process, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tSTATUS\tSTARTED\tCOMMAND")
	for _, p := range list {
		status := "running"
		switch {
		case p.Result != nil && p.Result.TimedOut:
			status = "timed out"
		case p.Result != nil:
			status = "exited " + strconv.Itoa(p.Result.ExitCode)
		case !p.Running:
			status = "exited"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", p.Pid, status, ago(now.Sub(p.StartedAt)), strings.Join(p.Cmd, " "))
	}
	return tw.Flush()
}

func killCommand(connect connector) *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:   "kill [-s SIGNAL] ID PID",
		Short: "Signal a process group in a sandbox",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("PID %q is not a number", args[1])
			}
			c, err := connect()
			if err != nil {
				return err
			}
			return c.SignalProcess(cmd.Context(), args[0], pid, sig)
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "KILL", "signal name or number")
	return cmd
}

func logsCommand(connect connector) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs [-f] ID PID",
		Short: "Print a process's output (kept from its start)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("PID %q is not a number", args[1])
			}
			c, err := connect()
			if err != nil {
				return err
			}
			st, err := c.ProcessOutput(cmd.Context(), args[0], pid, follow)
			if err != nil {
				return err
			}
			defer st.Close()
			for {
				ev, err := st.Next()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				var w io.Writer
				switch ev.Type {
				case api.EventStdout:
					w = cmd.OutOrStdout()
				case api.EventStderr:
					w = cmd.ErrOrStderr()
				default:
					continue
				}
				if _, err := w.Write(ev.Data); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow live output until the process ends")
	return cmd
}
