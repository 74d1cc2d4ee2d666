package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/e2b/envd/filesystem"
)

// restCall calls one of envd's REST routes for c's sandbox.
func (c *envdClient) restCall(t *testing.T, method, route string, q url.Values, body io.Reader, header http.Header) *http.Response {
	t.Helper()
	u := c.url + route
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(t.Context(), method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c.headers {
		req.Header[k] = v
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// envdStatus checks a REST answer's status and, for an error, E2B's body.
func envdStatus(t *testing.T, res *http.Response, status int) []byte {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d: %s", res.Request.Method, res.Request.URL, res.StatusCode, status, b)
	}
	if status >= 400 {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Code != status || e.Message == "" {
			t.Fatalf("%s %s: error body %s is not E2B's {code, message} (%v)", res.Request.Method, res.Request.URL, b, err)
		}
	}
	return b
}

type envdUpload struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// envdMultipart is a form of "file" parts, one per name and content.
func envdMultipart(t *testing.T, files ...[2]string) (io.Reader, http.Header) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, f := range files {
		w, err := mw.CreateFormFile("file", f[0])
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, f[1])
	}
	mw.Close()
	return &b, http.Header{"Content-Type": {mw.FormDataContentType()}}
}

func envdUploads(t *testing.T, res *http.Response) []envdUpload {
	t.Helper()
	var got []envdUpload
	if err := json.Unmarshal(envdStatus(t, res, http.StatusOK), &got); err != nil {
		t.Fatal(err)
	}
	return got
}

func envdRead(t *testing.T, c *envdClient, p, user string) string {
	t.Helper()
	q := url.Values{"path": {p}}
	if user != "" {
		q.Set("username", user)
	}
	return string(envdStatus(t, c.restCall(t, "GET", "/files", q, nil, nil), http.StatusOK))
}

func rootRun(t *testing.T, d *daemon, id, script string) string {
	t.Helper()
	r, err := d.client.Exec(t.Context(), id, api.ExecRequest{Shell: script, User: "root"})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("%s: %+v %v", script, r, err)
	}
	return string(r.Stdout)
}

