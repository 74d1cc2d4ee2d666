// Package api holds the public wire types of berth's HTTP API, shared by the
// server and the Go client. openapi.yaml beside this file describes the same
// contract; a server test checks that the two agree.
package api

import "time"

// Version is the API version prefix of every route.
const Version = "v1"

// Sandbox states. Transitions (docs/lifecycle.md): creating → running;
// running → stopping → stopped; stopped → starting → running; any settled
// state → deleting → gone; a failed delete → error.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateStarting = "starting"
	StateDeleting = "deleting"
	StateError    = "error"
)

// Timeouts bound a sandbox's life. In a request, an absent field takes the
// daemon's default and 0 turns that timeout off; a sandbox reports the
// values in force.
type Timeouts struct {
	// IdleSeconds stops a running sandbox after this long without activity:
	// an exec, a running process started through the API, an open stream, a
	// keepalive.
	IdleSeconds *int64 `json:"idle_timeout_s,omitempty"`
	// DeleteAfterSeconds deletes a sandbox this long after it stopped.
	DeleteAfterSeconds *int64 `json:"delete_after_s,omitempty"`
	// ArchiveAfterSeconds archives a sandbox this long after it stopped:
	// its writable layer becomes a compressed archive and its directory is
	// freed, until start restores it (a delete_after that is due first
	// wins).
	ArchiveAfterSeconds *int64 `json:"archive_after_s,omitempty"`
	// MaxLifetimeSeconds stops a running sandbox this long after it was
	// created, busy or not.
	MaxLifetimeSeconds *int64 `json:"max_lifetime_s,omitempty"`
	// AutoResume starts a sandbox its idle timeout stopped again when a
	// request comes for one of its ports (it then waits for the port, up
	// to 30 s, before the request goes through). Its start_cmd brings the
	// server back. A sandbox stopped on purpose stays stopped.
	AutoResume bool `json:"auto_resume,omitempty"`
}

// Limits are a sandbox's resource ceilings. A zero field means: in a create
// request, the daemon's default; in an update (PATCH), keep the current value;
// in a returned sandbox, no limit.
type Limits struct {
	// CPUs is the CPU quota in cores (0.5 = half a core).
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryBytes is the memory ceiling, swap included.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pids is the maximum number of tasks (processes and threads).
	Pids int64 `json:"pids,omitempty"`
	// DiskBytes is the size of the writable layer's own file system: a full
	// one is ENOSPC inside the sandbox. Set at create; it can only grow.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// OpenFiles is the most descriptors one process may hold (RLIMIT_NOFILE,
	// soft and hard); a change applies to processes started after it.
	OpenFiles int64 `json:"open_files,omitempty"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	// Image is the root filesystem; "host" (the default) is a read-only view of
	// the host's system directories with a private writable layer.
	Image string `json:"image,omitempty"`
	// Runtime picks the isolation tier; empty means the daemon default.
	Runtime string            `json:"runtime,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Workdir is the default working directory of execs (default /home/user).
	Workdir string `json:"workdir,omitempty"`
	// User is the default user of execs: a name or uid[:gid] inside the sandbox (default "user").
	User     string            `json:"user,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Limits   Limits            `json:"limits,omitzero"`
	Timeouts Timeouts          `json:"timeouts,omitzero"`
	// Network is what the sandbox may reach (default: the daemon's
	// default policy, none unless it was started with --default-network).
	Network *Network `json:"network,omitempty"`
	// PublicPorts are ports inside that the daemon serves without the
	// sandbox's access token (see Port).
	PublicPorts []int `json:"public_ports,omitempty"`
	// Public serves every port inside without the access token: a public
	// sandbox (E2B's allowPublicTraffic).
	Public bool `json:"public,omitempty"`
	// StartCmd is a command line (run by /bin/sh -c as the sandbox's user,
	// in its workdir) started as a background process each time the
	// sandbox starts: at create and at every start, auto-resume included.
	// An agent's server, a dev server.
	StartCmd string `json:"start_cmd,omitempty"`
}

// Sandbox is the public view of a sandbox.
type Sandbox struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Image string `json:"image"`
	// ImageID is the stored image the sandbox is made of (absent for the
	// host image): the sandbox keeps these files whatever its image's name
	// points at later.
	ImageID   string            `json:"image_id,omitempty"`
	Runtime   string            `json:"runtime"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir"`
	User      string            `json:"user"`
	Labels    map[string]string `json:"labels,omitempty"`
	Limits    Limits            `json:"limits"`
	Timeouts  Timeouts          `json:"timeouts"`
	Network   Network           `json:"network"`
	CreatedAt time.Time         `json:"created_at"`
	// PublicPorts open without the access token.
	PublicPorts []int `json:"public_ports,omitempty"`
	// Public says every port opens without the access token.
	Public bool `json:"public,omitempty"`
	// AccessToken opens the sandbox's private ports (see Port).
	AccessToken string `json:"access_token,omitempty"`
	// StartCmd runs in the background each time the sandbox starts.
	StartCmd string `json:"start_cmd,omitempty"`
	// Archived says a stopped sandbox's files are in a compressed archive
	// (archive_after_s) until start restores them.
	Archived bool `json:"archived,omitempty"`
	// Checkpointed says a paused sandbox's processes are saved with their
	// memory (pause with memory): it holds no CPU or memory until resume
	// restores them. Reported by a sandbox's GET, pause and resume.
	Checkpointed bool `json:"checkpointed,omitempty"`
	// StoppedAt is when the sandbox last stopped, while it is stopped.
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// Error says why a sandbox is in the error state, or why it stopped
	// when berth stopped it (a timeout, an init that died, a host restart).
	Error string `json:"error,omitempty"`
}

