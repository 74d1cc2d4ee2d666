package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
)

func quotaCommand(connect connector) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Set tenants' quotas (an admin key's commands)",
	}
	var q api.Quota
	var memory, disk, snapshots string
	set := &cobra.Command{
		Use:   "set TENANT",
		Short: "Replace a tenant's quota (0 or unset: no bound; every flag unset removes the quota)",
		Long: "set replaces a tenant's quota. A create, start or fork that would pass a bound is refused " +
			"(resource_exhausted, naming the bound and the use); a quota below the current use stops nothing " +
			"that runs, it only refuses what would add more.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			for _, s := range []struct {
				flag, v string
				to      *int64
			}{{"memory", memory, &q.MemoryBytes}, {"disk", disk, &q.DiskBytes}, {"snapshots", snapshots, &q.SnapshotBytes}} {
				if s.v == "" {
					continue
				}
				if *s.to, err = ParseSize(s.v); err != nil {
					return fmt.Errorf("--%s: %w", s.flag, err)
				}
			}
			c, err := connect()
			if err != nil {
				return err
			}
			u, err := c.SetQuota(cmd.Context(), args[0], q)
			if err != nil {
				return err
			}
			return printUsage(cmd, []api.TenantUsage{u})
		},
	}
	set.Flags().IntVar(&q.Sandboxes, "sandboxes", 0, "the most sandboxes running at once")
	set.Flags().Float64Var(&q.CPUs, "cpus", 0, "the most CPUs (limits.cpus) summed over running sandboxes")
	set.Flags().StringVar(&memory, "memory", "", "the most memory (limits.memory_bytes) summed over running sandboxes: 16G")
	set.Flags().StringVar(&disk, "disk", "", "the most disk (limits.disk_bytes) summed over all its sandboxes: 100G")
	set.Flags().StringVar(&snapshots, "snapshots", "", "the most bytes of snapshots stored: 20G")
	cmd.AddCommand(set)
	return cmd
}

func usageCommand(connect connector) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show tenants' use now, quotas and usage counters (sandbox-, CPU-, GB-seconds, egress)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			list, err := c.Usage(cmd.Context(), tenant)
			if err != nil {
				return err
			}
			return printUsage(cmd, list)
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "one tenant's (an admin key's flag)")
	return cmd
}

func printUsage(cmd *cobra.Command, list []api.TenantUsage) error {
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tSANDBOXES\tCPUS\tMEMORY\tDISK\tSNAPSHOTS\tSANDBOX-S\tCPU-S\tGB-S\tEGRESS OUT/IN")
	of := func(use, quota string, bounded bool) string {
		if !bounded {
			return use
		}
		return use + "/" + quota
	}
	for _, u := range list {
		q := u.Quota
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.1f\t%.1f\t%d/%d\n", dash(u.Tenant),
			of(fmt.Sprint(u.Sandboxes), fmt.Sprint(q.Sandboxes), q.Sandboxes > 0),
			of(fmt.Sprintf("%g", u.CPUs), fmt.Sprintf("%g", q.CPUs), q.CPUs > 0),
			of(humanBytes(u.MemoryBytes), humanBytes(q.MemoryBytes), q.MemoryBytes > 0),
			of(humanBytes(u.DiskBytes), humanBytes(q.DiskBytes), q.DiskBytes > 0),
			of(humanBytes(u.SnapshotBytes), humanBytes(q.SnapshotBytes), q.SnapshotBytes > 0),
			u.SandboxSeconds, u.CPUSeconds, u.MemoryGBSeconds, u.EgressBytesOut, u.EgressBytesIn)
	}
	return tw.Flush()
}
