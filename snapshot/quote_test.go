package snapshot

import (
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// unquoteC undoes git's C-style quoting, as git apply reads it.
func unquoteC(t *testing.T, q string) string {
	t.Helper()
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		t.Fatalf("%q: not in quotes", q)
	}
	q = q[1 : len(q)-1]
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c == '"' {
			t.Fatalf("%q: a bare quote inside", q)
		}
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i == len(q) {
			t.Fatalf("%q: ends in a backslash", q)
		}
		if j := strings.IndexByte("abtnvfr\"\\", q[i]); j >= 0 {
			b.WriteByte("\a\b\t\n\v\f\r\"\\"[j])
			continue
		}
		if i+3 > len(q) {
			t.Fatalf("%q: a short octal escape", q)
		}
		n, err := strconv.ParseUint(q[i:i+3], 8, 8)
		if err != nil {
			t.Fatalf("%q: %v", q, err)
		}
		b.WriteByte(byte(n))
		i += 2
	}
	return b.String()
}

func FuzzQuoteName(f *testing.F) {
	for _, s := range []string{"a/etc/hosts", "a/evil\nname", "b/\x1b[31mred", "a/ü", "a/\u202eevil", "a/\xff\xfe", `a/"q"\`, "a/tab\there"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := quoteName(s)
		for _, r := range q {
			if r != ' ' && !unicode.IsPrint(r) {
				t.Fatalf("quoteName(%q) = %q holds %U", s, q, r)
			}
		}
		if !utf8.ValidString(q) {
			t.Fatalf("quoteName(%q) = %q is not UTF-8", s, q)
		}
		if q == s {
			if needsQuote(s) {
				t.Fatalf("%q left as it is", s)
			}
			return
		}
		if got := unquoteC(t, q); got != s {
			t.Fatalf("quoteName(%q) = %q, which reads back as %q", s, q, got)
		}
		if sh := show(s); strings.ContainsFunc(sh, func(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }) {
			t.Fatalf("show(%q) = %q", s, sh)
		}
	})
}
