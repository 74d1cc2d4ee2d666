package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/berthsh/berth/mcpserver"
	"github.com/berthsh/berth/server"
)

func mcpCommand(connect connector) *cobra.Command {
	var httpAddr string
	var noAuth bool
	cmd := &cobra.Command{
		Use:   "mcp [--http 127.0.0.1:7681]",
		Short: "Serve the daemon's sandboxes to AI agents over the Model Context Protocol (stdio, or streamable HTTP on loopback)",
		Long: `Serve berth as an MCP server: tools to create sandboxes, run commands and
move files, and the resource template berth://sandbox/{sandbox_id}/{+path}.

By default it speaks MCP on stdin and stdout, as an MCP host starts it:

  claude mcp add berth -- berth mcp

With --http it serves MCP's streamable HTTP transport at http://ADDR/mcp
instead, on a loopback address only (":7681" means 127.0.0.1:7681), to
clients that send the token in BERTH_MCP_TOKEN as Authorization: Bearer
(the MCP host's config carries it as a header). --insecure-no-auth serves
any local process instead, and with it what the daemon's key can do.

Either way it is a client of the berth daemon at --url (env BERTH_URL),
with the API key in BERTH_API_KEY if the daemon wants one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token := os.Getenv("BERTH_MCP_TOKEN")
			if httpAddr != "" {
				addr, err := mcpserver.LoopbackAddr(httpAddr)
				if err != nil {
					return err
				}
				httpAddr = addr
				switch {
				case token == "" && !noAuth:
					return errors.New("--http: set BERTH_MCP_TOKEN, the token MCP clients send as Authorization: Bearer " +
						"(e.g. export BERTH_MCP_TOKEN=$(head -c 32 /dev/urandom | base64)), or pass --insecure-no-auth")
				case token != "" && noAuth:
					return errors.New("--insecure-no-auth with BERTH_MCP_TOKEN set: choose one")
				case token != "" && len(token) < 16:
					return errors.New("BERTH_MCP_TOKEN: at least 16 characters")
				}
			}
			c, err := connect()
			if err != nil {
				return err
			}
			// stdout belongs to the protocol: the log goes to stderr.
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx := cmd.Context()
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := c.Health(hctx); err != nil {
				// Start anyway: the host keeps the server, and each tool
				// call says the daemon is down until it is up.
				fmt.Fprintf(cmd.ErrOrStderr(), "berth mcp: warning: %v\n", err)
			}
			cancel()
			srv := mcpserver.New(c, mcpserver.Options{Version: server.Version, Logger: logger})
			if httpAddr == "" {
				err := srv.Run(ctx, &mcp.StdioTransport{})
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			return serveMCPHTTP(ctx, cmd, srv, httpAddr, token, logger)
		},
	}
	cmd.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP at http://ADDR/mcp instead of stdio (loopback only, e.g. 127.0.0.1:7681), to clients that send $BERTH_MCP_TOKEN")
	cmd.Flags().BoolVar(&noAuth, "insecure-no-auth", false, "with --http: serve any local process, without a token")
	return cmd
}

// serveMCPHTTP serves srv at /mcp on addr (checked for loopback) until ctx ends.
func serveMCPHTTP(ctx context.Context, cmd *cobra.Command, srv *mcp.Server, addr, token string, logger *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpserver.HTTPHandler(srv, logger, token))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: server.IdleTimeout}
	fmt.Fprintf(cmd.ErrOrStderr(), "berth mcp: serving MCP at http://%s/mcp\n", ln.Addr())
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
