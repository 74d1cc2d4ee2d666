package cli

import (
	"bytes"
	"testing"
	"time"

	"github.com/berthsh/berth/hostcheck"
)

func TestDoctorTable(t *testing.T) {
	var b bytes.Buffer
	err := printDoctor(&b, []hostcheck.Result{
		{Name: "root", Status: hostcheck.OK, Detail: "running as root", Required: true, Duration: time.Millisecond},
		{Name: "static_binary", Status: hostcheck.Fail, Detail: "linked with cgo", Fix: "CGO_ENABLED=0 go build ./cmd/berth", Required: true, Duration: 2 * time.Millisecond},
		{Name: "kvm", Status: hostcheck.Warn, Detail: "no /dev/kvm", Fix: "modprobe kvm_intel", Duration: time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `CHECK          STATUS  DETAIL
root           OK      running as root
static_binary  FAIL    linked with cgo
                       fix: CGO_ENABLED=0 go build ./cmd/berth
kvm            WARN    no /dev/kvm
                       fix: modprobe kvm_intel

3 checks in 4ms: 1 failed, 1 warned; serve refuses to start until these are fixed: static_binary
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}
