package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

func newSandbox(t testing.TB, d *daemon) string {
	t.Helper()
	sb, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

func TestFilesRoundTrips(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	id := newSandbox(t, d)
	data := make([]byte, 10<<20)
	rand.Read(data)
	for _, gz := range []bool{false, true} {
		fi, err := d.client.Upload(ctx, id, "big/data.bin", bytes.NewReader(data), client.FileOptions{Gzip: gz})
		if err != nil || fi.Path != "/home/user/big/data.bin" || fi.Owner != "user" || fi.Size != int64(len(data)) {
			t.Fatalf("upload (gzip %v): %+v %v", gz, fi, err)
		}
		rc, err := d.client.Download(ctx, id, "/home/user/big/data.bin", client.FileOptions{Gzip: gz})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(rc)
		rc.Close()
		if sha256.Sum256(got) != sha256.Sum256(data) {
			t.Fatalf("10 MiB round trip (gzip %v) differs", gz)
		}
	}
	// Inside, the file is the user's and has the same bytes.
	r, _ := d.client.Exec(ctx, id, api.ExecRequest{Shell: "stat -c '%U %a %s' big/data.bin; sha256sum big/data.bin"})
	if want := fmt.Sprintf("user 644 %d\n%x  big/data.bin\n", len(data), sha256.Sum256(data)); string(r.Stdout) != want {
		t.Fatalf("inside: %q, want %q", r.Stdout, want)
	}

	// A tree of 1,000 small files through tar, out of one sandbox into another.
	_, err := d.client.Exec(ctx, id, api.ExecRequest{Shell: `for i in $(seq 1 1000); do d=tree/d$((i % 13)); mkdir -p $d; head -c $((i * 7)) /dev/urandom > $d/f$i; done; ln -s d1/f1 tree/link`})
	if err != nil {
		t.Fatal(err)
	}
	sums := func(sb string) string {
		r, err := d.client.Exec(ctx, sb, api.ExecRequest{Shell: "cd /home/user/tree && find . -type f | sort | xargs sha256sum | sha256sum; readlink link; find . | wc -l"})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("hash tree: %+v %v", r, err)
		}
		return string(r.Stdout)
	}
	want := sums(id)
	other := newSandbox(t, d)
	for _, gz := range []bool{false, true} {
		rc, err := d.client.DownloadArchive(ctx, id, "/home/user/tree", client.FileOptions{Gzip: gz})
		if err != nil {
			t.Fatal(err)
		}
		res, err := d.client.UploadArchive(ctx, other, "/home/user", rc, client.FileOptions{Gzip: gz})
		rc.Close()
		if err != nil || res.Entries != 1015 {
			t.Fatalf("tar upload (gzip %v): %+v %v", gz, res, err)
		}
		if got := sums(other); got != want {
			t.Fatalf("tree differs after the tar round trip (gzip %v): %q vs %q", gz, got, want)
		}
	}
}

