// Package runtime defines how berth talks to an isolation tier: a runtime makes
// a sandbox whose guest agent answers on a private channel, re-attaches to it
// after a daemon restart, and deletes it without a trace.
package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/berthsh/berth/api/guestapi"
)

// Spec is a sandbox as the manager resolved it: everything a runtime needs
// to realize it, decided in one place (sandbox.Manager's resolve). A runtime
// never pulls an image or chooses a policy; it makes what the spec says, or
// refuses what it cannot make. Exec defaults (env, user, workdir) are the
// manager's business, not the runtime's.
type Spec struct {
	ID string
	// Hostname is the sandbox's host name (its id).
	Hostname string
	// Root is the root file system's read-only part; the runtime adds the
	// sandbox's own writable layer on top.
	Root RootFS
	// Mounts are bound into the root after it is assembled, in order.
	Mounts []Mount
	// Users maps user and group ids inside the sandbox to the host.
	Users IDMap
	// Network is how the sandbox reaches out.
	Network Network
	Limits  Limits
	// Files are written into the writable layer before the sandbox boots,
	// at create and at each start (owned by the sandbox's root), over what
	// was there.
	Files []File
}

// RootFS is a root file system as read-only directories on the host.
type RootFS struct {
	// Image is the reference the root was resolved from (for logs and errors).
	Image string
	// Layers are read-only directories, topmost first. Their files are owned
	// as Spec.Users maps them (the sandbox's root owns what root owns
	// inside), unless IDMapped.
	Layers []string
	// IDMapped says the layers' files are owned as the sandbox sees them
	// (root's are uid 0 on the host): the runtime mounts each layer through
	// Spec.Users (an idmapped mount), so one copy of a layer serves every
	// sandbox whatever its range. Only for a runtime with
	// Capabilities.IDMappedLayers.
	IDMapped bool
}

// Mount binds host directory Source at Target inside the sandbox.
type Mount struct {
	Source, Target string
	ReadOnly       bool
}

// IDMap maps ids 0..Size-1 inside a sandbox to HostID..HostID+Size-1 outside,
// for users and groups alike. A runtime makes the sandbox's user namespace
// owned by HostID (the sandbox's root), not by the daemon's root: the
// kernel charges per-user counts (inotify instances and watches, pending
// signals, message queue bytes, processes) to a user namespace's owner, and
// per-uid ones (the pipe-buffer and keyring quotas) to the host uid, so a
// sandbox with a range of its own exhausts only its own.
type IDMap struct {
	HostID uint32
	Size   uint32
}

// DefaultIDMap is the base of sandboxes' mappings unless the daemon is told
// otherwise: uid and gid 0..65535 inside are 1,000,000,000.. outside, far
// above the ranges that /etc/subuid hands to users, so sandboxes share no
// ids with anything else on the host. The manager gives each sandbox a
// range of its own above it (Range); range 0 is the one sandboxes shared
// before ranges were per sandbox.
var DefaultIDMap = IDMap{HostID: 1_000_000_000, Size: 65536}

// Range is the n-th range of m's size from m's base: n*Size above it.
func (m IDMap) Range(n uint32) IDMap {
	return IDMap{HostID: m.HostID + n*m.Size, Size: m.Size}
}

// Ranges is how many ranges fit from m's base below the highest valid id
// (4294967294; 4294967295 is the kernel's "no id").
func (m IDMap) Ranges() uint32 {
	if m.Size == 0 {
		return 0
	}
	return uint32((uint64(1<<32-1) - uint64(m.HostID)) / uint64(m.Size))
}

// Network modes of a runtime: how a sandbox is attached, never what it may
// reach (that is the network package's policy, on the link's far end).
const (
	// NetworkNone is loopback only.
	NetworkNone = "none"
	// NetworkLink is one interface whose far end the runtime hands to the
	// daemon (Instance.Link): every packet the sandbox sends leaves there.
	NetworkLink = "link"
)

