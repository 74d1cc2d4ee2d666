package guestapi

import (
	"strconv"
	"strings"
)

// Bootstrap is everything the guest needs before it serves: who it is, the
// token it proves, where it listens, the root to assemble and how far to
// harden itself. It is the same for every runtime. How it reaches the guest
// is the boot mode's business (BootPipe, BootFile); the guest core never
// sees it.
type Bootstrap struct {
	ID       string `json:"id"`
	Hostname string `json:"hostname"`
	Token    string `json:"token"`
	// Listen is where the guest serves this protocol: "unix:PATH", a path
	// as the guest sees it when it boots. When the guest assembles Root it
	// binds the socket first, so the path stays outside the sandbox's root
	// and nothing inside can reach it.
	Listen string `json:"listen"`
	// Root is the root file system the guest assembles and pivots into. Nil
	// means the guest's root is the sandbox's already (an OCI runtime or a
	// VM's own disk prepared it): the guest only listens and hardens.
	Root *Root `json:"root,omitempty"`
	// Seccomp installs berth's seccomp profile on the guest, and with it on
	// every process the guest starts.
	Seccomp bool `json:"seccomp"`
	// Hide are directories, as the guest sees them, that the guest covers
	// with an empty read-only file system once it listens and before it
	// hardens: where a runtime that prepares the root itself (Root nil)
	// put the control socket, the guest's binary and this bootstrap. Its
	// listener keeps working; nothing started later can reach the paths.
	Hide []string `json:"hide,omitempty"`
}

// Root describes a root file system as directories the guest can see when it
// boots: read-only layers under a writable one, and directories bound in.
type Root struct {
	// Layers are read-only directories, topmost first (overlayfs lowerdirs):
	// a path, or PassedLayer(i), the i-th mount the runtime passed with the
	// Bootstrap (BootPipe), already idmapped to the sandbox's range.
	Layers []string `json:"layers"`
	// Upper and Work are the writable layer and overlayfs's scratch
	// directory, on the same file system: paths, or with Writable, names
	// within it.
	Upper string `json:"upper"`
	Work  string `json:"work"`
	// Writable, when set, is PassedLayer(i): the mount of the file system
	// that holds Upper and Work (a sandbox's disk of its own), passed
	// because the runtime may mount it after the guest's mount namespace
	// was made.
	Writable string `json:"writable,omitempty"`
	// Mounts are bound into the root after it is assembled, in order.
	Mounts []Mount `json:"mounts,omitempty"`
}

// Mount binds a directory at Target inside the sandbox.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// ListenUnix prefixes a unix socket address in Bootstrap.Listen.
const ListenUnix = "unix:"

// passedPrefix marks a layer passed as a mount descriptor.
const passedPrefix = "fd:"

// PassedLayer names the i-th mount passed with a Bootstrap as a layer.
func PassedLayer(i int) string { return passedPrefix + strconv.Itoa(i) }

// ParsePassedLayer says whether layer names a passed mount and which:
// i is -1 for a malformed name.
func ParsePassedLayer(layer string) (i int, passed bool) {
	s, ok := strings.CutPrefix(layer, passedPrefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= MaxPassed {
		return -1, true
	}
	return i, true
}

// Boot modes: how a runtime starts `berth guest` and hands it a Bootstrap.
//
// BootPipe (`berth guest`, the native runtime): the Bootstrap arrives as JSON
// in one message on PipeBootstrapFD, a unix SOCK_SEQPACKET socket, with the
// mounts its passed layers name as SCM_RIGHTS descriptors (at most
// MaxPassed); the socket is then closed. The guest answers on PipeStatusFD
// with StatusReady and its hello (a HelloResponse without proof, as JSON,
// after a space) once it serves, or with an Error as JSON if it cannot: the
// runtime, which holds the pipe, needs no hello over the socket.
// The runtime learns of a failure at once, with the reason.
//
// BootFile (`berth guest --bootstrap FILE`): the Bootstrap is the JSON in
// FILE, which the guest removes once read. The guest is ready when it
// accepts on Listen. This is the shape for runtimes that start the guest
// through something else (runsc from an OCI bundle, a VM's init, a Pod),
// where only files and sockets cross.
//
// `berth guest --check` only says, by its exit status (and why on stderr),
// whether the binary can be a guest; runtimes run it when they start.
//
// `berth guest --probe-layers`, started in new user and mount namespaces,
// receives a Bootstrap as BootPipe does whose Root has one passed layer
// holding a file ProbeFile, mounts the root on a private tmpfs and checks
// that the file is root's and copies up when written: whether this kernel
// builds a root from idmapped layers. Its exit status says; stderr says why not.
//
// `berth guest --spawner` is not a guest: it runs on the host, as root, as
// the native runtime's spawner (package spawn), serving the daemon on
// descriptor 3. It starts the guests.
const (
	SpawnerFlag     = "--spawner"
	CheckFlag       = "--check"
	ProbeLayersFlag = "--probe-layers"
	ProbeFile       = "probe"
	MaxPassed       = 128
	BootFlagFile    = "--bootstrap"
	PipeBootstrapFD = 3
	PipeStatusFD    = 4
	StatusReady     = "ready"
)
