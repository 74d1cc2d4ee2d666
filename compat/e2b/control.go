package e2b

// E2B's control API (E2B's spec/openapi.yml, as the SDKs call it) on
// berth's manager. What E2B has and berth names otherwise:
//
//   - a template is a berth image or template by name ("base" is berth's
//     host image); only stored ones are found, nothing is pulled;
//   - a sandbox's timeout is its max_lifetime_s, counted from creation:
//     the end E2B reports is created_at + max_lifetime_s, and a new
//     timeout moves that end. At the end a "kill" sandbox stops and is
//     deleted a second later (delete_after_s 1); a "pause" one (autoPause)
//     stops and keeps its files, and connect starts it again;
//   - E2B's states are running and paused: berth's stopped (and stopping,
//     error) is reported as paused, since connect brings it back;
//   - metadata is the sandbox's labels, but for those under labelPrefix
//     that hold E2B's settings.
//
// The X-API-Key header carries a berth API key (the edge takes it as it
// takes Authorization: Bearer), and every request acts for its tenant.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/url"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
	"github.com/berthsh/berth/server"
)

// Bounds and defaults of E2B's control API.
const (
	// maxTimeoutSeconds is E2B's longest sandbox timeout (24 h, its Pro
	// plan's).
	maxTimeoutSeconds = 24 * 3600
	// defaultTimeoutV1 and defaultTimeoutV2 are the timeouts of a create
	// that gives none: POST /sandboxes's and POST /v2/sandboxes's.
	defaultTimeoutV1 = 15
	defaultTimeoutV2 = 300
	// maxRefreshSeconds bounds a refresh's duration.
	maxRefreshSeconds = 3600
	// maxListLimit is the largest page of a list, and its default.
	maxListLimit = 100
	// maxMetricIDs bounds GET /sandboxes/metrics's sandbox_ids.
	maxMetricIDs = 100
	// cpuSampleWindow is how long a metric watches CPU use: berth's
	// usage is cumulative, E2B's a percentage now.
	cpuSampleWindow = 200 * time.Millisecond
	// metricBucket is the width of E2B's metric buckets, in seconds: a
	// sample of now counts for an interval that ended this recently.
	metricBucket = 5
	// controlBodyLimit bounds a control request's JSON body.
	controlBodyLimit = 1 << 20

	stateRunning = "running"
	statePaused  = "paused"

	onTimeoutKill  = "kill"
	onTimeoutPause = "pause"
)

// noEnd is the endAt of a sandbox without a maximum lifetime: E2B's field
// is required, and a berth sandbox may run for ever.
var noEnd = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// newSandboxBody is E2B's NewSandbox (POST /sandboxes, POST /v2/sandboxes).
type newSandboxBody struct {
	TemplateID string `json:"templateID"`
	// Timeout is in seconds (absent: the route's default).
	Timeout *int64 `json:"timeout"`
	// AutoPause keeps the sandbox at its timeout, stopped, instead of
	// killing it.
	AutoPause bool `json:"autoPause"`
	// AutoPauseMemory asks for the paused sandbox's memory to be kept:
	// berth's timeout stop keeps the files only (E2B's false).
	AutoPauseMemory *bool `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	// Secure is accepted: berth always checks envd's access token.
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Mcp                 json.RawMessage   `json:"mcp"`
	Iam                 *struct {
		Tokens map[string]json.RawMessage `json:"tokens"`
	} `json:"iam"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
}

// networkConfig is E2B's SandboxNetworkConfig and, for PUT
// /sandboxes/{id}/network, SandboxNetworkUpdateConfig.
type networkConfig struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	// DNSServers are accepted and not needed: berth answers the sandbox's
	// DNS itself and lets through what the policy allows.
	DNSServers      []string        `json:"dnsServers,omitempty"`
	EgressProxy     json.RawMessage `json:"egressProxy,omitempty"`
	MaskRequestHost string          `json:"maskRequestHost,omitempty"`
	HTTPSPorts      []int           `json:"httpsPorts,omitempty"`
	Rules           json.RawMessage `json:"rules,omitempty"`
	// AllowInternetAccess is the update's own field.
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
}

// sandboxRef is E2B's Sandbox: what create, connect and resume answer.
type sandboxRef struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// TrafficAccessToken opens the sandbox's ports when it is not public
	// (the proxy takes it as E2b-Traffic-Access-Token).
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

