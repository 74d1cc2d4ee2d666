// Package fake is an in-memory runtime for tests that cannot have root: each
// sandbox is a fake guest served in-process over net.Pipe that speaks the
// real guest protocol (api/guestapi), with a few built-in programs and an
// in-memory file tree. It declares capabilities like a real runtime and can
// be told to fail, so that the manager's and the server's logic (lifecycle,
// rollback, capability refusals, the warm pool, routing) is tested without
// namespaces. It isolates nothing and runs no real process.
package fake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
)

// Name is the fake runtime's registered name.
const Name = "fake"

// Capabilities are a fake runtime's defaults: everything, on a host with
// 4 CPUs, 8 GiB of memory, 100 GiB of disk and 4096 open files.
func Capabilities() runtime.Capabilities {
	return runtime.Capabilities{
		Limits:       runtime.LimitSupport{CPUs: true, Memory: true, Pids: true, Disk: true, OpenFiles: true},
		Host:         runtime.HostLimits{CPUs: 4, MemoryBytes: 8 << 30, DiskBytes: 100 << 30, OpenFiles: 4096},
		NetworkModes: []string{runtime.NetworkNone},
		StopStart:    true, UpdateLimits: true, GrowDisk: true, Stats: true,
	}
}

// Runtime is the fake runtime. Its methods are safe for concurrent use.
type Runtime struct {
	caps runtime.Capabilities

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	calls     []Call
	fail      map[string]error
}

// Call is one request the runtime received.
type Call struct {
	Op   string // create, start, stop, delete, attach, set_limits
	ID   string
	Spec runtime.Spec   // create and start
	Lim  runtime.Limits // set_limits
}

// sandbox is one fake sandbox; its files outlive a stop, like a real one's.
type sandbox struct {
	spec   runtime.Spec
	limits runtime.Limits
	token  string
	guest  *guest // nil while stopped
	files  *tree
	usage  runtime.Usage
	hits   runtime.LimitHits
}

// New returns a fake runtime with caps.
func New(caps runtime.Capabilities) *Runtime {
	return &Runtime{caps: caps, sandboxes: map[string]*sandbox{}, fail: map[string]error{}}
}

// Factory registers the fake with caps.
func Factory(caps runtime.Capabilities) runtime.Factory {
	return func(runtime.Config) (runtime.Runtime, error) { return New(caps), nil }
}

// Fail makes every later call of op (create, start, stop, delete, attach,
// set_limits) fail with err; a nil err lets them succeed again. Op "hello"
// makes guests answer the daemon's hello with err.
func (r *Runtime) Fail(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.fail, op)
	} else {
		r.fail[op] = err
	}
}

// Calls returns the requests received so far, oldest first.
func (r *Runtime) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// IDs lists the sandboxes the runtime holds (running or stopped), sorted.
func (r *Runtime) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.sandboxes))
}

// Kill makes a running sandbox's init exit, as if it had died.
func (r *Runtime) Kill(id string) {
	r.mu.Lock()
	sb := r.sandboxes[id]
	var g *guest
	if sb != nil {
		g, sb.guest = sb.guest, nil
	}
	r.mu.Unlock()
	if g != nil {
		g.stop()
	}
}

// SetUsage sets what Stats reports for a sandbox, and its OOM kills.
func (r *Runtime) SetUsage(id string, u runtime.Usage, hits runtime.LimitHits) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb := r.sandboxes[id]; sb != nil {
		sb.usage, sb.hits = u, hits
	}
}

// record notes a call and returns the failure set for it, if any.
func (r *Runtime) record(c Call) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	return r.fail[c.Op]
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return Name }

// Capabilities implements runtime.Runtime.
func (r *Runtime) Capabilities() runtime.Capabilities { return r.caps }

var (
	_ runtime.Stopper       = (*Runtime)(nil)
	_ runtime.Updater       = (*Runtime)(nil)
	_ runtime.StatsProvider = (*Runtime)(nil)
)

// state is the runtime-private state the manager persists.
type state struct {
	Token string `json:"token"`
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (*runtime.Instance, error) {
	if err := r.record(Call{Op: "create", ID: spec.ID, Spec: spec}); err != nil {
		return nil, err
	}
	if len(spec.Root.Layers) == 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "sandbox %s: the spec has no root file system", spec.ID)
	}
	r.mu.Lock()
	if _, ok := r.sandboxes[spec.ID]; ok {
		r.mu.Unlock()
		return nil, errdefs.New(errdefs.AlreadyExists, "sandbox %q exists", spec.ID)
	}
	sb := &sandbox{spec: spec, limits: spec.Limits, files: newTree()}
	r.sandboxes[spec.ID] = sb
	r.mu.Unlock()
	return r.boot(spec.ID, sb)
}