// TestFileToolsInASandbox drives the agent tools and the filesystem
// operations through the API, with the sandbox's default user.
func TestFileToolsInASandbox(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	id := newSandbox(t, d)
	if _, err := c.Write(ctx, id, api.WriteRequest{Path: "proj/main.py", Content: "def f():\n    return 1  # TODO\n", CreateOnly: true}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Write(ctx, id, api.WriteRequest{Path: "proj/main.py", Content: "x", CreateOnly: true})
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "/home/user/proj/main.py") {
		t.Fatalf("create-only on an existing file: %v", err)
	}
	if res, err := c.Edit(ctx, id, api.EditRequest{Path: "proj/main.py", Old: "return 1", New: "return 2"}); err != nil || res.Occurrences != 1 {
		t.Fatalf("edit: %+v %v", res, err)
	}
	rd, err := c.Read(ctx, id, api.ReadRequest{Path: "/home/user/proj/main.py"})
	if err != nil || rd.TotalLines != 2 || rd.Lines[1].Text != "    return 2  # TODO" || rd.Lines[1].Number != 2 {
		t.Fatalf("read: %+v %v", rd, err)
	}
	g, err := c.Grep(ctx, id, api.GrepRequest{Pattern: "TODO", Path: "/home/user", Glob: "*.py"})
	if err != nil || len(g.Matches) != 1 || g.Matches[0].Path != "/home/user/proj/main.py" || g.Matches[0].Line != 2 {
		t.Fatalf("grep: %+v %v", g, err)
	}
	gl, err := c.Glob(ctx, id, api.GlobRequest{Pattern: "**/*.py"})
	if err != nil || len(gl.Matches) != 1 {
		t.Fatalf("glob: %+v %v", gl, err)
	}
	if _, err := c.Mkdir(ctx, id, api.MkdirRequest{Path: "a/b", Parents: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Move(ctx, id, api.MoveRequest{From: "proj", To: "a/b/proj"}); err != nil {
		t.Fatal(err)
	}
	ls, err := c.List(ctx, id, api.ListRequest{Path: "a", Depth: 3})
	if err != nil || len(ls.Entries) != 3 {
		t.Fatalf("list: %+v %v", ls, err)
	}
	if ex, _ := c.Exists(ctx, id, api.StatRequest{Path: "proj"}); ex.Exists {
		t.Fatal("moved directory still exists at the old path")
	}
	if err := c.Remove(ctx, id, api.RemoveRequest{Path: "a", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	// The default user may not write /etc; root may, and chown works.
	_, err = c.Write(ctx, id, api.WriteRequest{Path: "/etc/x", Content: "x"})
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "/etc/x") {
		t.Fatalf("user writing /etc: %v", err)
	}
	if _, err := c.Write(ctx, id, api.WriteRequest{Where: api.Where{User: "root"}, Path: "/etc/x", Content: "x"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.Chown(ctx, id, api.ChownRequest{Where: api.Where{User: "root"}, Path: "/etc/x", Owner: "user"}); err != nil || fi.Owner != "user" {
		t.Fatalf("chown: %+v %v", fi, err)
	}
	// Errors carry the deepagents classes.
	_, err = c.Read(ctx, id, api.ReadRequest{Path: "/nope"})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "/nope") {
		t.Fatalf("missing: %v", err)
	}
	_, err = c.Read(ctx, id, api.ReadRequest{Path: "/home"})
	if errdefs.ReasonOf(err) != errdefs.IsDirectory {
		t.Fatalf("directory: %v (reason %q)", err, errdefs.ReasonOf(err))
	}
	_, err = c.Read(ctx, id, api.ReadRequest{Path: "/tmp/a\x00b"})
	if errdefs.ReasonOf(err) != errdefs.InvalidPath {
		t.Fatalf("NUL: %v", err)
	}
	// Batches report per path.
	up, err := c.UploadFiles(ctx, id, api.UploadRequest{Files: []api.UploadFile{{Path: "ok.txt", Content: []byte("ok")}, {Path: "/etc/no", Content: []byte("no")}}})
	if err != nil || up.Results[0].Error != nil || up.Results[1].Error == nil || up.Results[1].Error.Class != "permission_denied" {
		t.Fatalf("upload batch: %+v %v", up, err)
	}
	down, err := c.DownloadFiles(ctx, id, api.DownloadRequest{Paths: []string{"ok.txt", "/missing"}})
	if err != nil || string(down.Results[0].Content) != "ok" || down.Results[1].Error.Class != "not_found" {
		t.Fatalf("download batch: %+v %v", down, err)
	}
	// A sandbox that does not exist is named.
	_, err = c.Read(ctx, "sb-nope", api.ReadRequest{Path: "/x"})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "sb-nope") {
		t.Fatalf("missing sandbox: %v", err)
	}
}

// TestFileEscapes attacks the file API from inside a sandbox: whatever the
// workload plants, no file operation reads or writes outside the sandbox.
func TestFileEscapes(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	c := d.client
	id := newSandbox(t, d)
	hostSecret := filepath.Join(t.TempDir(), "host-secret")
	os.WriteFile(hostSecret, []byte("HOST SECRET"), 0o644)
	// The workload, as root inside, plants traps.
	plant := strings.Join([]string{
		"ln -s / /tmp/root-link",
		"ln -s ../../../../../../.. /tmp/up",
		"ln -s " + hostSecret + " /tmp/abs",
		"ln -s /proc/1/root /tmp/p1root",
		"ln -s /proc/self/fd/2 /tmp/selffd",
		"ln -s /proc/1/fd /tmp/p1fd",
		"mkfifo /tmp/fifo",
		"ln /etc/hostname /tmp/hard 2>/dev/null || true",
	}, "; ")
	if r, err := c.Exec(ctx, id, api.ExecRequest{Shell: plant, User: "root"}); err != nil || r.ExitCode != 0 {
		t.Fatalf("plant: %+v %v", r, err)
	}
	root := api.Where{User: "root"}
	reads := []string{
		"/tmp/up" + hostSecret, "/tmp/abs", "/tmp/root-link" + hostSecret, "/../../.." + hostSecret,
		"/tmp/p1root" + hostSecret, "/proc/1/root" + hostSecret, "/proc/self/root" + hostSecret,
		"/proc/1/fd/2", "/tmp/selffd", "/tmp/p1fd/0", "/proc/1/environ", "/proc/self/mem", "/proc/1/exe",
		"/proc/1/cwd" + hostSecret, "/sys/kernel/notes",
	}
	for _, p := range reads {
		rc, err := c.Download(ctx, id, p, client.FileOptions{User: "root"})
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			if bytes.Contains(b, []byte("HOST SECRET")) || p == "/proc/1/fd/2" || p == "/tmp/selffd" || p == "/proc/1/environ" {
				t.Errorf("download %s succeeded (%d bytes)", p, len(b))
			}
		}
		if _, err := c.Read(ctx, id, api.ReadRequest{Where: root, Path: p}); err == nil && strings.Contains(p, "/proc/") {
			t.Errorf("read tool on %s succeeded", p)
		}
	}
	// Writes through the same traps land inside or fail.
	for _, p := range []string{"/tmp/abs", "/tmp/up" + hostSecret, "/proc/1/root" + hostSecret, "/tmp/selffd", "/proc/1/fd/1", "/proc/self/exe"} {
		c.Write(ctx, id, api.WriteRequest{Where: root, Path: p, Content: "PWNED"})
		c.Upload(ctx, id, p, strings.NewReader("PWNED"), client.FileOptions{User: "root"})
	}
	if b, _ := os.ReadFile(hostSecret); string(b) != "HOST SECRET" {
		t.Fatalf("host file changed: %q", b)
	}
	if strings.Contains(d.log.String(), "PWNED") {
		t.Fatal("a write reached the guest's stderr (the daemon's log)")
	}
	// The guest still works, its binary is intact.
	if r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("after the attacks: %+v %v", r, err)
	}
	// A FIFO does not hang any operation; devices are refused.
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := c.Read(ctx, id, api.ReadRequest{Where: root, Path: "/tmp/fifo"}); errdefs.ReasonOf(err) != errdefs.NotRegularFile {
			t.Errorf("read FIFO: %v", err)
		}
		if _, err := c.Download(ctx, id, "/tmp/fifo", client.FileOptions{}); errdefs.ReasonOf(err) != errdefs.NotRegularFile {
			t.Errorf("download FIFO: %v", err)
		}
		if _, err := c.Write(ctx, id, api.WriteRequest{Where: root, Path: "/tmp/fifo", Content: "x"}); errdefs.ReasonOf(err) != errdefs.NotRegularFile {
			t.Errorf("write FIFO: %v", err)
		}
		if _, err := c.Download(ctx, id, "/dev/zero", client.FileOptions{}); errdefs.ReasonOf(err) != errdefs.NotRegularFile {
			t.Errorf("download /dev/zero: %v", err)
		}
		g, err := c.Grep(ctx, id, api.GrepRequest{Where: root, Pattern: "x", Path: "/tmp"})
		if err != nil {
			t.Errorf("grep over a FIFO: %+v %v", g, err)
		}
		rc, err := c.DownloadArchive(ctx, id, "/tmp", client.FileOptions{User: "root"})
		if err != nil {
			t.Errorf("tar over a FIFO: %v", err)
		} else {
			io.Copy(io.Discard, rc)
			rc.Close()
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a file operation on a FIFO or device hangs")
	}
	// A tar that plants a symlink and writes through it stays inside.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "esc", Linkname: filepath.Dir(hostSecret)})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "esc/host-secret", Size: 5, Mode: 0o644})
	tw.Write([]byte("PWNED"))
	tw.Close()
	_, err := c.UploadArchive(ctx, id, "/tmp/x", &buf, client.FileOptions{User: "root"})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("tar through a symlink: %v", err)
	}
	if b, _ := os.ReadFile(hostSecret); string(b) != "HOST SECRET" {
		t.Fatalf("host file changed by tar: %q", b)
	}
	// Very long paths are refused with the reason.
	_, err = c.Read(ctx, id, api.ReadRequest{Path: "/" + strings.Repeat("a/", 2100)})
	if errdefs.ReasonOf(err) != errdefs.InvalidPath {
		t.Fatalf("long path: %v", err)
	}
}

