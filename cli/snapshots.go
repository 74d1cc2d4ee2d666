package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

func snapshotCommand(connect connector) *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Save sandboxes' files as snapshots; list, inspect and remove them"}
	var lbls []string
	create := &cobra.Command{
		Use:   "create ID NAME",
		Short: "Snapshot a sandbox's files (a running one keeps running); create from it with --image snapshot:NAME",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := parsePairs("--label", lbls)
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			sn, err := c.CreateSnapshot(cmd.Context(), args[0], api.CreateSnapshotRequest{Name: args[1], Labels: l})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\tfrozen %.1f ms\n", sn.Name, humanBytes(sn.SizeBytes), sn.FrozenMs)
			return nil
		},
	}
	create.Flags().StringArrayVarP(&lbls, "label", "l", nil, "label k=v (repeatable)")
	var selector string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			list, err := c.ListSnapshots(cmd.Context(), selector)
			if err != nil {
				return err
			}
			return printSnapshots(cmd.OutOrStdout(), list)
		},
	}
	ls.Flags().StringVarP(&selector, "selector", "s", "", "label selector (a=b,c!=d,e)")
	inspect := &cobra.Command{
		Use:   "inspect NAME...",
		Short: "Show snapshots as JSON, with the sandboxes made from them",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			var out []api.Snapshot
			for _, n := range args {
				sn, err := c.GetSnapshot(cmd.Context(), n)
				if err != nil {
					return err
				}
				out = append(out, sn)
			}
			if len(out) == 1 {
				return printJSON(cmd.OutOrStdout(), out[0])
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove snapshots (refused while a sandbox is made from one)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachSandbox(cmd, connect, args, func(c *client.Client, n string) (bool, error) {
				err := c.DeleteSnapshot(cmd.Context(), n)
				return err == nil, err
			})
		},
	}
	cmd.AddCommand(create, ls, inspect, rm)
	return cmd
}

func printSnapshots(w io.Writer, list []api.Snapshot) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSANDBOX\tIMAGE\tSIZE\tFROZEN\tCREATED")
	for _, sn := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f ms\t%s\n", sn.Name, sn.Sandbox, sn.Image, humanBytes(sn.SizeBytes), sn.FrozenMs, sn.CreatedAt.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

func forkCommand(connect connector) *cobra.Command {
	var (
		n    int
		lbls []string
	)
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Make running copies of a sandbox's files (not its processes); prints their ids",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := parsePairs("--label", lbls)
			if err != nil {
				return err
			}
			req := api.ForkRequest{Count: n}
			if len(l) > 0 {
				for range n {
					req.Labels = append(req.Labels, l)
				}
			}
			c, err := connect()
			if err != nil {
				return err
			}
			res, err := c.Fork(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			for _, sb := range res.Sandboxes {
				fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "how many copies")
	cmd.Flags().StringArrayVarP(&lbls, "label", "l", nil, "label k=v of every copy (repeatable)")
	return cmd
}

func diffCommand(connect connector) *cobra.Command {
	var (
		against, format string
	)
	cmd := &cobra.Command{
		Use:   "diff ID",
		Short: "Show what a sandbox changed since its image (or --against a snapshot): A/M/D paths, --format patch or tar",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			switch format {
			case "", "list":
				d, err := c.Diff(cmd.Context(), args[0], against)
				if err != nil {
					return err
				}
				for _, ch := range d.Changes {
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", strings.ToUpper(ch.Kind[:1]), ch.Path)
				}
				return nil
			case api.DiffJSON:
				d, err := c.Diff(cmd.Context(), args[0], against)
				if err != nil {
					return err
				}
				return printJSON(cmd.OutOrStdout(), d)
			case api.DiffPatch, api.DiffTar:
				if format == api.DiffTar && isTerminal(cmd.OutOrStdout()) {
					return errors.New("--format tar: stdout is a terminal; redirect it to a file")
				}
				rc, err := c.DiffStream(cmd.Context(), args[0], against, format)
				if err != nil {
					return err
				}
				defer rc.Close()
				_, err = io.Copy(cmd.OutOrStdout(), rc)
				return err
			}
			return fmt.Errorf("--format: %q is not list, json, patch or tar", format)
		},
	}
	cmd.Flags().StringVar(&against, "against", "", "a snapshot to compare with (default: the sandbox's image)")
	cmd.Flags().StringVar(&format, "format", "list", "list, json, patch (a unified diff) or tar (the changes, whiteouts for deletions)")
	return cmd
}

func applyCommand(connect connector) *cobra.Command {
	var (
		from, tarFile string
		overwrite     bool
	)
	cmd := &cobra.Command{
		Use:   "apply ID --from OTHER | --tar FILE|-",
		Short: "Apply what another sandbox (or snapshot:NAME) changed onto a sandbox, refusing conflicts unless --overwrite; or a tar from diff --format tar",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (from == "") == (tarFile == "") {
				return errors.New("give one of --from (a sandbox id or snapshot:NAME) and --tar (a file, - for stdin)")
			}
			c, err := connect()
			if err != nil {
				return err
			}
			if tarFile != "" {
				var r io.Reader = cmd.InOrStdin()
				if tarFile != "-" {
					f, err := os.Open(tarFile)
					if err != nil {
						return err
					}
					defer f.Close()
					r = f
				}
				res, err := c.ApplyTar(cmd.Context(), args[0], r)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d entries, %d deletions, %s\n", res.Entries, res.Whiteouts, humanBytes(res.Bytes))
				return nil
			}
			res, err := c.Apply(cmd.Context(), args[0], api.ApplyRequest{From: from, Overwrite: overwrite})
			if paths := errdefs.PathsOf(err); len(paths) > 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "conflicts:")
				for _, p := range paths {
					fmt.Fprintln(cmd.ErrOrStderr(), "  "+p)
				}
			}
			if err != nil {
				return err
			}
			for _, ch := range res.Changes {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", strings.ToUpper(ch.Kind[:1]), ch.Path)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the sandbox id or snapshot:NAME whose changes to apply")
	cmd.Flags().BoolVar(&overwrite, "overwrite", false, "apply changes to paths this sandbox also changed (theirs win)")
	cmd.Flags().StringVar(&tarFile, "tar", "", "a layer tar to apply as it is (berth diff --format tar), - for stdin")
	return cmd
}

func pauseCommand(connect connector) *cobra.Command {
	var memory bool
	cmd := &cobra.Command{
		Use:   "pause ID...",
		Short: "Freeze sandboxes' processes (memory kept, no CPU) until resume",
		Long: "Freeze sandboxes' processes (memory kept, no CPU) until resume. With --memory the\n" +
			"runtime saves them with their memory and frees the sandbox's CPU and memory\n" +
			"(runtimes with memory_checkpoint: gvisor); resume brings them back where they were.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachSandbox(cmd, connect, args, func(c *client.Client, id string) (bool, error) {
				var err error
				if memory {
					_, err = c.PauseMemory(cmd.Context(), id)
				} else {
					_, err = c.Pause(cmd.Context(), id)
				}
				return err == nil, err
			})
		},
	}
	cmd.Flags().BoolVar(&memory, "memory", false, "save the processes with their memory and free the sandbox's CPU and memory")
	return cmd
}

func resumeCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "resume ID...",
		Short: "Thaw paused sandboxes",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachSandbox(cmd, connect, args, func(c *client.Client, id string) (bool, error) {
				_, err := c.Resume(cmd.Context(), id)
				return err == nil, err
			})
		},
	}
}

// isTerminal says whether w is a terminal (binary output is not written to one).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