// PauseRequest is the (optional) body of POST /v1/sandboxes/{id}/pause.
type PauseRequest struct {
	// Memory saves the processes with their memory and frees the
	// sandbox's CPU and memory (a runtime with memory_checkpoint), instead
	// of freezing them in place.
	Memory bool `json:"memory,omitempty"`
}

// UpdateSandboxRequest is the body of PATCH /v1/sandboxes/{id}. Labels is a
// merge patch: a string sets a label, null removes it.
type UpdateSandboxRequest struct {
	Labels map[string]*string `json:"labels,omitempty"`
	// Limits change a running sandbox's ceilings at once; a zero field keeps
	// its current value.
	Limits *Limits `json:"limits,omitempty"`
	// Network replaces the sandbox's network policy whole; new connections
	// obey it at once (open ones keep going). A change that fails leaves
	// the old policy in force.
	Network *Network `json:"network,omitempty"`
	// PublicPorts replaces the ports that open without the access token
	// (an empty list: none).
	PublicPorts *[]int `json:"public_ports,omitempty"`
	// Public, when set, makes every port open without the access token
	// (true) or only the public ports (false).
	Public *bool `json:"public,omitempty"`
	// Timeouts replace the timeouts in force field by field: an absent
	// field keeps its value, 0 turns that timeout off. max_lifetime_s
	// still counts from the sandbox's creation. auto_resume true turns
	// auto-resume on; false leaves it as it is.
	Timeouts *Timeouts `json:"timeouts,omitempty"`
}

// Usage is what a sandbox uses now: GET /v1/sandboxes/{id}/stats.
type Usage struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryBytes     int64   `json:"memory_bytes"`
	MemoryPeakBytes int64   `json:"memory_peak_bytes"`
	Pids            int64   `json:"pids"`
	// OOMKills counts processes the kernel killed at the memory limit.
	OOMKills int64 `json:"oom_kills"`
	// DiskBytes is the space the sandbox's writable layer takes.
	DiskBytes int64 `json:"disk_bytes"`
	// Egress counts the sandbox's egress since the daemon last attached its
	// network (absent without one).
	Egress *EgressSummary `json:"egress,omitempty"`
}

