package labels

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/berthsh/berth/errdefs"
)

func TestValidate(t *testing.T) {
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		naming string // "" = valid; else a substring the error must hold
	}{
		{"nil", nil, ""},
		{"simple", map[string]string{"thread_id": "t-1", "a": "", "A.b-c_D": "x"}, ""},
		{"prefixed", map[string]string{"app.kubernetes.io/name": "x", "berth.sh/owner": "y", "x/y": "z"}, ""},
		{"one char name", map[string]string{"a": "b"}, ""},
		{"name of 63", map[string]string{strings.Repeat("n", 63): "v"}, ""},
		{"name of 64", map[string]string{strings.Repeat("n", 64): "v"}, strings.Repeat("n", 64)},
		{"empty key", map[string]string{"": "v"}, `""`},
		{"leading dash", map[string]string{"-bad": "v"}, "-bad"},
		{"trailing dot", map[string]string{"bad.": "v"}, "bad."},
		{"trailing underscore", map[string]string{"bad_": "v"}, "bad_"},
		{"space in key", map[string]string{"bad key": "v"}, "bad key"},
		{"equals in key", map[string]string{"a=b": "v"}, "a=b"},
		{"bang in key", map[string]string{"!a": "v"}, "!a"},
		{"comma in key", map[string]string{"a,b": "v"}, "a,b"},
		{"non-ascii key", map[string]string{"clé": "v"}, "clé"},
		{"empty name", map[string]string{"berth.sh/": "v"}, "berth.sh/"},
		{"empty prefix", map[string]string{"/name": "v"}, "/name"},
		{"two slashes", map[string]string{"a/b/c": "v"}, "a/b/c"},
		{"uppercase prefix", map[string]string{"Berth.sh/k": "v"}, "Berth.sh/k"},
		{"underscore prefix", map[string]string{"my_co.io/k": "v"}, "my_co.io/k"},
		{"empty prefix label", map[string]string{"a..b/k": "v"}, "a..b/k"},
		{"prefix label of 64", map[string]string{strings.Repeat("p", 64) + ".io/k": "v"}, "/k"},
		{"prefix of 253", map[string]string{longPrefix(253) + "/k": "v"}, ""},
		{"prefix of 254", map[string]string{longPrefix(254) + "/k": "v"}, "/k"},
		{"value of 256", map[string]string{"k": strings.Repeat("v", 256)}, ""},
		{"value of 256 runes", map[string]string{"k": strings.Repeat("é", 256)}, ""},
		{"value of 257", map[string]string{"k": strings.Repeat("v", 257)}, `label "k"`},
		{"printable value", map[string]string{"k": "a b=c,d!e/f:g 💡 日本"}, ""},
		{"newline", map[string]string{"k": "a\nb"}, `label "k"`},
		{"tab", map[string]string{"k": "a\tb"}, `label "k"`},
		{"nul", map[string]string{"k": "a\x00b"}, `label "k"`},
		{"del", map[string]string{"k": "a\x7fb"}, `label "k"`},
		{"c1 control", map[string]string{"k": "a\u0085b"}, `label "k"`},
		{"line separator", map[string]string{"k": "a\u2028b"}, `label "k"`},
		{"invalid utf-8", map[string]string{"k": "a\xffb"}, `label "k"`},
		{"64 labels", many(64), ""},
		{"65 labels", many(65), "65 labels"},
		{"first bad key in order", map[string]string{"b-": "v", "a-": "v"}, "a-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.labels)
			if tc.naming == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.naming) {
				t.Fatalf("Validate: %v, want invalid_argument naming %s", err, tc.naming)
			}
		})
	}
}

// longPrefix returns a valid DNS subdomain of exactly n (> 1) characters:
// labels of "a", at most 63 long, joined by dots.
func longPrefix(n int) string {
	var parts []string
	for n > 0 {
		l := min(63, n)
		if n-l == 1 { // a lone dot would be left over; leave room for "x.y"
			l--
		}
		parts = append(parts, strings.Repeat("a", l))
		n -= l + 1
	}
	return strings.Join(parts, ".")
}

