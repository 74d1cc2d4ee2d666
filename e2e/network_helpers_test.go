package e2e

import (
	"archive/zip"
	"bytes"
	"os/exec"
	"testing"
)

func slicesAny[T any](s []T, f func(T) bool) bool {
	for _, v := range s {
		if f(v) {
			return true
		}
	}
	return false
}

func runIP(args ...string) ([]byte, error) { return exec.Command("ip", args...).CombinedOutput() }

// demoWheel is a minimal valid wheel: berthdemo 1.0.
func demoWheel(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	z := zip.NewWriter(&b)
	for name, body := range map[string]string{
		"berthdemo/__init__.py":                 "VERSION = '1.0'\n",
		"berthdemo-1.0.dist-info/METADATA":      "Metadata-Version: 2.1\nName: berthdemo\nVersion: 1.0\n",
		"berthdemo-1.0.dist-info/WHEEL":         "Wheel-Version: 1.0\nGenerator: berth-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"berthdemo-1.0.dist-info/RECORD":        "",
		"berthdemo-1.0.dist-info/top_level.txt": "berthdemo\n",
	} {
		w, err := z.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(body))
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
