package api

// BuildTemplateRequest is how a template is built (the query of POST
// /v1/templates/build, whose body is the build context as a tar).
type BuildTemplateRequest struct {
	// Name is the template's name, an image reference ("my-agent",
	// "team/agent:v2"): sandboxes are created with it as their image.
	Name string `json:"name"`
	// Dockerfile is the Dockerfile's path in the context (default
	// "Dockerfile").
	Dockerfile string `json:"dockerfile,omitempty"`
	// Args are build arguments: values for the Dockerfile's ARGs.
	Args map[string]string `json:"args,omitempty"`
	// NoCache runs every step, ignoring cached ones.
	NoCache bool `json:"no_cache,omitempty"`
	// Network is what RUN steps may reach (default: the daemon's default
	// policy, as for any sandbox).
	Network *Network `json:"network,omitempty"`
	// CPUs and MemoryBytes limit each step's sandbox (default: the
	// daemon's defaults); a tenant with a CPU or memory quota gives them.
	CPUs        float64 `json:"cpus,omitempty"`
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
}

// Build event types (the lines of a build's NDJSON log).
const (
	BuildStep   = "step"   // a step begins (or was found in the cache: Cached)
	BuildStdout = "stdout" // a RUN step's output
	BuildStderr = "stderr"
	BuildDone   = "done"  // the template is stored: Image, Executed, Cached
	BuildError  = "error" // the build failed: Error
)

// BuildEvent is one line of a template build's log.
type BuildEvent struct {
	Type string `json:"type"`
	// Step is the step's number (1-based) of Steps.
	Step  int `json:"step,omitempty"`
	Steps int `json:"steps,omitempty"`
	// Instruction is the step as written in the Dockerfile, at Line.
	Instruction string `json:"instruction,omitempty"`
	Line        int    `json:"line,omitempty"`
	// Cached says the step's result came from an earlier build.
	Cached bool   `json:"cached,omitempty"`
	Data   []byte `json:"data,omitempty"`
	// Image is the template, with done.
	Image *Image `json:"image,omitempty"`
	// Executed and CachedSteps count the steps that ran and that came
	// from the cache, with done.
	Executed    int    `json:"executed,omitempty"`
	CachedSteps int    `json:"cached_steps,omitempty"`
	Error       *Error `json:"error,omitempty"`
}

// BuildResult is the answer of a build without a streamed log.
type BuildResult struct {
	Image       Image  `json:"image"`
	Executed    int    `json:"executed"`
	CachedSteps int    `json:"cached_steps"`
	Log         []byte `json:"log,omitempty"`
}
