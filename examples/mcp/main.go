// Command mcp is what an MCP host does with berth: it starts `berth mcp` over
// stdio, finds or creates the sandbox of one conversation, runs a command in
// it with the execute tool, and deletes the sandbox.
//
//	berth serve &          # or: make run
//	go run ./examples/mcp
//
// BERTH_BINARY names the berth binary (default: berth on PATH); BERTH_URL
// the daemon, as for every berth command.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	bin := os.Getenv("BERTH_BINARY")
	if bin == "" {
		bin = "berth"
	}
	if err := run(ctx, bin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "examples/mcp:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin string, out io.Writer) error {
	// The MCP host's side: start the server as a child and speak over its
	// stdin and stdout. berth mcp reads BERTH_URL from the environment.
	cmd := exec.Command(bin, "mcp")
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "berth-example", Version: "1"}, nil)
	session, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return fmt.Errorf("start %s mcp: %w", bin, err)
	}
	defer session.Close()

	// One sandbox per conversation, found again by its label.
	res, err := call(ctx, session, "get_or_create_sandbox", map[string]any{
		"labels": map[string]string{"conversation": "examples-mcp"},
	})
	if err != nil {
		return err
	}
	sb, _ := res.StructuredContent.(map[string]any)["sandbox"].(map[string]any)
	id, _ := sb["id"].(string)
	fmt.Fprintln(out, textOf(res))
	defer func() {
		if res, err := call(context.WithoutCancel(ctx), session, "delete_sandbox", map[string]any{"sandbox_id": id}); err == nil {
			fmt.Fprintln(out, textOf(res))
		}
	}()

	res, err = call(ctx, session, "execute", map[string]any{
		"sandbox_id": id,
		"command":    "echo hello from a berth sandbox; uname -sr",
		"timeout":    60,
	})
	if err != nil {
		return err
	}
	// What a model reads: stdout, then stderr and how the command ended.
	fmt.Fprintln(out, textOf(res))
	return nil
}

// call runs a tool; a tool error (isError) is returned as an error too.
func call(ctx context.Context, s *mcp.ClientSession, tool string, args map[string]any) (*mcp.CallToolResult, error) {
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tool, err)
	}
	if res.IsError {
		return nil, fmt.Errorf("%s: %s", tool, textOf(res))
	}
	return res, nil
}

func textOf(res *mcp.CallToolResult) string {
	var s string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			s += t.Text
		}
	}
	return s
}