// Start implements runtime.Stopper.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (*runtime.Instance, error) {
	if err := r.record(Call{Op: "start", ID: spec.ID, Spec: spec}); err != nil {
		return nil, err
	}
	r.mu.Lock()
	sb, ok := r.sandboxes[spec.ID]
	if ok {
		sb.spec, sb.limits = spec, spec.Limits
	}
	r.mu.Unlock()
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s has no files to start from", spec.ID)
	}
	return r.boot(spec.ID, sb)
}

// boot starts a fake guest for sb.
func (r *Runtime) boot(id string, sb *sandbox) (*runtime.Instance, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(b)
	g := newGuest(id, token, sb.files, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.fail["hello"]
	})
	r.mu.Lock()
	sb.token, sb.guest = token, g
	r.mu.Unlock()
	st, err := json.Marshal(state{Token: token})
	if err != nil {
		return nil, err
	}
	return g.instance(st), nil
}

// Attach implements runtime.Runtime: a running fake sandbox is reached again.
func (r *Runtime) Attach(ctx context.Context, id string, st json.RawMessage) (*runtime.Instance, error) {
	if err := r.record(Call{Op: "attach", ID: id}); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	if sb == nil || sb.guest == nil {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s: its init is gone", id)
	}
	return sb.guest.instance(st), nil
}

// Stop implements runtime.Stopper.
func (r *Runtime) Stop(ctx context.Context, id string, _ json.RawMessage) error {
	if err := r.record(Call{Op: "stop", ID: id}); err != nil {
		return err
	}
	r.Kill(id)
	return nil
}

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(ctx context.Context, id string, _ json.RawMessage) error {
	if err := r.record(Call{Op: "delete", ID: id}); err != nil {
		return err
	}
	r.Kill(id)
	r.mu.Lock()
	delete(r.sandboxes, id)
	r.mu.Unlock()
	return nil
}

// SetLimits implements runtime.Updater.
func (r *Runtime) SetLimits(ctx context.Context, id string, l runtime.Limits) error {
	if err := r.record(Call{Op: "set_limits", ID: id, Lim: l}); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	if sb == nil || sb.guest == nil {
		return errdefs.New(errdefs.Conflict, "sandbox %s is not running", id)
	}
	sb.limits = l
	return nil
}

// Limits returns the limits in force in a sandbox.
func (r *Runtime) Limits(id string) (runtime.Limits, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	if !ok {
		return runtime.Limits{}, false
	}
	return sb.limits, true
}

func (r *Runtime) running(id string) (*sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	if sb == nil || sb.guest == nil {
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s is not running", id)
	}
	return sb, nil
}

// Stats implements runtime.StatsProvider with what SetUsage set.
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Usage, error) {
	sb, err := r.running(id)
	if err != nil {
		return runtime.Usage{}, err
	}
	return sb.usage, nil
}

// OOMKills implements runtime.StatsProvider.
func (r *Runtime) OOMKills(ctx context.Context, id string) (int64, error) {
	sb, err := r.running(id)
	if err != nil {
		return 0, err
	}
	return sb.usage.OOMKills, nil
}

// LimitHits implements runtime.StatsProvider.
func (r *Runtime) LimitHits(ctx context.Context, id string) (runtime.LimitHits, error) {
	sb, err := r.running(id)
	if err != nil {
		return runtime.LimitHits{}, err
	}
	return sb.hits, nil
}

// pipeListener hands the server ends of net.Pipe connections to an
// http.Server.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial connects to the listener, or fails once it is closed.
func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		client.Close()
		server.Close()
		return nil, errdefs.New(errdefs.Unavailable, "fake guest: gone")
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "fake-guest" }

// guest is one boot of a fake sandbox: its server, its processes, and the
// channel closed when it ends.
type guest struct {
	id, token string
	ln        *pipeListener
	srv       *http.Server
	served    chan struct{}
	exited    chan struct{}
	procs     *procTable
	files     *tree
	helloErr  func() error
	stopOnce  sync.Once
}

func newGuest(id, token string, files *tree, helloErr func() error) *guest {
	g := &guest{id: id, token: token, files: files, procs: newProcTable(), helloErr: helloErr,
		ln:     &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})},
		served: make(chan struct{}), exited: make(chan struct{})}
	g.srv = &http.Server{Handler: g.handler()}
	go func() {
		defer close(g.served)
		g.srv.Serve(g.ln)
	}()
	return g
}

func (g *guest) instance(st json.RawMessage) *runtime.Instance {
	return &runtime.Instance{State: st, Dial: g.ln.dial, Token: g.token, Exited: g.exited}
}

// stop ends the guest: its processes, its server and its connections.
func (g *guest) stop() {
	g.stopOnce.Do(func() {
		g.procs.killAll()
		g.srv.Close()
		<-g.served
		close(g.exited)
	})
}

func (g *guest) String() string { return fmt.Sprintf("fake guest of %s", g.id) }
