package auth

import (
	"strings"
	"testing"
)

// TestRedact: every key's secret goes, its id stays; text that only looks
// like the start of a key is left as it is.
func TestRedact(t *testing.T) {
	_, key, _ := newKey()
	_, other, _ := newKey()
	id := key[:len(Prefix)+idLen+1]
	for in, want := range map[string]string{
		"":                                   "",
		"/v1/keys/" + key:                    "/v1/keys/" + id + "…",
		"/v1/sandboxes/" + key + "/exec":     "/v1/sandboxes/" + id + "…/exec",
		`API key "` + key + `" and ` + other: `API key "` + id + `…" and ` + other[:len(id)] + "…",
		"berth_ and berth_12 and berth_xyz":  "berth_ and berth_12 and berth_xyz",
		"berth_berth_" + key[len(Prefix):]:   "berth_" + id + "…",
		key[:len(key)-10]:                    id + "…",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
		if strings.Contains(Redact(in), key[len(key)-40:]) {
			t.Errorf("Redact(%q) keeps the secret", in)
		}
	}
	if id := idOf(key); id != key[len(Prefix):len(Prefix)+idLen] {
		t.Errorf("idOf(key) = %q", id)
	}
	if got := idOf("3f9a0c1b2d4e"); got != "3f9a0c1b2d4e" {
		t.Errorf("idOf(an id) = %q", got)
	}
}
