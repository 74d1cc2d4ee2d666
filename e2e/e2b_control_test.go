package e2e

import (
	"bytes"
	"encoding/json"
	"io"
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
	"github.com/berthsh/berth/errdefs"
)

// e2bControl calls E2B's control API on a daemon, as the SDKs do: JSON
// bodies, an X-API-Key berth ignores.
type e2bControl struct {
	t *testing.T
	d *daemon
}

// do sends body (nil: none; a string: as it is; else JSON) and returns
// the status, the body and the headers.
func (c e2bControl) do(method, path string, body any) (int, []byte, http.Header) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.d.url+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", c.d.key) // E2B's SDKs send E2B_API_KEY so: here, berth's key
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// json sends like do, wants status and decodes the answer into out.
func (c e2bControl) json(method, path string, body any, status int, out any) http.Header {
	c.t.Helper()
	got, b, h := c.do(method, path, body)
	if got != status {
		c.t.Fatalf("%s %s: %d %s, want %d", method, path, got, b, status)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return h
}

// fails sends like do and wants E2B's error body with status, its
// message holding each of want.
func (c e2bControl) fails(method, path string, body any, status int, want ...string) {
	c.t.Helper()
	got, b, _ := c.do(method, path, body)
	var e struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Code == nil || e.Message == nil {
		c.t.Fatalf("%s %s: %d %q is not E2B's error body", method, path, got, b)
	}
	if got != status || *e.Code != status {
		c.t.Fatalf("%s %s: %d (code %d) %s, want %d", method, path, got, *e.Code, *e.Message, status)
	}
	for _, w := range want {
		if !strings.Contains(*e.Message, w) {
			c.t.Fatalf("%s %s: message %q lacks %q", method, path, *e.Message, w)
		}
	}
}

// e2bSandbox is E2B's Sandbox (create, connect) as the SDKs read it.
type e2bSandbox struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias"`
}

// e2bInfo is E2B's ListedSandbox and SandboxDetail.
type e2bInfo struct {
	TemplateID          string            `json:"templateID"`
	SandboxID           string            `json:"sandboxID"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	DiskSizeMB          *int              `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken"`
	AllowInternetAccess *bool             `json:"allowInternetAccess"`
	Network             *struct {
		AllowPublicTraffic *bool `json:"allowPublicTraffic"`
	} `json:"network"`
	Lifecycle *struct {
		AutoResume bool   `json:"autoResume"`
		OnTimeout  string `json:"onTimeout"`
	} `json:"lifecycle"`
}

func (c e2bControl) create(body map[string]any) e2bSandbox {
	c.t.Helper()
	var sb e2bSandbox
	c.json("POST", "/v2/sandboxes", body, http.StatusCreated, &sb)
	return sb
}

func (c e2bControl) get(id string) e2bInfo {
	c.t.Helper()
	var info e2bInfo
	c.json("GET", "/sandboxes/"+id, nil, http.StatusOK, &info)
	return info
}

// near says a and b are within slack.
func near(a, b time.Time, slack time.Duration) bool {
	d := a.Sub(b)
	return d < slack && d > -slack
}

