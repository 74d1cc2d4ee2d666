package auth

import "strings"

// Redact returns s with the secret of every berth key in it replaced by
// "…": the key's id stays, so that a log line or an audit record still
// says which key was pasted where an id belongs (a path, an error).
func Redact(s string) string {
	if !strings.Contains(s, Prefix) {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, Prefix)
		if i < 0 {
			break
		}
		end := i + len(Prefix) + idLen + 1
		if end > len(s) || !isHex(s[i+len(Prefix):end-1]) || s[end-1] != '_' {
			b.WriteString(s[:i+len(Prefix)])
			s = s[i+len(Prefix):]
			continue
		}
		n := end
		for n < len(s) && n-end < secretLen && isHex(s[n:n+1]) {
			n++
		}
		b.WriteString(s[:end])
		if n > end {
			b.WriteString("…")
		}
		s = s[n:]
	}
	b.WriteString(s)
	return b.String()
}

// idOf is the id a caller means: a whole key pasted where its id belongs
// (berth key revoke <key>) names its id.
func idOf(ref string) string {
	if id, _, ok := split(ref); ok {
		return id
	}
	return ref
}