func TestE2BFilesTransfer(t *testing.T) {
	d := startDaemon(t, "")
	sb, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c := newEnvdClient(t, d, sb)

	// One part at the path parameter; relative paths start at the home.
	body, h := envdMultipart(t, [2]string{"ignored.txt", "one\n"})
	got := envdUploads(t, c.restCall(t, "POST", "/files", url.Values{"path": {"notes/a.txt"}}, body, h))
	if want := []envdUpload{{"/home/user/notes/a.txt", "a.txt", "file"}}; !slices.Equal(got, want) {
		t.Fatalf("one part: %+v, want %+v", got, want)
	}
	if s := envdRead(t, c, "/home/user/notes/a.txt", ""); s != "one\n" {
		t.Fatalf("read back %q", s)
	}
	// Two parts, each at its file name (a path, kept whole).
	body, h = envdMultipart(t, [2]string{"multi/b.txt", "bee"}, [2]string{"/tmp/multi/c.txt", "sea"})
	got = envdUploads(t, c.restCall(t, "POST", "/files", nil, body, h))
	if want := []envdUpload{{"/home/user/multi/b.txt", "b.txt", "file"}, {"/tmp/multi/c.txt", "c.txt", "file"}}; !slices.Equal(got, want) {
		t.Fatalf("two parts: %+v, want %+v", got, want)
	}
	if s := rootRun(t, d, sb.ID, "cat /home/user/multi/b.txt /tmp/multi/c.txt; stat -c %U /tmp/multi/c.txt"); s != "beeseauser\n" {
		t.Fatalf("inside: %q", s)
	}
	// Two parts to one path: the first is written, the second refused.
	body, h = envdMultipart(t, [2]string{"x", "first"}, [2]string{"y", "second"})
	envdStatus(t, c.restCall(t, "POST", "/files", url.Values{"path": {"dup.txt"}}, body, h), http.StatusBadRequest)
	if s := envdRead(t, c, "dup.txt", ""); s != "first" {
		t.Fatalf("dup.txt: %q", s)
	}

	// 50 MiB as application/octet-stream, and back with and without gzip.
	data := make([]byte, 50<<20)
	rand.Read(data)
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	got = envdUploads(t, c.restCall(t, "POST", "/files", url.Values{"path": {"big/data.bin"}}, bytes.NewReader(data), octet))
	if want := []envdUpload{{"/home/user/big/data.bin", "data.bin", "file"}}; !slices.Equal(got, want) {
		t.Fatalf("octet-stream: %+v", got)
	}
	res := c.restCall(t, "GET", "/files", url.Values{"path": {"big/data.bin"}}, nil, http.Header{"Accept-Encoding": {"identity"}})
	if res.ContentLength != int64(len(data)) || res.Header.Get("Content-Type") != "application/octet-stream" ||
		res.Header.Get("Content-Disposition") != `inline; filename=data.bin` {
		t.Fatalf("download headers: length %d, %v", res.ContentLength, res.Header)
	}
	if b := envdStatus(t, res, http.StatusOK); sha256.Sum256(b) != sha256.Sum256(data) {
		t.Fatal("50 MiB round trip (identity) differs")
	}
	res = c.restCall(t, "GET", "/files", url.Values{"path": {"/home/user/big/data.bin"}}, nil, nil) // Go asks for gzip
	if !res.Uncompressed {
		t.Fatalf("download with Accept-Encoding gzip was not gzipped: %v", res.Header)
	}
	if b := envdStatus(t, res, http.StatusOK); sha256.Sum256(b) != sha256.Sum256(data) {
		t.Fatal("50 MiB round trip (gzip) differs")
	}
	// A gzipped upload (the SDKs' gzip option).
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte("squeezed"))
	zw.Close()
	gzHeader := http.Header{"Content-Type": {"application/octet-stream"}, "Content-Encoding": {"gzip"}}
	envdUploads(t, c.restCall(t, "POST", "/files", url.Values{"path": {"z.txt"}}, &zb, gzHeader))
	if s := envdRead(t, c, "z.txt", ""); s != "squeezed" {
		t.Fatalf("gzip upload: %q", s)
	}

	// username=root writes as root, relative to /root; so does HTTP Basic.
	got = envdUploads(t, c.restCall(t, "POST", "/files", url.Values{"path": {"secret.txt"}, "username": {"root"}}, strings.NewReader("s3"), octet))
	if got[0].Path != "/root/secret.txt" {
		t.Fatalf("username=root: %+v", got)
	}
	basicRoot := http.Header{"Content-Type": {"application/octet-stream"}, "Authorization": {"Basic " + basicUser("root")}}
	if got = envdUploads(t, c.restCall(t, "POST", "/files", url.Values{"path": {"~/basic.txt"}}, strings.NewReader("b"), basicRoot)); got[0].Path != "/root/basic.txt" {
		t.Fatalf("Basic root: %+v", got)
	}
	if s := rootRun(t, d, sb.ID, "stat -c '%U %a' /root/secret.txt /root/basic.txt"); s != "root 644\nroot 644\n" {
		t.Fatalf("root's files: %q", s)
	}
	if s := envdRead(t, c, "secret.txt", "root"); s != "s3" {
		t.Fatalf("read as root: %q", s)
	}

	// Errors, in E2B's shape.
	envdStatus(t, c.restCall(t, "GET", "/files", url.Values{"path": {"notes"}}, nil, nil), http.StatusBadRequest)
	envdStatus(t, c.restCall(t, "GET", "/files", url.Values{"path": {"nope.txt"}}, nil, nil), http.StatusNotFound)
	envdStatus(t, c.restCall(t, "GET", "/files", nil, nil, nil), http.StatusBadRequest)
	envdStatus(t, c.restCall(t, "POST", "/files", nil, strings.NewReader("x"), octet), http.StatusBadRequest)
	envdStatus(t, c.restCall(t, "POST", "/files", url.Values{"path": {"t.txt"}}, strings.NewReader("x"), http.Header{"Content-Type": {"text/plain"}}), http.StatusBadRequest)
	envdStatus(t, c.restCall(t, "POST", "/files", url.Values{"path": {"notes"}}, strings.NewReader("x"), octet), http.StatusBadRequest)
	envdStatus(t, c.restCall(t, "POST", "/files", url.Values{"path": {"t.txt"}}, strings.NewReader("not gzip"), gzHeader), http.StatusBadRequest)
	envdStatus(t, c.restCall(t, "GET", "/files", url.Values{"path": {"~other/x"}}, nil, nil), http.StatusBadRequest)
	envdStatus(t, c.restCall(t, "GET", "/files", url.Values{"path": {"a.txt"}}, nil, http.Header{"X-Access-Token": {"wrong"}}), http.StatusUnauthorized)
	envdStatus(t, c.restCall(t, "GET", "/envs", nil, nil, http.Header{"X-Access-Token": {"wrong"}}), http.StatusUnauthorized)
}