// TestE2BControlCreate: E2B's create maps onto berth's sandbox: the
// template, metadata as labels, envVars as its env, the timeout as its
// lifetime (killed at the end), E2B's network settings; the answer is
// what the SDKs need to reach envd.
func TestE2BControlCreate(t *testing.T) {
	d := startDaemon(t, "")
	c := e2bControl{t, d}
	ctx := t.Context()

	sb := c.create(map[string]any{
		"templateID": "base", "timeout": 120,
		"metadata": map[string]string{"user": "alice", "thread_id": "t-1"},
		"envVars":  map[string]string{"GREETING": "hello from e2b"},
		"secure":   true,
	})
	if sb.SandboxID == "" || sb.ClientID != sb.SandboxID || sb.TemplateID != "base" || sb.Alias != "base" ||
		sb.EnvdVersion == "" || sb.EnvdAccessToken == "" || sb.TrafficAccessToken == nil || *sb.TrafficAccessToken != sb.EnvdAccessToken ||
		sb.Domain == nil || !strings.HasPrefix(*sb.Domain, api.DefaultDomain+":") {
		t.Fatalf("create: %+v", sb)
	}
	berth, err := d.client.GetSandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if berth.Image != "host" || berth.AccessToken != sb.EnvdAccessToken || !berth.Public || berth.Labels["user"] != "alice" ||
		*berth.Timeouts.MaxLifetimeSeconds != 120 || *berth.Timeouts.IdleSeconds != 0 || *berth.Timeouts.DeleteAfterSeconds != 1 {
		t.Fatalf("the berth sandbox: %+v (timeouts idle %d max %d delete %d)", berth,
			*berth.Timeouts.IdleSeconds, *berth.Timeouts.MaxLifetimeSeconds, *berth.Timeouts.DeleteAfterSeconds)
	}
	res, err := d.client.Exec(ctx, sb.SandboxID, api.ExecRequest{Shell: `printf %s "$GREETING"`})
	if err != nil || string(res.Stdout) != "hello from e2b" {
		t.Fatalf("envVars in the sandbox: %q %v", res.Stdout, err)
	}

	info := c.get(sb.SandboxID)
	if info.SandboxID != sb.SandboxID || info.TemplateID != "base" || info.State != "running" || info.EnvdAccessToken != sb.EnvdAccessToken ||
		len(info.Metadata) != 2 || info.Metadata["thread_id"] != "t-1" || info.CPUCount < 1 || info.MemoryMB < 1 || info.DiskSizeMB == nil ||
		info.Lifecycle == nil || info.Lifecycle.OnTimeout != "kill" || info.Network == nil || info.Network.AllowPublicTraffic == nil || !*info.Network.AllowPublicTraffic {
		t.Fatalf("get: %+v", info)
	}
	if !info.StartedAt.Equal(berth.CreatedAt) || info.EndAt.Sub(info.StartedAt) != 120*time.Second {
		t.Fatalf("startedAt %s endAt %s, created %s with a 120 s timeout", info.StartedAt, info.EndAt, berth.CreatedAt)
	}

	// POST /sandboxes (v1) defaults to E2B's 15 s; autoPause keeps the
	// sandbox at its end; no internet is berth's none; private traffic
	// needs the token.
	var v1 e2bSandbox
	c.json("POST", "/sandboxes", map[string]any{"templateID": "base", "autoPause": true, "allow_internet_access": false,
		"network": map[string]any{"allowPublicTraffic": false}}, http.StatusCreated, &v1)
	berth, err = d.client.GetSandbox(ctx, v1.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if *berth.Timeouts.MaxLifetimeSeconds != 15 || *berth.Timeouts.DeleteAfterSeconds != 0 || berth.Network.Mode != api.NetworkNone || berth.Public {
		t.Fatalf("v1 create with autoPause: max %d delete %d network %+v public %v", *berth.Timeouts.MaxLifetimeSeconds,
			*berth.Timeouts.DeleteAfterSeconds, berth.Network, berth.Public)
	}
	if info := c.get(v1.SandboxID); info.Lifecycle.OnTimeout != "pause" || *info.AllowInternetAccess {
		t.Fatalf("v1 sandbox: %+v", info)
	}
	// Its envd answers with the token the create gave, and only with it.
	env := newEnvdClient(t, d, api.Sandbox{ID: v1.SandboxID, AccessToken: v1.EnvdAccessToken})
	if _, err := env.fs.Stat(ctx, asUser(&filesystem.StatRequest{Path: "/home/user"}, "")); err != nil {
		t.Fatalf("envd with the create's token: %v", err)
	}
	env = newEnvdClient(t, d, api.Sandbox{ID: v1.SandboxID, AccessToken: sb.EnvdAccessToken})
	if _, err := env.fs.Stat(ctx, asUser(&filesystem.StatRequest{Path: "/home/user"}, "")); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("envd with another sandbox's token: %v", err)
	}
}

