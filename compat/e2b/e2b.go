// Package e2b serves E2B's protocol on berth's listener, so that code
// written against E2B's SDKs runs on berth's sandboxes unchanged: the
// control API (create, connect, list, kill, timeouts, pause, metrics,
// templates, snapshots, forks) at E2B's paths, and envd, E2B's in-sandbox
// agent, translated onto berth's manager: the process and filesystem
// services (Connect RPC with the JSON and binary codecs, from the
// published .proto files in api/e2b) and the REST routes /files, /health
// and /envs. One implementation of processes and files, two wire formats.
//
// A request is for envd when it carries E2b-Sandbox-Id (the SDK's
// E2B_SANDBOX_URL mode) or arrives for the host 49983-ID.DOMAIN; every
// other port of that host form is the port proxy's. envd requests carry
// the sandbox's access token (X-Access-Token), which the create and
// connect answers hand out as envdAccessToken.
package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/e2b/envd/filesystem/filesystemconnect"
	"github.com/berthsh/berth/api/e2b/envd/process/processconnect"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/server"
)

// Wire constants of E2B's protocol.
const (
	// EnvdPort is the port envd listens on in an E2B sandbox; the SDKs
	// address envd as this port of the sandbox.
	EnvdPort = 49983
	// EnvdVersion is the envd version berth reports: the SDKs gate
	// features on it, and berth serves every feature up to this one.
	EnvdVersion = "0.5.7"

	// maxMessage bounds one Connect message from a client.
	maxMessage = 32 << 20

	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
	headerAccessToken = "X-Access-Token"
	headerAPIKey      = "X-Api-Key"
	// HeaderTrafficToken carries the access token of a sandbox's ports
	// when the sandbox does not allow public traffic; the daemon's port
	// proxy takes it as it takes berth's own header.
	HeaderTrafficToken = "E2b-Traffic-Access-Token"

	// labelPrefix marks the labels berth keeps of an E2B sandbox's own
	// settings; E2B's metadata is the sandbox's other labels.
	labelPrefix = "e2b.berth.sh/"
	// labelTemplate is the templateID the sandbox was created from.
	labelTemplate = labelPrefix + "template"
	// labelOnTimeout is what its timeout does: "kill" or "pause".
	labelOnTimeout = labelPrefix + "on-timeout"
)

// Manager is what E2B's protocol needs of berth's sandbox manager
// (sandbox.Manager implements it).
type Manager interface {
	Create(ctx context.Context, tenant string, req api.CreateSandboxRequest) (api.Sandbox, error)
	Get(ctx context.Context, tenant, id string) (api.Sandbox, error)
	List(ctx context.Context, tenant string, sel labels.Selector) ([]api.Sandbox, error)
	Delete(ctx context.Context, tenant, id string) error
	Update(ctx context.Context, tenant, id string, req api.UpdateSandboxRequest) (api.Sandbox, error)
	StartSandbox(ctx context.Context, tenant, id string) (api.Sandbox, error)
	Stop(ctx context.Context, tenant, id string) (api.Sandbox, error)
	Pause(ctx context.Context, tenant, id string, memory bool) (api.Sandbox, error)
	Resume(ctx context.Context, tenant, id string) (api.Sandbox, error)
	Stats(ctx context.Context, tenant, id string) (api.Usage, error)

	Snapshot(ctx context.Context, tenant, id string, req api.CreateSnapshotRequest) (api.Snapshot, error)
	ListSnapshots(ctx context.Context, tenant string, sel labels.Selector) ([]api.Snapshot, error)
	DeleteSnapshot(ctx context.Context, tenant, ref string) error
	Fork(ctx context.Context, tenant, id string, req api.ForkRequest) (api.ForkResponse, error)

	StartProcess(ctx context.Context, tenant, id string, req api.ExecRequest) (api.Process, error)
	ListProcesses(ctx context.Context, tenant, id string) ([]api.Process, error)
	GetProcess(ctx context.Context, tenant, id string, pid int) (api.Process, error)
	SignalProcess(ctx context.Context, tenant, id string, pid int, signal string) error
	WriteStdin(ctx context.Context, tenant, id string, pid int, data []byte, close bool) error
	Attach(ctx context.Context, tenant, id string, pid int) (api.Attachment, error)

	FS(ctx context.Context, tenant, id, op string, req any) (any, error)
	Download(ctx context.Context, tenant, id string, where api.Where, path string, setSize func(int64)) (io.ReadCloser, error)
	Upload(ctx context.Context, tenant, id string, where api.Where, path string, mode *uint32, createOnly bool, body io.Reader, size int64) (api.FileInfo, error)
	Watch(ctx context.Context, tenant, id string, where api.Where, path string, recursive bool, ready func() error, emit func(api.WatchEvent) error) error
}

// Templates is what the template routes need of berth's image store
// (image.Store implements it): E2B's templates are berth's images and
// templates, as the request's tenant sees them.
type Templates interface {
	List(ctx context.Context, tenant string) ([]api.Image, error)
	Inspect(ctx context.Context, tenant, ref string) (api.Image, error)
	Remove(ctx context.Context, tenant, ref string) (api.PruneResult, error)
}

