package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

// printImages writes images as a table, a row per tag and its tenant ("-"
// for the operator's catalog; names by digest are not tags; an image
// without a tag is <none>).
func printImages(w io.Writer, imgs []api.Image) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTENANT\tID\tSIZE\tLAYERS\tCREATED")
	for _, img := range imgs {
		type tag struct{ name, tenant string }
		var tags []tag
		owner := map[string]string{}
		for t, names := range img.TenantNames {
			for _, n := range names {
				owner[n] = t
			}
		}
		for _, n := range img.Names {
			if !strings.Contains(n, "@") {
				tags = append(tags, tag{n, owner[n]})
				delete(owner, n)
			}
		}
		var rest []tag // other tenants' names (the operator's view)
		for n, t := range owner {
			if !strings.Contains(n, "@") {
				rest = append(rest, tag{n, t})
			}
		}
		sort.Slice(rest, func(i, j int) bool {
			return rest[i].tenant < rest[j].tenant || rest[i].tenant == rest[j].tenant && rest[i].name < rest[j].name
		})
		tags = append(tags, rest...)
		if len(tags) == 0 {
			tags = []tag{{"<none>", ""}}
		}
		for _, n := range tags {
			t := n.tenant
			if t == "" {
				t = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", n.name, t, shortID(img.ID), humanBytes(img.Size), len(img.Layers), img.CreatedAt.Local().Format(time.DateTime))
		}
	}
	return tw.Flush()
}

// listImagesCommand is an `ls` of images as list gives them: a table, or
// JSON with --json.
func listImagesCommand(connect connector, short string, list func(*client.Client, context.Context) ([]api.Image, error)) *cobra.Command {
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			imgs, err := list(c, cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), imgs)
			}
			return printImages(cmd.OutOrStdout(), imgs)
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return ls
}

func imageCommand(connect connector) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Pull, import, list, inspect and remove images"}
	var quiet bool
	pull := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from its registry (python:3.12-slim, ghcr.io/org/img@sha256:…)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			bar := newProgressBar(cmd.ErrOrStderr(), quiet)
			img, err := c.PullImage(cmd.Context(), args[0], bar.update)
			bar.done()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), img.ID)
			return nil
		},
	}
	pull.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress")
	var as string
	imp := &cobra.Command{
		Use:   "import FILE|-",
		Short: "Store the images of a docker save tarball or an OCI layout tar",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = cmd.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			c, err := connect()
			if err != nil {
				return err
			}
			imgs, err := c.ImportImages(cmd.Context(), r, as, nil)
			if err != nil {
				return err
			}
			for _, img := range imgs {
				fmt.Fprintln(cmd.OutOrStdout(), img.ID, strings.Join(img.Names, " "))
			}
			return nil
		},
	}
	imp.Flags().StringVar(&as, "name", "", "a name (repo:tag) for the file's one image")
	ls := listImagesCommand(connect, "List the stored images (a tenant's own and the operator's; the operator's key: every tenant's)", (*client.Client).ListImages)
	var tenant string
	inspect := &cobra.Command{
		Use:   "inspect REF",
		Short: "Describe an image (JSON), with the sandboxes made of it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			img, err := c.InspectImageOf(cmd.Context(), tenant, args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), img)
		},
	}
	rm := &cobra.Command{
		Use:   "rm REF...",
		Short: "Remove names, or images and the layers no other image has (refused while a sandbox uses one)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			for _, ref := range args {
				res, err := c.RemoveImageOf(cmd.Context(), tenant, ref)
				if err != nil {
					return err
				}
				if len(res.Images) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "untagged", ref)
				}
				for _, id := range res.Images {
					fmt.Fprintf(cmd.OutOrStdout(), "deleted %s (%d layers, %s)\n", id, res.Layers, humanBytes(res.FreedBytes))
				}
			}
			return nil
		},
	}
	inspect.Flags().StringVar(&tenant, "tenant", "", "the operator only: a name of this tenant's")
	rm.Flags().StringVar(&tenant, "tenant", "", "the operator only: names of this tenant's")
	var all bool
	prune := &cobra.Command{
		Use:   "prune",
		Short: "Remove unnamed images no sandbox uses (--all: every image no sandbox uses) and unused layers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			res, err := c.PruneImages(cmd.Context(), all)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d images, %d layers, %s\n", len(res.Images), res.Layers, humanBytes(res.FreedBytes))
			return nil
		},
	}
	prune.Flags().BoolVarP(&all, "all", "a", false, "remove every image no sandbox uses, named ones too")
	cmd.AddCommand(pull, imp, ls, inspect, rm, prune)
	return cmd
}

func poolCommand(connect connector) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool [IMAGE=N]",
		Short: "List the warm pools, or keep N sandboxes of IMAGE booted (0 removes the pool)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			if len(args) == 1 {
				img, size, ok := strings.Cut(args[0], "=")
				n, err := strconv.Atoi(size)
				if !ok || err != nil {
					return fmt.Errorf("%q: want IMAGE=N", args[0])
				}
				if _, err := c.SetPool(cmd.Context(), img, n); err != nil {
					return err
				}
			}
			pools, err := c.Pools(cmd.Context())
			if err != nil {
				return err
			}
			sort.Slice(pools, func(i, j int) bool { return pools[i].Image < pools[j].Image })
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "IMAGE\tRUNTIME\tSIZE\tREADY")
			for _, p := range pools {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", p.Image, p.Runtime, p.Size, p.Ready)
			}
			return tw.Flush()
		},
	}
	return cmd
}

func shortID(id string) string {
	h := strings.TrimPrefix(id, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// progressBar draws a pull's progress on a terminal: one line, redrawn,
// with the bytes fetched of the total and the layers done. Off a terminal
// (or quiet) it prints nothing.
type progressBar struct {
	w           io.Writer
	on          bool
	total       int64
	current     map[string]int64
	layers, ok  int
	lastDraw    time.Time
	drewAnyLine bool
}

func newProgressBar(w io.Writer, quiet bool) *progressBar {
	f, isFile := w.(*os.File)
	return &progressBar{w: w, on: !quiet && isFile && term.IsTerminal(int(f.Fd())), current: map[string]int64{}}
}

func (p *progressBar) update(ev api.PullEvent) {
	switch ev.Status {
	case api.PullResolved:
		p.total = ev.Total
	case api.PullDownloading:
		p.current[ev.Layer] = ev.Current
	case api.PullUnpacked, api.PullLayerExists:
		p.ok++
	}
	if !p.on || (time.Since(p.lastDraw) < 100*time.Millisecond && ev.Status == api.PullDownloading) {
		return
	}
	p.lastDraw = time.Now()
	var got int64
	for _, n := range p.current {
		got += n
	}
	const width = 30
	fill := 0
	if p.total > 0 {
		fill = int(min(float64(width), float64(width)*float64(got)/float64(p.total)))
	}
	fmt.Fprintf(p.w, "\r[%s%s] %s / %s  %d layers done\033[K", strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
		humanBytes(got), humanBytes(p.total), p.ok)
	p.drewAnyLine = true
}

func (p *progressBar) done() {
	if p.drewAnyLine {
		fmt.Fprintln(p.w)
	}
}