func TestParseSelector(t *testing.T) {
	eq := func(k, v string) Requirement { return Requirement{Key: k, Op: Equals, Value: v} }
	ne := func(k, v string) Requirement { return Requirement{Key: k, Op: NotEquals, Value: v} }
	ex := func(k string) Requirement { return Requirement{Key: k, Op: Exists} }
	nx := func(k string) Requirement { return Requirement{Key: k, Op: NotExists} }
	for _, tc := range []struct {
		in     string
		want   []Requirement
		str    string // String() of the result
		errHas string // "" = valid; else a substring the error must hold
	}{
		{in: "", str: ""},
		{in: "   ", str: ""},
		{in: "a=b", want: []Requirement{eq("a", "b")}, str: "a=b"},
		{in: "a==b", want: []Requirement{eq("a", "b")}, str: "a=b"},
		{in: "a=", want: []Requirement{eq("a", "")}, str: "a="},
		{in: "a!=b", want: []Requirement{ne("a", "b")}, str: "a!=b"},
		{in: "a!=", want: []Requirement{ne("a", "")}, str: "a!="},
		{in: "a", want: []Requirement{ex("a")}, str: "a"},
		{in: "!a", want: []Requirement{nx("a")}, str: "!a"},
		{in: "a=b,c!=d,e,!f", want: []Requirement{eq("a", "b"), ne("c", "d"), ex("e"), nx("f")}, str: "a=b,c!=d,e,!f"},
		{in: " a = b , c != d ,\te\t, ! f ", want: []Requirement{eq("a", "b"), ne("c", "d"), ex("e"), nx("f")}, str: "a=b,c!=d,e,!f"},
		{in: "berth.sh/thread=conv 42", want: []Requirement{eq("berth.sh/thread", "conv 42")}, str: "berth.sh/thread=conv 42"},
		{in: "a=b=c", want: []Requirement{eq("a", "b=c")}, str: "a=b=c"},
		{in: "a!=b!=c", want: []Requirement{ne("a", "b!=c")}, str: "a!=b!=c"},
		{in: "a=x==", want: []Requirement{eq("a", "x==")}, str: "a=x=="},
		{in: "a=1,a=2", want: []Requirement{eq("a", "1"), eq("a", "2")}, str: "a=1,a=2"},
		{in: "k=💡", want: []Requirement{eq("k", "💡")}, str: "k=💡"},
		{in: ",", errHas: "empty term"},
		{in: "a=b,", errHas: "empty term"},
		{in: "a=b,,c", errHas: "empty term"},
		{in: "=v", errHas: `"=v"`},
		{in: "!=v", errHas: `"!=v"`},
		{in: "!", errHas: `"!"`},
		{in: "!!a", errHas: `"!!a"`},
		{in: "!a=b", errHas: `"!a=b"`},
		{in: "bad key=v", errHas: `"bad key=v"`},
		{in: "a=b,-c", errHas: `"-c"`},
		{in: "a===b", errHas: `"a===b"`},
		{in: "a!==b", errHas: `"a!==b"`},
		{in: "a= =b", errHas: `"a= =b"`},
		{in: "a ! = b", errHas: `"a ! = b"`},
		{in: "a=\x01", errHas: `"a=\x01"`},
		{in: "a=" + strings.Repeat("v", 257), errHas: "at most 256"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			sel, err := ParseSelector(tc.in)
			if tc.errHas != "" {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("ParseSelector(%q) = %v, want invalid_argument holding %s", tc.in, err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSelector(%q): %v", tc.in, err)
			}
			if got := sel.Requirements(); !slices.Equal(got, tc.want) {
				t.Errorf("requirements %+v, want %+v", got, tc.want)
			}
			if sel.String() != tc.str {
				t.Errorf("String() = %q, want %q", sel.String(), tc.str)
			}
			if sel.Empty() != (len(tc.want) == 0) {
				t.Errorf("Empty() = %v", sel.Empty())
			}
		})
	}
}