// sandboxInfo is E2B's ListedSandbox and, with the fields after State,
// its SandboxDetail.
type sandboxInfo struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int64             `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`

	EnvdAccessToken     string          `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool           `json:"allowInternetAccess,omitempty"`
	Domain              *string         `json:"domain,omitempty"`
	Network             *networkConfig  `json:"network,omitempty"`
	Lifecycle           *sandboxCycle   `json:"lifecycle,omitempty"`
	VolumeMounts        []volumeMountIO `json:"volumeMounts,omitempty"`
}

// sandboxCycle is E2B's SandboxLifecycle.
type sandboxCycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// volumeMountIO is E2B's SandboxVolumeMount (berth has no volumes).
type volumeMountIO struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int64     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	// MemCache is 0: berth does not report the page cache apart.
	MemCache  int64 `json:"memCache"`
	DiskUsed  int64 `json:"diskUsed"`
	DiskTotal int64 `json:"diskTotal"`
}

// routeControl registers E2B's control API. Every route answers errors in
// E2B's shape, and so do unknown routes under E2B's prefixes.
func (g *Group) routeControl(r *server.Router) {
	known := http.NewServeMux()
	handle := func(pattern string, h func(http.ResponseWriter, *http.Request) error) {
		hh := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := h(w, r); err != nil {
				g.writeError(w, r, err)
			}
		})
		r.HandleHTTP(pattern, hh)
		known.Handle(pattern, hh)
	}
	handle("POST /sandboxes", func(w http.ResponseWriter, r *http.Request) error { return g.createSandbox(w, r, defaultTimeoutV1) })
	handle("POST /v2/sandboxes", func(w http.ResponseWriter, r *http.Request) error { return g.createSandbox(w, r, defaultTimeoutV2) })
	handle("GET /sandboxes", g.listRunning)
	handle("GET /v2/sandboxes", g.listSandboxes)
	handle("GET /sandboxes/{id}", g.getSandbox)
	handle("DELETE /sandboxes/{id}", g.killSandbox)
	handle("POST /sandboxes/{id}/timeout", g.setTimeout)
	handle("POST /sandboxes/{id}/refreshes", g.refreshSandbox)
	handle("POST /sandboxes/{id}/pause", g.pauseSandbox)
	handle("POST /sandboxes/{id}/resume", g.resumeSandbox)
	handle("POST /sandboxes/{id}/connect", func(w http.ResponseWriter, r *http.Request) error { return g.connectSandbox(w, r, false) })
	handle("POST /v2/sandboxes/{id}/connect", func(w http.ResponseWriter, r *http.Request) error { return g.connectSandbox(w, r, true) })
	handle("PUT /sandboxes/{id}/network", g.updateNetwork)
	handle("GET /sandboxes/{id}/metrics", g.sandboxMetrics)
	handle("GET /sandboxes/metrics", g.manyMetrics)
	g.routeTemplates(handle)
	g.routeSnapshots(handle)

	unknown := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.writeError(w, r, g.noControlRoute(known, w, r)) })
	for _, p := range []string{"/sandboxes", "/sandboxes/", "/v2/", "/v3/", "/templates", "/templates/", "/snapshots", "/default-templates"} {
		r.HandleHTTP(p, unknown)
	}
}

// noControlRoute is the error of a request under E2B's prefixes that no
// route takes: 405 with Allow when the path has other methods, 501 for
// what berth does elsewhere, else 404.
func (g *Group) noControlRoute(known *http.ServeMux, w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodDelete && isTemplatePath(r.URL.Path) {
		return errBuildTemplates // a build, a rebuild, a tag: berth builds its own way
	}
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := known.Handler(probe); pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		return errdefs.New(errdefs.MethodNotAllowed, "%s %s: the route takes %s", r.Method, r.URL.Path, strings.Join(allow, ", "))
	}
	p := r.URL.Path
	switch {
	case isTemplatePath(p):
		return errBuildTemplates
	case strings.HasSuffix(p, "/logs"):
		return errdefs.New(errdefs.NotImplemented, "%s %s: berth keeps no sandbox logs; its events are at GET /v1/sandboxes/{id}/events", r.Method, p)
	}
	return errdefs.New(errdefs.NotFound, "no route %s %s", r.Method, p)
}

// decodeControl reads a request's JSON body into v. An empty body is
// left as v's zero value when optional, else refused.
func decodeControl(r *http.Request, v any, optional bool) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, controlBodyLimit+1))
	if err != nil {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "request body: cannot be read")
	}
	if len(b) > controlBodyLimit {
		return errdefs.New(errdefs.TooLarge, "request body: over %d bytes", controlBodyLimit)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		if optional {
			return nil
		}
		return errdefs.New(errdefs.InvalidArgument, "request body: a JSON object is required")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "request body: not valid JSON for this route: %v", err)
	}
	return nil
}

// createSandbox is POST /sandboxes and /v2/sandboxes: a berth sandbox
// made from E2B's request; nothing is created unless all of it maps.
func (g *Group) createSandbox(w http.ResponseWriter, r *http.Request, defaultTimeout int64) error {
	var body newSandboxBody
	if err := decodeControl(r, &body, false); err != nil {
		return err
	}
	ctx := r.Context()
	req, err := g.createRequest(ctx, server.Tenant(r), body, defaultTimeout)
	if err != nil {
		return err
	}
	sb, err := g.m.Create(ctx, server.Tenant(r), req)
	if err != nil {
		if errdefs.IsNotFound(err) {
			// The image went between the lookup and the create.
			return errdefs.Wrap(errdefs.NotFound, err, "template %q", body.TemplateID)
		}
		return err
	}
	server.NoteSandbox(r, sb.ID)
	return writeJSON(w, http.StatusCreated, g.sandboxRef(sb))
}

// createRequest maps E2B's create onto berth's, refusing what berth
// cannot honor rather than ignoring it.
func (g *Group) createRequest(ctx context.Context, tenant string, body newSandboxBody, defaultTimeout int64) (api.CreateSandboxRequest, error) {
	var req api.CreateSandboxRequest
	if body.TemplateID == "" {
		return req, errdefs.New(errdefs.InvalidArgument, "templateID: required")
	}
	image, err := g.templateImage(ctx, tenant, body.TemplateID)
	if err != nil {
		return req, err
	}
	timeout := defaultTimeout
	if body.Timeout != nil {
		timeout = *body.Timeout
	}
	if err := checkTimeout("timeout", timeout, maxTimeoutSeconds); err != nil {
		return req, err
	}
	if body.AutoResume != nil && body.AutoResume.Enabled {
		return req, errdefs.New(errdefs.NotImplemented, "autoResume: berth does not resume a sandbox its timeout stopped on traffic; Sandbox.connect starts it again")
	}
	if len(body.Mcp) > 0 && string(body.Mcp) != "null" {
		return req, errdefs.New(errdefs.NotImplemented, "mcp: E2B's MCP gateway is not served by berth (berth mcp is berth's own MCP server)")
	}
	if body.Iam != nil && len(body.Iam.Tokens) > 0 {
		return req, errdefs.New(errdefs.NotImplemented, "iam: workload identity tokens are not served by berth")
	}
	if len(body.VolumeMounts) > 0 {
		return req, errdefs.New(errdefs.NotImplemented, "volumeMounts: berth has no volumes")
	}
	lbl := make(map[string]string, len(body.Metadata)+2)
	for k, v := range body.Metadata {
		if strings.HasPrefix(k, labelPrefix) {
			return req, errdefs.New(errdefs.InvalidArgument, "metadata: key %q: keys under %s are berth's own", k, labelPrefix)
		}
		lbl[k] = v
	}
	if err := labels.Validate(lbl); err != nil {
		return req, errdefs.Wrap(errdefs.InvalidArgument, err, "metadata")
	}
	onTimeout := onTimeoutKill
	if body.AutoPause {
		onTimeout = onTimeoutPause
	}
	lbl[labelTemplate] = body.TemplateID
	lbl[labelOnTimeout] = onTimeout
	network, public, err := mapNetwork(body.AllowInternetAccess, body.Network)
	if err != nil {
		return req, err
	}
	life, idle := max(timeout, 1), int64(0)
	req = api.CreateSandboxRequest{
		Image:    image,
		Env:      body.EnvVars,
		Labels:   lbl,
		Network:  network,
		Public:   public,
		Timeouts: api.Timeouts{MaxLifetimeSeconds: &life, IdleSeconds: &idle},
	}
	if onTimeout == onTimeoutKill {
		// E2B kills at the timeout: berth stops, then deletes at once.
		del := int64(1)
		req.Timeouts.DeleteAfterSeconds = &del
	}
	return req, nil
}

// checkTimeout refuses seconds outside 0..most, naming field.
func checkTimeout(field string, seconds, most int64) error {
	if seconds < 0 || seconds > most {
		return errdefs.New(errdefs.InvalidArgument, "%s: %d is outside 0..%d seconds", field, seconds, most)
	}
	return nil
}

// mapNetwork turns E2B's network settings into berth's policy (nil: the
// daemon's default) and whether the sandbox is public. E2B lets all
// egress out unless told otherwise; berth takes its daemon's default, so
// that allow_internet_access true (or absent) never fails a create on a
// daemon without networking. An allowOut list is berth's allowlist: the
// rest is refused even without E2B's denyOut 0.0.0.0/0.
func mapNetwork(internet *bool, n *networkConfig) (*api.Network, bool, error) {
	if n == nil {
		n = &networkConfig{}
	}
	if n.AllowInternetAccess != nil && internet == nil {
		internet = n.AllowInternetAccess
	}
	switch {
	case len(n.EgressProxy) > 0 && string(n.EgressProxy) != "null":
		return nil, false, errdefs.New(errdefs.NotImplemented, "network.egressProxy: berth does not relay egress through a SOCKS proxy")
	case len(n.Rules) > 0 && string(n.Rules) != "null" && string(n.Rules) != "{}":
		return nil, false, errdefs.New(errdefs.NotImplemented, "network.rules: use berth's secrets (network.secrets in POST /v1/sandboxes), which keep the value out of the sandbox")
	case n.MaskRequestHost != "":
		return nil, false, errdefs.New(errdefs.NotImplemented, "network.maskRequestHost: the port proxy passes the request's Host through")
	case len(n.HTTPSPorts) > 0:
		return nil, false, errdefs.New(errdefs.NotImplemented, "network.httpsPorts: the port proxy speaks plain HTTP to servers inside")
	}
	public := n.AllowPublicTraffic == nil || *n.AllowPublicTraffic
	var deny []string
	denyAll := internet != nil && !*internet
	for _, d := range n.DenyOut {
		if d == "0.0.0.0/0" {
			denyAll = true
			continue
		}
		deny = append(deny, d)
	}
	switch {
	case len(n.AllowOut) > 0:
		return &api.Network{Mode: api.NetworkAllowlist, Allow: n.AllowOut, Deny: deny}, public, nil
	case denyAll:
		return &api.Network{Mode: api.NetworkNone}, public, nil
	case len(deny) > 0:
		return &api.Network{Mode: api.NetworkOpen, Deny: deny}, public, nil
	}
	return nil, public, nil
}

// sandboxRef is create's and connect's answer for sb.
func (g *Group) sandboxRef(sb api.Sandbox) sandboxRef {
	tmpl, alias := templateOf(sb)
	token := sb.AccessToken
	domain := g.cfg.Domain
	return sandboxRef{
		TemplateID: tmpl, SandboxID: sb.ID, ClientID: sb.ID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: sb.AccessToken, TrafficAccessToken: &token, Domain: &domain, Alias: alias,
	}
}

// templateOf is the templateID a sandbox reports: the one it was created
// from through E2B, else its berth image ("host" for berth's default),
// and the alias (the name E2B's create gave, if any).
func templateOf(sb api.Sandbox) (id, alias string) {
	if t := sb.Labels[labelTemplate]; t != "" {
		return t, t
	}
	return sb.Image, ""
}

// e2bState is E2B's state of a berth state: running, or paused for
// every state connect brings back to running.
func e2bState(state string) string {
	switch state {
	case api.StateRunning, api.StateCreating, api.StateStarting:
		return stateRunning
	}
	return statePaused
}

// endAt is when a sandbox's timeout ends it: its creation plus its
// maximum lifetime.
func endAt(sb api.Sandbox) time.Time {
	if p := sb.Timeouts.MaxLifetimeSeconds; p != nil && *p > 0 {
		return sb.CreatedAt.Add(time.Duration(*p) * time.Second)
	}
	return noEnd
}

// metadataOf is a sandbox's labels without berth's own.
func metadataOf(sb api.Sandbox) map[string]string {
	md := map[string]string{}
	for k, v := range sb.Labels {
		if !strings.HasPrefix(k, labelPrefix) {
			md[k] = v
		}
	}
	return md
}

// hostLimits is what one sandbox of runtime rt may get on this host, when
// the manager says (a sandbox without a limit can use that much).
func (g *Group) hostLimits(rt string) api.Limits {
	ri, ok := g.m.(interface{ RuntimeInfo() []api.Runtime })
	if !ok {
		return api.Limits{}
	}
	infos := ri.RuntimeInfo()
	for _, info := range infos {
		if info.Capabilities != nil && (info.Name == rt || (rt == "" && info.Default)) {
			return info.Capabilities.Max
		}
	}
	return api.Limits{}
}

// sizes are the CPU count and the memory and disk sizes E2B reports: the
// sandbox's limits, or the host's where it has none.
type sizes struct {
	cpus                int64
	memBytes, diskBytes int64
}

func (g *Group) sizesOf(rt string, l api.Limits) sizes {
	host := g.hostLimits(rt)
	s := sizes{memBytes: l.MemoryBytes, diskBytes: l.DiskBytes}
	cpus := l.CPUs
	if cpus <= 0 {
		cpus = host.CPUs
	}
	if cpus <= 0 {
		cpus = float64(goruntime.NumCPU())
	}
	s.cpus = max(int64(math.Ceil(cpus)), 1)
	if s.memBytes == 0 {
		s.memBytes = host.MemoryBytes
	}
	if s.diskBytes == 0 {
		s.diskBytes = host.DiskBytes
	}
	return s
}

// info is the ListedSandbox of sb; detail adds SandboxDetail's fields.
func (g *Group) info(sb api.Sandbox, detail bool) sandboxInfo {
	tmpl, alias := templateOf(sb)
	sz := g.sizesOf(sb.Runtime, sb.Limits)
	out := sandboxInfo{
		TemplateID: tmpl, Alias: alias, SandboxID: sb.ID, ClientID: sb.ID,
		StartedAt: sb.CreatedAt.UTC(), EndAt: endAt(sb).UTC(),
		CPUCount: sz.cpus, MemoryMB: sz.memBytes >> 20, DiskSizeMB: sz.diskBytes >> 20,
		Metadata: metadataOf(sb), State: e2bState(sb.State), EnvdVersion: EnvdVersion,
	}
	if !detail {
		return out
	}
	out.EnvdAccessToken = sb.AccessToken
	domain := g.cfg.Domain
	out.Domain = &domain
	internet := sb.Network.Mode == api.NetworkOpen
	out.AllowInternetAccess = &internet
	public := sb.Public
	out.Network = &networkConfig{AllowPublicTraffic: &public, AllowOut: sb.Network.Allow, DenyOut: sb.Network.Deny}
	onTimeout := sb.Labels[labelOnTimeout]
	if onTimeout == "" {
		// A berth-made sandbox: its timeout stops it and keeps it (its
		// own delete_after_s decides the rest).
		onTimeout = onTimeoutPause
	}
	out.Lifecycle = &sandboxCycle{OnTimeout: onTimeout}
	return out
}

// getSandbox is GET /sandboxes/{id}: SandboxDetail.
func (g *Group) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := g.m.Get(r.Context(), server.Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, g.info(sb, true))
}

// killSandbox is DELETE /sandboxes/{id}.
func (g *Group) killSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := g.m.Delete(r.Context(), server.Tenant(r), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// listFilter is what a list asks for.
type listFilter struct {
	states       []string // E2B states; none: both
	selector     labels.Selector
	none         bool // the metadata filter cannot match (a key twice)
	template     string
	image        string // the berth image template stands for
	startedAfter time.Time
}

func (f listFilter) keep(sb api.Sandbox) bool {
	if sb.State == api.StateDeleting {
		return false // going: E2B would not list it
	}
	if len(f.states) > 0 && !slices.Contains(f.states, e2bState(sb.State)) {
		return false
	}
	if f.template != "" {
		if id, _ := templateOf(sb); id != f.template && sb.Image != f.image {
			return false
		}
	}
	return f.startedAfter.IsZero() || !sb.CreatedAt.Before(f.startedAfter)
}

// metadataSelector reads E2B's metadata filter: a query string
// ("user=abc&app=prod") whose keys and values are URL-encoded once more.
func metadataSelector(q string) (labels.Selector, bool, error) {
	if q == "" {
		return labels.Selector{}, false, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return labels.Selector{}, false, errdefs.New(errdefs.InvalidArgument, "metadata: %q is not a query string like user=abc&app=prod", q)
	}
	want := map[string]string{}
	none := false
	for k, vs := range vals {
		key := unescapeOnce(k)
		if err := labels.ValidateKey(key); err != nil {
			return labels.Selector{}, false, errdefs.Wrap(errdefs.InvalidArgument, err, "metadata")
		}
		for _, v := range vs {
			v = unescapeOnce(v)
			if err := labels.ValidateValue(key, v); err != nil {
				return labels.Selector{}, false, errdefs.Wrap(errdefs.InvalidArgument, err, "metadata")
			}
			if old, ok := want[key]; ok && old != v {
				none = true
			}
			want[key] = v
		}
	}
	return labels.SelectorFromMap(want), none, nil
}

// unescapeOnce undoes the SDKs' own escaping of a metadata key or value
// (the query's escaping is undone already); text that is not escaped
// stays as it is.
func unescapeOnce(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// listed returns the tenant's sandboxes that f keeps, newest first (asc:
// oldest first).
func (g *Group) listed(ctx context.Context, tenant string, f listFilter, asc bool) ([]api.Sandbox, error) {
	if f.none {
		return nil, nil
	}
	all, err := g.m.List(ctx, tenant, f.selector)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, sb := range all {
		if f.keep(sb) {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b api.Sandbox) int {
		c := a.CreatedAt.Compare(b.CreatedAt)
		if c == 0 {
			c = strings.Compare(a.ID, b.ID)
		}
		if asc {
			return c
		}
		return -c
	})
	return out, nil
}

// listRunning is GET /sandboxes: the running sandboxes, all at once.
func (g *Group) listRunning(w http.ResponseWriter, r *http.Request) error {
	sel, none, err := metadataSelector(r.URL.Query().Get("metadata"))
	if err != nil {
		return err
	}
	sbs, err := g.listed(r.Context(), server.Tenant(r), listFilter{states: []string{stateRunning}, selector: sel, none: none}, false)
	if err != nil {
		return err
	}
	out := make([]sandboxInfo, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, g.info(sb, false))
	}
	return writeJSON(w, http.StatusOK, out)
}

// listSandboxes is GET /v2/sandboxes: filtered by state, metadata,
// template and start, ordered by start, a page of limit at a time (the
// next page's token in X-Next-Token).
func (g *Group) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var f listFilter
	var err error
	if f.selector, f.none, err = metadataSelector(q.Get("metadata")); err != nil {
		return err
	}
	// E2B's spec joins the states with commas; a client may repeat the
	// parameter instead.
	for _, v := range q["state"] {
		for s := range strings.SplitSeq(v, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			if s != stateRunning && s != statePaused {
				return errdefs.New(errdefs.InvalidArgument, "state: %q is neither %s nor %s", s, stateRunning, statePaused)
			}
			f.states = append(f.states, s)
		}
	}
	f.template = q.Get("template")
	f.image = g.templateRef(f.template)
	if v := q.Get("startedAfter"); v != "" {
		if f.startedAfter, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return errdefs.New(errdefs.InvalidArgument, "startedAfter: %q is not an RFC 3339 time", v)
		}
	}
	asc := false
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		asc = true
	default:
		return errdefs.New(errdefs.InvalidArgument, "order: %q is neither asc nor desc", o)
	}
	limit := maxListLimit
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxListLimit {
			return errdefs.New(errdefs.InvalidArgument, "limit: %q is outside 1..%d", v, maxListLimit)
		}
	}
	sbs, err := g.listed(r.Context(), server.Tenant(r), f, asc)
	if err != nil {
		return err
	}
	running := 0
	for _, sb := range sbs {
		if e2bState(sb.State) == stateRunning {
			running++
		}
	}
	if len(f.states) == 0 || slices.Contains(f.states, stateRunning) {
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
	}
	if tok := q.Get("nextToken"); tok != "" {
		after, id, err := parsePageToken(tok)
		if err != nil {
			return err
		}
		// The page starts past the token's sandbox in the list's order,
		// whether or not that sandbox is still there.
		i := 0
		for i < len(sbs) {
			c := sbs[i].CreatedAt.Compare(after)
			if c == 0 {
				c = strings.Compare(sbs[i].ID, id)
			}
			if (asc && c > 0) || (!asc && c < 0) {
				break
			}
			i++
		}
		sbs = sbs[i:]
	}
	if len(sbs) > limit {
		last := sbs[limit-1]
		w.Header().Set("X-Next-Token", pageToken(last.CreatedAt, last.ID))
		sbs = sbs[:limit]
	}
	out := make([]sandboxInfo, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, g.info(sb, false))
	}
	return writeJSON(w, http.StatusOK, out)
}

// pageToken is the opaque position in a list after the item (sandbox, snapshot) at, id.
func pageToken(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixNano(), 10) + "/" + id))
}

func parsePageToken(tok string) (time.Time, string, error) {
	bad := errdefs.New(errdefs.InvalidArgument, "nextToken: %q is not a token this list gave", tok)
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", bad
	}
	ns, id, ok := strings.Cut(string(b), "/")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return time.Time{}, "", bad
	}
	return time.Unix(0, n), id, nil
}

// lifetimeFor is the max_lifetime_s that ends sb at end: whole seconds
// from its creation, to the nearest (so within half a second of end;
// rounding up would make a 5 s timeout up to 6), at least 1 (0 is never).
func lifetimeFor(sb api.Sandbox, end time.Time) int64 {
	d := end.Sub(sb.CreatedAt)
	return max(int64(math.Round(d.Seconds())), 1)
}

// setEnd moves sb's end to end. extend only moves it later: a sandbox
// without an end keeps none.
func (g *Group) setEnd(ctx context.Context, tenant string, sb api.Sandbox, end time.Time, extend bool) (api.Sandbox, error) {
	if extend && !endAt(sb).Before(end) {
		return sb, nil
	}
	life := lifetimeFor(sb, end)
	return g.m.Update(ctx, tenant, sb.ID, api.UpdateSandboxRequest{Timeouts: &api.Timeouts{MaxLifetimeSeconds: &life}})
}

// setTimeout is POST /sandboxes/{id}/timeout: the sandbox ends timeout
// seconds from now, sooner or later than before.
func (g *Group) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeControl(r, &body, false); err != nil {
		return err
	}
	if body.Timeout == nil {
		return errdefs.New(errdefs.InvalidArgument, "timeout: required")
	}
	if err := checkTimeout("timeout", *body.Timeout, maxTimeoutSeconds); err != nil {
		return err
	}
	ctx, tenant := r.Context(), server.Tenant(r)
	sb, err := g.m.Get(ctx, tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	end := g.cfg.Now().Add(time.Duration(*body.Timeout) * time.Second)
	if _, err := g.setEnd(ctx, tenant, sb, end, false); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refreshSandbox is POST /sandboxes/{id}/refreshes: the sandbox lives at
// least duration seconds more.
func (g *Group) refreshSandbox(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if err := decodeControl(r, &body, true); err != nil {
		return err
	}
	d := int64(defaultTimeoutV1)
	if body.Duration != nil {
		d = *body.Duration
	}
	if err := checkTimeout("duration", d, maxRefreshSeconds); err != nil {
		return err
	}
	ctx, tenant := r.Context(), server.Tenant(r)
	sb, err := g.m.Get(ctx, tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	if _, err := g.setEnd(ctx, tenant, sb, g.cfg.Now().Add(time.Duration(d)*time.Second), true); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pauseSandbox is POST /sandboxes/{id}/pause: E2B's pause keeps memory,
// so on a runtime with memory checkpoints (gvisor) the processes are saved
// with their memory and the sandbox's CPU and memory freed, as on E2B;
// elsewhere berth's pause freezes them in place (memory kept, no CPU).
// Only a running sandbox pauses (409 otherwise, which the SDKs read as
// "already paused").
func (g *Group) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeControl(r, &body, true); err != nil {
		return err
	}
	ctx, tenant, id := r.Context(), server.Tenant(r), r.PathValue("id")
	sb, err := g.m.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	if sb.State != api.StateRunning {
		return errdefs.New(errdefs.Conflict, "sandbox %s is %s: only a running sandbox can be paused", id, e2bState(sb.State))
	}
	pause := func(ctx context.Context, tenant, id string) (api.Sandbox, error) {
		sb, err := g.m.Pause(ctx, tenant, id, true)
		if errdefs.IsNotImplemented(err) { // no memory checkpoints on this runtime
			return g.m.Pause(ctx, tenant, id, false)
		}
		return sb, err
	}
	if body.Memory != nil && !*body.Memory {
		// A filesystem-only pause (mode="filesystem"): berth's stop, which
		// keeps the files and ends the processes; connect starts it again.
		pause = g.m.Stop
	}
	if _, err := pause(ctx, tenant, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// wake sets or extends sb's end and brings it back to running: a paused
// sandbox is resumed, a stopped one started. resumed says it was not
// running.
func (g *Group) wake(ctx context.Context, tenant, id string, timeout int64, extend bool) (sb api.Sandbox, resumed bool, err error) {
	sb, err = g.m.Get(ctx, tenant, id)
	if err != nil {
		return sb, false, err
	}
	// The end moves first: a stopped sandbox past its old end would stop
	// again at the next sweep.
	if sb, err = g.setEnd(ctx, tenant, sb, g.cfg.Now().Add(time.Duration(timeout)*time.Second), extend); err != nil {
		return sb, false, err
	}
	switch sb.State {
	case api.StateRunning:
		return sb, false, nil
	case api.StatePaused:
		sb, err = g.m.Resume(ctx, tenant, id)
	case api.StateStopped:
		sb, err = g.m.StartSandbox(ctx, tenant, id)
	default:
		return sb, false, errdefs.New(errdefs.Conflict, "sandbox %s is %s: try again once that has finished", id, sb.State)
	}
	return sb, err == nil, err
}

// connectSandbox is POST /sandboxes/{id}/connect and its /v2 form: 200
// with a running sandbox, 201 with one it resumed; the end only moves
// later. The v2 form's timeout is optional.
func (g *Group) connectSandbox(w http.ResponseWriter, r *http.Request, v2 bool) error {
	var body struct {
		Timeout *int64 `json:"timeout"`
		// Memory false asks a paused sandbox to boot afresh from its
		// files: berth's pause keeps memory, its stop files only.
		Memory *bool `json:"memory"`
	}
	if err := decodeControl(r, &body, v2); err != nil {
		return err
	}
	timeout := int64(defaultTimeoutV2)
	switch {
	case body.Timeout != nil:
		timeout = *body.Timeout
	case !v2:
		return errdefs.New(errdefs.InvalidArgument, "timeout: required")
	}
	if err := checkTimeout("timeout", timeout, maxTimeoutSeconds); err != nil {
		return err
	}
	sb, resumed, err := g.wake(r.Context(), server.Tenant(r), r.PathValue("id"), timeout, true)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	return writeJSON(w, status, g.sandboxRef(sb))
}

// resumeSandbox is POST /sandboxes/{id}/resume (deprecated by E2B for
// connect): a sandbox that is not running comes back with a new end; a
// running one is a conflict.
func (g *Group) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeControl(r, &body, true); err != nil {
		return err
	}
	timeout := int64(defaultTimeoutV1)
	if body.Timeout != nil {
		timeout = *body.Timeout
	}
	if err := checkTimeout("timeout", timeout, maxTimeoutSeconds); err != nil {
		return err
	}
	ctx, tenant, id := r.Context(), server.Tenant(r), r.PathValue("id")
	sb, err := g.m.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	if e2bState(sb.State) == stateRunning {
		return errdefs.New(errdefs.Conflict, "sandbox %s is already running", id)
	}
	sb, _, err = g.wake(ctx, tenant, id, timeout, false)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, g.sandboxRef(sb))
}

// updateNetwork is PUT /sandboxes/{id}/network: the egress policy is
// replaced whole (an absent field clears it), and so berth's.
func (g *Group) updateNetwork(w http.ResponseWriter, r *http.Request) error {
	var body networkConfig
	if err := decodeControl(r, &body, false); err != nil {
		return err
	}
	if body.AllowPublicTraffic != nil {
		return errdefs.New(errdefs.InvalidArgument, "allowPublicTraffic: not part of a network update")
	}
	n, _, err := mapNetwork(nil, &body)
	if err != nil {
		return err
	}
	if n == nil {
		n = &api.Network{Mode: api.NetworkOpen}
	}
	if _, err := g.m.Update(r.Context(), server.Tenant(r), r.PathValue("id"), api.UpdateSandboxRequest{Network: n}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// sandboxMetrics is GET /sandboxes/{id}/metrics: one sample of now
// (berth keeps no history, so start and end select nothing), none while
// the sandbox is not running.
func (g *Group) sandboxMetrics(w http.ResponseWriter, r *http.Request) error {
	ctx, tenant := r.Context(), server.Tenant(r)
	sb, err := g.m.Get(ctx, tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	var bounds [2]int64 // start and end, Unix seconds (0: none)
	for i, name := range []string{"start", "end"} {
		if v := r.URL.Query().Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return errdefs.New(errdefs.InvalidArgument, "%s: %q is not a Unix time in seconds", name, v)
			}
			bounds[i] = n
		}
	}
	out := []sandboxMetric{}
	// The one sample is now: an interval that ended before now (E2B's
	// samples fall in 5 s buckets) or starts after it has none.
	now := g.cfg.Now().Unix()
	if bounds[1] != 0 && now > bounds[1]+metricBucket || bounds[0] > now {
		return writeJSON(w, http.StatusOK, out)
	}
	got, err := g.sample(ctx, tenant, []api.Sandbox{sb})
	if err != nil {
		return err
	}
	if m, ok := got[sb.ID]; ok {
		out = append(out, m)
	}
	return writeJSON(w, http.StatusOK, out)
}

// manyMetrics is GET /sandboxes/metrics?sandbox_ids=a,b: a sample of each
// running sandbox named (unknown ones, another tenant's and those not
// running are left out).
func (g *Group) manyMetrics(w http.ResponseWriter, r *http.Request) error {
	var ids []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for id := range strings.SplitSeq(v, ",") {
			if id = strings.TrimSpace(id); id != "" && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return errdefs.New(errdefs.InvalidArgument, "sandbox_ids: required (comma-separated sandbox ids)")
	}
	if len(ids) > maxMetricIDs {
		return errdefs.New(errdefs.InvalidArgument, "sandbox_ids: %d ids, at most %d", len(ids), maxMetricIDs)
	}
	ctx, tenant := r.Context(), server.Tenant(r)
	var sbs []api.Sandbox
	for _, id := range ids {
		sb, err := g.m.Get(ctx, tenant, id)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		sbs = append(sbs, sb)
	}
	got, err := g.sample(ctx, tenant, sbs)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		Sandboxes map[string]sandboxMetric `json:"sandboxes"`
	}{got})
}

// sample measures the running sandboxes of sbs: usage twice,
// cpuSampleWindow apart, for CPU use now (berth counts CPU seconds). A
// sandbox that stops or goes meanwhile is left out.
func (g *Group) sample(ctx context.Context, tenant string, sbs []api.Sandbox) (map[string]sandboxMetric, error) {
	type first struct {
		sb  api.Sandbox
		u   api.Usage
		at  time.Time
		err error
	}
	var firsts []first
	for _, sb := range sbs {
		if sb.State != api.StateRunning {
			continue
		}
		u, err := g.m.Stats(ctx, tenant, sb.ID)
		if err != nil && !vanished(err) {
			return nil, err
		}
		firsts = append(firsts, first{sb: sb, u: u, at: time.Now(), err: err})
	}
	out := map[string]sandboxMetric{}
	if len(firsts) == 0 {
		return out, nil
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(cpuSampleWindow):
	}
	for _, f := range firsts {
		if f.err != nil {
			continue
		}
		u, err := g.m.Stats(ctx, tenant, f.sb.ID)
		if vanished(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		now := time.Now()
		sz := g.sizesOf(f.sb.Runtime, f.sb.Limits)
		pct := 0.0
		if secs := now.Sub(f.at).Seconds(); secs > 0 {
			pct = (u.CPUSeconds - f.u.CPUSeconds) / secs / float64(sz.cpus) * 100
		}
		ts := g.cfg.Now().UTC()
		out[f.sb.ID] = sandboxMetric{
			Timestamp: ts, TimestampUnix: ts.Unix(), CPUCount: sz.cpus,
			CPUUsedPct: math.Round(min(max(pct, 0), 100)*100) / 100,
			MemUsed:    u.MemoryBytes, MemTotal: sz.memBytes,
			DiskUsed: u.DiskBytes, DiskTotal: sz.diskBytes,
		}
	}
	return out, nil
}

// vanished says a sandbox stopped or went while it was being measured.
func vanished(err error) bool {
	return err != nil && (errdefs.IsNotFound(err) || errdefs.IsConflict(err))
}
