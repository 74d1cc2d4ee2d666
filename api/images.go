package api

import "time"

// Image is a stored image: pulled from a registry, imported from a file or
// built as a template.
type Image struct {
	// ID is the digest of the image's manifest (of its config, for a
	// template), "sha256:…": a reference that always means these files.
	ID string `json:"id"`
	// Names are the references that resolve to it for the caller
	// ("docker.io/library/python:3.12-slim"): a tenant's own names and the
	// operator's (the catalog every tenant uses); for the operator, the
	// operator's.
	Names []string `json:"names,omitempty"`
	// TenantNames are the names that belong to a tenant, by tenant: a
	// tenant's own (the rest of Names are the operator's); for the
	// operator, every tenant's.
	TenantNames map[string][]string `json:"tenant_names,omitempty"`
	// Size is the bytes of its unpacked layers.
	Size int64 `json:"size"`
	// Layers are its layers' digests (of their uncompressed tars), bottom first.
	Layers []string `json:"layers"`
	// Source is the reference it was pulled as or the file it came from.
	Source    string      `json:"source"`
	CreatedAt time.Time   `json:"created_at"`
	Config    ImageConfig `json:"config"`
	// InUse lists the sandboxes made of it (inspect only).
	InUse []string `json:"in_use,omitempty"`
	// Template says it was built here from a Dockerfile (berth template
	// build); Source is then "build:" and the Dockerfile's path.
	Template bool `json:"template,omitempty"`
	// Notes say what unpacking skipped (device files, extended attributes
	// that would mean something on the host).
	Notes []string `json:"notes,omitempty"`
}

// ImageConfig is what of an image's configuration berth reads: Env,
// WorkingDir and User are sandboxes' defaults (a create's or an exec's own
// values win). Entrypoint and Cmd are reported; an exec always names its
// own command.
type ImageConfig struct {
	Env          []string          `json:"env,omitempty"`
	WorkingDir   string            `json:"working_dir,omitempty"`
	User         string            `json:"user,omitempty"`
	Entrypoint   []string          `json:"entrypoint,omitempty"`
	Cmd          []string          `json:"cmd,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	ExposedPorts []string          `json:"exposed_ports,omitempty"`
	Architecture string            `json:"architecture,omitempty"`
	OS           string            `json:"os,omitempty"`
}

// PullImageRequest is the body of POST /v1/images/pull.
type PullImageRequest struct {
	// Ref is an image reference: "python:3.12-slim",
	// "ghcr.io/org/img@sha256:…", "registry.local:5000/team/img:tag".
	Ref string `json:"ref"`
}

// PruneImagesRequest is the body of POST /v1/images/prune.
type PruneImagesRequest struct {
	// All removes every image no sandbox uses, not only unnamed ones.
	All bool `json:"all,omitempty"`
}

// PruneResult says what a prune removed.
type PruneResult struct {
	Images     []string `json:"images"`
	Layers     int      `json:"layers"`
	FreedBytes int64    `json:"freed_bytes"`
	// CacheEntries is how many cached template build steps went (prune
	// with all).
	CacheEntries int `json:"cache_entries,omitempty"`
}

// Pull progress statuses.
const (
	PullResolved    = "resolved"    // the manifest is read: Total is the bytes to download
	PullDownloading = "downloading" // a layer's bytes so far (Current of Total)
	PullLayerExists = "exists"      // a layer already in the store
	PullUnpacked    = "unpacked"    // a layer is verified and stored
	PullDone        = "done"        // the image is stored: Image is set
	PullError       = "error"       // the pull failed: Error is set
)

// PullEvent is one line of a pull's NDJSON progress stream (POST
// /v1/images/pull or /v1/images/import with Accept: application/x-ndjson).
type PullEvent struct {
	Status  string `json:"status"`
	Layer   string `json:"layer,omitempty"`
	Current int64  `json:"current,omitempty"`
	Total   int64  `json:"total,omitempty"`
	// Image is the stored image, with "done".
	Image *Image `json:"image,omitempty"`
	// Error is the failure, with "error".
	Error *Error `json:"error,omitempty"`
}

// Pool is a warm pool: sandboxes of one image booted ahead of time, so a
// create of that image is a hand-over (GET /v1/pools, PUT /v1/pools).
type Pool struct {
	Image   string `json:"image"`
	Runtime string `json:"runtime,omitempty"`
	// Size is how many the pool keeps ready; 0 in a PUT removes the pool.
	Size int `json:"size"`
	// Ready is how many are ready now.
	Ready int `json:"ready"`
}

// ListImagesResponse is the body of GET /v1/images and of an import.
type ListImagesResponse struct {
	Images []Image `json:"images"`
}

// ListPoolsResponse is the body of GET /v1/pools.
type ListPoolsResponse struct {
	Pools []Pool `json:"pools"`
}
