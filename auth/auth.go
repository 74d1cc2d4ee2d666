// Package auth is berth's API keys and the tenants they act for.
//
// A key is "berth_" + a 12-hex-digit id + "_" + 64 hex digits of secret.
// The id is public (logs, the audit table, `berth key revoke` name it);
// the secret is stored only as its SHA-256, which is enough for a random
// 256-bit secret (no password stretching: nothing to guess), and checked in
// constant time. The Keyring holds every key in memory, loaded once from
// the store and changed through it, so authenticating a request is a map
// lookup and one hash, with no store access.
//
// A Principal is whom a request acts for: the operator (the unix socket,
// an admin key, or a daemon without authentication) sees every tenant's
// objects and owns what it creates under the empty tenant; a read or
// write key sees only its tenant's.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// Kind is how a request was authenticated.
type Kind int

const (
	// Anonymous sent no key over TCP: only routes that check their own
	// access (a sandbox's port, with its access token) or need none
	// (/healthz, the dashboard's files) take it.
	Anonymous Kind = iota
	// Root came over the unix socket, which only root can open.
	Root
	// Key sent a valid API key.
	Key
	// Open came to a daemon started with --insecure-no-auth.
	Open
)

// Principal is whom a request acts for.
type Principal struct {
	Kind Kind
	// Tenant is the tenant the request sees and creates for; "" is the
	// operator's, which sees every tenant's objects.
	Tenant string
	// KeyID is the key's id (Kind Key only).
	KeyID string
	// Scope is what the request may do.
	Scope string
}

// Operator is the principal of the unix socket and of an unauthenticated
// daemon's requests.
func Operator(k Kind) Principal { return Principal{Kind: k, Scope: api.ScopeAdmin} }

// Allows says whether the principal's scope covers need.
func (p Principal) Allows(need string) bool {
	if p.Kind == Anonymous {
		return false
	}
	return rank(p.Scope) >= rank(need)
}

func rank(scope string) int {
	switch scope {
	case api.ScopeRead:
		return 1
	case api.ScopeWrite:
		return 2
	case api.ScopeAdmin:
		return 3
	}
	return 0
}

// Prefix starts every berth API key, so that secret scanners know them.
const Prefix = "berth_"

const (
	idLen     = 12 // hex digits
	secretLen = 64 // hex digits: 32 random bytes
	keyLen    = len(Prefix) + idLen + 1 + secretLen
)

// newKey makes a key: its id, the full key and the hash stored for it.
func newKey() (id, key string, hash []byte) {
	var b [idLen/2 + secretLen/2]byte
	rand.Read(b[:])
	id = hex.EncodeToString(b[:idLen/2])
	secret := hex.EncodeToString(b[idLen/2:])
	sum := sha256.Sum256([]byte(secret))
	return id, Prefix + id + "_" + secret, sum[:]
}

// split parses a key into its id and secret; ok is false for anything
// that is not a well-formed key.
func split(key string) (id, secret string, ok bool) {
	if len(key) != keyLen || !strings.HasPrefix(key, Prefix) || key[len(Prefix)+idLen] != '_' {
		return "", "", false
	}
	id, secret = key[len(Prefix):len(Prefix)+idLen], key[len(Prefix)+idLen+1:]
	return id, secret, isHex(id) && isHex(secret)
}

func isHex(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// matches checks secret against a stored hash in constant time.
func matches(secret string, hash []byte) bool {
	sum := sha256.Sum256([]byte(secret))
	return subtle.ConstantTimeCompare(sum[:], hash) == 1
}

// CheckTenant refuses a tenant name that is not a DNS label: 1 to 63
// lower-case letters, digits and '-', starting and ending with a letter
// or digit.
func CheckTenant(field, name string) error {
	bad := len(name) == 0 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-'
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			bad = true
		}
	}
	if bad {
		return errdefs.New(errdefs.InvalidArgument, "%s: %q is not a tenant name: a DNS label of 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit", field, name)
	}
	return nil
}

// unauthenticated is the one answer to a key that does not work: it says
// nothing of any sandbox, and the same for an unknown id as for a wrong
// secret, so that ids cannot be probed.
func unauthenticated(why string) error {
	return errdefs.New(errdefs.Unauthenticated, "%s: send a berth API key as Authorization: Bearer <key> (berth key create makes one)", why)
}

// expired says whether a key with that expiry time no longer works at now.
func expired(expires, now time.Time) bool { return !expires.IsZero() && !now.Before(expires) }