// Network is a sandbox's network attachment.
type Network struct {
	Mode string
	// Address is the sandbox's address on its link and Gateway the far
	// end's (a point-to-point link; the default route goes through it).
	Address, Gateway netip.Addr
	// MTU is the link's.
	MTU int
}

// Link is the far end of a sandbox's network link.
type Link struct {
	// File reads and writes the sandbox's IP packets (a TUN queue). The
	// link lives as long as it is open: closing it leaves the sandbox
	// with loopback only.
	File *os.File
	MTU  int
}

// Linker is a runtime that can give a running sandbox a link (a network
// policy changed from none); a link is taken away by closing it.
type Linker interface {
	Link(ctx context.Context, id string, n Network) (*Link, error)
}

// File is a file the sandbox's writable layer starts with.
type File struct {
	Path string // absolute, inside the sandbox
	Data []byte
	Mode os.FileMode
}

// Limits are kernel-enforced ceilings; zero means unlimited.
type Limits struct {
	CPUs        float64
	MemoryBytes int64
	Pids        int64
	// DiskBytes bounds the writable layer; a runtime that cannot bound it
	// refuses a non-zero value.
	DiskBytes int64
	// OpenFiles bounds each process's descriptors (RLIMIT_NOFILE).
	OpenFiles int64
}

// Instance is a running sandbox as its runtime hands it to the manager.
type Instance struct {
	// State is runtime-private; the manager persists it and hands it back to
	// Attach and Delete after a daemon restart.
	State json.RawMessage
	// Dial opens a connection to the guest's control channel.
	Dial func(ctx context.Context) (net.Conn, error)
	// Token authenticates the daemon to the guest (and the guest to the daemon, by proof).
	Token string
	// Exited is closed when the sandbox's init has exited.
	Exited <-chan struct{}
	// Link is the far end of the sandbox's network link (NetworkLink; nil
	// from Attach: the caller links again with Linker).
	Link *Link
	// Hello is the guest's hello when the runtime had it from the guest
	// at boot, over a channel of its own (without proof: the channel is
	// the proof); nil when the caller must ask the guest.
	Hello *guestapi.HelloResponse
}

// Capabilities declares what a runtime can do beyond create, attach and
// delete, and the most it can give one sandbox on this host. The manager reads
// them before it asks: a request for what a runtime lacks is refused with the
// runtime's reason, never passed down to fail late or to be ignored.
type Capabilities struct {
	// Limits are the limits the runtime enforces.
	Limits LimitSupport
	// Host is the most one sandbox may be given here (0: no bound known).
	Host HostLimits
	// NetworkModes are the network modes the runtime can attach.
	NetworkModes []string
	// StopStart: the runtime implements Stopper.
	StopStart bool
	// UpdateLimits: the runtime implements Updater.
	UpdateLimits bool
	// GrowDisk: Updater can raise a running sandbox's disk limit.
	GrowDisk bool
	// Stats: the runtime implements StatsProvider.
	Stats bool
	// Pause: the runtime implements Pauser.
	Pause bool
	// Snapshot: the runtime implements Capturer.
	Snapshot bool
	// MemoryCheckpoint: the runtime implements Checkpointer.
	MemoryCheckpoint bool
	// IDMappedLayers: the runtime mounts layers through a sandbox's user
	// mapping (RootFS.IDMapped), so sandboxes with different ranges share
	// one copy of each layer.
	IDMappedLayers bool
	// Missing says why the runtime lacks a capability it could have on
	// another host, by the name of the limit or capability: "disk_bytes",
	// "grow_disk", "stop_start", "idmapped_layers", … The manager quotes it
	// when it refuses.
	Missing map[string]string
}

// LimitSupport says which limits a runtime enforces.
type LimitSupport struct {
	CPUs, Memory, Pids, Disk, OpenFiles bool
}

// HostLimits are the ceilings of one sandbox's limits on this host.
type HostLimits struct {
	CPUs        float64
	MemoryBytes int64
	DiskBytes   int64
	OpenFiles   int64
}

