//go:build !berth_guest_embedded

package guestbin

// binary is empty in a build without the berth_guest_embedded tag: the
// daemon then runs its own executable as `berth guest`.
var binary []byte
