package api

// Quota bounds what one tenant holds; a zero field is no bound. A create
// (or start, or fork) that would pass a bound is resource_exhausted naming
// it and the current use; lowering a quota below the current use stops
// nothing that runs, it only refuses what would add more.
type Quota struct {
	// Sandboxes is the most sandboxes running (or paused) at once.
	Sandboxes int `json:"sandboxes,omitempty"`
	// CPUs is the most limits.cpus summed over running sandboxes; a
	// sandbox without a CPU limit is refused while it is set.
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryBytes is the most limits.memory_bytes summed over running
	// sandboxes; a sandbox without a memory limit is refused while it is set.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// DiskBytes is the most limits.disk_bytes summed over all the tenant's
	// sandboxes, stopped ones too (they keep their files); a sandbox
	// without a disk limit is refused while it is set.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// SnapshotBytes is the most bytes of snapshots stored; a snapshot is
	// refused once the tenant's reach it.
	SnapshotBytes int64 `json:"snapshot_bytes,omitempty"`
}

// TenantUsage is what one tenant uses now and has used: the current use
// the quota bounds, and the counters a team bills on.
type TenantUsage struct {
	// Tenant is the tenant's name; empty for the operator's own sandboxes.
	Tenant string `json:"tenant"`
	Quota  Quota  `json:"quota"`
	// Current use, as the quota counts it.
	Sandboxes     int     `json:"sandboxes"`
	CPUs          float64 `json:"cpus"`
	MemoryBytes   int64   `json:"memory_bytes"`
	DiskBytes     int64   `json:"disk_bytes"`
	SnapshotBytes int64   `json:"snapshot_bytes"`
	// Counters since the tenant's first sandbox, sampled every few seconds
	// while sandboxes run.
	SandboxSeconds  float64 `json:"sandbox_seconds"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryGBSeconds float64 `json:"memory_gb_seconds"`
	EgressBytesOut  int64   `json:"egress_bytes_out"`
	EgressBytesIn   int64   `json:"egress_bytes_in"`
}

// UsageResponse is the body of GET /v1/usage.
type UsageResponse struct {
	Tenants []TenantUsage `json:"tenants"`
}
