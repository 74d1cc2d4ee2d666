// Package testutil holds helpers shared by berth's tests.
package testutil

import (
	"os"
	"testing"
)

// RequireRoot skips a test that needs root on a developer's machine and fails
// it where CI=true (CI runs as root, so a skip there would hide a broken test).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root, and CI=true turns the skip into a failure")
	}
	t.Skip("needs root")
}