// Runtime is an isolation tier. Implementations must be safe for concurrent use.
type Runtime interface {
	Name() string
	Capabilities() Capabilities
	// Create makes and starts a sandbox. On error nothing is left behind.
	Create(ctx context.Context, spec Spec) (*Instance, error)
	// Attach reconnects to a sandbox created by an earlier daemon process.
	Attach(ctx context.Context, id string, state json.RawMessage) (*Instance, error)
	// Delete stops every process of the sandbox and removes all its traces. It
	// is idempotent: deleting what is already gone is not an error.
	Delete(ctx context.Context, id string, state json.RawMessage) error
}

// Spares is a runtime that can start sandboxes' guests ahead of time: a
// spare has its namespaces, cgroup and started runtime, and waits for its
// sandbox's bootstrap, so that a create that finds one skips the spawn.
// Each spare is made for a sandbox id and id map given in advance (the
// manager's), and serves only a Create of that id and map.
type Spares interface {
	// KeepSpares keeps n spares until ctx ends, then ends those not handed
	// out and returns. reserve gives each new spare its sandbox id and id
	// map; release takes back one whose spare ended unused.
	KeepSpares(ctx context.Context, n int, reserve func() (id string, users IDMap, err error), release func(id string))
	// ReadySpares is how many spares are ready now.
	ReadySpares() int
	// TakeSpare hands out a ready spare's sandbox id; the next Create of
	// that id boots on it. ok is false when none is ready.
	TakeSpare() (id string, ok bool)
	// DiscardSpare ends spare id, handed out but not to be created (its
	// create failed before the runtime's Create). Its id map stays the
	// caller's.
	DiscardSpare(id string)
}

// Stopper is a runtime that can stop a sandbox and start it again with the
// same files (and, as far as the runtime can, the same identity).
type Stopper interface {
	// Stop ends every process of the sandbox and keeps its files. Stopping a
	// stopped sandbox is not an error.
	Stop(ctx context.Context, id string, state json.RawMessage) error
	// Start boots a stopped sandbox again.
	Start(ctx context.Context, spec Spec) (*Instance, error)
}

// Differ is a runtime that can read what a sandbox changed over its image.
type Differ interface {
	// Diff writes the writable layer of stopped sandbox id, whose ids map
	// as users, to w as an OCI layer tar (see package layerdiff), leaving
	// out what skip names.
	Diff(ctx context.Context, id string, users IDMap, skip map[string][]byte, w io.Writer) (entries int, err error)
}

// Pauser is a runtime that can freeze every process of a running
// sandbox (no CPU; memory, files and connections stay) and thaw them.
type Pauser interface {
	// Pause freezes the sandbox's processes and returns once all are frozen.
	Pause(ctx context.Context, id string) error
	// Resume thaws them. Resuming what runs is not an error.
	Resume(ctx context.Context, id string) error
}

// Capture is what a Capturer copied.
type Capture struct {
	// Entries and Bytes are what the layer holds.
	Entries int
	Bytes   int64
	// Frozen is how long the sandbox's processes were frozen (0 for a
	// sandbox that was not running).
	Frozen time.Duration
	// Reflinked says file contents were shared with the writable layer
	// (reflinks), not copied.
	Reflinked bool
}

// Capturer is a runtime that can copy what a sandbox changed into an image
// layer, consistently while it runs: the files are as they were at one
// instant (what a power cut then would have left).
type Capturer interface {
	// Capture copies the writable layer of sandbox id (running, paused or
	// stopped), whose ids map as users, into empty directory dst as an image
	// layer: ids as the sandbox sees them, overlay's whiteouts and opaque
	// marks kept, what skip names left out (see layerdiff). A running
	// sandbox is frozen only for a last pass over what changed during a
	// first, unfrozen one.
	Capture(ctx context.Context, id string, users IDMap, skip map[string][]byte, dst string) (Capture, error)
	// WritableLayer is the directory of sandbox id's writable layer in
	// overlay's format, for reading (a diff) while it runs. Its contents
	// are the sandbox's: hostile.
	WritableLayer(id string) (string, error)
}

