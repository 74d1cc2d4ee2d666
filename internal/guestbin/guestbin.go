// Package guestbin carries the lean guest binary (cmd/berth-guest) inside
// berth when it is built with the berth_guest_embedded tag, as `make build`
// does: the daemon writes it out and runs it as every sandbox's init, so
// that no daemon package's initializer runs in a sandbox's start.
package guestbin

import (
	"fmt"

	"github.com/berthsh/berth/runtime"
)

// Install writes the embedded guest into dir, named by its content hash
// (an upgrade never overwrites a binary that sandboxes run), and returns
// its path; "" when this berth was built without one.
func Install(dir string) (string, error) {
	if len(binary) == 0 {
		return "", nil
	}
	var dst string
	var err error
	if sum != "" {
		dst, err = runtime.InstallGuestBytesSum(binary, sum, dir)
	} else {
		dst, err = runtime.InstallGuestBytes(binary, dir)
	}
	if err != nil {
		return "", fmt.Errorf("install guest: %w", err)
	}
	return dst, nil
}

// sum is the embedded guest's SHA-256 in hex, which `make build` sets
// (-ldflags -X) from the file it embeds; a build without it hashes the
// binary at each start instead.
var sum string

// Embedded says whether this berth carries the lean guest.
func Embedded() bool { return len(binary) > 0 }
