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
	"time"
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

// Ports: a server listening inside the sandbox is reached through the
// guest, which connects from the sandbox's own network namespace, so it
// works for a sandbox with no network at all. The guest announces
// FeaturePorts in hello.
const (
	FeaturePorts = "ports"
	// PathDial upgrades (see Upgrade) to a stream connected to a TCP port of
	// the sandbox: GET PathDial?port=N, N in 1..65535. The guest connects to
	// 127.0.0.1:N, and to [::1]:N if that is refused, within DialTimeout,
	// and answers 101 only once connected; from then on the stream's bytes,
	// half-closes included, pass through both ways. Nothing listening is
	// "unavailable" with reason "port_closed"; a connection not accepted in
	// time is "unavailable" too; a bad port is "invalid_argument".
	PathDial = "/guest/v1/dial"
	// PathPorts: GET -> PortsResult, the TCP sockets listening in the sandbox.
	PathPorts = "/guest/v1/ports"
)

// DialTimeout bounds the guest's connection to a port of the sandbox.
const DialTimeout = 5 * time.Second

// MaxPorts bounds PortsResult: the guest sends the first MaxPorts in its order.
const MaxPorts = 4096

// Protocols of a ListeningPort.
const (
	ProtoTCP  = "tcp"
	ProtoTCP6 = "tcp6"
)

// ListeningPort is one TCP socket listening in the sandbox.
type ListeningPort struct {
	Port    int    `json:"port"`
	Address string `json:"address"` // the bound address: "0.0.0.0", "127.0.0.1", "::", "::1", ...
	Proto   string `json:"proto"`   // ProtoTCP or ProtoTCP6
}

// PortsResult answers GET PathPorts: listening sockets sorted by port, then
// address, then protocol, without duplicates, at most MaxPorts of them.
type PortsResult struct {
	Ports []ListeningPort `json:"ports"`
}

// Terminals and interactive input: a process started with TTY or
// OpenStdin takes input after it started, and any number of attachments
// follow it at once. The guest announces FeatureTerminals in hello.
const (
	FeatureTerminals = "terminals"
	// PathProcessStdin: POST {PathProcesses}/{pid}/stdin with the raw bytes
	// as the body (at most MaxStdinWrite) writes them to the process's
	// input; ?close=true closes the input after them (EOF; for a terminal,
	// the terminal's EOF character). 204 when written. A process without
	// OpenStdin or TTY is "conflict"; one that ended, "conflict" too; a
	// process that does not read blocks the request until its ctx ends.
	PathProcessStdinSuffix = "/stdin"
	// PathProcessAttach: GET {PathProcesses}/{pid}/attach upgrades (see
	// Upgrade) to a stream of frames (Frame*) both ways. The guest sends
	// first what came before: a TTY process's last ScrollbackBytes of
	// output, another process's kept output from its start; then output as
	// it comes, and FrameExit last, after which it closes the stream. The
	// daemon sends FrameStdin, FrameResize and FrameCloseStdin; a frame the
	// guest cannot take ends the attachment. Closing an attachment does not
	// touch the process.
	PathProcessAttachSuffix = "/attach"
)

// Suspending, for a runtime that saves a sandbox whole (gVisor's checkpoint
// cannot save a socket bound on the host): POST PathSuspend answers 204,
// then the guest closes its listener and every connection and stream, and
// serves nothing until it receives RelistenSignal from outside (runsc kill)
// and listens again where it did. A guest that was not booted to be
// suspended (native's) answers "not_implemented". The guest announces
// FeatureSuspend in hello when it can.
const (
	FeatureSuspend = "suspend"
	PathSuspend    = "/guest/v1/suspend"
	// RelistenSignal is SIGUSR2. A process inside may send it too; at worst
	// the guest listens again early and the runtime's checkpoint fails,
	// leaving that sandbox running.
	RelistenSignal = 12
)

// Exits: the daemon learns of every background process's end as it
// happens, whether or not anyone waits on it. The guest announces
// FeatureExits in hello; an older guest has no such route.
const (
	FeatureExits = "exits"
	// PathExits: GET -> NDJSON stream of Event{Type: EventExit, Pid,
	// Result} (Result without output), one per background process
	// (PathProcesses, not PathExec) that ended, each once: first those no
	// stream has carried yet, oldest first (the guest keeps the last
	// MaxExitsKept), then each as it happens. The stream stays open until
	// the client closes it or the guest stops serving.
	PathExits = "/guest/v1/exits"
	// MaxExitsKept bounds the exits the guest keeps for a stream to come.
	MaxExitsKept = 1024
	// MaxExitLine bounds one line of the PathExits stream as the daemon
	// reads it.
	MaxExitLine = 16 << 10
)

// Frames of an attachment: a 5-byte head, the type and the payload's
// length as a big-endian uint32 (at most MaxFrame), then the payload.
const (
	FrameStdin      byte = 1 // daemon → guest: input bytes
	FrameStdout     byte = 2 // guest → daemon: output bytes (a TTY's output)
	FrameStderr     byte = 3 // guest → daemon: stderr bytes (not for a TTY)
	FrameResize     byte = 4 // daemon → guest: TTY JSON, the terminal's new size
	FrameExit       byte = 5 // guest → daemon: Result JSON without output; the last frame
	FrameCloseStdin byte = 6 // daemon → guest: no payload; as ?close=true
	FrameHead            = 5
	MaxFrame             = 1 << 20
)

// ScrollbackBytes is how much of a terminal's recent output the guest
// keeps for an attachment made later (a reattach after a dropped connection).
const ScrollbackBytes = 256 << 10

// MaxStdinWrite bounds one PathProcessStdin body.
const MaxStdinWrite = 16 << 20

// TTY is a terminal's size.
type TTY struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

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
	// TTY runs the process on a pseudo-terminal of this size: its stdin,
	// stdout and stderr are the terminal, it leads a session of its own
	// with the terminal as its controlling one, and TERM defaults to
	// xterm-256color. Its output is stdout only. Needs FeatureTerminals.
	TTY *TTY `json:"tty,omitempty"`
	// OpenStdin keeps standard input open (a pipe, or the terminal) for
	// PathProcessStdin and attachments to feed; Stdin, if any, is written
	// first. Without it and without TTY, stdin is Stdin then EOF, or
	// /dev/null. Needs FeatureTerminals.
	OpenStdin bool `json:"open_stdin,omitempty"`
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
	// TTY is the terminal's size for a process on one; OpenStdin says its
	// input is open (true for a TTY process until its input is closed).
	TTY       *TTY `json:"tty,omitempty"`
	OpenStdin bool `json:"open_stdin,omitempty"`
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
