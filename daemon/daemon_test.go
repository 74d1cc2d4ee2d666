package daemon

import (
	"strings"
	"testing"
)

func TestListenMustBeLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		remote bool
		ok     bool
	}{
		{"127.0.0.1:7680", false, true}, {"[::1]:7680", false, true}, {"localhost:7680", false, true},
		{"127.3.2.1:80", false, true}, {"", false, true},
		{"0.0.0.0:7680", false, false}, {":7680", false, false}, {"[::]:7680", false, false},
		{"10.0.0.5:7680", false, false}, {"berth.example:7680", false, false},
		{"0.0.0.0:7680", true, true}, {"nonsense", false, false},
	} {
		err := checkListen(tc.addr, tc.remote)
		if (err == nil) != tc.ok {
			t.Errorf("%q remote=%v: %v, want ok=%v", tc.addr, tc.remote, err, tc.ok)
		}
		if err != nil && tc.addr != "nonsense" && !strings.Contains(err.Error(), "--insecure-remote-api") {
			t.Errorf("%q: the refusal does not say how to override it: %v", tc.addr, err)
		}
	}
}
