// Package labels validates the key/value labels on sandboxes and parses the
// selectors ("a=b,c!=d,e,!f") that pick sandboxes by them.
package labels

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/berthsh/berth/errdefs"
)

// Bounds on a label set. A value may be up to MaxValueLen characters, far
// more than Kubernetes' 63, because conversation and thread ids often are.
const (
	MaxLabels    = 64  // labels on one sandbox
	MaxNameLen   = 63  // characters in a key's name part
	MaxPrefixLen = 253 // characters in a key's DNS-subdomain prefix
	MaxValueLen  = 256 // characters (runes) in a value
)

// Validate checks a label set: at most MaxLabels labels, every key valid
// (ValidateKey) and every value valid (ValidateValue). Its error is
// invalid_argument and names the offending key; keys are checked in sorted
// order, so the same set always reports the same error.
func Validate(m map[string]string) error {
	if len(m) > MaxLabels {
		return errdefs.New(errdefs.InvalidArgument, "%d labels, at most %d are allowed", len(m), MaxLabels)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := ValidateKey(k); err != nil {
			return err
		}
		if err := ValidateValue(k, m[k]); err != nil {
			return err
		}
	}
	return nil
}

// ValidateKey checks one label key: an optional prefix and "/", then a name.
// The name is 1 to MaxNameLen characters of [-_.A-Za-z0-9] that begin and
// end with [A-Za-z0-9]; the prefix is a DNS subdomain of at most MaxPrefixLen
// characters (dot-separated lowercase labels of [-a-z0-9], each 1 to 63
// characters beginning and ending with [a-z0-9]).
func ValidateKey(k string) error {
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if !isDNSSubdomain(prefix) {
			return errdefs.New(errdefs.InvalidArgument,
				"label key %q: the prefix before %q must be a DNS subdomain of at most %d characters", k, "/", MaxPrefixLen)
		}
		name = rest
	}
	if !isName(name) {
		return errdefs.New(errdefs.InvalidArgument,
			"label key %q: the name must be 1-%d characters of [-_.A-Za-z0-9], beginning and ending with [A-Za-z0-9]", k, MaxNameLen)
	}
	return nil
}

// ValidateValue checks the value v of label k: at most MaxValueLen
// characters of valid UTF-8 without control characters or line breaks. The
// value may be empty.
func ValidateValue(k, v string) error {
	if !utf8.ValidString(v) {
		return errdefs.New(errdefs.InvalidArgument, "label %q: the value is not valid UTF-8", k)
	}
	if n := utf8.RuneCountInString(v); n > MaxValueLen {
		return errdefs.New(errdefs.InvalidArgument, "label %q: the value %q is %d characters, at most %d are allowed", k, abbrev(v), n, MaxValueLen)
	}
	if i := strings.IndexFunc(v, unprintable); i >= 0 {
		r, _ := utf8.DecodeRuneInString(v[i:])
		return errdefs.New(errdefs.InvalidArgument, "label %q: the value %q holds the unprintable character %U", k, abbrev(v), r)
	}
	return nil
}

// unprintable reports whether r may not appear in a value: control
// characters and the Unicode line and paragraph separators.
func unprintable(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Zl, unicode.Zp)
}

