package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/hostcheck"
)

// DoctorReport is what `berth doctor --json` prints.
type DoctorReport struct {
	// OK is false when a check failed (doctor then exits 1).
	OK bool `json:"ok"`
	// Checks are every check's result, in order.
	Checks []hostcheck.Result `json:"checks"`
}

// DoctorCommand is `berth doctor`: it runs every host check and says, per
// check, ok, warn or fail with the fix. options reads the settings the
// checks look at (the state dir, runsc, …): the caller binds them to the
// command's flags, the same as serve's, and its config file.
func DoctorCommand(bind func(cmd *cobra.Command) (options func() (hostcheck.Options, error))) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this host for what berth needs, and say how to fix what is missing",
		Long: "doctor checks what berth serve needs of this host (root, a static binary, the state dir, cgroups, user " +
			"namespaces, overlayfs, seccomp) and what it can use (idmapped mounts, disk space, runsc, /dev/kvm). It " +
			"takes serve's flags and config file, so that it checks the host as that daemon would see it. It exits 1 " +
			"when a check fails; warnings do not fail. Run it as root, like serve.",
		Args: cobra.NoArgs,
	}
	options := bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the results as JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := options()
		if err != nil {
			return err
		}
		results := hostcheck.All(cmd.Context(), o)
		report := DoctorReport{OK: len(hostcheck.Failed(results)) == 0, Checks: results}
		if asJSON {
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			if err := enc.Encode(report); err != nil {
				return err
			}
		} else if err := printDoctor(cmd.OutOrStdout(), results); err != nil {
			return err
		}
		if !report.OK {
			return &ExitError{Code: 1}
		}
		return nil
	}
	return cmd
}

// printDoctor writes one row per check, then its fix on the next line.
func printDoctor(w io.Writer, results []hostcheck.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
	var fails, warns int
	var refuse []string
	var total time.Duration
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Name, strings.ToUpper(string(r.Status)), r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(tw, "\t\tfix: %s\n", r.Fix)
		}
		switch r.Status {
		case hostcheck.Fail:
			fails++
			if r.Required {
				refuse = append(refuse, r.Name)
			}
		case hostcheck.Warn:
			warns++
		}
		total += r.Duration
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "berth can run sandboxes here"
	switch {
	case len(refuse) > 0:
		verdict = "serve refuses to start until these are fixed: " + strings.Join(refuse, ", ")
	case fails > 0:
		verdict = "serve starts, but what failed does not work"
	}
	_, err := fmt.Fprintf(w, "\n%d checks in %v: %d failed, %d warned; %s\n", len(results), total.Round(time.Millisecond), fails, warns, verdict)
	return err
}
