package guest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/guestclient"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/runtimetest"
)

// TestBootFromFileOnASocket boots `berth guest --bootstrap FILE` the way a
// runtime that cannot pass descriptors would (runsc from an OCI bundle, a
// VM's init): the bootstrap is a file, readiness is the socket accepting.
// Once with a root for the guest to assemble, once with the root prepared
// (the guest's own root is the sandbox's).
func TestBootFromFileOnASocket(t *testing.T) {
	testutil.RequireRoot(t)
	ids := runtime.DefaultIDMap
	state := testutil.StateDir(t)
	images, err := image.New(filepath.Join(state, "images"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	img, err := images.Resolve(t.Context(), image.Host, ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		assemble bool
	}{{"AssembledRoot", true}, {"PreparedRoot", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(state, strings.ToLower(tc.name))
			mkdirOwned(t, dir, 0o710, 0, int(ids.HostID))
			for _, d := range []string{"upper", "work", "ctl"} {
				mkdirOwned(t, filepath.Join(dir, d), 0o700, int(ids.HostID), int(ids.HostID))
			}
			os.Chmod(filepath.Join(dir, "upper"), 0o755)
			b := guestapi.Bootstrap{
				ID:       "sb-boot" + strings.ToLower(tc.name[:4]),
				Token:    "boot-test-token-0123456789abcdef",
				Listen:   guestapi.ListenUnix + filepath.Join(dir, "ctl", "guest.sock"),
				Hostname: "boot-" + strings.ToLower(tc.name[:4]),
				Seccomp:  true,
			}
			if tc.assemble {
				var mounts []guestapi.Mount
				for _, m := range img.Mounts {
					mounts = append(mounts, guestapi.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
				}
				b.Root = &guestapi.Root{Layers: img.Root.Layers, Upper: filepath.Join(dir, "upper"),
					Work: filepath.Join(dir, "work"), Mounts: mounts}
			}
			file := filepath.Join(dir, "ctl", "bootstrap.json")
			writeOwned(t, file, b, int(ids.HostID))

			var log bytes.Buffer
			cmd := exec.Command(testutil.Berth(t), "guest", guestapi.BootFlagFile, file)
			cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = []string{"GOMAXPROCS=1"}, "/", &log, &log
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
					syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
				UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ids.HostID), Size: int(ids.Size)}},
				GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ids.HostID), Size: int(ids.Size)}},
				GidMappingsEnableSetgroups: true,
				Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
				Setsid:                     true,
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd.Process.Kill()
				cmd.Wait()
			})
			sock := strings.TrimPrefix(b.Listen, guestapi.ListenUnix)
			gc := guestclient.New(b.ID, b.Token, func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			})
			defer gc.Close()
			// Ready is the socket accepting: dial until the hello answers.
			deadline := time.Now().Add(10 * time.Second)
			for {
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				_, err := gc.Hello(ctx)
				cancel()
				if err == nil {
					break
				}
				if time.Now().After(deadline) || cmd.ProcessState != nil {
					t.Fatalf("guest never answered: %v\nlog: %s", err, log.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the bootstrap file (it holds the token) is still there: %v", err)
			}
			out := run(t, gc, "hostname; id -u; cat /proc/self/status | grep -c '^Seccomp:.*2'")
			if want := b.Hostname + "\n0\n1\n"; out != want {
				t.Errorf("hostname, uid, seccomp: %q, want %q", out, want)
			}
			// The assembled root is the host image: a private writable layer,
			// the host's /usr read-only; the prepared one is the root the
			// guest started in.
			// The shell's complaints are silenced: stderr and stdout are two
			// streams, and their order as events is not the order written.
			out = run(t, gc, "{ echo x > /etc/berth-boot-test; } 2>/dev/null && ls /etc/berth-boot-test; touch /usr/berth-boot-test 2>/dev/null || echo ro")
			if tc.assemble && out != "/etc/berth-boot-test\nro\n" {
				t.Errorf("assembled root: %q", out)
			}
			if !tc.assemble && out != "ro\n" {
				t.Errorf("prepared root: root inside wrote the host's /usr or /etc: %q", out)
			}
			conn, err := gc.Echo(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := runtimetest.EchoRoundTrip(conn, 8<<20); err != nil {
				t.Errorf("two-way stream: %v", err)
			}
		})
	}
}

func run(t *testing.T, gc *guestclient.Client, script string) string {
	t.Helper()
	st, err := gc.Exec(t.Context(), guestapi.ProcessSpec{Args: []string{"/bin/sh", "-c", script}, User: "root", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out bytes.Buffer
	for {
		ev, err := st.Next()
		if err != nil {
			t.Fatalf("%q: %v", script, err)
		}
		switch ev.Type {
		case guestapi.EventStdout, guestapi.EventStderr:
			out.Write(ev.Data)
		case guestapi.EventExit:
			return out.String()
		}
	}
}

func mkdirOwned(t *testing.T, dir string, mode os.FileMode, uid, gid int) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
}

func writeOwned(t *testing.T, file string, v any, owner int) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(file, owner, owner); err != nil {
		t.Fatal(err)
	}
}