// abbrev shortens a long value for an error message.
func abbrev(v string) string {
	const keep = 32
	if utf8.RuneCountInString(v) <= keep+1 {
		return v
	}
	i := 0
	for n := 0; n < keep; n++ {
		_, size := utf8.DecodeRuneInString(v[i:])
		i += size
	}
	return v[:i] + "…"
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// isName reports whether s is a valid key name.
func isName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// isDNSSubdomain reports whether s is a lowercase RFC 1123 subdomain.
func isDNSSubdomain(s string) bool {
	if len(s) == 0 || len(s) > MaxPrefixLen {
		return false
	}
	for part := range strings.SplitSeq(s, ".") {
		if len(part) == 0 || len(part) > 63 || !isLowerAlnum(part[0]) || !isLowerAlnum(part[len(part)-1]) {
			return false
		}
		for i := 1; i < len(part)-1; i++ {
			if c := part[i]; !isLowerAlnum(c) && c != '-' {
				return false
			}
		}
	}
	return true
}

func isLowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

// Op is the operator of a Requirement.
type Op int

// The operators.
const (
	Equals    Op = iota // "k=v" (or "k==v"): k is present with value v
	NotEquals           // "k!=v": k is absent, or present with another value
	Exists              // "k": k is present, with any value
	NotExists           // "!k": k is absent
)

// String returns the operator as written in a selector.
func (o Op) String() string {
	switch o {
	case Equals:
		return "="
	case NotEquals:
		return "!="
	case Exists:
		return "exists"
	case NotExists:
		return "!"
	default:
		return "unknown"
	}
}

// Requirement is one term of a selector. Value is used by Equals and
// NotEquals only.
type Requirement struct {
	Key   string
	Op    Op
	Value string
}

// Matches reports whether the label set m satisfies r.
func (r Requirement) Matches(m map[string]string) bool {
	v, ok := m[r.Key]
	switch r.Op {
	case Equals:
		return ok && v == r.Value
	case NotEquals:
		return !ok || v != r.Value
	case Exists:
		return ok
	case NotExists:
		return !ok
	default:
		return false
	}
}

// String renders r in selector syntax.
func (r Requirement) String() string {
	switch r.Op {
	case Equals:
		return r.Key + "=" + r.Value
	case NotEquals:
		return r.Key + "!=" + r.Value
	case NotExists:
		return "!" + r.Key
	default:
		return r.Key
	}
}

// Selector is an AND of requirements. The zero Selector is empty and
// matches every label set.
type Selector struct {
	reqs []Requirement
}

// ParseSelector parses a comma-separated list of requirements, all of which
// must hold: "k=v" (or "k==v"), "k!=v", "k" (k exists) and "!k" (k does not
// exist). Whitespace around terms, keys and values is ignored, and a blank
// string is the empty selector. Keys must pass ValidateKey and values
// ValidateValue; a value may be empty but cannot hold a comma or begin with
// "=", so labels whose values do cannot be selected by value. The error is
// invalid_argument and names the bad term.
func ParseSelector(s string) (Selector, error) {
	if strings.TrimSpace(s) == "" {
		return Selector{}, nil
	}
	var sel Selector
	for term := range strings.SplitSeq(s, ",") {
		r, err := parseRequirement(strings.TrimSpace(term))
		if err != nil {
			return Selector{}, err
		}
		sel.reqs = append(sel.reqs, r)
	}
	return sel, nil
}

// parseRequirement parses one trimmed term of a selector.
func parseRequirement(term string) (Requirement, error) {
	if term == "" {
		return Requirement{}, errdefs.New(errdefs.InvalidArgument, "selector: empty term (a stray comma?)")
	}
	var r Requirement
	if i := strings.IndexByte(term, '='); i < 0 {
		// No value: "k" or "!k".
		r.Op, r.Key = Exists, term
		if rest, ok := strings.CutPrefix(term, "!"); ok {
			r.Op, r.Key = NotExists, strings.TrimSpace(rest)
		}
	} else {
		key, value := term[:i], term[i+1:]
		r.Op = Equals
		if k, ok := strings.CutSuffix(key, "!"); ok {
			r.Op, key = NotEquals, k
		} else if v, ok := strings.CutPrefix(value, "="); ok {
			value = v // "k==v"
		}
		r.Key, r.Value = strings.TrimSpace(key), strings.TrimSpace(value)
	}
	if err := ValidateKey(r.Key); err != nil {
		return Requirement{}, errdefs.Wrap(errdefs.InvalidArgument, err, "selector term %q", term)
	}
	if err := ValidateValue(r.Key, r.Value); err != nil {
		return Requirement{}, errdefs.Wrap(errdefs.InvalidArgument, err, "selector term %q", term)
	}
	if strings.HasPrefix(r.Value, "=") {
		return Requirement{}, errdefs.New(errdefs.InvalidArgument, "selector term %q: a value cannot begin with %q", term, "=")
	}
	return r, nil
}

// SelectorFromMap returns the selector that requires every pair of m
// (Equals), its requirements sorted by key.
func SelectorFromMap(m map[string]string) Selector {
	var sel Selector
	for k, v := range m {
		sel.reqs = append(sel.reqs, Requirement{Key: k, Op: Equals, Value: v})
	}
	slices.SortFunc(sel.reqs, func(a, b Requirement) int { return strings.Compare(a.Key, b.Key) })
	return sel
}

// Matches reports whether the label set m satisfies every requirement of s.
func (s Selector) Matches(m map[string]string) bool {
	for _, r := range s.reqs {
		if !r.Matches(m) {
			return false
		}
	}
	return true
}

// Empty reports whether s has no requirements, so matches everything.
func (s Selector) Empty() bool { return len(s.reqs) == 0 }

// Requirements returns a copy of s's requirements, in order.
func (s Selector) Requirements() []Requirement { return slices.Clone(s.reqs) }

// String renders s in the syntax ParseSelector reads; for a selector that
// ParseSelector returned, parsing the string gives the same requirements.
func (s Selector) String() string {
	parts := make([]string, len(s.reqs))
	for i, r := range s.reqs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}