func TestE2BFilesEnvs(t *testing.T) {
	d := startDaemon(t, "")
	sb, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{Env: map[string]string{"GREETING": "hello", "EMPTY": ""}})
	if err != nil {
		t.Fatal(err)
	}
	c := newEnvdClient(t, d, sb)
	res := c.restCall(t, "GET", "/envs", nil, nil, nil)
	var env map[string]string
	if err := json.Unmarshal(envdStatus(t, res, http.StatusOK), &env); err != nil {
		t.Fatal(err)
	}
	if v, ok := env["GREETING"]; !ok || v != "hello" || env["EMPTY"] != "" || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("envs: %v %v", env, res.Header)
	}
}

func TestE2BFilesOps(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c := newEnvdClient(t, d, sb)
	fs := c.fs

	// MakeDir makes parents; again it is AlreadyExists; over a file it
	// is InvalidArgument.
	mk, err := fs.MakeDir(ctx, asUser(&filesystem.MakeDirRequest{Path: "t/sub1/sub1_1"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if e := mk.Msg.Entry; e.Path != "/home/user/t/sub1/sub1_1" || e.Type != filesystem.FileType_FILE_TYPE_DIRECTORY || e.Permissions != "drwxr-xr-x" || e.Mode != 0o755 || e.Owner != "user" {
		t.Fatalf("MakeDir entry: %v", e)
	}
	for _, p := range []string{"t/sub1/sub1_2", "t/sub2/sub2_1"} {
		if _, err := fs.MakeDir(ctx, asUser(&filesystem.MakeDirRequest{Path: p}, "")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fs.MakeDir(ctx, asUser(&filesystem.MakeDirRequest{Path: "/home/user/t/sub1"}, "")); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("MakeDir of an existing directory: %v", err)
	}
	envdUploads(t, c.restCall(t, "POST", "/files", url.Values{"path": {"t/file1.txt"}}, strings.NewReader("Hello, world!"), http.Header{"Content-Type": {"application/octet-stream"}}))
	if _, err := fs.MakeDir(ctx, asUser(&filesystem.MakeDirRequest{Path: "t/file1.txt"}, "")); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("MakeDir over a file: %v", err)
	}

	// Stat.
	st, err := fs.Stat(ctx, asUser(&filesystem.StatRequest{Path: "t/file1.txt"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Msg.Entry; e.Name != "file1.txt" || e.Path != "/home/user/t/file1.txt" || e.Type != filesystem.FileType_FILE_TYPE_FILE ||
		e.Size != 13 || e.Mode != 0o644 || e.Permissions != "-rw-r--r--" || e.Owner != "user" || e.Group != "user" ||
		e.SymlinkTarget != nil || time.Since(e.ModifiedTime.AsTime()) > time.Minute {
		t.Fatalf("Stat: %v", e)
	}
	if _, err := fs.Stat(ctx, asUser(&filesystem.StatRequest{Path: "t/missing"}, "")); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Stat of a missing path: %v", err)
	}
	// A symlink is its target's type, with the path it leads to.
	rootRun(t, d, sb.ID, "cd /home/user/t && ln -s file1.txt link && ln -s nowhere dangling")
	st, err = fs.Stat(ctx, asUser(&filesystem.StatRequest{Path: "t/link"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Msg.Entry; e.Type != filesystem.FileType_FILE_TYPE_FILE || e.GetSymlinkTarget() != "/home/user/t/file1.txt" || e.Mode != 0o644 || !strings.HasPrefix(e.Permissions, "L") {
		t.Fatalf("Stat of a symlink: %v", e)
	}

	// ListDir: depth 1 (and 0, the default), then 2, in envd's order.
	names := func(depth uint32) []string {
		t.Helper()
		res, err := fs.ListDir(ctx, asUser(&filesystem.ListDirRequest{Path: "t", Depth: depth}, ""))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range res.Msg.Entries {
			if !strings.HasPrefix(e.Path, "/home/user/t/") {
				t.Fatalf("ListDir entry %v outside t", e)
			}
			out = append(out, strings.TrimPrefix(e.Path, "/home/user/t/")+":"+e.Type.String())
		}
		return out
	}
	const (
		dir  = ":FILE_TYPE_DIRECTORY"
		file = ":FILE_TYPE_FILE"
	)
	want1 := []string{"dangling:FILE_TYPE_UNSPECIFIED", "file1.txt" + file, "link" + file, "sub1" + dir, "sub2" + dir}
	for _, depth := range []uint32{0, 1} {
		if got := names(depth); !slices.Equal(got, want1) {
			t.Fatalf("ListDir depth %d: %v, want %v", depth, got, want1)
		}
	}
	want2 := []string{"dangling:FILE_TYPE_UNSPECIFIED", "file1.txt" + file, "link" + file, "sub1" + dir, "sub1/sub1_1" + dir, "sub1/sub1_2" + dir, "sub2" + dir, "sub2/sub2_1" + dir}
	if got := names(2); !slices.Equal(got, want2) {
		t.Fatalf("ListDir depth 2: %v, want %v", got, want2)
	}
	if _, err := fs.ListDir(ctx, asUser(&filesystem.ListDirRequest{Path: "t", Depth: 100}, "")); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("ListDir deeper than berth lists: %v", err)
	}
	if _, err := fs.ListDir(ctx, asUser(&filesystem.ListDirRequest{Path: "t/file1.txt"}, "")); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("ListDir of a file: %v", err)
	}
	if _, err := fs.ListDir(ctx, asUser(&filesystem.ListDirRequest{Path: "t/missing"}, "")); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("ListDir of a missing path: %v", err)
	}

	// Move makes the destination's parents and replaces a file there.
	mv, err := fs.Move(ctx, asUser(&filesystem.MoveRequest{Source: "t/file1.txt", Destination: "t/new/dir/renamed.txt"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if e := mv.Msg.Entry; e.Path != "/home/user/t/new/dir/renamed.txt" || e.Name != "renamed.txt" || e.Size != 13 {
		t.Fatalf("Move entry: %v", e)
	}
	if _, err := fs.Move(ctx, asUser(&filesystem.MoveRequest{Source: "t/file1.txt", Destination: "t/x.txt"}, "")); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Move of a missing source: %v", err)
	}

	// Remove takes a tree; a missing path is removed already (envd's and
	// the SDKs' tests' behaviour).
	if _, err := fs.Remove(ctx, asUser(&filesystem.RemoveRequest{Path: "t/sub1"}, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat(ctx, asUser(&filesystem.StatRequest{Path: "t/sub1"}, "")); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Stat after Remove: %v", err)
	}
	if _, err := fs.Remove(ctx, asUser(&filesystem.RemoveRequest{Path: "t/sub1"}, "")); err != nil {
		t.Fatalf("Remove of a missing path: %v", err)
	}
	if _, err := fs.Remove(ctx, asUser(&filesystem.RemoveRequest{Path: ""}, "")); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("Remove of the empty path: %v", err)
	}

	// Acting as root: relative paths start at /root, and root owns what
	// it makes.
	mk, err = fs.MakeDir(ctx, asUser(&filesystem.MakeDirRequest{Path: "rootdir"}, "root"))
	if err != nil {
		t.Fatal(err)
	}
	if e := mk.Msg.Entry; e.Path != "/root/rootdir" || e.Owner != "root" {
		t.Fatalf("MakeDir as root: %v", e)
	}
	// Another user's home comes from the sandbox's /etc/passwd.
	rootRun(t, d, sb.ID, "echo 'other:x:1234:1234::/srv/other:/bin/sh' >> /etc/passwd && mkdir -p /srv/other && chown 1234:1234 /srv/other")
	mk, err = fs.MakeDir(ctx, asUser(&filesystem.MakeDirRequest{Path: "~/made"}, "other"))
	if err != nil {
		t.Fatal(err)
	}
	if e := mk.Msg.Entry; e.Path != "/srv/other/made" || e.Owner != "other" {
		t.Fatalf("MakeDir as other: %v", e)
	}
	if _, err := fs.Stat(ctx, asUser(&filesystem.StatRequest{Path: "x"}, "nosuchuser")); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("Stat as an unknown user: %v", err)
	}
}

func TestE2BFilesConfinement(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c := newEnvdClient(t, d, sb)
	list := func(p string) []string {
		t.Helper()
		res, err := c.fs.ListDir(ctx, asUser(&filesystem.ListDirRequest{Path: p}, ""))
		if err != nil {
			t.Fatalf("ListDir %s: %v", p, err)
		}
		var out []string
		for _, e := range res.Msg.Entries {
			out = append(out, e.Name)
		}
		return out
	}
	// A host-only marker: in the daemon's state directory on the host.
	marker := "e2b-escape-marker-" + sb.ID
	if err := os.WriteFile(filepath.Join(d.state, marker), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := list("/")
	rootRun(t, d, sb.ID, "ln -s / /home/user/to-root && ln -s ../../.. /home/user/up")
	for _, p := range []string{"to-root", "up", "../../../..", "/../../.."} {
		if got := list(p); !slices.Equal(got, root) {
			t.Fatalf("ListDir %s: %v, want the sandbox's root %v", p, got, root)
		}
	}
	for _, p := range []string{"to-root" + d.state + "/" + marker, "../../.." + d.state + "/" + marker, d.state + "/" + marker} {
		if _, err := c.fs.Stat(ctx, asUser(&filesystem.StatRequest{Path: p}, "")); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("Stat %s: %v, want NotFound (the host's file)", p, err)
		}
		q := url.Values{"path": {p}}
		envdStatus(t, c.restCall(t, "GET", "/files", q, nil, nil), http.StatusNotFound)
	}
	// What escapes lexically lands in the sandbox's own /tmp.
	hostTmp := filepath.Join(os.TempDir(), marker)
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	got := envdUploads(t, c.restCall(t, "POST", "/files", url.Values{"path": {"../../../.." + hostTmp}}, strings.NewReader("in"), octet))
	if got[0].Path != hostTmp {
		t.Fatalf("upload through ..: %+v", got)
	}
	if _, err := os.Stat(hostTmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an upload reached the host's %s: %v", hostTmp, err)
	}
	if s := rootRun(t, d, sb.ID, "cat "+hostTmp); s != "in" {
		t.Fatalf("inside: %q", s)
	}
	if s := envdRead(t, c, "to-root/etc/hostname", ""); s != rootRun(t, d, sb.ID, "cat /etc/hostname") {
		t.Fatalf("hostname through the link: %q", s)
	}
}

// e2bEvent is one event as a test compares it.
func e2bEvent(e *filesystem.FilesystemEvent) string {
	return strings.TrimPrefix(e.Type.String(), "EVENT_TYPE_") + " " + e.Name
}

func TestE2BFilesWatch(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c := newEnvdClient(t, d, sb)
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	write := func(p, s string) {
		t.Helper()
		envdUploads(t, c.restCall(t, "POST", "/files", url.Values{"path": {p}}, strings.NewReader(s), octet))
	}
	if _, err := c.fs.MakeDir(ctx, asUser(&filesystem.MakeDirRequest{Path: "w/nested"}, "")); err != nil {
		t.Fatal(err)
	}

	t.Run("stream", func(t *testing.T) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		req := asUser(&filesystem.WatchDirRequest{Path: "w"}, "")
		req.Header().Set("Keepalive-Ping-Interval", "1")
		stream, err := c.fs.WatchDir(sctx, req)
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		if !stream.Receive() || stream.Msg().GetStart() == nil {
			t.Fatalf("first message: %v %v", stream.Msg(), stream.Err())
		}
		write("w/f.txt", "one")
		rootRun(t, d, sb.ID, "echo two >> /home/user/w/f.txt")
		var got []string
		keepalives := 0
		deadline := time.Now().Add(10 * time.Second)
		for (keepalives == 0 || !slices.Contains(got, "WRITE f.txt") || len(got) < 4) && time.Now().Before(deadline) {
			if !stream.Receive() {
				t.Fatalf("stream ended: %v (events %v)", stream.Err(), got)
			}
			if stream.Msg().GetKeepalive() != nil {
				keepalives++
			}
			if fe := stream.Msg().GetFilesystem(); fe != nil {
				got = append(got, e2bEvent(fe))
			}
		}
		// The upload is envd's three events (no temporary file shows),
		// then the shell's append.
		if want := []string{"CREATE f.txt", "CHMOD f.txt", "WRITE f.txt", "WRITE f.txt"}; !slices.Equal(got, want) || keepalives == 0 {
			t.Fatalf("events %v (keepalives %d), want %v and a keepalive", got, keepalives, want)
		}
	})

	t.Run("polled", func(t *testing.T) {
		cw, err := c.fs.CreateWatcher(ctx, asUser(&filesystem.CreateWatcherRequest{Path: "/home/user/w", Recursive: true, IncludeEntry: true}, ""))
		if err != nil {
			t.Fatal(err)
		}
		id := cw.Msg.WatcherId
		write("w/nested/g.txt", "hello")
		// poll polls at least once, until it has n events.
		poll := func(n int) []*filesystem.FilesystemEvent {
			t.Helper()
			var all []*filesystem.FilesystemEvent
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				res, err := c.fs.GetWatcherEvents(ctx, asUser(&filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, res.Msg.Events...)
				if len(all) >= n || time.Now().After(deadline) {
					return all
				}
			}
		}
		// One poll right after the change sees it, as the SDKs' tests
		// expect of envd.
		res, err := c.fs.GetWatcherEvents(ctx, asUser(&filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
		if err != nil {
			t.Fatal(err)
		}
		evs := res.Msg.Events
		var got []string
		for _, e := range evs {
			got = append(got, e2bEvent(e))
		}
		if want := []string{"CREATE nested/g.txt", "CHMOD nested/g.txt", "WRITE nested/g.txt"}; !slices.Equal(got, want) {
			t.Fatalf("polled events %v, want %v", got, want)
		}
		if e := evs[2].Entry; e == nil || e.Path != "/home/user/w/nested/g.txt" || e.Size != 5 {
			t.Fatalf("included entry: %v", e)
		}
		// Drained: nothing new until the next change.
		if evs := poll(0); len(evs) != 0 {
			t.Fatalf("events after the drain: %v", evs)
		}
		if _, err := c.fs.Remove(ctx, asUser(&filesystem.RemoveRequest{Path: "w/nested/g.txt"}, "")); err != nil {
			t.Fatal(err)
		}
		if evs := poll(1); len(evs) != 1 || e2bEvent(evs[0]) != "REMOVE nested/g.txt" || evs[0].Entry != nil {
			t.Fatalf("after a remove: %v", evs)
		}

		// Another sandbox does not see this watcher.
		other, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		oc := newEnvdClient(t, d, other)
		if _, err := oc.fs.GetWatcherEvents(ctx, asUser(&filesystem.GetWatcherEventsRequest{WatcherId: id}, "")); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("another sandbox's watcher: %v", err)
		}
		if _, err := oc.fs.RemoveWatcher(ctx, asUser(&filesystem.RemoveWatcherRequest{WatcherId: id}, "")); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("removing another sandbox's watcher: %v", err)
		}
		if _, err := c.fs.RemoveWatcher(ctx, asUser(&filesystem.RemoveWatcherRequest{WatcherId: id}, "")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.fs.GetWatcherEvents(ctx, asUser(&filesystem.GetWatcherEventsRequest{WatcherId: id}, "")); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("a removed watcher: %v", err)
		}
		if _, err := c.fs.GetWatcherEvents(ctx, asUser(&filesystem.GetWatcherEventsRequest{WatcherId: "wnope"}, "")); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("an unknown watcher: %v", err)
		}
	})

	t.Run("bad", func(t *testing.T) {
		write("w/plain.txt", "x")
		if _, err := c.fs.CreateWatcher(ctx, asUser(&filesystem.CreateWatcherRequest{Path: "w/plain.txt"}, "")); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("watching a file: %v", err)
		}
		if _, err := c.fs.CreateWatcher(ctx, asUser(&filesystem.CreateWatcherRequest{Path: "w/none"}, "")); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("watching a missing path: %v", err)
		}
		stream, err := c.fs.WatchDir(ctx, asUser(&filesystem.WatchDirRequest{Path: "w/none"}, ""))
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
			stream.Close()
		}
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("WatchDir of a missing path: %v", err)
		}
	})

	t.Run("ends", func(t *testing.T) {
		// A watcher of a sandbox that goes answers no more.
		gone, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		gc := newEnvdClient(t, d, gone)
		cw, err := gc.fs.CreateWatcher(ctx, asUser(&filesystem.CreateWatcherRequest{Path: "/tmp"}, ""))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.client.DeleteSandbox(ctx, gone.ID); err != nil {
			t.Fatal(err)
		}
		// (The route frame answers for the missing sandbox, before Connect.)
		if _, err := gc.fs.GetWatcherEvents(ctx, asUser(&filesystem.GetWatcherEventsRequest{WatcherId: cw.Msg.WatcherId}, "")); err == nil {
			t.Fatal("a deleted sandbox's watcher answered")
		}
		// The daemon stops its live watchers when it stops.
		if _, err := c.fs.CreateWatcher(ctx, asUser(&filesystem.CreateWatcherRequest{Path: "w", Recursive: true}, "")); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { d.stop(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Fatal("the daemon did not stop with a watcher running")
		}
	})
}
