package labels

import (
	"strings"
	"testing"

	"github.com/berthsh/berth/errdefs"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		ok     bool
		names  string
	}{
		{map[string]string{"thread_id": "t-1", "app.kubernetes.io/name": "x", "a": ""}, true, ""},
		{map[string]string{"-bad": "x"}, false, "-bad"},
		{map[string]string{"bad key": "x"}, false, "bad key"},
		{map[string]string{strings.Repeat("k", 64): "x"}, false, strings.Repeat("k", 64)},
		{map[string]string{"Bad_Prefix.com/k": "x"}, false, "Bad_Prefix.com/k"},
		{map[string]string{"k": strings.Repeat("v", 257)}, false, `"k"`},
		{map[string]string{"k": "a\nb"}, false, `"k"`},
		{map[string]string{"k": strings.Repeat("v", 256)}, true, ""},
	} {
		err := Validate(tc.labels)
		if tc.ok != (err == nil) {
			t.Errorf("Validate(%v) = %v, want ok=%v", tc.labels, err, tc.ok)
			continue
		}
		if err != nil && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.names)) {
			t.Errorf("Validate(%v) = %v, want invalid_argument naming %s", tc.labels, err, tc.names)
		}
	}
	many := map[string]string{}
	for i := range 65 {
		many[strings.Repeat("k", 1)+string(rune('a'+i%26))+strings.Repeat("x", i/26)] = "v"
	}
	if err := Validate(many); !errdefs.IsInvalidArgument(err) {
		t.Errorf("65 labels: %v", err)
	}
}

func TestSelector(t *testing.T) {
	set := map[string]string{"thread_id": "42", "env": "prod"}
	for _, tc := range []struct {
		sel   string
		match bool
	}{
		{"", true},
		{"thread_id=42", true},
		{"thread_id==42", true},
		{"thread_id=43", false},
		{"thread_id=42, env=prod", true},
		{"thread_id=42,env!=prod", false},
		{"missing!=x", true},
		{"env", true},
		{"missing", false},
		{"!missing", true},
		{"!env", false},
	} {
		s, err := ParseSelector(tc.sel)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", tc.sel, err)
		}
		if got := s.Matches(set); got != tc.match {
			t.Errorf("%q matches %v = %v, want %v", tc.sel, set, got, tc.match)
		}
	}
	for _, bad := range []string{",", "a=b,,c", "=v", "bad key=v", "a=b=c", "!", "a!=b!=c"} {
		if _, err := ParseSelector(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseSelector(%q) = %v, want invalid_argument", bad, err)
		}
	}
	if s := SelectorFromMap(map[string]string{"b": "2", "a": "1"}); s.String() != "a=1,b=2" || !s.Matches(map[string]string{"a": "1", "b": "2", "c": "3"}) {
		t.Errorf("SelectorFromMap: %s", s)
	}
}

// FuzzParseSelector: parsing never panics, and a parsed selector's String
// parses back to the same requirements.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"a=b", "a!=b,c", "!d, e = f", "x.io/k=v", "", ",", "a==b", "k=\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		again, err := ParseSelector(sel.String())
		if err != nil {
			t.Fatalf("String() %q of parsed %q does not parse: %v", sel.String(), s, err)
		}
		if again.String() != sel.String() {
			t.Fatalf("round trip %q -> %q -> %q", s, sel.String(), again.String())
		}
	})
}
