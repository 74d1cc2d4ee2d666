package api

import "time"

// Network modes.
const (
	// NetworkNone is loopback only.
	NetworkNone = "none"
	// NetworkAllowlist reaches only the destinations Allow lists.
	NetworkAllowlist = "allowlist"
	// NetworkOpen reaches the public internet; loopback, private, link-local
	// and other special ranges stay unreachable unless Allow names them.
	NetworkOpen = "open"
)

// Network is a sandbox's network policy: set at create, replaced whole by
// PATCH /v1/sandboxes/{id} (new connections obey at once).
type Network struct {
	// Mode is none, allowlist or open (default: the daemon's, none unless
	// it was started with --default-network).
	Mode string `json:"mode"`
	// Allow lists destinations: a domain ("pypi.org"), a wildcard that
	// matches its subdomains ("*.pythonhosted.org"), an IPv4 address or
	// CIDR ("10.1.0.0/16"), each with an optional port or port range
	// ("github.com:22", "10.1.2.3:8000-8100"). A CIDR here also opens a
	// special range (private, loopback, link-local) that is otherwise
	// refused in every mode.
	Allow []string `json:"allow,omitempty"`
	// Deny lists destinations refused even where Allow or the open mode
	// would let them through; same forms as Allow.
	Deny []string `json:"deny,omitempty"`
	// Secrets bind stored secrets to the destinations that may receive
	// them. A bound host is allowed without an Allow entry.
	Secrets []SecretBinding `json:"secrets,omitempty"`
}

// SecretBinding lets the daemon add a stored secret to HTTPS requests from
// the sandbox to one host, so that the secret never enters the sandbox.
// At least one of Header and Env is set.
type SecretBinding struct {
	// Secret names a stored secret (POST /v1/secrets).
	Secret string `json:"secret"`
	// Host is the exact host name (no wildcard, no address) whose requests
	// get the secret; the daemon verifies the upstream's certificate for it.
	Host string `json:"host"`
	// Header is set on every request to Host, to Format with "{secret}"
	// replaced by the secret ("Authorization" with "Bearer {secret}").
	Header string `json:"header,omitempty"`
	// Format is the header's value; "{secret}" when empty.
	Format string `json:"format,omitempty"`
	// Env names an environment variable of the sandbox that holds
	// Placeholder; the daemon replaces the placeholder by the secret
	// wherever it appears in the headers of a request to Host.
	Env string `json:"env,omitempty"`
	// Placeholder is the stand-in the sandbox sees (set by the daemon).
	Placeholder string `json:"placeholder,omitempty"`
}

// CreateSecretRequest is the body of POST /v1/secrets.
type CreateSecretRequest struct {
	// Name is how bindings refer to the secret: letters, digits, '_', '-'
	// and '.', at most 128.
	Name string `json:"name"`
	// Value is the secret; no API ever returns it.
	Value string `json:"value"`
}

// UpdateSecretRequest is the body of PUT /v1/secrets/{name}: a new value.
type UpdateSecretRequest struct {
	Value string `json:"value"`
}

// Secret is a stored secret as the API shows it: never its value.
type Secret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// ListSecretsResponse is the body of GET /v1/secrets.
type ListSecretsResponse struct {
	Secrets []Secret `json:"secrets"`
}

// Egress protocols of EgressRecord.
const (
	EgressDNS   = "dns"
	EgressTCP   = "tcp"
	EgressUDP   = "udp"
	EgressTLS   = "tls"   // TLS passed through: the name is the SNI
	EgressHTTP  = "http"  // one plain HTTP request
	EgressHTTPS = "https" // one HTTPS request the daemon terminated (a bound secret)
)

// EgressRecord is one connection, request or DNS query a sandbox tried to
// make: GET /v1/sandboxes/{id}/egress.
type EgressRecord struct {
	// Seq orders a sandbox's records; a follow resumes after it.
	Seq   int64     `json:"seq"`
	Time  time.Time `json:"time"`
	Proto string    `json:"proto"`
	// Name is the DNS query, the TLS server name or the HTTP Host.
	Name   string `json:"name,omitempty"`
	Addr   string `json:"addr,omitempty"`
	Port   int    `json:"port,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Status int    `json:"status,omitempty"`
	// BytesOut went from the sandbox to the destination, BytesIn back.
	BytesOut   int64 `json:"bytes_out"`
	BytesIn    int64 `json:"bytes_in"`
	DurationMs int64 `json:"duration_ms"`
	Allowed    bool  `json:"allowed"`
	// Rule is the rule that allowed the attempt, or why it was refused.
	Rule string `json:"rule"`
	// Secret names the secret added to the request (never its value).
	Secret string `json:"secret,omitempty"`
	// Error says why an allowed attempt failed (the destination refused,
	// a certificate did not verify).
	Error string `json:"error,omitempty"`
}

// ListEgressResponse is the body of GET /v1/sandboxes/{id}/egress.
type ListEgressResponse struct {
	Records []EgressRecord `json:"records"`
}

// EgressSummary counts a sandbox's egress since it was created: part of
// its stats.
type EgressSummary struct {
	Allowed  int64 `json:"allowed"`
	Denied   int64 `json:"denied"`
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
}
