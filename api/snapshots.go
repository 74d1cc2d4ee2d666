package api

import "time"

// StatePaused is a sandbox whose processes are frozen: no CPU, memory and
// files kept; exec and files answer conflict until it resumes.
const StatePaused = "paused"

// Sandbox event types of pause and resume.
const (
	SandboxPaused   = "paused"
	SandboxResumed  = "resumed"
	SandboxArchived = "archived"
)

// SnapshotPrefix begins an image reference that names a snapshot:
// "snapshot:NAME" in a create request, a warm pool or a template's FROM.
const SnapshotPrefix = "snapshot:"

// CreateSnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type CreateSnapshotRequest struct {
	// Name is unique among the tenant's snapshots: letters, digits and
	// "._-", up to 128, starting with a letter or digit.
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

// Snapshot is a sandbox's files at one instant, usable as an image
// ("snapshot:NAME").
type Snapshot struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Sandbox is the sandbox it was taken of (which may be gone since).
	Sandbox string `json:"sandbox"`
	// Image is the image that sandbox was made from; BaseImageID the stored
	// image under the snapshot's layers (absent for the host image).
	Image       string `json:"image"`
	BaseImageID string `json:"base_image_id,omitempty"`
	// Parent is the snapshot that sandbox was made from, if any.
	Parent string `json:"parent,omitempty"`
	// SizeBytes is what the snapshot's own layer holds: what the sandbox
	// changed over its image (or parent snapshot).
	SizeBytes int64             `json:"size_bytes"`
	Labels    map[string]string `json:"labels,omitempty"`
	// FrozenMs is how long the sandbox's processes were frozen while its
	// files were captured (0 when it was not running).
	FrozenMs  float64   `json:"frozen_ms"`
	CreatedAt time.Time `json:"created_at"`
	// InUse lists the sandboxes made from it (inspect only).
	InUse []string `json:"in_use,omitempty"`
}

// ListSnapshotsResponse is the body of GET /v1/snapshots.
type ListSnapshotsResponse struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many copies (default 1, at most 64).
	Count int `json:"count,omitempty"`
	// Labels are each copy's labels, in order (fewer than Count: the rest
	// get none). Every copy also gets berth.fork_of=<source id>.
	Labels []map[string]string `json:"labels,omitempty"`
}

// ForkResponse is the result of a fork.
type ForkResponse struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	// Snapshot is the id of the copies' shared layer (absent when the
	// source had changed nothing: the copies are made from its image).
	Snapshot string `json:"snapshot,omitempty"`
	// FrozenMs is how long the source was frozen for the capture.
	FrozenMs float64 `json:"frozen_ms"`
}

// Change kinds.
const (
	ChangeAdded    = "added"
	ChangeModified = "modified"
	ChangeDeleted  = "deleted"
)

// Change is one path a sandbox changed.
type Change struct {
	Path string `json:"path"`
	// Kind is added, modified or deleted.
	Kind string `json:"kind"`
	// Type is the entry's (the old one's for deleted): file, dir, symlink, …
	Type string `json:"type"`
	// Mode is the permission bits with setuid, setgid and sticky.
	Mode uint32 `json:"mode"`
	Size int64  `json:"size"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	// Link is a symlink's target.
	Link string `json:"link,omitempty"`
}

// Diff formats of GET /v1/sandboxes/{id}/diff?format=.
const (
	DiffJSON  = "json"
	DiffTar   = "tar"
	DiffPatch = "patch"
)

// DiffResponse is the JSON body of GET /v1/sandboxes/{id}/diff.
type DiffResponse struct {
	// Against is what the sandbox is compared with: its image, or a snapshot.
	Against string   `json:"against"`
	Changes []Change `json:"changes"`
}

// ApplyRequest is the body of POST /v1/sandboxes/{id}/apply.
type ApplyRequest struct {
	// From is a sandbox id or "snapshot:NAME": its changes over its own
	// image (a snapshot's: over the snapshot it was made from) are applied.
	From string `json:"from"`
	// Overwrite applies a change although this sandbox changed the same
	// path differently; without it such conflicts refuse the whole apply.
	Overwrite bool `json:"overwrite,omitempty"`
}

// ApplyResult says what an apply changed.
type ApplyResult struct {
	// Changes are the changes applied (absent for a tar: it is applied as
	// it comes).
	Changes []Change `json:"changes"`
	// Conflicts are the paths both sides changed (applied with overwrite).
	Conflicts []string `json:"conflicts,omitempty"`
	// Entries were written (files, directories, links), Whiteouts applied
	// (deletions), Bytes of file content written.
	Entries   int   `json:"entries"`
	Whiteouts int   `json:"whiteouts"`
	Bytes     int64 `json:"bytes"`
}