// Config tunes the group.
type Config struct {
	// Domain is the sandbox domain the SDKs build hosts from
	// ({port}-{id}.{domain}, sandbox.get_host): the port proxy's domain
	// and, unless the daemon listens on port 80, its port
	// ("berth.localhost:7680").
	Domain string
	// Templates maps E2B template names to berth images where they
	// differ; "base", E2B's default, is berth's "host" unless set here.
	Templates map[string]string
	Log       *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Group is E2B's protocol as a route group of the daemon's edge.
type Group struct {
	m      Manager
	images Templates
	cfg    Config
	log    *slog.Logger
	// envd answers envd's routes once the sandbox is known.
	envd http.Handler
	// domain is cfg.Domain without its port, lower case, with a leading dot.
	domain string

	procs    *processes
	watchers *watchers
}

// New returns the group over m and images.
func New(cfg Config, m Manager, images Templates) *Group {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Domain == "" {
		cfg.Domain = api.DefaultDomain
	}
	host := cfg.Domain
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	g := &Group{m: m, images: images, cfg: cfg, log: cfg.Log, domain: "." + strings.Trim(strings.ToLower(host), ".")}
	g.procs = newProcesses()
	g.watchers = newWatchers(cfg.Now)
	mux := http.NewServeMux()
	// A message is read whole before a handler sees it: bound it (input
	// for a process is sent in pieces far smaller).
	opts := []connect.HandlerOption{connect.WithInterceptors(classify{}), connect.WithReadMaxBytes(maxMessage)}
	mux.Handle(processconnect.NewProcessHandler(&processService{g: g}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{g: g}, opts...))
	g.routeEnvdREST(mux)
	g.envd = mux
	return g
}

// Close ends the group's watchers.
func (g *Group) Close() { g.watchers.closeAll() }

// Name implements server.Group.
func (g *Group) Name() string { return "e2b" }

// Routes implements server.Group. envd's routes are served on any path
// when the request names its sandbox (E2b-Sandbox-Id or the host form),
// so the control API and envd share the one base URL.
func (g *Group) Routes(r *server.Router) {
	// The edge's refusals (a missing or bad key) in E2B's error shape.
	r = r.Errors(g.writeError)
	r.Host(g.ownsHost, g.serveHost)
	g.routeControl(r)
	for _, p := range []string{
		"/" + processconnect.ProcessName + "/",
		"/" + filesystemconnect.FilesystemName + "/",
		"/files", "/envs", "/health",
	} {
		// envd's requests carry the sandbox's access token.
		r.OwnAccess().HandleHTTP(p, http.HandlerFunc(g.serveHeader))
	}
}

// sandboxKey carries the sandbox an envd request is for.
type sandboxKey struct{}

// envdRequest is what envd knows of one request once it is authorized.
type envdRequest struct {
	tenant string
	id     string
	// user is the request's user (HTTP Basic, or the username
	// parameter); "" is the sandbox's default user.
	user string
}

// envdOf returns the request's sandbox, as the envd handlers see it.
func envdOf(ctx context.Context) envdRequest {
	e, _ := ctx.Value(sandboxKey{}).(envdRequest)
	return e
}

// ownsHost claims 49983-ID.DOMAIN, envd's port in the host form; the
// other ports of that form are the port proxy's.
func (g *Group) ownsHost(host string) bool {
	_, ok := g.hostSandbox(host)
	return ok
}

func (g *Group) hostSandbox(host string) (string, bool) {
	port, id, ok := api.SplitPortHost(host, g.domain)
	return id, ok && port == EnvdPort
}

func (g *Group) serveHost(w http.ResponseWriter, r *http.Request) error {
	id, _ := g.hostSandbox(r.Host)
	g.serveEnvd(w, r, id)
	return nil
}

// serveHeader serves envd's paths in the E2B_SANDBOX_URL mode: the
// sandbox is E2b-Sandbox-Id's (a port other than envd's is refused:
// berth serves servers inside at their own URLs).
func (g *Group) serveHeader(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(headerSandboxID)
	if id == "" && r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent) // the control API's health
		return
	}
	if id == "" {
		g.writeError(w, r, errdefs.New(errdefs.NotFound, "%s %s: envd's routes need the %s header (or the host %d-ID%s)", r.Method, r.URL.Path, headerSandboxID, EnvdPort, g.domain))
		return
	}
	if p := r.Header.Get(headerSandboxPort); p != "" && p != strconv.Itoa(EnvdPort) {
		g.writeError(w, r, errdefs.New(errdefs.InvalidArgument, "%s: port %s: only envd's port %d is served at this URL; reach a server inside at %s-%s%s", headerSandboxPort, p, EnvdPort, p, id, g.domain))
		return
	}
	g.serveEnvd(w, r, id)
}

