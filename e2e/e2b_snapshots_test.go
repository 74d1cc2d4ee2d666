package e2e

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
)

// e2bSnapshot is E2B's SnapshotInfo.
type e2bSnapshot struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// e2bForkResult is E2B's SandboxForkResult.
type e2bForkResult struct {
	Sandbox *e2bSandbox `json:"sandbox"`
	Error   *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// readFile is a file's content in sandbox id, read through berth's own API.
func readFile(t *testing.T, d *daemon, id, path string) string {
	t.Helper()
	res, err := d.client.Exec(t.Context(), id, api.ExecRequest{Cmd: []string{"cat", path}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("cat %s in %s: %v exit %d %s", path, id, err, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// writeFile writes content to path in sandbox id through berth's own API.
func writeFile(t *testing.T, d *daemon, id, path, content string) {
	t.Helper()
	res, err := d.client.Exec(t.Context(), id, api.ExecRequest{Shell: `printf %s "$CONTENT" > "$FILE"`, Env: map[string]string{"CONTENT": content, "FILE": path}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("write %s in %s: %v exit %d %s", path, id, err, res.ExitCode, res.Stderr)
	}
}

// TestE2BSnapshots: E2B's snapshots are berth's, named "snapshot:NAME"
// (a generated name when E2B's request has none): listed by source
// sandbox and by name (with or without "snapshot:" and a tag), a
// template to create sandboxes from, deleted through DELETE /templates.
func TestE2BSnapshots(t *testing.T) {
	d := startDaemon(t, "")
	c := e2bControl{t, d}
	src := c.create(map[string]any{"templateID": "base", "timeout": 300})
	other := c.create(map[string]any{"templateID": "base", "timeout": 300})
	writeFile(t, d, src.SandboxID, "/home/user/state.txt", "from the source")

	// A name that begins as berth's snapshot ids do ("snap-") is a name.
	const name = "snap-e2b-named"
	var named, unnamed e2bSnapshot
	c.json("POST", "/sandboxes/"+src.SandboxID+"/snapshots", map[string]any{"name": name}, http.StatusCreated, &named)
	if named.SnapshotID != "snapshot:"+name || !slices.Equal(named.Names, []string{named.SnapshotID}) {
		t.Fatalf("named snapshot: %+v", named)
	}
	c.json("POST", "/sandboxes/"+src.SandboxID+"/snapshots", map[string]any{"memory": false}, http.StatusCreated, &unnamed)
	if !strings.HasPrefix(unnamed.SnapshotID, "snapshot:e2b-") || !slices.Equal(unnamed.Names, []string{unnamed.SnapshotID}) {
		t.Fatalf("unnamed snapshot: %+v", unnamed)
	}
	sn, err := d.client.GetSnapshot(t.Context(), strings.TrimPrefix(unnamed.SnapshotID, "snapshot:"))
	if err != nil || sn.Sandbox != src.SandboxID {
		t.Fatalf("the berth snapshot of %s: %+v %v", unnamed.SnapshotID, sn, err)
	}
	c.fails("POST", "/sandboxes/"+src.SandboxID+"/snapshots", map[string]any{"name": name}, http.StatusConflict, name)
	c.fails("POST", "/sandboxes/"+src.SandboxID+"/snapshots", map[string]any{"name": "team/x"}, http.StatusBadRequest, "team/x")
	c.fails("POST", "/sandboxes/"+src.SandboxID+"/snapshots", map[string]any{"memory": true}, http.StatusNotImplemented, "memory")
	c.fails("POST", "/sandboxes/sb-nosuchsandbox/snapshots", map[string]any{}, http.StatusNotFound, "sb-nosuchsandbox")
	c.fails("GET", "/sandboxes/"+src.SandboxID+"/snapshots", nil, http.StatusMethodNotAllowed, "POST")

	ids := func(query string) []string {
		t.Helper()
		var list []e2bSnapshot
		c.json("GET", "/snapshots"+query, nil, http.StatusOK, &list)
		var out []string
		for _, s := range list {
			out = append(out, s.SnapshotID)
		}
		slices.Sort(out)
		return out
	}
	both := []string{named.SnapshotID, unnamed.SnapshotID}
	slices.Sort(both)
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", both},
		{"?sandboxID=" + src.SandboxID, both},
		{"?sandboxID=" + other.SandboxID, nil},
		{"?name=" + name, []string{named.SnapshotID}},
		{"?name=" + url.QueryEscape("snapshot:"+name), []string{named.SnapshotID}},
		{"?name=" + url.QueryEscape(name+":default"), []string{named.SnapshotID}},
		{"?name=" + url.QueryEscape("snapshot:"+name+":v1") + "&sandboxID=" + src.SandboxID, []string{named.SnapshotID}},
		{"?name=" + name + "&sandboxID=" + other.SandboxID, nil},
		{"?name=" + name + "-does-not-exist", nil},
	} {
		if got := ids(tc.query); !slices.Equal(got, tc.want) {
			t.Errorf("GET /snapshots%s: %v, want %v", tc.query, got, tc.want)
		}
	}
	// Pages of one, newest first.
	var seen []string
	token := ""
	for range 5 {
		q := "?limit=1"
		if token != "" {
			q += "&nextToken=" + url.QueryEscape(token)
		}
		var page []e2bSnapshot
		h := c.json("GET", "/snapshots"+q, nil, http.StatusOK, &page)
		if len(page) != 1 {
			t.Fatalf("page %d: %+v", len(seen), page)
		}
		seen = append(seen, page[0].SnapshotID)
		if token = h.Get("X-Next-Token"); token == "" {
			break
		}
	}
	if !slices.Equal(seen, []string{unnamed.SnapshotID, named.SnapshotID}) {
		t.Fatalf("pages: %v", seen)
	}
	c.fails("GET", "/snapshots?limit=0", nil, http.StatusBadRequest, "limit")
	c.fails("GET", "/snapshots?nextToken=bogus", nil, http.StatusBadRequest, "nextToken")

	// A sandbox made from the snapshot has the source's files and reports
	// the snapshot as its template; the source goes on apart.
	made := c.create(map[string]any{"templateID": named.SnapshotID, "timeout": 120})
	if made.TemplateID != named.SnapshotID {
		t.Fatalf("made from %s: %+v", named.SnapshotID, made)
	}
	if info := c.get(made.SandboxID); info.TemplateID != named.SnapshotID || info.State != "running" {
		t.Fatalf("made from %s: %+v", named.SnapshotID, info)
	}
	writeFile(t, d, src.SandboxID, "/home/user/state.txt", "changed later")
	if got := readFile(t, d, made.SandboxID, "/home/user/state.txt"); got != "from the source" {
		t.Fatalf("the file in a sandbox made from the snapshot: %q", got)
	}
	b, err := d.client.GetSandbox(t.Context(), made.SandboxID)
	if err != nil || *b.Timeouts.MaxLifetimeSeconds != 120 || *b.Timeouts.DeleteAfterSeconds != 1 {
		t.Fatalf("made from %s: %+v %v", named.SnapshotID, b, err)
	}

	// Delete: refused while a sandbox is made of it, then gone, then 404.
	path := "/templates/" + url.PathEscape(named.SnapshotID)
	c.fails("DELETE", path, nil, http.StatusConflict, made.SandboxID)
	c.json("DELETE", "/sandboxes/"+made.SandboxID, nil, http.StatusNoContent, nil)
	c.json("DELETE", path, nil, http.StatusNoContent, nil)
	c.fails("DELETE", path, nil, http.StatusNotFound, name)
	c.json("DELETE", "/templates/"+unnamed.SnapshotID, nil, http.StatusNoContent, nil)
	c.fails("DELETE", "/templates/snapshot:no-such-snapshot", nil, http.StatusNotFound, "no-such-snapshot")
	c.fails("POST", "/v2/sandboxes", map[string]any{"templateID": named.SnapshotID}, http.StatusNotFound, name)
	if got := ids(""); len(got) != 0 {
		t.Fatalf("snapshots left: %v", got)
	}
}

// TestE2BFork: E2B's fork is berth's: count running copies of the
// source's files, each with the source's template, E2B's kill at its end
// and the request's timeout; the source keeps running.
func TestE2BFork(t *testing.T) {
	d := startDaemon(t, "")
	c := e2bControl{t, d}
	src := c.create(map[string]any{"templateID": "base", "timeout": 300, "metadata": map[string]string{"app": "source"}})
	writeFile(t, d, src.SandboxID, "/home/user/state.txt", "state before fork")

	var forks []e2bForkResult
	c.json("POST", "/sandboxes/"+src.SandboxID+"/fork", map[string]any{"count": 2, "timeout": 60}, http.StatusCreated, &forks)
	if len(forks) != 2 {
		t.Fatalf("fork of 2: %+v", forks)
	}
	seen := map[string]bool{}
	for i, f := range forks {
		if f.Error != nil || f.Sandbox == nil {
			t.Fatalf("fork %d: %+v", i, f)
		}
		sb := *f.Sandbox
		if sb.SandboxID == src.SandboxID || seen[sb.SandboxID] || sb.TemplateID != "base" || sb.EnvdAccessToken == "" || sb.EnvdAccessToken == src.EnvdAccessToken {
			t.Fatalf("fork %d: %+v (source %s)", i, sb, src.SandboxID)
		}
		seen[sb.SandboxID] = true
		b, err := d.client.GetSandbox(t.Context(), sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		if b.State != api.StateRunning || b.Labels["e2b.berth.sh/template"] != "base" || b.Labels["e2b.berth.sh/on-timeout"] != "kill" ||
			*b.Timeouts.MaxLifetimeSeconds != 60 || *b.Timeouts.IdleSeconds != 0 || *b.Timeouts.DeleteAfterSeconds != 1 {
			t.Fatalf("fork %d in berth: %+v (timeouts idle %d max %d delete %d)", i, b,
				*b.Timeouts.IdleSeconds, *b.Timeouts.MaxLifetimeSeconds, *b.Timeouts.DeleteAfterSeconds)
		}
		info := c.get(sb.SandboxID)
		if info.State != "running" || info.Lifecycle == nil || info.Lifecycle.OnTimeout != "kill" || info.EndAt.Sub(info.StartedAt) != 60*time.Second {
			t.Fatalf("fork %d: %+v", i, info)
		}
		for k := range info.Metadata {
			if strings.HasPrefix(k, "e2b.berth.sh/") {
				t.Fatalf("fork %d: metadata %v shows berth's own", i, info.Metadata)
			}
		}
		if got := readFile(t, d, sb.SandboxID, "/home/user/state.txt"); got != "state before fork" {
			t.Fatalf("fork %d: the file is %q", i, got)
		}
	}
	// The copies are apart from the source, which keeps running.
	first := forks[0].Sandbox.SandboxID
	writeFile(t, d, first, "/home/user/state.txt", "modified in fork")
	if got := readFile(t, d, src.SandboxID, "/home/user/state.txt"); got != "state before fork" {
		t.Fatalf("the source's file after a fork's write: %q", got)
	}
	if info := c.get(src.SandboxID); info.State != "running" || info.EndAt.Sub(info.StartedAt) != 300*time.Second {
		t.Fatalf("the source after the fork: %+v", info)
	}

	// No body: one copy, E2B's default timeout of 15 s.
	c.json("POST", "/sandboxes/"+src.SandboxID+"/fork", nil, http.StatusCreated, &forks)
	if len(forks) != 1 || forks[0].Sandbox == nil {
		t.Fatalf("default fork: %+v", forks)
	}
	if b, err := d.client.GetSandbox(t.Context(), forks[0].Sandbox.SandboxID); err != nil || *b.Timeouts.MaxLifetimeSeconds != 15 {
		t.Fatalf("default fork: %+v %v", b, err)
	}

	before, err := d.client.ListSandboxes(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		body   any
		status int
		want   string
	}{
		{map[string]any{"count": 0}, http.StatusBadRequest, "count"},
		{map[string]any{"count": 101}, http.StatusBadRequest, "count"},
		{map[string]any{"count": 1, "timeout": -1}, http.StatusBadRequest, "timeout"},
		{map[string]any{"count": 1, "timeout": 86401}, http.StatusBadRequest, "timeout"},
		{`{"count": 1,`, http.StatusBadRequest, "JSON"},
	} {
		c.fails("POST", "/sandboxes/"+src.SandboxID+"/fork", tc.body, tc.status, tc.want)
	}
	c.fails("POST", "/sandboxes/sb-nosuchsandbox/fork", map[string]any{"count": 1}, http.StatusNotFound, "sb-nosuchsandbox")
	c.fails("GET", "/sandboxes/"+src.SandboxID+"/fork", nil, http.StatusMethodNotAllowed, "POST")
	if after, err := d.client.ListSandboxes(t.Context(), nil); err != nil || len(after) != len(before) {
		t.Fatalf("refused forks made sandboxes: %d then %d (%v)", len(before), len(after), err)
	}
}
