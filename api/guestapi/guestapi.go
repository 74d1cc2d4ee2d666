// Package guestapi is the versioned contract between the berth daemon and the
// guest agent that runs as init inside every sandbox. It is the only package
// both sides import: the guest never imports daemon code, and the daemon treats
// everything the guest sends as untrusted input.
//
// Transport: HTTP/1.1 over a channel that code inside the sandbox cannot reach
// (Bootstrap.Listen: for the native runtime, a unix socket the guest binds
// before it pivots into the sandbox's root). Every request carries the
// per-sandbox token as "Authorization: Bearer <token>". At attach the daemon
// sends a random nonce to /hello and checks that the reply proves knowledge
// of the token. A request may upgrade its connection to a full-duplex byte
// stream (see Upgrade), on which terminals, port forwarding and relays are built.
package guestapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// Protocol versions. The guest serves every version from MinProtocol to
// Protocol; the daemon speaks the highest both know (STYLE 13: tolerate skew).
const (
	Protocol    = 1
	MinProtocol = 1
)

// Routes, relative to the guest's HTTP root.
const (
	PathHello     = "/guest/v1/hello"
	PathExec      = "/guest/v1/exec"      // POST ProcessSpec -> NDJSON Event stream until exit
	PathProcesses = "/guest/v1/processes" // POST ProcessSpec -> ProcessInfo; GET -> []ProcessInfo
	// Per process: GET {PathProcesses}/{pid}, GET .../{pid}/output (NDJSON, ?follow=true),
	// POST .../{pid}/wait (?timeout_ms=N), POST .../{pid}/signal (SignalRequest), DELETE .../{pid}.
)

// Headers.
const (
	HeaderNonce = "Berth-Nonce"
)

// Upgrade turns a request's connection into a full-duplex byte stream, the
// one primitive beyond request and response: terminals, port forwarding,
// interactive stdin and relays are built on it. The request carries
// "Connection: Upgrade" and "Upgrade: UpgradeProtocol"; the guest answers
// "101 Switching Protocols" with the same Upgrade header, and from then on
// the connection carries the stream's bytes both ways. Either side may
// close its write half and go on reading (half-close); a refusal is an
// ordinary error response. The guest announces FeatureStream in hello.
const (
	UpgradeProtocol = "berth-stream/1"
	FeatureStream   = "stream"
	// PathEcho upgrades to a stream that sends every byte back and closes
	// its write half once the client has closed its own: the primitive's
	// own check, used by the conformance suite.
	PathEcho = "/guest/v1/echo"
)

// HelloResponse answers PathHello.
type HelloResponse struct {
	Protocol    int      `json:"protocol"`
	MinProtocol int      `json:"min_protocol"`
	Features    []string `json:"features"`
	// Proof is hex(HMAC-SHA256(token, nonce)).
	Proof string `json:"proof"`
}

// Proof computes the hello proof for a token and nonce.
func Proof(token, nonce string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// ProcessSpec describes a process to start. The daemon has already merged the
// sandbox's defaults into it (env, cwd, user) and turned a shell string into argv.
type ProcessSpec struct {
	Args []string `json:"args"`
	// Env is KEY=VALUE entries; the guest adds PATH, HOME, USER, HOSTNAME when absent.
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	User string   `json:"user,omitempty"` // name or uid[:gid] inside the sandbox
	// Stdin is written to the process's standard input, which is then closed.
	Stdin          []byte `json:"stdin,omitempty"`
	TimeoutMs      int64  `json:"timeout_ms,omitempty"`
	MaxOutputBytes int64  `json:"max_output_bytes,omitempty"`
	// Batch asks an exec stream for its events as the response fills rather
	// than each at once: the caller wants only the end (a plain exec), and
	// one write at the exit beats one per event. Guests that predate it
	// ignore it and flush every event, which is also correct.
	Batch bool `json:"batch,omitempty"`
}

// Result says how a process ended.
type Result struct {
	Pid             int    `json:"pid"`
	ExitCode        int    `json:"exit_code"`
	Signal          int    `json:"signal,omitempty"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	Stdout          []byte `json:"stdout,omitempty"`
	Stderr          []byte `json:"stderr,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	DurationMs      int64  `json:"duration_ms"`
	// StartError explains a process that could not start (exit code 126 or 127).
	StartError string `json:"start_error,omitempty"`
}

// Event types on NDJSON streams.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// Event is one NDJSON line of an exec or output stream. In an exit event,
// Result carries the exit status but not the output (already streamed).
type Event struct {
	Type   string  `json:"type"`
	Pid    int     `json:"pid,omitempty"`
	Data   []byte  `json:"data,omitempty"`
	Result *Result `json:"result,omitempty"`
	Error  *Error  `json:"error,omitempty"`
}

// ProcessInfo describes a process the guest manages.
type ProcessInfo struct {
	Pid           int      `json:"pid"`
	Args          []string `json:"args"`
	Running       bool     `json:"running"`
	StartedUnixMs int64    `json:"started_unix_ms"`
	Result        *Result  `json:"result,omitempty"` // set once exited; includes buffered output
}

// SignalRequest asks the guest to signal a process group.
type SignalRequest struct {
	Signal int `json:"signal"`
}

// Error is the guest's error body; Class is one of errdefs' class strings.
type Error struct {
	Class   string `json:"class"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
}
