//go:build berth_guest_embedded

package guestbin

import _ "embed"

// binary is cmd/berth-guest, built next to this file by `make build`.
//
//go:embed berth-guest
var binary []byte
