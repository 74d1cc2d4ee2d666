package spawn

import (
	"os"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkForkExec starts /bin/true in a new user and PID namespace and
// waits for it, forked (a copy of the process) and cloned into its memory,
// from this test process as it is and with 64 MiB more of it resident:
// what a fork copies grows with the parent, a clone copies nothing.
//
//	go test -run '^$' -bench ForkExec -count 6 ./spawn/
func BenchmarkForkExec(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("needs root: it writes a child's id maps")
	}
	for _, size := range []struct {
		name  string
		extra int
	}{{"self", 0}, {"self+64MiB", 64 << 20}} {
		ballast := make([]byte, size.extra)
		for i := 0; i < len(ballast); i += os.Getpagesize() {
			ballast[i] = 1
		}
		for _, way := range []struct {
			name     string
			dumpable int
		}{{"forked", 1}, {"cloned", 0}} {
			b.Run(size.name+"/"+way.name, func(b *testing.B) {
				if err := unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(way.dumpable), 0, 0, 0); err != nil {
					b.Fatal(err)
				}
				defer unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
				if want := cloneVM && way.dumpable == 0; sharesMemory() != want {
					b.Fatalf("sharesMemory %v, want %v", sharesMemory(), want)
				}
				c, err := newChild(Request{Path: "/bin/true", Args: []string{"true"}}, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer c.close()
				for b.Loop() {
					_, pidfd, err := forkExec(&c.child, syscall.CLONE_NEWUSER|syscall.CLONE_NEWPID, 300000, 65536, -1)
					if err != nil {
						b.Fatal(err)
					}
					var info unix.Siginfo
					if err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED, nil); err != nil {
						b.Fatal(err)
					}
					unix.Close(pidfd)
				}
			})
		}
		runtime.KeepAlive(ballast)
	}
}
