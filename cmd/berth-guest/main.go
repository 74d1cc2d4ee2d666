// Command berth-guest is berth's in-sandbox agent alone: the code of
// `berth guest` without the daemon's, the CLI's and the store's packages, so
// that a sandbox's init starts without their package initializers and maps a
// third of the bytes. `make build` embeds it in berth (internal/guestbin),
// and the daemon runs it as every sandbox's init; a berth built without it
// runs itself as `berth guest`.
package main

import (
	"fmt"
	"os"

	"github.com/berthsh/berth/guest"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "guest" { // runtimes start it as they start `berth guest`
		args = args[1:]
	}
	if err := guest.Command(args); err != nil {
		fmt.Fprintln(os.Stderr, "berth guest:", err)
		os.Exit(1)
	}
}
