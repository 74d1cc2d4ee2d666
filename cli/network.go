package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

// networkFlags are --network, --allow, --deny and --secret, for create,
// run and network.
type networkFlags struct {
	mode    string
	allow   []string
	deny    []string
	secrets []string
}

func (f *networkFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "network", "", "network mode: none, allowlist or open (default: the daemon's; allowlist when --allow is given)")
	fl.StringArrayVar(&f.allow, "allow", nil, "allow a destination: pypi.org, '*.pythonhosted.org', 10.0.0.0/8, github.com:22 (repeatable)")
	fl.StringArrayVar(&f.deny, "deny", nil, "deny a destination, same forms as --allow (repeatable)")
	fl.StringArrayVar(&f.secrets, "secret", nil, "bind a stored secret to a host: NAME=HOST[,header=H][,format=F][,env=VAR]; "+
		"with neither header nor env: header=Authorization, format='Bearer {secret}' (repeatable)")
}

func (f *networkFlags) set() bool {
	return f.mode != "" || len(f.allow) > 0 || len(f.deny) > 0 || len(f.secrets) > 0
}

// value is the policy the flags give; nil when none is given (the daemon's default).
func (f *networkFlags) value() (*api.Network, error) {
	if !f.set() {
		return nil, nil
	}
	n := &api.Network{Mode: f.mode, Allow: f.allow, Deny: f.deny}
	if n.Mode == "" {
		n.Mode = api.NetworkAllowlist
	}
	for _, s := range f.secrets {
		b, err := parseBinding(s)
		if err != nil {
			return nil, err
		}
		n.Secrets = append(n.Secrets, b)
	}
	return n, nil
}

// parseBinding reads NAME=HOST[,header=H][,format=F][,env=VAR].
func parseBinding(s string) (api.SecretBinding, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" || rest == "" {
		return api.SecretBinding{}, fmt.Errorf("--secret %q: want NAME=HOST[,header=H][,format=F][,env=VAR]", s)
	}
	parts := strings.Split(rest, ",")
	b := api.SecretBinding{Secret: name, Host: parts[0]}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return b, fmt.Errorf("--secret %q: %q is not key=value", s, p)
		}
		switch k {
		case "header":
			b.Header = v
		case "format":
			b.Format = v
		case "env":
			b.Env = v
		default:
			return b, fmt.Errorf("--secret %q: unknown %q (header, format or env)", s, k)
		}
	}
	if b.Header == "" && b.Env == "" {
		b.Header, b.Format = "Authorization", "Bearer {secret}"
	}
	return b, nil
}

func networkCommand(connect connector) *cobra.Command {
	var nf networkFlags
	cmd := &cobra.Command{
		Use:   "network ID [--network MODE] [--allow DEST]... [--deny DEST]... [--secret BINDING]...",
		Short: "Show a sandbox's network policy, or replace it (whole) with the flags given",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			var sb api.Sandbox
			if nf.set() {
				n, err := nf.value()
				if err != nil {
					return err
				}
				sb, err = c.SetNetwork(cmd.Context(), args[0], *n)
				if err != nil {
					return err
				}
			} else if sb, err = c.GetSandbox(cmd.Context(), args[0]); err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), sb.Network)
		},
	}
	nf.add(cmd)
	return cmd
}

func secretCommand(connect connector) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Manage the secrets the daemon adds to sandboxes' requests (values are never shown)",
	}
	var fromFile string
	valueOf := func(cmd *cobra.Command, args []string) (string, error) {
		switch {
		case fromFile != "" && len(args) > 1:
			return "", errors.New("give the value or --from-file, not both")
		case fromFile != "":
			b, err := os.ReadFile(fromFile)
			if err != nil {
				return "", err
			}
			return strings.TrimRight(string(b), "\r\n"), nil
		case len(args) > 1 && args[1] != "-":
			return args[1], nil
		}
		b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 1<<20))
		if err != nil {
			return "", err
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	add := &cobra.Command{
		Use:   "add NAME [VALUE | -]",
		Short: "Store a secret (the value from the argument, --from-file, or standard input)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := valueOf(cmd, args)
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			s, err := c.CreateSecret(cmd.Context(), args[0], v)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.Name)
			return nil
		},
	}
	add.Flags().StringVar(&fromFile, "from-file", "", "read the value from a file")
	set := &cobra.Command{
		Use:   "set NAME [VALUE | -]",
		Short: "Replace a secret's value",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := valueOf(cmd, args)
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			_, err = c.UpdateSecret(cmd.Context(), args[0], v)
			return err
		},
	}
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from a file")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the secrets",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			list, err := c.ListSecrets(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tUPDATED")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\n", s.Name, s.UpdatedAt.Format("2006-01-02 15:04:05"))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Delete secrets no sandbox binds",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			for _, name := range args {
				if err := c.DeleteSecret(cmd.Context(), name); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(add, set, ls, rm)
	return cmd
}

func egressCommand(connect connector) *cobra.Command {
	var follow, denied, asJSON bool
	var after int64
	cmd := &cobra.Command{
		Use:   "egress ID",
		Short: "Show what a sandbox reached or tried to reach: connections, requests, DNS queries, and the rule that decided",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			q := client.EgressQuery{After: after, Denied: denied}
			out := cmd.OutOrStdout()
			if !follow {
				recs, err := c.Egress(cmd.Context(), args[0], q)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(out, recs)
				}
				writeEgress(out, recs, true)
				return nil
			}
			st, err := c.FollowEgress(cmd.Context(), args[0], q)
			if err != nil {
				return err
			}
			defer st.Close()
			header := !asJSON
			for {
				rec, err := st.Next()
				if err != nil {
					if errors.Is(err, io.EOF) || cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				if asJSON {
					if err := printJSON(out, rec); err != nil {
						return err
					}
					continue
				}
				writeEgress(out, []api.EgressRecord{rec}, header)
				header = false
			}
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing new records as they happen")
	fl.BoolVar(&denied, "denied", false, "refused attempts only")
	fl.Int64Var(&after, "after", 0, "records after this seq")
	fl.BoolVar(&asJSON, "json", false, "print records as JSON")
	return cmd
}

// writeEgress prints records as a table (its header first when header).
func writeEgress(w io.Writer, recs []api.EgressRecord, header bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "SEQ\tTIME\tPROTO\tNAME\tADDR\tREQUEST\tSTATUS\tALLOWED\tRULE")
	}
	for _, r := range recs {
		req := strings.TrimSpace(r.Method + " " + r.Path)
		if req == "" {
			req = "-"
		}
		status := "-"
		if r.Status != 0 {
			status = fmt.Sprint(r.Status)
		}
		rule := r.Rule
		if r.Secret != "" {
			rule += " (secret " + r.Secret + ")"
		}
		if r.Error != "" {
			rule += ": " + r.Error
		}
		allowed := "no"
		if r.Allowed {
			allowed = "yes"
		}
		name := r.Name
		if name == "" {
			name = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s:%d\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.Local().Format("15:04:05.000"),
			r.Proto, name, r.Addr, r.Port, req, status, allowed, rule)
	}
	tw.Flush()
}
