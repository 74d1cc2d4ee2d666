package cli

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

// DefaultKeyFile is the admin key a daemon with the default state dir made
// on its first start; the CLI sends it when BERTH_API_KEY is unset and the
// file is readable (root's, on the daemon's host).
const DefaultKeyFile = "/var/lib/berth/admin.key"

// apiKey is the key the CLI sends to the daemon at rawURL: $BERTH_API_KEY,
// else the contents of $BERTH_API_KEY_FILE, else, for a daemon on this
// host's loopback, DefaultKeyFile when readable (this host's admin key
// never goes to another host unasked), else none.
func apiKey(rawURL string) string {
	if k := os.Getenv("BERTH_API_KEY"); k != "" {
		return k
	}
	path := os.Getenv("BERTH_API_KEY_FILE")
	if path == "" && !localDaemon(rawURL) {
		return ""
	}
	if path == "" {
		path = DefaultKeyFile
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// localDaemon says whether rawURL is a daemon on this host's loopback (or
// its unix socket).
func localDaemon(rawURL string) bool {
	if rawURL == "" {
		return true
	}
	if !strings.Contains(rawURL, "://") {
		rawURL = "http://" + rawURL
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	if u.Scheme == "unix" {
		return true
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// parseExpiry reads --expires: a duration with d for days (30d, 12h, 90m).
func parseExpiry(s string, now time.Time) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 36500 {
			return nil, fmt.Errorf("--expires %q: a number of days (30d) or a duration (12h)", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d <= 0 {
			return nil, fmt.Errorf("--expires %q: a number of days (30d) or a duration (12h)", s)
		}
	}
	t := now.Add(d).UTC()
	return &t, nil
}

func keyCommand(connect connector) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Manage API keys (an admin key's commands)",
		Long: "API keys authenticate requests to the daemon's TCP API. A read or write key acts for one tenant and sees only " +
			"its sandboxes, snapshots, secrets and audit log; an admin key acts for the operator and sees every tenant's. " +
			"A key is shown once, when it is created; the daemon keeps only its hash.",
	}
	var tenant, scope, name, expires string
	create := &cobra.Command{
		Use:   "create",
		Short: "Make a key and print it (once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exp, err := parseExpiry(expires, time.Now())
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			k, err := c.CreateAPIKey(cmd.Context(), api.CreateAPIKeyRequest{Tenant: tenant, Scope: scope, Name: name, ExpiresAt: exp})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			fmt.Fprintf(cmd.ErrOrStderr(), "key %s (%s%s): store it now, it cannot be shown again\n", k.ID, k.Scope, tenantNote(k.Tenant))
			return nil
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "the tenant the key acts for (a DNS label; none for an admin key)")
	create.Flags().StringVar(&scope, "scope", api.ScopeWrite, "read, write or admin")
	create.Flags().StringVar(&name, "name", "", "a note for people")
	create.Flags().StringVar(&expires, "expires", "", "how long the key works: 30d, 12h (default: until revoked)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the keys (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			list, err := c.ListAPIKeys(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTENANT\tSCOPE\tCREATED\tEXPIRES\tSTATE\tNAME")
			now := time.Now()
			for _, k := range list {
				state, exp := "active", "-"
				if k.ExpiresAt != nil {
					exp = k.ExpiresAt.Local().Format("2006-01-02 15:04")
					if !now.Before(*k.ExpiresAt) {
						state = "expired"
					}
				}
				if k.RevokedAt != nil {
					state = "revoked"
				}
				t := k.Tenant
				if t == "" {
					t = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, t, k.Scope, k.CreatedAt.Local().Format("2006-01-02 15:04"), exp, state, k.Name)
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID...",
		Short: "Stop keys from working, at once",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				if _, err := c.RevokeAPIKey(cmd.Context(), id); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.AddCommand(create, ls, revoke)
	return cmd
}

func tenantNote(t string) string {
	if t == "" {
		return ", every tenant"
	}
	return " for tenant " + t
}

func auditCommand(connect connector) *cobra.Command {
	var q client.AuditQuery
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log: every mutating API call, with its tenant, key and result",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			recs, err := c.Audit(cmd.Context(), q)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tTIME\tTENANT\tKEY\tCALL\tSANDBOX\tSTATUS")
			for _, r := range recs {
				status := strconv.Itoa(r.Status)
				if r.Error != "" {
					status += " " + r.Error
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s %s\t%s\t%s\n", r.Seq, r.At.Local().Format("2006-01-02 15:04:05"),
					dash(r.Tenant), dash(r.KeyID), r.Method, r.Path, dash(r.SandboxID), status)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&q.Tenant, "tenant", "", "one tenant's calls (an admin key's flag)")
	cmd.Flags().StringVar(&q.Sandbox, "sandbox", "", "one sandbox's calls")
	cmd.Flags().Int64Var(&q.After, "after", 0, "calls after this seq")
	cmd.Flags().IntVar(&q.Limit, "limit", 100, "the most calls shown, the newest")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