// ListSandboxesResponse is the body of GET /v1/sandboxes.
type ListSandboxesResponse struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// ExecRequest starts a process in a sandbox: POST /v1/sandboxes/{id}/exec
// (wait for the result, or stream with ?stream=true) and
// POST /v1/sandboxes/{id}/processes (start in the background).
type ExecRequest struct {
	// Cmd is the argv; at most one of Cmd and Shell is set. With neither,
	// the sandbox's image's Entrypoint and Cmd run (as docker run does).
	Cmd []string `json:"cmd,omitempty"`
	// Shell is a command line run by /bin/sh -c.
	Shell string            `json:"shell,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	User  string            `json:"user,omitempty"`
	// Stdin is written to the process's standard input, which is then closed.
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutMs kills the whole process group after this many milliseconds (0: none).
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// MaxOutputBytes bounds each of stdout and stderr as kept and sent; output
	// past it is dropped and the result says truncated (0: the default, 4 MiB).
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// TTY runs a background process on a pseudo-terminal of this size
	// (stdin, stdout and stderr are the terminal; output is stdout only).
	TTY *TTY `json:"tty,omitempty"`
	// OpenStdin keeps a background process's input open, to be fed later
	// (Stdin, if set, first); a TTY process's always is.
	OpenStdin bool `json:"open_stdin,omitempty"`
}

// ExecResult says how a process ended. Output is raw bytes (base64 in JSON).
type ExecResult struct {
	Pid int `json:"pid"`
	// ExitCode is the exit status, or 128+signal when a signal ended the process.
	ExitCode int `json:"exit_code"`
	// Signal is the number of the signal that ended the process, or 0.
	Signal          int    `json:"signal,omitempty"`
	TimedOut        bool   `json:"timed_out"`
	OOMKilled       bool   `json:"oom_killed"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	DurationMs      int64  `json:"duration_ms"`
	// Error explains an exec that could not start (exit code 126 or 127).
	Error string `json:"error,omitempty"`
}

// Exec stream event types (NDJSON lines of a streaming exec or process output).
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// ExecEvent is one line of a streamed exec: start (with Pid), stdout and stderr
// chunks (Data), then exactly one exit (with Result) or error.
type ExecEvent struct {
	Type   string      `json:"type"`
	Pid    int         `json:"pid,omitempty"`
	Data   []byte      `json:"data,omitempty"`
	Result *ExecResult `json:"result,omitempty"`
	Error  *Error      `json:"error,omitempty"`
}

// Process is a process started in a sandbox through the API.
type Process struct {
	Pid       int       `json:"pid"`
	Cmd       []string  `json:"cmd"`
	Running   bool      `json:"running"`
	StartedAt time.Time `json:"started_at"`
	// Result is set once the process has exited.
	Result *ExecResult `json:"result,omitempty"`
	// TTY is the terminal's size, for a process on one.
	TTY *TTY `json:"tty,omitempty"`
	// OpenStdin says the process's input is open for more.
	OpenStdin bool `json:"open_stdin,omitempty"`
}

// ListProcessesResponse is the body of GET /v1/sandboxes/{id}/processes.
type ListProcessesResponse struct {
	Processes []Process `json:"processes"`
}

// SignalRequest is the body of POST /v1/sandboxes/{id}/processes/{pid}/signal.
type SignalRequest struct {
	// Signal is a name ("TERM", "SIGKILL") or a number ("9").
	Signal string `json:"signal"`
}

// Error is the body of every error response.
type Error struct {
	// Class is one of errdefs' classes: not_found, invalid_argument, conflict, ...
	Class   string `json:"class"`
	Message string `json:"message"`
	// Reason refines the class for file errors: is_directory, not_directory,
	// invalid_path, not_regular_file, no_space.
	Reason string `json:"reason,omitempty"`
	// Paths are the paths the error is about (an apply's conflicts).
	Paths []string `json:"paths,omitempty"`
}

// ErrorResponse wraps Error as the top-level body.
type ErrorResponse struct {
	Error Error `json:"error"`
}

// VersionResponse is the body of GET /v1/version.
type VersionResponse struct {
	Version  string   `json:"version"`
	API      string   `json:"api"`
	Runtimes []string `json:"runtimes"`
	// PortsDomain is the domain of sandboxes' ports in host form:
	// {port}-{id}.{PortsDomain} on the daemon's listener.
	PortsDomain string `json:"ports_domain,omitempty"`
}