// TestE2BControlList: the lists filter by metadata (as the SDKs encode
// it), state and template, and /v2 pages through with X-Next-Token.
func TestE2BControlList(t *testing.T) {
	d := startDaemon(t, "")
	c := e2bControl{t, d}
	a1 := c.create(map[string]any{"templateID": "base", "metadata": map[string]string{"user": "a", "note": "two words"}})
	a2 := c.create(map[string]any{"templateID": "base", "metadata": map[string]string{"user": "a"}})
	b1 := c.create(map[string]any{"templateID": "base", "metadata": map[string]string{"user": "b"}})
	plain, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{Labels: map[string]string{"user": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	c.json("POST", "/sandboxes/"+a2.SandboxID+"/pause", nil, http.StatusNoContent, nil)

	ids := func(list []e2bInfo) []string {
		var out []string
		for _, i := range list {
			out = append(out, i.SandboxID)
		}
		slices.Sort(out)
		return out
	}
	want := func(ids ...string) []string { slices.Sort(ids); return ids }
	// The SDKs encode keys and values, then the pairs, then the parameter.
	metadata := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Add(url.PathEscape(kv[i]), url.PathEscape(kv[i+1]))
		}
		return url.QueryEscape(v.Encode())
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", want(a1.SandboxID, a2.SandboxID, b1.SandboxID, plain.ID)},
		{"?metadata=" + metadata("user", "a"), want(a1.SandboxID, a2.SandboxID, plain.ID)},
		{"?metadata=" + metadata("user", "a", "note", "two words"), want(a1.SandboxID)},
		{"?metadata=" + metadata("user", "a") + "&state=paused", want(a2.SandboxID)},
		{"?state=running,paused&metadata=" + metadata("user", "b"), want(b1.SandboxID)},
		{"?state=running&state=paused&metadata=" + metadata("user", "b"), want(b1.SandboxID)},
		{"?template=base", want(a1.SandboxID, a2.SandboxID, b1.SandboxID, plain.ID)},
		{"?template=other", nil},
		{"?metadata=" + metadata("user", "nobody"), nil},
	} {
		var list []e2bInfo
		c.json("GET", "/v2/sandboxes"+tc.query, nil, http.StatusOK, &list)
		if got := ids(list); !slices.Equal(got, tc.want) {
			t.Errorf("GET /v2/sandboxes%s: %v, want %v", tc.query, got, tc.want)
		}
	}
	var list []e2bInfo
	c.json("GET", "/v2/sandboxes?metadata="+metadata("user", "a", "note", "two words"), nil, http.StatusOK, &list)
	if len(list) != 1 || list[0].Metadata["note"] != "two words" || list[0].TemplateID != "base" || list[0].State != "running" {
		t.Fatalf("listed: %+v", list)
	}
	// GET /sandboxes is the running ones.
	c.json("GET", "/sandboxes?metadata="+metadata("user", "a"), nil, http.StatusOK, &list)
	if got := ids(list); !slices.Equal(got, want(a1.SandboxID, plain.ID)) {
		t.Fatalf("GET /sandboxes: %v", got)
	}

	// Pages of one, newest first, then oldest first.
	for _, order := range []string{"desc", "asc"} {
		var seen []string
		token := ""
		for range 10 {
			q := "?limit=1&order=" + order
			if token != "" {
				q += "&nextToken=" + url.QueryEscape(token)
			}
			var page []e2bInfo
			h := c.json("GET", "/v2/sandboxes"+q, nil, http.StatusOK, &page)
			if len(page) != 1 {
				t.Fatalf("page %d (%s): %d sandboxes", len(seen), order, len(page))
			}
			seen = append(seen, page[0].SandboxID)
			if token = h.Get("X-Next-Token"); token == "" {
				break
			}
		}
		if len(seen) != 4 || !slices.IsSortedFunc(seen, func(a, b string) int {
			ia, ib := c.get(a).StartedAt, c.get(b).StartedAt
			if order == "asc" {
				return ia.Compare(ib)
			}
			return ib.Compare(ia)
		}) {
			t.Fatalf("pages (%s): %v", order, seen)
		}
	}

	c.fails("GET", "/v2/sandboxes?state=stopped", nil, http.StatusBadRequest, "state")
	c.fails("GET", "/v2/sandboxes?limit=0", nil, http.StatusBadRequest, "limit")
	c.fails("GET", "/v2/sandboxes?nextToken=bogus", nil, http.StatusBadRequest, "nextToken")
	c.fails("GET", "/v2/sandboxes?metadata="+metadata("-bad-", "x"), nil, http.StatusBadRequest, "-bad-")
}

