package api

// Terminals and interactive input. A background process started with TTY
// runs on a pseudo-terminal; one started with OpenStdin (or TTY) takes
// input after it started, by POST /v1/sandboxes/{id}/processes/{pid}/stdin
// or over an attachment: a WebSocket at
// GET /v1/sandboxes/{id}/processes/{pid}/attach, or
// GET /v1/sandboxes/{id}/pty, which starts a terminal and attaches to it.
//
// On an attachment's WebSocket, binary messages carry bytes: from the
// client, input; from the daemon, output (a terminal's, or stdout). Text
// messages are one TerminalMessage each, as JSON: from the client, resize
// and eof; from the daemon, attached first, then stderr (for a process
// without a terminal), error (input the daemon could not take; the
// attachment goes on) and exit last, after which the daemon closes the
// WebSocket (1000). When the sandbox goes away (stopped, deleted) the
// daemon sends an error saying why and closes with 1001. An attachment made later gets what came before first:
// a terminal's recent screen output (the last 256 KiB), another process's
// kept output. Closing an attachment leaves the process running.

// TTY is a terminal's size in characters.
type TTY struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// MaxTTY bounds a terminal's rows and columns.
const MaxTTY = 10000

// Terminal message types (TerminalMessage.Type).
const (
	MsgAttached = "attached" // daemon → client: first; Pid and TTY
	MsgStderr   = "stderr"   // daemon → client: Data
	MsgExit     = "exit"     // daemon → client: Result; the last message
	MsgError    = "error"    // daemon → client: Error
	MsgResize   = "resize"   // client → daemon: Rows and Cols
	MsgEOF      = "eof"      // client → daemon: close the input
)

// TerminalMessage is a text message on an attachment's WebSocket.
type TerminalMessage struct {
	Type string `json:"type"`
	// Pid is the process attached to (attached).
	Pid int `json:"pid,omitempty"`
	// TTY is the terminal's size (attached, for a terminal).
	TTY *TTY `json:"tty,omitempty"`
	// Rows and Cols are the new size (resize).
	Rows int `json:"rows,omitempty"`
	Cols int `json:"cols,omitempty"`
	// Data is stderr output (stderr).
	Data []byte `json:"data,omitempty"`
	// Result is how the process ended (exit); its output was sent already.
	Result *ExecResult `json:"result,omitempty"`
	// Error is what the daemon could not do (error).
	Error *Error `json:"error,omitempty"`
}

// DefaultShell is what GET /v1/sandboxes/{id}/pty runs without cmd: the
// user's login shell, bash if the image has it.
var DefaultShell = []string{"/bin/sh", "-c", `if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi`}

// Attachment is the manager's side of one attachment (a Go interface, not
// a wire type: the server bridges it to the WebSocket).
type Attachment interface {
	// Next returns the next output, stdout or stderr bytes (stream is
	// EventStdout or EventStderr), or, last, how the process ended (res).
	// An error ends the attachment (the sandbox went away).
	Next() (stream string, data []byte, res *ExecResult, err error)
	// Stdin, Resize and CloseStdin act on the process.
	Stdin(data []byte) error
	Resize(rows, cols int) error
	CloseStdin() error
	// Close ends the attachment, not the process; Next then fails.
	Close() error
}
