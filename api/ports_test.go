package api

import "testing"

func TestSplitPortHost(t *testing.T) {
	for _, c := range []struct {
		host   string
		port   int
		id     string
		ok     bool
		domain string
	}{
		{"8000-sb-abc.berth.localhost", 8000, "sb-abc", true, "berth.localhost"},
		{"8000-SB-ABC.Berth.Localhost.:7680", 8000, "sb-abc", true, "berth.localhost"},
		{"49983-sb-x.example.com", 49983, "sb-x", true, ".example.com"},
		{"berth.localhost", 0, "", false, "berth.localhost"},
		{"8000-sb-abc.evil.berth.localhost", 0, "", false, "berth.localhost"},
		{"8000-sb-abc.notberth.localhost", 0, "", false, "berth.localhost"},
		{"x-sb-abc.berth.localhost", 0, "", false, "berth.localhost"},
		{"8000-.berth.localhost", 0, "", false, "berth.localhost"},
		{"8000.berth.localhost", 0, "", false, "berth.localhost"},
	} {
		port, id, ok := SplitPortHost(c.host, c.domain)
		if port != c.port || id != c.id || ok != c.ok {
			t.Errorf("SplitPortHost(%q, %q) = %d, %q, %v; want %d, %q, %v", c.host, c.domain, port, id, ok, c.port, c.id, c.ok)
		}
	}
}
