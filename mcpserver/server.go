// Package mcpserver serves a berth daemon's sandboxes to AI agents as a Model
// Context Protocol server: tools that create sandboxes, run commands and move
// files, and a resource template that reads a sandbox's files.
package mcpserver

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

// Options configure a server.
type Options struct {
	// Version is reported to MCP clients as the server's version.
	Version string
	// Logger receives the server's own log (never stdout, which the stdio
	// transport owns); nil discards it.
	Logger *slog.Logger
}

// instructions tell a model how the tools fit together.
const instructions = `berth gives you a disposable, isolated Linux computer (a sandbox) to run commands and edit files in.
Start with get_or_create_sandbox and a label that names this conversation, for example {"labels": {"conversation": "<a name or id for this chat>"}}: the same labels give back the same sandbox later, with its files. Pass the sandbox_id it returns to every other tool.
Paths are inside the sandbox; a relative path starts at the sandbox's working directory (/home/user unless the sandbox was created with another workdir).
Use execute to run shell commands, read_file/write_file/edit_file to work on text files, ls/glob/grep to look around, upload/download for binary files.`

// New returns an MCP server whose tools and resources act through c.
func New(c *client.Client, opts Options) *mcp.Server {
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "berth", Title: "berth sandboxes", Version: version},
		&mcp.ServerOptions{Instructions: instructions, Logger: logger})
	b := &backend{c: c}
	b.addSandboxTools(s)
	b.addExecTool(s)
	b.addFileTools(s)
	b.addResources(s)
	return s
}

// backend is what every tool acts through: the daemon's client.
type backend struct {
	c *client.Client
}

// MaxHTTPBodyBytes bounds one HTTP request to the streamable transport: an
// upload of the daemon's largest batch (64 MiB) as base64, with room for the
// JSON around it.
const MaxHTTPBodyBytes = 96 << 20

// HTTPHandler serves s over MCP's streamable HTTP transport, to clients
// that send token as Authorization: Bearer (compared in constant time; an
// empty token serves anyone, which berth mcp allows only when told to).
// It is served on loopback only (see LoopbackAddr), and what a web page
// could send it is refused: a request on loopback whose Host is not
// loopback (DNS rebinding; the SDK checks) and a browser's cross-origin
// request (net/http's CrossOriginProtection).
func HTTPHandler(s *mcp.Server, logger *slog.Logger, token string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Logger: logger, MaxRequestBodyBytes: MaxHTTPBodyBytes})
	guarded := http.NewCrossOriginProtection().Handler(h)
	if token == "" {
		return guarded
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="berth mcp"`)
			http.Error(w, "berth mcp: send the server's token as Authorization: Bearer <token> (BERTH_MCP_TOKEN where it was started)", http.StatusUnauthorized)
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// LoopbackAddr checks that addr (host:port, or :port for 127.0.0.1) is a
// loopback address and returns it with the host filled in. The HTTP
// transport is plain HTTP with a bearer token (or none), so anything else
// is refused.
func LoopbackAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", errdefs.Wrap(errdefs.InvalidArgument, err, "--http %q: want host:port or :port", addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", errdefs.New(errdefs.InvalidArgument,
			"--http %q: the MCP HTTP transport is plain HTTP, so it listens on loopback only (127.0.0.1, ::1 or localhost)", addr)
	}
	return net.JoinHostPort(host, port), nil
}

// toolFunc is a tool's body: it returns the structured result and the text a
// model reads, or an error (a berth error becomes a result with isError).
type toolFunc[In, Out any] func(ctx context.Context, in In) (Out, string, error)

// addTool registers a tool whose input schema is inferred from In (field
// descriptions from jsonschema tags; tweak may refine it) and output schema
// from Out. Arguments that do not fit the schema are a JSON-RPC
// invalid-params error, not a tool result: the call itself was malformed.
func addTool[In, Out any](s *mcp.Server, t *mcp.Tool, tweak func(*jsonschema.Schema), fn toolFunc[In, Out]) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: input schema: %v", t.Name, err))
	}
	if tweak != nil {
		tweak(in)
	}
	resolved, err := in.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: input schema: %v", t.Name, err))
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: output schema: %v", t.Name, err))
	}
	t.InputSchema, t.OutputSchema = in, out
	name := t.Name
	s.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		raw := req.Params.Arguments
		if len(raw) == 0 || string(raw) == "null" {
			raw = json.RawMessage("{}")
		}
		var args map[string]any
		if err := json.Unmarshal(raw, &args); err != nil {
			return nil, invalidParams("tool %s: arguments must be a JSON object: %v", name, err)
		}
		if err := resolved.Validate(args); err != nil {
			return nil, invalidParams("tool %s: invalid arguments: %v", name, err)
		}
		var input In
		if err := json.Unmarshal(raw, &input); err != nil {
			return nil, invalidParams("tool %s: invalid arguments: %v", name, err)
		}
		output, text, err := fn(ctx, input)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return errorResult(err), nil
		}
		res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: output}
		if x, ok := any(output).(extraContent); ok {
			res.Content = append(res.Content, x.extraContent()...)
		}
		return res, nil
	})
}

// extraContent is a tool output that has content beyond its text (an
// embedded resource, say), which follows the text in the result.
type extraContent interface {
	extraContent() []mcp.Content
}

func invalidParams(format string, args ...any) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(format, args...)}
}

// errorResult is a tool result with isError set, whose text tells a model
// what went wrong (the daemon's own message, with its class) and what to try.
func errorResult(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: ErrorText(err)}}, IsError: true}
}

// ErrorText is the message a model reads for err: "Error (class): message"
// and, for the classes where it helps, a hint on what to do next.
func ErrorText(err error) string {
	class := errdefs.ClassOf(err)
	msg := err.Error()
	hint := ""
	switch class {
	case errdefs.NotFound:
		hint = "Check the sandbox_id or path: list_sandboxes shows the sandboxes there are, ls shows what is in a directory."
	case errdefs.AlreadyExists:
		hint = "Something with that name exists already: choose another name, or remove it first."
	case errdefs.InvalidArgument:
		hint = "Fix the argument named in the message and call the tool again."
	case errdefs.Conflict:
		hint = "The sandbox's state does not allow this now (a stopped sandbox runs nothing: start_sandbox starts it)."
	case errdefs.PermissionDenied:
		hint = "The acting user may not do this: choose another path, or run as another user."
	case errdefs.ResourceExhausted:
		hint = "A limit was reached (memory, processes, disk or a quota): free something, or ask for a sandbox with larger limits."
	case errdefs.Unavailable:
		hint = "The berth daemon is not reachable: the user has to start it (berth serve) or point berth mcp at it (--url or BERTH_URL). Retrying now will not help."
	case errdefs.Unauthenticated:
		hint = "The daemon refused the API key: the user has to set BERTH_API_KEY for berth mcp."
	case errdefs.NotImplemented:
		hint = "This sandbox's runtime cannot do this."
	case errdefs.DeadlineExceeded:
		hint = "It took too long: try again with a longer timeout, or do less at once."
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Error (%s): %s", class, msg)
	if hint != "" {
		b.WriteString("\n")
		b.WriteString(hint)
	}
	return b.String()
}

// invalid is an invalid-argument error naming the argument.
func invalid(arg, format string, args ...any) error {
	return errdefs.New(errdefs.InvalidArgument, "%s: %s", arg, fmt.Sprintf(format, args...))
}

func ptr[T any](v T) *T { return &v }