// Archiver is a runtime that can free a stopped sandbox's writable layer,
// whose contents the caller keeps elsewhere (a Differ's tar), and give it
// a new one to fill back.
type Archiver interface {
	// ClearLayer removes stopped sandbox id's writable layer (its disk
	// too); Start fails until RenewLayer.
	ClearLayer(ctx context.Context, id string) error
	// RenewLayer gives stopped sandbox spec.ID an empty writable layer (on
	// a disk of spec's limit) and calls fill with its directory; on error
	// the layer is cleared again.
	RenewLayer(ctx context.Context, spec Spec, fill func(dir string) error) error
}

// Checkpointer is a runtime that can save a running sandbox whole (its
// processes with their memory, open files and connections inside), free its
// CPU and memory, and bring the same processes back, at the same point.
// The guest is suspended (guestclient.Suspend) before Checkpoint: it holds
// no connection to the host while it is saved.
type Checkpointer interface {
	// Checkpoint saves sandbox id and ends its processes; its files stay.
	// It returns the sandbox's runtime state from then on (what Restore,
	// Stop and Delete take). On error the sandbox runs on as it was.
	Checkpoint(ctx context.Context, id string, state json.RawMessage) (json.RawMessage, error)
	// Restore brings back the checkpointed sandbox of spec whose runtime
	// state Checkpoint returned. On error it stays checkpointed.
	Restore(ctx context.Context, spec Spec, state json.RawMessage) (*Instance, error)
	// Checkpointed says whether state is that of a checkpointed sandbox
	// (nothing of it runs; Attach has nothing to attach to).
	Checkpointed(state json.RawMessage) bool
}

// Updater is a runtime that can change a running sandbox's limits.
type Updater interface {
	SetLimits(ctx context.Context, id string, l Limits) error
}

// Usage is what a sandbox uses now.
type Usage struct {
	CPUSeconds      float64
	MemoryBytes     int64
	MemoryPeakBytes int64
	Pids            int64
	OOMKills        int64
	DiskBytes       int64 // bytes in the writable layer
}

// StatsProvider is a runtime that reports a sandbox's usage.
type StatsProvider interface {
	Stats(ctx context.Context, id string) (Usage, error)
	// OOMKills is the sandbox's count of OOM kills so far: cheap enough to
	// read around every exec.
	OOMKills(ctx context.Context, id string) (int64, error)
	// LimitHits says how often the sandbox met its limits so far; cheap
	// enough to read every second.
	LimitHits(ctx context.Context, id string) (LimitHits, error)
}

// LimitHits are a sandbox's counts of limits met.
type LimitHits struct {
	// Pids counts forks refused at the pids limit.
	Pids int64
	// CPUThrottled counts CPU periods in which the quota ran out.
	CPUThrottled int64
	// DiskFull says the writable layer's disk (with a disk limit) is full now.
	DiskFull bool
}

// Factory builds a runtime from the daemon's configuration. It returns an
// error that says why when the runtime cannot work on this host.
type Factory func(cfg Config) (Runtime, error)

// Config is what the daemon gives every runtime factory.
type Config struct {
	// StateDir is a directory private to the runtime.
	StateDir string
	// GuestBinary is the binary that runs as every sandbox's init
	// (`GuestBinary guest`: the lean berth-guest, or berth itself); every
	// runtime runs the same guest agent.
	GuestBinary string
	// Log is the runtime's logger.
	Log *slog.Logger
}

// Registry maps runtime names to factories. Runtimes register themselves in
// the daemon's wiring; there is no global registry.
type Registry struct {
	mu        sync.Mutex
	factories map[string]Factory
}

// Register adds a factory under name.
func (r *Registry) Register(name string, f Factory) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.factories == nil {
		r.factories = map[string]Factory{}
	}
	if _, dup := r.factories[name]; dup {
		panic(fmt.Sprintf("runtime %q registered twice", name))
	}
	r.factories[name] = f
}

// Names lists the registered runtimes, sorted.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Factory returns the factory registered under name.
func (r *Registry) Factory(name string) (Factory, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.factories[name]
	return f, ok
}
