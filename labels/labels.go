// Package labels validates sandbox labels and parses label selectors
// ("a=b,c!=d,e,!f"), the way Kubernetes users expect.
package labels

import (
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/berthsh/berth/errdefs"
)

// Bounds. Values may be longer than Kubernetes' 63 characters because
// conversation and thread ids often are.
const (
	MaxLabels   = 64
	MaxValueLen = 256
)

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9]([-_.A-Za-z0-9]{0,61}[A-Za-z0-9])?$`)
	prefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// ValidateKey checks one key: an optional DNS-subdomain prefix and "/", then
// a name of 1..63 characters.
func ValidateKey(k string) error {
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if len(prefix) == 0 || len(prefix) > 253 || !prefixRE.MatchString(prefix) {
			return errdefs.New(errdefs.InvalidArgument, "labels: key %q has an invalid prefix (a DNS subdomain)", k)
		}
		name = rest
	}
	if !nameRE.MatchString(name) {
		return errdefs.New(errdefs.InvalidArgument, "labels: key %q is invalid (1-63 characters [A-Za-z0-9-_.], alphanumeric at both ends)", k)
	}
	return nil
}

// ValidateValue checks one value: at most MaxValueLen bytes of printable UTF-8.
func ValidateValue(k, v string) error {
	if len(v) > MaxValueLen {
		return errdefs.New(errdefs.InvalidArgument, "labels: value of %q is %d bytes, at most %d", k, len(v), MaxValueLen)
	}
	if !utf8.ValidString(v) || strings.IndexFunc(v, func(r rune) bool { return unicode.IsControl(r) }) >= 0 {
		return errdefs.New(errdefs.InvalidArgument, "labels: value of %q must be printable UTF-8", k)
	}
	return nil
}

// Validate checks a label set.
func Validate(m map[string]string) error {
	if len(m) > MaxLabels {
		return errdefs.New(errdefs.InvalidArgument, "labels: %d labels, at most %d", len(m), MaxLabels)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
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

// Op is a requirement's operator.
type Op int

// Operators.
const (
	Equals Op = iota
	NotEquals
	Exists
	NotExists
)

// Requirement is one term of a selector.
type Requirement struct {
	Key   string
	Op    Op
	Value string
}

func (r Requirement) matches(m map[string]string) bool {
	v, ok := m[r.Key]
	switch r.Op {
	case Equals:
		return ok && v == r.Value
	case NotEquals:
		return !ok || v != r.Value
	case Exists:
		return ok
	default:
		return !ok
	}
}

func (r Requirement) String() string {
	switch r.Op {
	case Equals:
		return r.Key + "=" + r.Value
	case NotEquals:
		return r.Key + "!=" + r.Value
	case Exists:
		return r.Key
	default:
		return "!" + r.Key
	}
}

// Selector is an AND of requirements; the zero value matches everything.
type Selector struct{ reqs []Requirement }

// ParseSelector parses "k=v,k!=v,k,!k" (whitespace around terms allowed).
func ParseSelector(s string) (Selector, error) {
	var sel Selector
	if strings.TrimSpace(s) == "" {
		return sel, nil
	}
	for _, term := range strings.Split(s, ",") {
		term = strings.TrimSpace(term)
		var r Requirement
		switch {
		case term == "":
			return Selector{}, errdefs.New(errdefs.InvalidArgument, "selector: empty term in %q", s)
		case strings.Contains(term, "!="):
			k, v, _ := strings.Cut(term, "!=")
			r = Requirement{Key: strings.TrimSpace(k), Op: NotEquals, Value: strings.TrimSpace(v)}
		case strings.Contains(term, "="):
			k, v, _ := strings.Cut(term, "=")
			v = strings.TrimPrefix(v, "=") // accept "k==v"
			r = Requirement{Key: strings.TrimSpace(k), Op: Equals, Value: strings.TrimSpace(v)}
		case strings.HasPrefix(term, "!"):
			r = Requirement{Key: strings.TrimSpace(term[1:]), Op: NotExists}
		default:
			r = Requirement{Key: term, Op: Exists}
		}
		if err := ValidateKey(r.Key); err != nil {
			return Selector{}, errdefs.New(errdefs.InvalidArgument, "selector: term %q: %s", term, errdefs.Message(err))
		}
		if err := ValidateValue(r.Key, r.Value); err != nil || strings.ContainsAny(r.Value, ",=!") {
			return Selector{}, errdefs.New(errdefs.InvalidArgument, "selector: term %q has an invalid value", term)
		}
		sel.reqs = append(sel.reqs, r)
	}
	return sel, nil
}

// SelectorFromMap selects label sets that hold every pair of m.
func SelectorFromMap(m map[string]string) Selector {
	var sel Selector
	for k, v := range m {
		sel.reqs = append(sel.reqs, Requirement{Key: k, Op: Equals, Value: v})
	}
	slices.SortFunc(sel.reqs, func(a, b Requirement) int { return strings.Compare(a.Key, b.Key) })
	return sel
}

// Matches reports whether m satisfies every requirement.
func (s Selector) Matches(m map[string]string) bool {
	for _, r := range s.reqs {
		if !r.matches(m) {
			return false
		}
	}
	return true
}

// Empty reports whether the selector matches everything.
func (s Selector) Empty() bool { return len(s.reqs) == 0 }

// Requirements returns the selector's terms.
func (s Selector) Requirements() []Requirement { return slices.Clone(s.reqs) }

// String renders the selector in the syntax ParseSelector reads.
func (s Selector) String() string {
	parts := make([]string, len(s.reqs))
	for i, r := range s.reqs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}
