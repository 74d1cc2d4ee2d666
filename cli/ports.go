package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
)

func portsCommand(connect connector) *cobra.Command {
	var token bool
	cmd := &cobra.Command{
		Use:   "ports ID",
		Short: "List the ports processes inside a sandbox listen on, with the URL of each",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			ports, err := c.ListPorts(ctx, args[0])
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(ctx, args[0])
			if err != nil {
				return err
			}
			v, err := c.Version(ctx)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PORT\tADDRESS\tACCESS\tURL")
			for _, p := range ports {
				access, tok := "token", ""
				if p.Public {
					access = "public"
				} else if token {
					tok = sb.AccessToken
				}
				u, err := c.PortHostURL(sb.ID, p.Port, v.PortsDomain, tok)
				if err != nil {
					u = "(berth port-forward " + sb.ID + " " + strconv.Itoa(p.Port) + ")"
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", p.Port, p.Address, access, u)
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&token, "token", false, "put the access token in the URLs of private ports (a link a browser can open)")
	return cmd
}

func accessTokenCommand(connect connector) *cobra.Command {
	var rotate bool
	cmd := &cobra.Command{
		Use:   "access-token ID",
		Short: "Print the token that opens a sandbox's private ports; --rotate replaces it first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			var token string
			if rotate {
				token, err = c.RotateAccessToken(cmd.Context(), args[0])
			} else {
				var sb api.Sandbox
				sb, err = c.GetSandbox(cmd.Context(), args[0])
				token = sb.AccessToken
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), token)
			return nil
		},
	}
	cmd.Flags().BoolVar(&rotate, "rotate", false, "give the sandbox a new token (the old one stops working) and print it")
	return cmd
}

func portForwardCommand(connect connector) *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward ID [LOCAL:]REMOTE...",
		Short: "Listen on local ports and carry each connection to a port inside the sandbox, like kubectl port-forward",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			sb, err := c.GetSandbox(ctx, args[0])
			if err != nil {
				return err
			}
			type pair struct{ local, remote int }
			var pairs []pair
			for _, a := range args[1:] {
				l, r, err := parseForward(a)
				if err != nil {
					return err
				}
				pairs = append(pairs, pair{l, r})
			}
			var wg sync.WaitGroup
			var listeners []net.Listener
			defer func() {
				for _, l := range listeners {
					l.Close()
				}
				wg.Wait()
			}()
			for _, p := range pairs {
				l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(p.local)))
				if err != nil {
					return err
				}
				listeners = append(listeners, l)
				fmt.Fprintf(cmd.OutOrStdout(), "Forwarding from %s -> %s:%d\n", l.Addr(), sb.ID, p.remote)
				wg.Go(func() {
					for {
						conn, err := l.Accept()
						if err != nil {
							return
						}
						wg.Go(func() {
							defer conn.Close()
							up, err := c.DialPort(ctx, sb.ID, p.remote, sb.AccessToken)
							if err != nil {
								fmt.Fprintf(cmd.ErrOrStderr(), "port %d: %v\n", p.remote, err)
								return
							}
							defer up.Close()
							stop := context.AfterFunc(ctx, func() { conn.Close(); up.Close() })
							defer stop()
							done := make(chan struct{})
							go func() {
								io.Copy(up, conn)
								up.Close() // the tunnel cannot half-close: the copy back ends too
								close(done)
							}()
							io.Copy(conn, up)
							conn.Close()
							<-done
						})
					}
				})
			}
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	return cmd
}

// parseForward reads [LOCAL:]REMOTE (LOCAL 0: any free port).
func parseForward(s string) (local, remote int, err error) {
	l, r, ok := strings.Cut(s, ":")
	if !ok {
		l, r = s, s
	}
	if local, err = strconv.Atoi(l); err != nil || local < 0 || local > 65535 {
		return 0, 0, fmt.Errorf("%q: the local port must be 0–65535 ([LOCAL:]REMOTE)", s)
	}
	if remote, err = strconv.Atoi(r); err != nil || remote < 1 || remote > 65535 {
		return 0, 0, fmt.Errorf("%q: the remote port must be 1–65535 ([LOCAL:]REMOTE)", s)
	}
	return local, remote, nil
}