// TestE2BControlTimeouts: set_timeout moves endAt both ways; connect only
// extends it and resumes a paused sandbox; pause is berth's; at its end
// a sandbox is killed, or kept and started by connect with autoPause.
func TestE2BControlTimeouts(t *testing.T) {
	d := startDaemon(t, "")
	c := e2bControl{t, d}
	ctx := t.Context()
	sb := c.create(map[string]any{"templateID": "base", "timeout": 300})
	id := sb.SandboxID

	for _, timeout := range []int{600, 30} {
		c.json("POST", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": timeout}, http.StatusNoContent, nil)
		if end := c.get(id).EndAt; !near(end, time.Now().Add(time.Duration(timeout)*time.Second), 3*time.Second) {
			t.Fatalf("timeout %d: endAt %s, now %s", timeout, end, time.Now())
		}
	}
	// Connect to a running sandbox: 200, and a shorter timeout leaves the end.
	before := c.get(id).EndAt
	var got e2bSandbox
	c.json("POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 5}, http.StatusOK, &got)
	if got.SandboxID != id || got.EnvdAccessToken != sb.EnvdAccessToken || !c.get(id).EndAt.Equal(before) {
		t.Fatalf("connect with a shorter timeout: %+v endAt %s, was %s", got, c.get(id).EndAt, before)
	}
	c.json("POST", "/sandboxes/"+id+"/refreshes", map[string]any{"duration": 120}, http.StatusNoContent, nil)
	if end := c.get(id).EndAt; !near(end, time.Now().Add(120*time.Second), 3*time.Second) {
		t.Fatalf("refresh 120: endAt %s", end)
	}
	c.fails("POST", "/sandboxes/"+id+"/resume", map[string]any{"timeout": 60}, http.StatusConflict, "running")

	// Pause: berth's pause; twice is a conflict; connect resumes (201).
	c.json("POST", "/sandboxes/"+id+"/pause", nil, http.StatusNoContent, nil)
	if info := c.get(id); info.State != "paused" {
		t.Fatalf("after pause: %s", info.State)
	}
	if b, _ := d.client.GetSandbox(ctx, id); b.State != api.StatePaused {
		t.Fatalf("berth state after pause: %s", b.State)
	}
	c.fails("POST", "/sandboxes/"+id+"/pause", nil, http.StatusConflict, "paused")
	c.json("POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 900}, http.StatusCreated, &got)
	if info := c.get(id); info.State != "running" || !near(info.EndAt, time.Now().Add(900*time.Second), 3*time.Second) {
		t.Fatalf("after connect: %s endAt %s", info.State, info.EndAt)
	}
	if res, err := d.client.Exec(ctx, id, api.ExecRequest{Shell: "echo back"}); err != nil || string(res.Stdout) != "back\n" {
		t.Fatalf("exec after connect: %q %v", res.Stdout, err)
	}

	// A kill sandbox's end deletes it.
	c.json("POST", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 1}, http.StatusNoContent, nil)
	waitFor(t, 15*time.Second, func() bool {
		status, _, _ := c.do("GET", "/sandboxes/"+id, nil)
		return status == http.StatusNotFound
	})

	// An autoPause sandbox's end stops and keeps it: paused to E2B, and
	// connect starts it again with its files.
	kept := c.create(map[string]any{"templateID": "base", "timeout": 2, "autoPause": true})
	if _, err := d.client.Exec(ctx, kept.SandboxID, api.ExecRequest{Shell: "echo kept > /home/user/f"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, func() bool {
		b, err := d.client.GetSandbox(ctx, kept.SandboxID)
		return err == nil && b.State == api.StateStopped
	})
	if info := c.get(kept.SandboxID); info.State != "paused" || info.Lifecycle.OnTimeout != "pause" {
		t.Fatalf("after its end: %+v", info)
	}
	time.Sleep(1500 * time.Millisecond) // past a kill sandbox's delete_after
	c.json("POST", "/sandboxes/"+kept.SandboxID+"/connect", map[string]any{"timeout": 60}, http.StatusCreated, &got)
	res, err := d.client.Exec(ctx, kept.SandboxID, api.ExecRequest{Cmd: []string{"cat", "/home/user/f"}})
	if err != nil || string(res.Stdout) != "kept\n" {
		t.Fatalf("files after connect: %q %v", res.Stdout, err)
	}
	if info := c.get(kept.SandboxID); info.State != "running" || !near(info.EndAt, time.Now().Add(60*time.Second), 3*time.Second) {
		t.Fatalf("after connect: %+v", info)
	}

	// Kill.
	c.json("DELETE", "/sandboxes/"+kept.SandboxID, nil, http.StatusNoContent, nil)
	if _, err := d.client.GetSandbox(ctx, kept.SandboxID); !errdefs.IsNotFound(err) {
		t.Fatalf("after kill: %v", err)
	}
	c.fails("DELETE", "/sandboxes/"+kept.SandboxID, nil, http.StatusNotFound, kept.SandboxID)
}

// TestE2BControlMetrics: a running sandbox has one sample of now, a paused
// one none; the many-sandboxes form leaves out what it cannot measure.
func TestE2BControlMetrics(t *testing.T) {
	d := startDaemon(t, "")
	c := e2bControl{t, d}
	a := c.create(map[string]any{"templateID": "base"})
	b := c.create(map[string]any{"templateID": "base"})
	if _, err := d.client.StartProcess(t.Context(), a.SandboxID, api.ExecRequest{Shell: "while :; do :; done"}); err != nil {
		t.Fatal(err)
	}
	type metric struct {
		Timestamp     time.Time `json:"timestamp"`
		TimestampUnix int64     `json:"timestampUnix"`
		CPUCount      int       `json:"cpuCount"`
		CPUUsedPct    float64   `json:"cpuUsedPct"`
		MemUsed       int64     `json:"memUsed"`
		MemTotal      int64     `json:"memTotal"`
		MemCache      *int64    `json:"memCache"`
		DiskUsed      int64     `json:"diskUsed"`
		DiskTotal     *int64    `json:"diskTotal"`
	}
	var ms []metric
	c.json("GET", "/sandboxes/"+a.SandboxID+"/metrics", nil, http.StatusOK, &ms)
	if len(ms) != 1 {
		t.Fatalf("metrics: %+v", ms)
	}
	m := ms[0]
	if m.CPUCount < 1 || m.CPUUsedPct <= 0 || m.CPUUsedPct > 100 || m.MemUsed <= 0 || m.MemTotal < m.MemUsed ||
		m.MemCache == nil || m.DiskTotal == nil || !near(m.Timestamp, time.Now(), 5*time.Second) || m.TimestampUnix != m.Timestamp.Unix() {
		t.Fatalf("metric of a busy sandbox: %+v", m)
	}
	c.json("POST", "/sandboxes/"+b.SandboxID+"/pause", nil, http.StatusNoContent, nil)
	c.json("GET", "/sandboxes/"+b.SandboxID+"/metrics", nil, http.StatusOK, &ms)
	if len(ms) != 0 {
		t.Fatalf("metrics of a paused sandbox: %+v", ms)
	}
	var many struct {
		Sandboxes map[string]metric `json:"sandboxes"`
	}
	c.json("GET", "/sandboxes/metrics?sandbox_ids="+a.SandboxID+","+b.SandboxID+",sb-nosuchsandbox", nil, http.StatusOK, &many)
	if len(many.Sandboxes) != 1 || many.Sandboxes[a.SandboxID].MemUsed <= 0 {
		t.Fatalf("metrics of a, b (paused) and an unknown one: %+v", many)
	}
	c.fails("GET", "/sandboxes/metrics", nil, http.StatusBadRequest, "sandbox_ids")
	c.fails("GET", "/sandboxes/sb-nosuchsandbox/metrics", nil, http.StatusNotFound, "sb-nosuchsandbox")
}

// TestE2BControlTemplates: berth's host image is the template "base",
// berth's templates are E2B's by name; building through E2B's API is
// refused with the way to build in berth.
func TestE2BControlTemplates(t *testing.T) {
	d := startDaemon(t, "")
	c := e2bControl{t, d}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM scratch\nCOPY data.txt /data.txt\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "data.txt"), []byte("data\n"), 0o644)
	res, err := d.client.BuildTemplate(t.Context(), api.BuildTemplateRequest{Name: "e2b-tmpl"}, contextTar(t, dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	type template struct {
		TemplateID    string     `json:"templateID"`
		BuildID       string     `json:"buildID"`
		CPUCount      int        `json:"cpuCount"`
		MemoryMB      int        `json:"memoryMB"`
		Public        *bool      `json:"public"`
		Aliases       []string   `json:"aliases"`
		Names         []string   `json:"names"`
		CreatedAt     time.Time  `json:"createdAt"`
		LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
		BuildStatus   string     `json:"buildStatus"`
		EnvdVersion   string     `json:"envdVersion"`
		Builds        []struct {
			BuildID string `json:"buildID"`
			Status  string `json:"status"`
		} `json:"builds"`
	}
	var list []template
	c.json("GET", "/templates", nil, http.StatusOK, &list)
	byID := map[string]template{}
	for _, tm := range list {
		byID[tm.TemplateID] = tm
	}
	host, built := byID["host"], byID["e2b-tmpl"]
	if !slices.Contains(host.Aliases, "base") || host.BuildStatus != "ready" || host.CPUCount < 1 || host.Public == nil || host.EnvdVersion == "" {
		t.Fatalf("host template: %+v", host)
	}
	if built.TemplateID == "" || !built.CreatedAt.Equal(res.Image.CreatedAt) || !slices.Equal(built.Names, []string{"e2b-tmpl"}) {
		t.Fatalf("built template: %+v (of %d)", built, len(list))
	}
	for _, name := range []string{"base", "e2b-tmpl"} {
		var one template
		c.json("GET", "/templates/"+name, nil, http.StatusOK, &one)
		if len(one.Builds) != 1 || one.Builds[0].BuildID != one.BuildID || one.Builds[0].Status != "ready" || len(one.BuildID) != 36 {
			t.Fatalf("GET /templates/%s: %+v", name, one)
		}
		var alias struct {
			TemplateID string `json:"templateID"`
			Public     *bool  `json:"public"`
		}
		c.json("GET", "/templates/aliases/"+name, nil, http.StatusOK, &alias)
		if alias.TemplateID != one.TemplateID || alias.Public == nil {
			t.Fatalf("alias %s: %+v", name, alias)
		}
	}
	c.fails("GET", "/templates/aliases/no-such-template", nil, http.StatusNotFound, "no-such-template")
	c.fails("POST", "/v3/templates", map[string]any{"name": "x"}, http.StatusNotImplemented, "berth template build")
	c.fails("POST", "/v2/templates/x/builds/y", map[string]any{}, http.StatusNotImplemented, "berth template build")
	c.fails("GET", "/templates/x/builds/y/status", nil, http.StatusNotImplemented, "berth template build")
	c.fails("DELETE", "/templates/base", nil, http.StatusBadRequest, "built-in")
	c.json("DELETE", "/templates/e2b-tmpl", nil, http.StatusNoContent, nil)
	c.fails("GET", "/templates/e2b-tmpl", nil, http.StatusNotFound, "e2b-tmpl")
	c.fails("DELETE", "/templates/e2b-tmpl", nil, http.StatusNotFound, "e2b-tmpl")
}

// TestE2BControlBadInput: bad requests get E2B's error body with the
// status of berth's class, and nothing is made of them.
func TestE2BControlBadInput(t *testing.T) {
	d := startDaemon(t, "")
	c := e2bControl{t, d}
	for _, tc := range []struct {
		body   any
		status int
		want   string
	}{
		{map[string]any{"templateID": "no-such-template"}, http.StatusNotFound, "no-such-template"},
		{map[string]any{"templateID": "Not A Reference!"}, http.StatusNotFound, "Not A Reference!"},
		{map[string]any{}, http.StatusBadRequest, "templateID"},
		{map[string]any{"templateID": "base", "timeout": -1}, http.StatusBadRequest, "timeout"},
		{map[string]any{"templateID": "base", "timeout": 86401}, http.StatusBadRequest, "timeout"},
		{map[string]any{"templateID": "base", "metadata": map[string]string{"-bad-": "v"}}, http.StatusBadRequest, "-bad-"},
		{map[string]any{"templateID": "base", "metadata": map[string]string{"e2b.berth.sh/template": "x"}}, http.StatusBadRequest, "e2b.berth.sh/"},
		{map[string]any{"templateID": "base", "envVars": map[string]string{"1BAD": "v"}}, http.StatusBadRequest, "1BAD"},
		{map[string]any{"templateID": "base", "autoResume": map[string]any{"enabled": true}}, http.StatusNotImplemented, "autoResume"},
		{map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"not a host!"}}}, http.StatusBadRequest, "not a host!"},
		{map[string]any{"templateID": "base", "network": map[string]any{"egressProxy": map[string]any{"address": "p:1080"}}}, http.StatusNotImplemented, "egressProxy"},
		{`{"templateID": "base",`, http.StatusBadRequest, "JSON"},
		{`["base"]`, http.StatusBadRequest, "JSON"},
		{"", http.StatusBadRequest, "body"},
	} {
		c.fails("POST", "/v2/sandboxes", tc.body, tc.status, tc.want)
	}
	if list, err := d.client.ListSandboxes(t.Context(), nil); err != nil || len(list) != 0 {
		t.Fatalf("bad creates left sandboxes: %v %v", list, err)
	}

	sb := c.create(map[string]any{"templateID": "base"})
	id := sb.SandboxID
	for _, tc := range []struct {
		method, path string
		body         any
		status       int
		want         string
	}{
		{"POST", "/sandboxes/" + id + "/timeout", map[string]any{"timeout": 86401}, http.StatusBadRequest, "timeout"},
		{"POST", "/sandboxes/" + id + "/timeout", map[string]any{}, http.StatusBadRequest, "timeout"},
		{"POST", "/sandboxes/" + id + "/timeout", "{", http.StatusBadRequest, "JSON"},
		{"POST", "/sandboxes/" + id + "/refreshes", map[string]any{"duration": 3601}, http.StatusBadRequest, "duration"},
		{"POST", "/sandboxes/" + id + "/connect", map[string]any{}, http.StatusBadRequest, "timeout"},
		{"POST", "/v2/sandboxes/" + id + "/connect", map[string]any{"timeout": -5}, http.StatusBadRequest, "timeout"},
		{"PUT", "/sandboxes/" + id, nil, http.StatusMethodNotAllowed, "GET, DELETE"},
		{"GET", "/sandboxes/" + id + "/nothing", nil, http.StatusNotFound, "no route"},
		{"GET", "/v2/nothing", nil, http.StatusNotFound, "no route"},
	} {
		c.fails(tc.method, tc.path, tc.body, tc.status, tc.want)
	}
	if b, err := d.client.GetSandbox(t.Context(), id); err != nil || *b.Timeouts.MaxLifetimeSeconds != defaultE2BTimeout {
		t.Fatalf("refused updates changed the sandbox: %+v %v", b.Timeouts, err)
	}
	const unknown = "sb-nosuchsandbox"
	for _, tc := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/sandboxes/" + unknown, nil},
		{"DELETE", "/sandboxes/" + unknown, nil},
		{"POST", "/sandboxes/" + unknown + "/timeout", map[string]any{"timeout": 10}},
		{"POST", "/sandboxes/" + unknown + "/refreshes", map[string]any{"duration": 10}},
		{"POST", "/sandboxes/" + unknown + "/pause", nil},
		{"POST", "/sandboxes/" + unknown + "/resume", map[string]any{"timeout": 10}},
		{"POST", "/sandboxes/" + unknown + "/connect", map[string]any{"timeout": 10}},
		{"POST", "/v2/sandboxes/" + unknown + "/connect", map[string]any{"timeout": 10}},
		{"PUT", "/sandboxes/" + unknown + "/network", map[string]any{"allowOut": []string{"example.com"}}},
	} {
		c.fails(tc.method, tc.path, tc.body, http.StatusNotFound, unknown)
	}
	if status, b, _ := c.do("GET", "/sandboxes/"+id, nil); status != http.StatusOK {
		t.Fatalf("get: %d %s", status, b)
	}
}

// defaultE2BTimeout is POST /v2/sandboxes's timeout when it gives none.
const defaultE2BTimeout = 300
