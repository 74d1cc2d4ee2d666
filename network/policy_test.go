package network

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

func TestCompileRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		n     api.Network
		field string
	}{
		{api.Network{Mode: "closed"}, "network.mode"},
		{api.Network{Mode: "allowlist", Allow: []string{"pypi.org", "*.com"}}, "network.allow[1]"},
		{api.Network{Mode: "allowlist", Allow: []string{"*"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"a.*.org"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"10.0.0.0/33"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"pypi.org:0"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"pypi.org:70000"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"pypi.org:90-80"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"[::1]:80"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"fd00::/8"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"exa mple.org"}}, "network.allow[0]"},
		{api.Network{Mode: "allowlist", Allow: []string{"-bad.org"}}, "network.allow[0]"},
		{api.Network{Mode: "open", Deny: []string{""}}, "network.deny[0]"},
		{api.Network{Mode: "open", Secrets: []api.SecretBinding{{Secret: "k", Host: "*.openai.com", Header: "Authorization"}}}, "network.secrets[0].host"},
		{api.Network{Mode: "open", Secrets: []api.SecretBinding{{Secret: "k", Host: "1.2.3.4", Header: "Authorization"}}}, "network.secrets[0].host"},
		{api.Network{Mode: "open", Secrets: []api.SecretBinding{{Secret: "k", Host: "api.openai.com"}}}, "network.secrets[0]"},
		{api.Network{Mode: "open", Secrets: []api.SecretBinding{{Secret: "no spaces", Host: "api.openai.com", Header: "X"}}}, "network.secrets[0].secret"},
		{api.Network{Mode: "open", Secrets: []api.SecretBinding{{Secret: "k", Host: "api.openai.com", Header: "Bad Header"}}}, "network.secrets[0].header"},
		{api.Network{Mode: "open", Secrets: []api.SecretBinding{{Secret: "k", Host: "api.openai.com", Header: "X", Format: "Bearer"}}}, "network.secrets[0].format"},
		{api.Network{Mode: "open", Secrets: []api.SecretBinding{{Secret: "k", Host: "api.openai.com", Env: "1X"}}}, "network.secrets[0].env"},
		{api.Network{Mode: "open", Secrets: []api.SecretBinding{{Secret: "k", Host: "a.com", Env: "K"}, {Secret: "j", Host: "b.com", Env: "K"}}}, "network.secrets[1].env"},
	} {
		_, err := Compile(tc.n)
		if !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(errdefs.Message(err), tc.field) {
			t.Errorf("%+v: %v, want invalid_argument naming %s", tc.n, err, tc.field)
		}
	}
}

func mustCompile(t *testing.T, n api.Network) *Policy {
	t.Helper()
	p, err := Compile(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNames(t *testing.T) {
	p := mustCompile(t, api.Network{Mode: "allowlist",
		Allow:   []string{"PyPI.org.", "*.pythonhosted.org", "github.com:22"},
		Deny:    []string{"evil.pythonhosted.org"},
		Secrets: []api.SecretBinding{{Secret: "openai", Host: "api.openai.com", Header: "Authorization", Format: "Bearer {secret}"}}})
	for name, want := range map[string]bool{
		"pypi.org": true, "PYPI.ORG.": true, "www.pypi.org": false, "files.pythonhosted.org": true,
		"a.b.pythonhosted.org": true, "pythonhosted.org": false, "evil.pythonhosted.org": false,
		"api.openai.com": true, "openai.com": false, "github.com": true, "example.com": false,
	} {
		if got := p.CheckName(name); got.Allowed != want || got.Rule == "" {
			t.Errorf("CheckName(%q) = %+v, want allowed %v with a rule", name, got, want)
		}
	}
	open := mustCompile(t, api.Network{Mode: "open", Deny: []string{"*.tracker.example"}})
	if !open.CheckName("anything.org").Allowed || open.CheckName("x.tracker.example").Allowed {
		t.Error("open mode: every name but the denied ones")
	}
	none := mustCompile(t, api.Network{Mode: "none"})
	if none.CheckName("pypi.org").Allowed {
		t.Error("mode none allowed a name")
	}
}

func TestAddresses(t *testing.T) {
	p := mustCompile(t, api.Network{Mode: "allowlist",
		Allow: []string{"pypi.org", "github.com:22", "10.9.0.0/16:5432", "198.51.100.7"},
		Deny:  []string{"203.0.113.66"}})
	a := netip.MustParseAddr
	for _, tc := range []struct {
		addr  string
		port  uint16
		names []string
		want  bool
	}{
		{"203.0.113.10", 443, []string{"pypi.org"}, true},
		{"203.0.113.10", 443, nil, false},                           // nobody resolved it
		{"203.0.113.10", 443, []string{"example.com"}, false},       // resolved, but not allowed
		{"203.0.113.11", 22, []string{"github.com"}, true},          // the rule's port
		{"203.0.113.11", 443, []string{"github.com"}, false},        // another port
		{"203.0.113.66", 443, []string{"pypi.org"}, false},          // denied address
		{"10.9.1.1", 5432, nil, true},                               // an allow CIDR opens a private range
		{"10.9.1.1", 80, nil, false},                                // not on that port
		{"10.1.1.1", 443, []string{"pypi.org"}, false},              // private, even if a name pointed there
		{"127.0.0.1", 80, []string{"pypi.org"}, false},              // loopback
		{"169.254.169.254", 80, []string{"pypi.org"}, false},        // metadata
		{"100.64.0.1", 80, nil, false},                              // berth's gateway
		{"::ffff:169.254.169.254", 80, []string{"pypi.org"}, false}, // v4-mapped
		{"2001:db8::1", 443, []string{"pypi.org"}, false},           // IPv6
		{"198.51.100.7", 9999, nil, true},                           // an allowed address, any port
	} {
		if got := p.CheckAddr(a(tc.addr), tc.port, tc.names); got.Allowed != tc.want || got.Rule == "" {
			t.Errorf("CheckAddr(%s:%d, %v) = %+v, want allowed %v with a rule", tc.addr, tc.port, tc.names, got, tc.want)
		}
	}
	open := mustCompile(t, api.Network{Mode: "open"})
	for addr, want := range map[string]bool{"203.0.113.10": true, "8.8.8.8": true, "192.168.1.1": false,
		"172.20.0.1": false, "127.0.0.53": false, "169.254.169.254": false, "224.0.0.1": false, "::1": false} {
		if got := open.CheckAddr(a(addr), 80, nil); got.Allowed != want {
			t.Errorf("open: %s: %+v, want %v", addr, got, want)
		}
	}
}

func TestBindings(t *testing.T) {
	p := mustCompile(t, api.Network{Mode: "allowlist", Secrets: []api.SecretBinding{
		{Secret: "a", Host: "API.example.com", Header: "Authorization"},
		{Secret: "b", Host: "api.example.com", Env: "B_KEY"},
		{Secret: "c", Host: "other.example.com", Env: "C_KEY"}}})
	if got := p.BindingsFor("api.example.com."); len(got) != 2 || got[0].Secret != "a" || got[1].Secret != "b" {
		t.Fatalf("bindings for api.example.com: %+v", got)
	}
	if got := p.CheckAddr(netip.MustParseAddr("203.0.113.5"), 443, []string{"api.example.com"}); !got.Allowed {
		t.Fatalf("a bound host on 443: %+v", got)
	}
	if got := p.CheckAddr(netip.MustParseAddr("203.0.113.5"), 22, []string{"api.example.com"}); got.Allowed {
		t.Fatalf("a bound host on 22: %+v", got)
	}
}