// serveEnvd authorizes an envd request for sandbox id and serves it. A
// request without the sandbox's token, or for another tenant's sandbox,
// learns nothing of it.
func (g *Group) serveEnvd(w http.ResponseWriter, r *http.Request, id string) {
	tenant := server.Tenant(r)
	sb, err := g.m.Get(r.Context(), tenant, id)
	if errdefs.IsNotFound(err) {
		// E2B's proxy answers so, and the SDKs know the words: their
		// error says the sandbox is gone, not that a route is missing.
		server.NoteError(r, err)
		writeJSON(w, http.StatusBadGateway, sandboxNotFound{SandboxID: id, Message: "The sandbox was not found", Code: http.StatusBadGateway})
		return
	}
	if err != nil {
		g.writeError(w, r, err)
		return
	}
	if err := g.checkAccess(r, sb.AccessToken); err != nil {
		g.writeError(w, r, errdefs.New(errdefs.Unauthenticated, "sandbox %s: %v", id, err))
		return
	}
	if sb.State != api.StateRunning {
		// E2B's proxy reaches no envd in a sandbox that does not run, and
		// the SDKs read its 502 as "not running" (is_running() is false).
		server.NoteError(r, errdefs.New(errdefs.Conflict, "sandbox %s is %s", id, sb.State))
		writeJSON(w, http.StatusBadGateway, sandboxNotFound{SandboxID: id, Code: http.StatusBadGateway,
			Message: fmt.Sprintf("The sandbox was not found running: it is %s (Sandbox.connect resumes or starts it)", sb.State)})
		return
	}
	user, err := requestUser(r)
	if err != nil {
		g.writeError(w, r, err)
		return
	}
	ctx := context.WithValue(r.Context(), sandboxKey{}, envdRequest{tenant: tenant, id: id, user: user})
	if r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	g.envd.ServeHTTP(w, r.WithContext(ctx))
}

// checkAccess checks an envd request's access token, or, for a file URL
// the SDK signed (download_url, upload_url), its signature: v1_ and the
// unpadded base64 of SHA-256("path:operation:user:token[:expiration]"),
// unexpired.
func (g *Group) checkAccess(r *http.Request, token string) error {
	if token == "" {
		return errors.New("it has no access token")
	}
	if got := r.Header.Get(headerAccessToken); got != "" || r.URL.Path != "/files" || !r.URL.Query().Has("signature") {
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			return fmt.Errorf("%s is missing or wrong", headerAccessToken)
		}
		return nil
	}
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		at, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || g.cfg.Now().Unix() > at {
			return errors.New("the signature has expired")
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) != 1 {
		return errors.New("the signature is wrong")
	}
	return nil
}

// requestUser is the user an envd request acts as: HTTP Basic's user name
// (how the SDKs send it), else none (the sandbox's default user).
func requestUser(r *http.Request) (string, error) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return "", nil
	}
	scheme, cred, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", nil // a bearer token is the edge's business
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", errdefs.New(errdefs.InvalidArgument, "Authorization: Basic credentials are not base64")
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user, nil
}

// writeError answers a REST request with E2B's error body,
// {"code": status, "message": ...}, and notes err for the access log.
func (g *Group) writeError(w http.ResponseWriter, r *http.Request, err error) {
	server.NoteError(r, err)
	status := errdefs.HTTPStatus(errdefs.ClassOf(err))
	writeJSON(w, status, apiError{Code: status, Message: errdefs.Message(err)})
}

// sandboxNotFound is the body of E2B's proxy for a sandbox it does not
// have.
type sandboxNotFound struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// connectCode is the Connect code of an error class: what the SDKs turn
// into their exceptions (NotFoundException, InvalidArgumentException, …).
func connectCode(c errdefs.Class) connect.Code {
	switch c {
	case errdefs.NotFound:
		return connect.CodeNotFound
	case errdefs.AlreadyExists:
		return connect.CodeAlreadyExists
	case errdefs.InvalidArgument, errdefs.TooLarge:
		return connect.CodeInvalidArgument
	case errdefs.Conflict:
		return connect.CodeFailedPrecondition
	case errdefs.ResourceExhausted:
		return connect.CodeResourceExhausted
	case errdefs.PermissionDenied:
		return connect.CodePermissionDenied
	case errdefs.Unauthenticated:
		return connect.CodeUnauthenticated
	case errdefs.Unavailable:
		return connect.CodeUnavailable
	case errdefs.DeadlineExceeded:
		return connect.CodeDeadlineExceeded
	case errdefs.NotImplemented, errdefs.MethodNotAllowed:
		return connect.CodeUnimplemented
	}
	return connect.CodeInternal
}

// toConnect turns a classified error into a Connect error with the
// user's message (internals stay in the log).
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if ce.Code() == connect.CodeInternal {
			// The handlers' own errors are classified below; an internal
			// one made by connect is its reading of a malformed request
			// (a truncated envelope): the client's error, not the daemon's.
			return connect.NewError(connect.CodeInvalidArgument, errors.New(ce.Message()))
		}
		return err
	}
	if errors.Is(err, context.Canceled) {
		return connect.NewError(connect.CodeCanceled, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connectCode(errdefs.ClassOf(err)), errors.New(errdefs.Message(err)))
}

// classify is the interceptor that maps every handler's error to its
// Connect code in one place, so the services return berth's errors.
type classify struct{}

func (classify) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, toConnect(err)
	}
}

func (classify) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (classify) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return toConnect(next(ctx, conn))
	}
}
