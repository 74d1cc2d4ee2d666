package guest

import (
	"go/build"
	"strings"
	"testing"
)

// TestGuestImportsNoDaemonCode enforces the boundary between the sandbox
// side and the host side: the guest, and the lean guest binary built from
// it, may import the protocol contract and neutral helpers, never the
// daemon's packages.
func TestGuestImportsNoDaemonCode(t *testing.T) {
	const module = "github.com/berthsh/berth/"
	allowed := map[string]bool{
		"api/guestapi": true, "errdefs": true, "guest": true, "guest/proc": true, "guest/files": true,
		"capability": true, "seccomp": true, "internal/fds": true,
		"spawn": true, "internal/osthread": true, // the spawner mode, which runs on the host
	}
	seen := map[string]bool{}
	var walk func(path string)
	walk = func(path string) {
		if seen[path] {
			return
		}
		seen[path] = true
		pkg, err := build.Import(path, ".", 0)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		for _, imp := range pkg.Imports {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				if !allowed[rel] {
					t.Errorf("%s imports %s: the guest must not depend on daemon code", path, imp)
				}
				walk(imp)
			}
		}
	}
	walk(module + "guest")
	walk(module + "cmd/berth-guest")
}
