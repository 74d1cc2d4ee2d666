package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthsh/berth/api"
)

// Defaults of execute.
const (
	DefaultExecTimeout = 5 * time.Minute
	// DefaultMaxOutputBytes bounds each of stdout and stderr that a model
	// gets back: enough for a build log's end, small enough for a context.
	DefaultMaxOutputBytes = 100 << 10
	// MaxOutputBytesLimit is the most a caller may ask for.
	MaxOutputBytesLimit = 4 << 20
	// MaxExecTimeoutS is the longest timeout a caller may give, in seconds
	// (7 days; larger ones would wrap once turned into a duration).
	MaxExecTimeoutS = 7 * 24 * 3600
)

type executeInput struct {
	SandboxID      string            `json:"sandbox_id"`
	Command        string            `json:"command" jsonschema:"A shell command line, run with /bin/sh -c (pipes, &&, redirections and globs work). Example: cd src && ls -la | head"`
	Timeout        int64             `json:"timeout,omitempty" jsonschema:"Seconds before the command's whole process group is killed (default 300)."`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"Working directory of the command (default: the sandbox's workdir)."`
	Env            map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for this command."`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"Text written to the command's standard input, which is then closed."`
	User           string            `json:"user,omitempty" jsonschema:"User to run as: a name or uid[:gid] inside the sandbox (default: the sandbox's user; root works too)."`
	MaxOutputBytes int64             `json:"max_output_bytes,omitempty" jsonschema:"Most bytes of stdout and of stderr each to return (default 102400, at most 4194304); the rest is dropped and the result says truncated."`
}

// executeOutput is how a command ended and what it wrote.
type executeOutput struct {
	ExitCode int `json:"exit_code" jsonschema:"Exit status, or 128+signal when a signal ended the command."`
	Signal   int `json:"signal,omitempty" jsonschema:"Number of the signal that ended the command, if one did."`
	// Stdout and Stderr are the output as text (invalid UTF-8 replaced).
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
	OOMKilled       bool   `json:"oom_killed"`
	DurationMs      int64  `json:"duration_ms"`
	Error           string `json:"error,omitempty" jsonschema:"Why the command could not start, if it could not."`
}

func (b *backend) addExecTool(s *mcp.Server) {
	addTool(s, &mcp.Tool{
		Name:  "execute",
		Title: "Run a shell command in a sandbox",
		Description: "Run a shell command in the sandbox and wait for it to end. Returns its exit code, stdout and stderr, " +
			"and says whether it timed out, was killed for running out of memory, or had its output truncated. " +
			"A non-zero exit code is not a tool error: read stderr. Commands run one at a time in a fresh shell: " +
			"cd and exported variables do not carry over to the next call (use cwd and env, or chain with &&). " +
			"Nothing is interactive: pass answers with stdin or flags such as -y.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	}, func(s *jsonschema.Schema) {
		describeSandboxID(s)
		s.Properties["command"].MinLength = ptr(1)
		s.Properties["timeout"].Minimum = ptr(0.0)
		s.Properties["timeout"].Maximum = ptr(float64(MaxExecTimeoutS))
		s.Properties["max_output_bytes"].Minimum = ptr(0.0)
		s.Properties["max_output_bytes"].Maximum = ptr(float64(MaxOutputBytesLimit))
	}, b.execute)
}

func (b *backend) execute(ctx context.Context, in executeInput) (executeOutput, string, error) {
	timeout := DefaultExecTimeout
	if in.Timeout > MaxExecTimeoutS {
		return executeOutput{}, "", invalid("timeout", "%d seconds is more than the %d (7 days) a command may run", in.Timeout, MaxExecTimeoutS)
	}
	if in.Timeout > 0 {
		timeout = time.Duration(in.Timeout) * time.Second
	}
	maxOut := in.MaxOutputBytes
	if maxOut == 0 {
		maxOut = DefaultMaxOutputBytes
	}
	req := api.ExecRequest{Shell: in.Command, Cwd: in.Cwd, Env: in.Env, User: in.User, TimeoutMs: timeout.Milliseconds(), MaxOutputBytes: maxOut}
	if in.Stdin != "" {
		req.Stdin = []byte(in.Stdin)
	}
	r, err := b.c.Exec(ctx, in.SandboxID, req)
	if err != nil {
		return executeOutput{}, "", err
	}
	out := executeOutput{ExitCode: r.ExitCode, Signal: r.Signal, Stdout: strings.ToValidUTF8(string(r.Stdout), "\uFFFD"),
		Stderr: strings.ToValidUTF8(string(r.Stderr), "\uFFFD"), StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated,
		TimedOut: r.TimedOut, OOMKilled: r.OOMKilled, DurationMs: r.DurationMs, Error: r.Error}
	return out, execText(out, timeout, maxOut), nil
}

// execText is what a model reads of a command's result: first berth's
// bracketed facts of how it ended, exit code last, then its stdout and its
// stderr under a marker. The facts come first because the output is the
// sandbox's: a command can print "[exit code 0]" itself, but only after the
// real one.
func execText(r executeOutput, timeout time.Duration, maxOut int64) string {
	var b strings.Builder
	if r.Error != "" {
		fmt.Fprintf(&b, "[could not start: %s]\n", r.Error)
	}
	if r.TimedOut {
		fmt.Fprintf(&b, "[timed out after %s: the command and its children were killed; pass a larger timeout if it needs longer]\n", timeout)
	}
	if r.OOMKilled {
		b.WriteString("[killed: the sandbox ran out of memory (oom_killed)]\n")
	}
	if r.Signal != 0 {
		fmt.Fprintf(&b, "[ended by signal %d]\n", r.Signal)
	}
	for _, t := range []struct {
		name string
		cut  bool
	}{{"stdout", r.StdoutTruncated}, {"stderr", r.StderrTruncated}} {
		if t.cut {
			fmt.Fprintf(&b, "[%s truncated: only its first %d bytes are shown; redirect to a file and read_file or grep it for the rest]\n", t.name, maxOut)
		}
	}
	fmt.Fprintf(&b, "[exit code %d]", r.ExitCode)
	if r.Stdout != "" {
		b.WriteString("\n")
		b.WriteString(r.Stdout)
	}
	if r.Stderr != "" {
		if !strings.HasSuffix(b.String(), "\n") {
			b.WriteString("\n")
		}
		b.WriteString("[stderr]\n")
		b.WriteString(r.Stderr)
	}
	return b.String()
}
