package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

// TestAgentInside runs examples/agent-inside (issue #14): an agent server
// in a sandbox, one sandbox per thread_id, reached over a WebSocket through
// the daemon's ports, whose model is a server on the test internet that the
// agent calls with a key it never holds: the sandbox has berth's
// placeholder and the daemon puts the key in on the way out.

var modelIP = netip.MustParseAddr("203.0.113.21")

// modelServer is the fake model: it answers the agent's conversation with a
// plan, and keeps what it was sent.
type modelServer struct {
	mu    sync.Mutex
	auth  []string
	calls [][]chatMessage
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func (m *modelServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []chatMessage `json:"messages"`
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat" || json.NewDecoder(r.Body).Decode(&req) != nil || len(req.Messages) == 0 {
		http.Error(w, "POST /v1/chat {messages}", http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	m.auth = append(m.auth, r.Header.Get("Authorization"))
	m.calls = append(m.calls, req.Messages)
	m.mu.Unlock()
	var before []string // the user's earlier messages
	for _, msg := range req.Messages[:len(req.Messages)-1] {
		if msg.Role == "user" {
			before = append(before, msg.Content)
		}
	}
	plan := map[string]any{
		"reply":   "Let me see which system this is and write hello.txt for you.",
		"command": "uname -s",
		"write":   map[string]string{"path": "hello.txt", "content": "written by the agent inside\n"},
	}
	if len(before) > 0 {
		plan = map[string]any{
			"reply":   fmt.Sprintf("You asked me %d things before this one, first: %q.", len(before), before[0]),
			"command": "cat hello.txt",
			"write":   nil,
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(plan)
}

func (m *modelServer) seen() (auth []string, calls [][]chatMessage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.auth), slices.Clone(m.calls)
}

// agentEvent is one event the agent streams.
type agentEvent struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Tool     string `json:"tool"`
	Command  string `json:"command"`
	Output   string `json:"output"`
	ExitCode int    `json:"exit_code"`
	Path     string `json:"path"`
	Message  string `json:"message"`
	Turn     int    `json:"turn"`

	at time.Time
}

// chatTurn sends one message and reads the events up to done.
func chatTurn(t *testing.T, ctx context.Context, ws *websocket.Conn, message string) []agentEvent {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"message": message})
	if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatalf("send %q: %v", message, err)
	}
	var events []agentEvent
	for {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("read after %d events %+v: %v", len(events), events, err)
		}
		var ev agentEvent
		if typ != websocket.MessageText || json.Unmarshal(b, &ev) != nil {
			t.Fatalf("not a JSON text event: %v %q", typ, b)
		}
		ev.at = time.Now()
		if ev.Type == "error" {
			t.Fatalf("the agent: %s", ev.Message)
		}
		events = append(events, ev)
		if ev.Type == "done" {
			return events
		}
	}
}

// reply is the tokens of a turn joined; tools are its tool events.
func reply(events []agentEvent) (text string, tokens int, tools []agentEvent) {
	for _, ev := range events {
		switch ev.Type {
		case "token":
			text += ev.Text
			tokens++
		case "tool":
			tools = append(tools, ev)
		}
	}
	return text, tokens, tools
}