// Runtime is an isolation tier of the daemon: GET /v1/runtimes.
type Runtime struct {
	Name string `json:"name"`
	// Default is the runtime a create gets when it names none.
	Default bool `json:"default"`
	// Available says whether the runtime can run on this host; Reason says
	// why not.
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	// Capabilities is what an available runtime can do here.
	Capabilities *RuntimeCapabilities `json:"capabilities,omitempty"`
}

// RuntimeCapabilities is what a runtime can do on this host. A request for
// anything else is refused with the reason, never silently ignored.
type RuntimeCapabilities struct {
	// Limits names the limits it enforces: cpus, memory_bytes, pids,
	// disk_bytes, open_files.
	Limits []string `json:"limits"`
	// Max is the most one sandbox may be given on this host (0: no bound known).
	Max Limits `json:"max"`
	// NetworkModes are the network modes it can give a sandbox.
	NetworkModes []string `json:"network_modes"`
	// StopStart: stop keeps the files and start brings the sandbox back.
	StopStart bool `json:"stop_start"`
	// UpdateLimits: a running sandbox's limits can change.
	UpdateLimits bool `json:"update_limits"`
	// GrowDisk: a running sandbox's disk limit can grow.
	GrowDisk bool `json:"grow_disk"`
	// Stats: usage is reported (stats, metrics, oom_killed, limit_hit).
	Stats bool `json:"stats"`
	// IDMappedLayers: one copy of an image serves every sandbox, mounted
	// through each sandbox's own range of host ids; without it each range
	// gets a copy of the image the first time it is used.
	IDMappedLayers bool `json:"idmapped_layers"`
	// Pause: a sandbox's processes can be frozen and thawed.
	Pause bool `json:"pause"`
	// Snapshot: a sandbox's files can be snapshotted, forked, diffed and
	// applied.
	Snapshot bool `json:"snapshot"`
	// MemoryCheckpoint: a paused sandbox's processes can be saved with
	// their memory (pause with memory).
	MemoryCheckpoint bool `json:"memory_checkpoint"`
	// Missing says why the runtime lacks a capability or limit here, by its
	// name above (disk_bytes, grow_disk, idmapped_layers, …).
	Missing map[string]string `json:"missing,omitempty"`
}

// ListRuntimesResponse is the body of GET /v1/runtimes.
type ListRuntimesResponse struct {
	Runtimes []Runtime `json:"runtimes"`
}

// Sandbox event types on GET /v1/sandboxes/{id}/events.
const (
	SandboxCreated  = "created"
	SandboxStarted  = "started"
	SandboxStopped  = "stopped"
	SandboxDeleted  = "deleted"
	ProcessStarted  = "process_started"
	ProcessExited   = "process_exited"
	ProcessOOM      = "oom"
	ProcessTimedOut = "timed_out"
	LimitHit        = "limit_hit"
	EgressDenied    = "egress_denied"
)

// SandboxEvent is one Server-Sent Event of a sandbox's events stream.
type SandboxEvent struct {
	Type    string    `json:"type"`
	Sandbox string    `json:"sandbox"`
	Time    time.Time `json:"time"`
	// Pid is the process of process events.
	Pid int `json:"pid,omitempty"`
	// Reason says why berth stopped a sandbox (a timeout, an init that died).
	Reason string `json:"reason,omitempty"`
	// Result is how a process ended (without its output), for process_exited, oom and timed_out.
	Result *ExecResult `json:"result,omitempty"`
	// Limit names the limit of a limit_hit event: pids (forks refused), cpu
	// (quota ran out) or disk (the writable layer's disk is full).
	Limit string `json:"limit,omitempty"`
	// Count is how many times it was hit since the last limit_hit event of
	// that limit (forks refused, CPU periods throttled; 1 for disk).
	Count int64 `json:"count,omitempty"`
	// Egress is the refused attempt of an egress_denied event.
	Egress *EgressRecord `json:"egress,omitempty"`
}
