// Package guest is berth's agent inside a sandbox. Its core serves the guest
// protocol (api/guestapi) on a listener it is given: processes (guest/proc)
// and files (guest/files), in the sandbox's own namespaces. Boot modes beside
// the core (boot.go) turn a runtime's way of starting the guest into that
// listener: they read the Bootstrap, assemble the root when asked, and harden
// the process before the core serves. It never imports daemon code.
package guest

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"sync"

	"github.com/berthsh/berth/guest/files"
	"github.com/berthsh/berth/guest/proc"
)

// Config is what the core needs to serve.
type Config struct {
	// Token authenticates the daemon (guestapi.Proof).
	Token string
	// Hostname is the HOSTNAME processes get by default.
	Hostname string
	// FilesRoot is the directory the file API serves: "/" in a sandbox.
	FilesRoot string
	// Relisten, unless nil, makes the guest suspendable (see Serve), and
	// Unlisten removes the socket file once it let go of it.
	Relisten func() (net.Listener, error)
	Unlisten func() error
}

// Run serves the guest protocol on l until ctx ends or serving fails. It owns
// the process table and its reaper, the file service and the server, and
// stops them all before it returns.
func Run(ctx context.Context, l net.Listener, cfg Config, log *slog.Logger) error {
	fs, err := files.New(cfg.FilesRoot)
	if err != nil {
		return err
	}
	defer fs.Close()
	table := proc.NewTable(log, proc.Defaults{Hostname: cfg.Hostname})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reaped := make(chan error, 1)
	go func() { reaped <- table.Run(ctx) }()
	err = Serve(ctx, l, cfg.Token, table, fs, cfg.Relisten, cfg.Unlisten, log)
	cancel()
	table.Close()
	<-reaped
	return err
}

// threadReserve is how many idle OS threads the guest keeps for later.
const threadReserve = 8

// reserveThreads makes the Go runtime create n OS threads now and keep them
// idle. The guest's threads count against the sandbox's pids limit, and the
// runtime aborts the process when it cannot create a thread it needs: under
// a fork bomb at the limit, a guest that needed a new thread would die with
// its sandbox. With a reserve it reuses idle threads instead. (Locking n
// goroutines at once forces n threads; unlocking parks them, not frees them.)
func reserveThreads(n int) {
	var locked, release sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	for range n {
		go func() {
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	release.Done()
}