func TestFileWatch(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	id := newSandbox(t, d)
	w, err := d.client.Watch(ctx, id, "/home/user", true, client.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := d.client.Exec(ctx, id, api.ExecRequest{Shell: "echo hi > notes.txt; rm notes.txt"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 3 {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, ev.Type+" "+ev.Path)
	}
	if strings.Join(got, ",") != "create /home/user/notes.txt,write /home/user/notes.txt,remove /home/user/notes.txt" {
		t.Fatalf("events: %v", got)
	}
	_, err = d.client.Watch(ctx, id, "/nope", false, client.FileOptions{})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("watch of a missing path: %v", err)
	}
}

func TestCLICopyAndFS(t *testing.T) {
	d := startDaemon(t, "")
	id := newSandbox(t, d)
	local := t.TempDir()
	src := filepath.Join(local, "src")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha\n"), 0o600)
	os.WriteFile(filepath.Join(src, "sub", "b.txt"), []byte("beta\n"), 0o644)
	os.Symlink("a.txt", filepath.Join(src, "link"))

	run := func(stdin string, args ...string) string {
		t.Helper()
		out, errOut, code := d.cli(stdin, args...)
		if code != 0 {
			t.Fatalf("berth %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	// A file into an existing directory, keeping its mode; a tree to a new name.
	run("", "cp", filepath.Join(src, "a.txt"), id+":/home/user")
	run("", "cp", src, id+":copied")
	out := run("", "exec", id, "--", "sh", "-c", "stat -c '%a %U' a.txt; cat copied/sub/b.txt; readlink copied/link")
	if out != "600 user\nbeta\na.txt\n" {
		t.Fatalf("inside after cp in: %q", out)
	}
	// Out again: a tree into an existing directory, a file to a new name, a tar to stdout.
	back := t.TempDir()
	run("", "cp", id+":copied", back)
	run("", "cp", id+":/home/user/a.txt", filepath.Join(back, "renamed.txt"))
	if b, _ := os.ReadFile(filepath.Join(back, "copied", "sub", "b.txt")); string(b) != "beta\n" {
		t.Fatalf("cp out tree: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(back, "renamed.txt")); string(b) != "alpha\n" {
		t.Fatalf("cp out file: %q", b)
	}
	tarOut := run("", "cp", id+":copied", "-")
	tr := tar.NewReader(strings.NewReader(tarOut))
	var names []string
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if strings.Join(names, " ") != "copied/ copied/a.txt copied/link copied/sub/ copied/sub/b.txt" {
		t.Fatalf("tar to stdout: %v", names)
	}
	run(tarOut, "cp", "-", id+":/tmp/fromtar")
	if out := run("", "fs", "cat", id, "/tmp/fromtar/copied/a.txt"); out != "alpha\n" {
		t.Fatalf("cp - then fs cat: %q", out)
	}
	// fs subcommands.
	run("", "fs", "mkdir", "-p", id, "x/y/z")
	run("", "fs", "mv", id, "x/y", "x/w")
	if out := run("", "fs", "ls", "-d", "2", id, "x"); !strings.Contains(out, "/home/user/x/w/z") || !strings.HasPrefix(out, "drwxr-xr-x") {
		t.Fatalf("fs ls: %q", out)
	}
	run("", "fs", "rm", "-r", id, "x")
	if _, errOut, code := d.cli("", "fs", "stat", id, "x"); code != 1 || !strings.Contains(errOut, "/home/user/x") {
		t.Fatalf("fs stat of a removed path: %d %q", code, errOut)
	}
	if _, errOut, code := d.cli("", "cp", "a", "b"); code == 0 || !strings.Contains(errOut, "ID:PATH") {
		t.Fatalf("cp without a sandbox side: %d %q", code, errOut)
	}

	// A hostile sandbox's tar cannot write outside the local destination.
	evil := t.TempDir()
	run("", "exec", "-u", "root", id, "--", "sh", "-c", "mkdir -p /tmp/evil && ln -s "+evil+"/.. /tmp/evil/up && ln -s / /tmp/evil/root")
	dest := t.TempDir()
	run("", "cp", id+":/tmp/evil", dest)
	if l, _ := os.Readlink(filepath.Join(dest, "evil", "up")); l != evil+"/.." {
		t.Fatalf("symlink not kept as a symlink: %q", l)
	}
	// A second copy over the first writes through nothing.
	run("", "cp", id+":/tmp/evil", dest)
	if ents, _ := os.ReadDir(filepath.Dir(evil)); len(ents) == 0 {
		t.Fatal("parent of the destination emptied")
	}
}

// TestUploadOverFullDisk fills a size-limited file system inside the
// sandbox (its 64 MiB /dev/shm tmpfs) with an upload: resource_exhausted,
// reason no_space, and no partial file left behind.
func TestUploadOverFullDisk(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	id := newSandbox(t, d)
	_, err := d.client.Upload(ctx, id, "/dev/shm/big", &zeros{n: 100 << 20}, client.FileOptions{})
	if !errdefs.IsResourceExhausted(err) || errdefs.ReasonOf(err) != errdefs.NoSpace || !strings.Contains(err.Error(), "/dev/shm/big") {
		t.Fatalf("upload over a full disk: %v (reason %q)", err, errdefs.ReasonOf(err))
	}
	r, err := d.client.Exec(ctx, id, api.ExecRequest{Shell: "ls -A /dev/shm | wc -l; df -k /dev/shm | tail -1 | awk '{print $3}'"})
	if err != nil || string(r.Stdout) != "0\n0\n" {
		t.Fatalf("after the failed upload: %q %v", r.Stdout, err)
	}
}