func TestAgentInside(t *testing.T) {
	inet := newInternet(t)
	model := &modelServer{}
	inet.ServeHTTPS(t, netip.AddrPortFrom(modelIP, 443), []string{"model.test"}, model)
	inet.SetRecord("model.test", modelIP)
	// The sandbox need not trust the test CA (withInternet's d.testCA, which
	// createWith installs): for a host with a bound secret the daemon
	// terminates TLS with the sandbox's own CA and verifies model.test's
	// certificate itself, with --egress-ca.
	d := startDaemon(t, "", (&daemon{}).withInternet(inet)...)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	agentPy, err := os.ReadFile(filepath.Join("..", "examples", "agent-inside", "agent.py"))
	if err != nil {
		t.Fatal(err)
	}
	const workdir = "/home/user/agent"

	// 1. The key is a berth secret; the sandbox of thread t1 may reach the
	// model, and holds a placeholder for the key.
	if _, err := d.client.CreateSecret(ctx, "model-key", canarySecret); err != nil {
		t.Fatal(err)
	}
	req := api.CreateSandboxRequest{
		Labels: map[string]string{"thread_id": "t1"},
		Env:    map[string]string{"MODEL_URL": "https://model.test/v1/chat"},
		Network: &api.Network{Mode: api.NetworkAllowlist, Allow: []string{"model.test"}, Secrets: []api.SecretBinding{
			{Secret: "model-key", Host: "model.test", Env: "MODEL_API_KEY"},
		}},
	}
	sb, created, err := d.client.GetOrCreate(ctx, req)
	if err != nil || !created {
		t.Fatalf("get-or-create thread t1: %+v created=%v %v", sb, created, err)
	}
	ph := sb.Network.Secrets[0].Placeholder
	if !strings.HasPrefix(ph, "berth-ph-") {
		t.Fatalf("placeholder %q", ph)
	}

	// 2. The agent: uploaded, started in the background, listening.
	if _, err := d.client.Upload(ctx, sb.ID, workdir+"/agent.py", strings.NewReader(string(agentPy)), client.FileOptions{}); err != nil {
		t.Fatal(err)
	}
	proc, err := d.client.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "agent.py", "--port", "8000"}, Cwd: workdir})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	if err := d.client.WaitPort(wctx, sb.ID, 8000); err != nil {
		st, _ := d.client.ProcessOutput(ctx, sb.ID, proc.Pid, false)
		if st != nil {
			for ev, err := st.Next(); err == nil; ev, err = st.Next() {
				t.Logf("agent %s: %s", ev.Type, ev.Data)
			}
		}
		t.Fatal(err)
	}

	// 3. A turn over a WebSocket through the daemon (path form, token as a
	// header): the reply streams a word at a time, the tools ran inside,
	// and the model got the real key.
	hc := portClient(d)
	defer hc.CloseIdleConnections()
	wsURL := "ws" + strings.TrimPrefix(d.portPath(sb.ID, 8000), "http") + "/chat"
	ws, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: hc,
		HTTPHeader: http.Header{api.HeaderAccessToken: {sb.AccessToken}}})
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", wsURL, err, resp)
	}
	defer ws.CloseNow()
	events := chatTurn(t, ctx, ws, "which system is this? and make a file hello.txt")
	text, tokens, tools := reply(events)
	if tokens < 2 || events[0].Type != "token" || text != "Let me see which system this is and write hello.txt for you." {
		t.Fatalf("turn 1: %d tokens %q in %+v", tokens, text, events)
	}
	// One message a token, relayed as the agent sends them (it waits 20 ms
	// between two): not gathered up on the way.
	if first, last := events[0].at, events[tokens-1].at; last.Sub(first) < time.Duration(tokens-1)*10*time.Millisecond {
		t.Errorf("%d tokens arrived within %v: buffered on the way?", tokens, last.Sub(first))
	}
	if len(tools) != 2 || tools[0].Tool != "write" || tools[0].Path != "hello.txt" ||
		tools[1].Tool != "shell" || tools[1].Command != "uname -s" || tools[1].Output != "Linux\n" || tools[1].ExitCode != 0 {
		t.Fatalf("turn 1 tools: %+v", tools)
	}
	if done := events[len(events)-1]; done.Turn != 1 {
		t.Fatalf("turn 1 done: %+v", done)
	}
	auth, calls := model.seen()
	if len(auth) != 1 || auth[0] != "Bearer "+canarySecret {
		t.Fatalf("the model got Authorization %q, want the key berth holds", auth)
	}
	if len(calls[0]) != 1 || calls[0][0].Role != "user" {
		t.Fatalf("the model's first call: %+v", calls[0])
	}
	waitEgress(t, d, sb.ID, "the model call with the key", func(r api.EgressRecord) bool {
		return r.Proto == api.EgressHTTPS && r.Name == "model.test" && r.Secret == "model-key" && r.Status == 200
	})
	if err := ws.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("close: %v", err)
	}

	// 4. Later, the same thread: the same sandbox, its files, the agent
	// still listening (the same process), and a turn that sees the history.
	again, created, err := d.client.GetOrCreate(ctx, req)
	if err != nil || created || again.ID != sb.ID {
		t.Fatalf("get-or-create thread t1 again: %s created=%v %v, want %s", again.ID, created, err, sb.ID)
	}
	if b, err := d.client.ReadFile(ctx, sb.ID, workdir+"/hello.txt"); err != nil || string(b) != "written by the agent inside\n" {
		t.Fatalf("hello.txt: %q %v", b, err)
	}
	logBytes, err := d.client.ReadFile(ctx, sb.ID, workdir+"/conversation.jsonl")
	if err != nil || strings.Count(string(logBytes), "\n") != 2 || !strings.Contains(string(logBytes), "uname -s") {
		t.Fatalf("conversation.jsonl: %q %v", logBytes, err)
	}
	ports, err := d.client.ListPorts(ctx, sb.ID)
	if err != nil || !slices.ContainsFunc(ports, func(p api.Port) bool { return p.Port == 8000 }) {
		t.Fatalf("ports after the reconnect: %+v %v", ports, err)
	}
	if p, err := d.client.GetProcess(ctx, sb.ID, proc.Pid); err != nil || !p.Running {
		t.Fatalf("the agent after the disconnect: %+v %v", p, err)
	}
	// This time the token rides in the query, as a link would carry it.
	wsURL2 := wsURL + "?" + url.Values{api.QueryAccessToken: {again.AccessToken}}.Encode()
	ws2, resp, err := websocket.Dial(ctx, wsURL2, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatalf("dial again: %v (%v)", err, resp)
	}
	defer ws2.CloseNow()
	events = chatTurn(t, ctx, ws2, "what did I ask before?")
	text, tokens, tools = reply(events)
	want := `You asked me 1 things before this one, first: "which system is this? and make a file hello.txt".`
	if tokens < 2 || text != want {
		t.Fatalf("turn 2: %d tokens %q, want %q", tokens, text, want)
	}
	if len(tools) != 1 || tools[0].Command != "cat hello.txt" || tools[0].Output != "written by the agent inside\n" {
		t.Fatalf("turn 2 tools: %+v", tools)
	}
	if done := events[len(events)-1]; done.Turn != 2 {
		t.Fatalf("turn 2 done: %+v", done)
	}
	auth, calls = model.seen()
	if len(calls) != 2 || auth[1] != "Bearer "+canarySecret {
		t.Fatalf("the model's calls: %d, Authorization %q", len(calls), auth)
	}
	roles := make([]string, len(calls[1]))
	for i, m := range calls[1] {
		roles[i] = m.Role
	}
	// user, assistant, its two tool results, user.
	if got := strings.Join(roles, ","); got != "user,assistant,tool,tool,user" {
		t.Fatalf("the model's second call has roles %s", got)
	}
	ws2.Close(websocket.StatusNormalClosure, "")
	if procs, err := d.client.ListProcesses(ctx, sb.ID); err != nil || len(procs) != 1 || procs[0].Pid != proc.Pid || !procs[0].Running {
		t.Fatalf("processes: %+v %v, want the one agent, still running", procs, err)
	}

	// 5. The key is nowhere inside: not in the environment, not in any
	// process's (the agent's holds the placeholder), not in the agent's
	// files. The needle is assembled inside, so no command line holds it.
	if out, _ := sh(t, d, sb.ID, "env"); strings.Contains(out, canarySecret) || !strings.Contains(out, "MODEL_API_KEY="+ph) {
		t.Errorf("the environment: %s", out)
	}
	for _, user := range []string{"root", "user"} { // root inside cannot read the environment of user's processes
		r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{User: user,
			Shell: fmt.Sprintf("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; echo; echo agent:; tr '\\0' '\\n' < /proc/%d/environ", proc.Pid)})
		if err != nil {
			t.Fatal(err)
		}
		out := string(r.Stdout) + string(r.Stderr)
		if strings.Contains(out, canarySecret) {
			t.Errorf("as %s: the key in a process's environment", user)
		}
		if _, agentEnv, _ := strings.Cut(out, "agent:\n"); user == "user" && !strings.Contains(agentEnv, "MODEL_API_KEY="+ph) {
			t.Errorf("the agent's environment, read as %s, lacks the placeholder: %q", user, agentEnv)
		}
	}
	half := len(canarySecret) / 2
	grep := fmt.Sprintf("grep -rlF -e \"$(printf %%s %q)$(printf %%s %q)\" %s /tmp; echo exit=$?", canarySecret[:half], canarySecret[half:], workdir)
	if out, _ := sh(t, d, sb.ID, grep); strings.TrimSpace(out) != "exit=1" {
		t.Errorf("grep for the key in the agent's files: %s", out)
	}
	if strings.Contains(string(logBytes), canarySecret) || strings.Contains(string(logBytes), ph) {
		t.Errorf("conversation.jsonl holds a key: %s", logBytes)
	}
}