func TestMatches(t *testing.T) {
	set := map[string]string{"thread_id": "42", "env": "prod", "empty": ""}
	for _, tc := range []struct {
		sel   string
		match bool
	}{
		{"", true},
		{"thread_id=42", true},
		{"thread_id=43", false},
		{"thread_id=4", false},
		{"empty=", true},
		{"missing=", false},
		{"thread_id=42, env=prod", true},
		{"thread_id=42,env!=prod", false},
		{"env!=dev", true},
		{"missing!=x", true},
		{"empty!=", false},
		{"env", true},
		{"empty", true},
		{"missing", false},
		{"!missing", true},
		{"!env", false},
		{"!empty", false},
		{"thread_id,!missing,env!=dev,env=prod", true},
		{"thread_id=42,thread_id=43", false},
	} {
		sel, err := ParseSelector(tc.sel)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", tc.sel, err)
		}
		if got := sel.Matches(set); got != tc.match {
			t.Errorf("%q matches %v = %v, want %v", tc.sel, set, got, tc.match)
		}
	}
	if !(Selector{}).Matches(nil) || !(Selector{}).Empty() || (Selector{}).String() != "" {
		t.Error("the zero Selector must be empty and match everything")
	}
	sel, _ := ParseSelector("!a,b!=c")
	if !sel.Matches(nil) {
		t.Error("!a,b!=c must match an empty label set")
	}
}

func TestSelectorFromMap(t *testing.T) {
	sel := SelectorFromMap(map[string]string{"b": "2", "a": "1", "berth.sh/c": "x y"})
	if got, want := sel.String(), "a=1,b=2,berth.sh/c=x y"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for _, r := range sel.Requirements() {
		if r.Op != Equals {
			t.Errorf("requirement %+v is not Equals", r)
		}
	}
	if !sel.Matches(map[string]string{"a": "1", "b": "2", "berth.sh/c": "x y", "d": "4"}) {
		t.Error("a superset must match")
	}
	if sel.Matches(map[string]string{"a": "1", "b": "2"}) || sel.Matches(map[string]string{"a": "1", "b": "3", "berth.sh/c": "x y"}) {
		t.Error("a set missing or changing a pair must not match")
	}
	if !SelectorFromMap(nil).Empty() {
		t.Error("SelectorFromMap(nil) must be empty")
	}
	reparsed, err := ParseSelector(sel.String())
	if err != nil || !slices.Equal(reparsed.Requirements(), sel.Requirements()) {
		t.Errorf("re-parse of %q: %v, %+v", sel, err, reparsed.Requirements())
	}
}

func TestRequirementsIsACopy(t *testing.T) {
	sel, _ := ParseSelector("a=b")
	sel.Requirements()[0].Value = "changed"
	if sel.String() != "a=b" {
		t.Errorf("changing Requirements() changed the selector: %s", sel)
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[Op]string{Equals: "=", NotEquals: "!=", Exists: "exists", NotExists: "!", Op(99): "unknown"} {
		if op.String() != want {
			t.Errorf("Op(%d).String() = %q, want %q", int(op), op.String(), want)
		}
	}
}

// FuzzParseSelector checks that parsing never panics, that every accepted
// term has a valid key and value, and that String of a parsed selector
// parses back to the same requirements. Seeds are in testdata/fuzz too.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{
		"", "a=b", "a==b", "a!=b,c", "!d, e = f", "berth.sh/k=v", ",", "a=b=c",
		"a= =b", "k=\x00", "k=\u00a0x\u00a0", "!", "a!==b", "k=💡,!x", "a=,b!=",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("ParseSelector(%q) error %v is not invalid_argument", s, err)
			}
			return
		}
		for _, r := range sel.Requirements() {
			if err := Validate(map[string]string{r.Key: r.Value}); err != nil {
				t.Fatalf("ParseSelector(%q) accepted %+v: %v", s, r, err)
			}
		}
		again, err := ParseSelector(sel.String())
		if err != nil {
			t.Fatalf("String() %q of parsed %q does not parse: %v", sel.String(), s, err)
		}
		if !slices.Equal(again.Requirements(), sel.Requirements()) {
			t.Fatalf("round trip %q -> %q -> %+v, want %+v", s, sel.String(), again.Requirements(), sel.Requirements())
		}
		if again.String() != sel.String() {
			t.Fatalf("String() not stable: %q then %q", sel.String(), again.String())
		}
	})
}
