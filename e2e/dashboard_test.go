package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/internal/testutil"
)

// The dashboard's browser tests drive Debian's chromium (headless, and
// without its sandbox: CI runs as root) against a real daemon.
// BERTH_DASHBOARD_SCREENSHOTS names a directory for a PNG of each page.

// chromium returns the browser's path: $BERTH_CHROMIUM, else chromium on
// PATH (scripts/test-deps.sh installs it). Missing, the test is skipped,
// and fails where CI=true.
func chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("BERTH_CHROMIUM"); p != "" {
		return p
	}
	testutil.RequireProgram(t, "chromium")
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// browser starts a headless chromium for the test; the returned context
// is its first tab.
func browser(t testing.TB) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.WindowSize(1440, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser, without a deadline
		t.Fatalf("start %s: %v", chromium(t), err)
	}
	return ctx
}

// pageLog collects what a tab asked for and what went wrong in it.
type pageLog struct {
	mu         sync.Mutex
	requests   []string // every URL the page requested, WebSockets too
	exceptions []string
	console    []string // errors and warnings of the console and the browser log
}

func watchPage(t testing.TB, ctx context.Context) *pageLog {
	t.Helper()
	l := &pageLog{}
	err := chromedp.Listen(ctx, func(ev any) {
		l.mu.Lock()
		defer l.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			l.requests = append(l.requests, ev.Request.URL)
		case *network.EventWebSocketCreated:
			l.requests = append(l.requests, ev.URL)
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			text := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				text += " " + d.Exception.Description
			}
			l.exceptions = append(l.exceptions, fmt.Sprintf("%s:%d %s", d.URL, d.LineNumber+1, text))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning {
				l.mu.Lock()
				l.console = append(l.console, fmt.Sprintf("%s: %s", m.Type, m.Text))
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// check fails the test for an uncaught exception, a refusal by the
// Content-Security-Policy, or a request to anywhere but the daemon.
func (l *pageLog) check(t testing.TB, daemonURL string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.exceptions {
		t.Errorf("uncaught exception in the page: %s", e)
	}
	for _, c := range l.console {
		if strings.Contains(c, "Content Security Policy") {
			t.Errorf("the page broke its own Content-Security-Policy: %s", c)
		}
	}
	ws := "ws" + strings.TrimPrefix(daemonURL, "http")
	for _, u := range l.requests {
		if !strings.HasPrefix(u, daemonURL+"/") && !strings.HasPrefix(u, ws+"/") && !strings.HasPrefix(u, "data:") && !strings.HasPrefix(u, "blob:") {
			t.Errorf("the page requested %s: only the daemon (%s) may be asked", u, daemonURL)
		}
	}
}

// screenshot writes the tab's viewport to $BERTH_DASHBOARD_SCREENSHOTS/name.
func screenshot(t testing.TB, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("BERTH_DASHBOARD_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// dashboardKey is the key to sign in with: the admin key the daemon wrote
// to admin.key in its state dir on its first start, as a user would copy it.
func dashboardKey(t testing.TB, d *daemon) string {
	t.Helper()
	return testutil.AdminKey(t, d.state)
}

// step runs actions with a deadline, failing the test with what it was
// doing and the page's state.
func step(t testing.TB, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("%s: %v\npage text:\n%s", what, err, body)
	}
}

// typeKeys types s into the focused element as a keyboard does: for each
// key a keydown without text, the character, a keyup. (SendKeys gives the
// keydown the text too, which a terminal takes as a second keystroke.)
// "\r" is Enter.
func typeKeys(s string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, r := range s {
			key, code := string(r), int64(0)
			if r == '\r' {
				key, code = "Enter", 13
			} else if r >= 'a' && r <= 'z' {
				code = int64(r - 'a' + 'A')
			} else if r == ' ' {
				code = 32
			}
			for _, ev := range []input.DispatchKeyEventParams{
				{Type: input.DispatchKeyEventTypeRawKeyDown, Key: key, WindowsVirtualKeyCode: code, NativeVirtualKeyCode: code},
				{Type: input.DispatchKeyEventTypeChar, Key: key, Text: string(r), UnmodifiedText: string(r), WindowsVirtualKeyCode: code, NativeVirtualKeyCode: code},
				{Type: input.DispatchKeyEventTypeKeyUp, Key: key, WindowsVirtualKeyCode: code, NativeVirtualKeyCode: code},
			} {
				if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, ev); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// TestDashboard signs in to the dashboard in a real browser, creates a
// sandbox from the list, opens it, runs echo hi in its live terminal and
// sees hi, uploads a file and sees it listed, and sees the sandbox's
// events as they happen; a wrong key gets the login page's error.
func TestDashboard(t *testing.T) {
	chromium(t)
	d := startDaemon(t, "")
	key := dashboardKey(t, d)
	ctx := browser(t)
	log := watchPage(t, ctx)
	t.Cleanup(func() { log.check(t, d.url) })

	// The login page, and a key the daemon refuses.
	step(t, ctx, "open the dashboard", chromedp.Navigate(d.url+"/"), chromedp.WaitVisible(chromedp.ID("login-key")))
	screenshot(t, ctx, "login.png")
	step(t, ctx, "sign in with a wrong key",
		chromedp.SendKeys(chromedp.ID("login-key"), "berth_not-a-key-of-this-daemon"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("login-error")))
	msg, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("login-error")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg, "refused the key") {
		t.Errorf("login error %q, want the daemon's refusal of the key", msg)
	}
	if stored, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("berth.key") || ""`)); stored != "" {
		t.Errorf("a refused key stays in sessionStorage: %q", stored)
	}
	screenshot(t, ctx, "login-refused.png")
	step(t, ctx, "sign in",
		chromedp.SendKeys(chromedp.ID("login-key"), key),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("sandbox-table")))

	// Create a sandbox from the list; it shows with its labels, and its
	// live CPU and memory once two stats have come.
	step(t, ctx, "create a sandbox",
		chromedp.SendKeys(chromedp.ID("create-labels"), "owner=dashboard-test, purpose=e2e"),
		chromedp.SetValue(chromedp.ID("create-network"), "allowlist"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("create-network").dispatchEvent(new Event("change"))`),
		chromedp.SendKeys(chromedp.ID("create-allow"), "pypi.org"),
		chromedp.Click(chromedp.ID("create-submit")),
		chromedp.WaitVisible(chromedp.CSS(`#sandbox-table tbody tr[data-id]`)))
	id, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#sandbox-table tbody tr[data-id]").dataset.id`))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.client.GetSandbox(t.Context(), id)
	if err != nil {
		t.Fatalf("the sandbox the page shows, %q: %v", id, err)
	}
	if sb.Labels["owner"] != "dashboard-test" || sb.Labels["purpose"] != "e2e" {
		t.Errorf("created with labels %v, want owner=dashboard-test and purpose=e2e", sb.Labels)
	}
	if sb.Network.Mode != api.NetworkAllowlist || len(sb.Network.Allow) != 1 || sb.Network.Allow[0] != "pypi.org" {
		t.Errorf("created with network %+v, want an allowlist of pypi.org", sb.Network)
	}
	row := fmt.Sprintf(`#sandbox-table tr[data-id=%q]`, id)
	step(t, ctx, "see the sandbox's CPU and memory",
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`(() => { const r = document.querySelector(%q);
			return r && /%%$/.test(r.querySelector(".cpu").textContent) && /B$/.test(r.querySelector(".mem").textContent); })()`, row),
			chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	// A label selector that matches nothing hides it; one that matches shows it.
	step(t, ctx, "filter by a label no sandbox has",
		chromedp.SendKeys(chromedp.ID("filter"), "owner=nobody"),
		chromedp.Poll[chromedp.Void](`!document.querySelector("#sandbox-table tbody tr[data-id]")`, chromedp.WithPollingTimeout(10*time.Second)))
	step(t, ctx, "filter by its label",
		chromedp.Evaluate[chromedp.Void](`(() => { const f = document.getElementById("filter");
			f.value = "owner=dashboard-test"; f.dispatchEvent(new Event("input")); })()`),
		chromedp.WaitVisible(chromedp.CSS(row)))
	screenshot(t, ctx, "list.png")

	// Its page: the events stream, and a terminal where echo hi prints hi.
	step(t, ctx, "open the sandbox",
		chromedp.Click(chromedp.CSS(row+" td a")),
		chromedp.WaitVisible(chromedp.CSS("#terminal .xterm")),
		chromedp.Poll[chromedp.Void](`document.getElementById("terminal-status").textContent.startsWith("connected") &&
			[...document.querySelectorAll("#terminal .xterm-rows > div")].some((r) => r.textContent.trim().endsWith("$"))`,
			chromedp.WithPollingTimeout(20*time.Second)))
	step(t, ctx, "see the terminal's process start among the events",
		chromedp.WaitVisible(chromedp.CSS(`#events li[data-type="process_started"]`)))
	step(t, ctx, "type echo hi in the terminal",
		chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")),
		typeKeys("echo hi\r"),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll("#terminal .xterm-rows > div")].some((r) => r.textContent.trim() === "hi")`,
			chromedp.WithPollingTimeout(20*time.Second)))
	// A name the allowlist refuses: an egress_denied event as it happens,
	// and a record in the egress log.
	if res, err := d.client.Exec(t.Context(), id, api.ExecRequest{Cmd: []string{"curl", "-sS", "-m", "5", "http://evil.test/"}}); err != nil || res.ExitCode == 0 {
		t.Fatalf("curl a name the allowlist refuses: %+v %v", res, err)
	}
	step(t, ctx, "see the refused lookup among the events",
		chromedp.WaitVisible(chromedp.CSS(`#events li[data-type="egress_denied"]`)))
	screenshot(t, ctx, "sandbox.png")

	// Its files: upload one into the workdir and see it listed, with the
	// bytes that were sent.
	local := filepath.Join(t.TempDir(), "notes-from-the-browser.txt")
	content := "uploaded by the dashboard's browser test\n"
	if err := os.WriteFile(local, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := d.client.Exec(t.Context(), id, api.ExecRequest{Cmd: []string{"sh", "-c", "mkdir -p project/src && echo '# project' > project/README.md"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("make a directory to browse: %+v %v", res, err)
	}
	step(t, ctx, "open the files",
		chromedp.Click(chromedp.ID("tab-files")),
		chromedp.WaitVisible(chromedp.CSS(`#files-table tbody tr`)))
	step(t, ctx, "upload a file",
		chromedp.SetUploadFiles(chromedp.ID("files-upload"), []string{local}),
		chromedp.WaitVisible(chromedp.CSS(`#files-table tr[data-name="notes-from-the-browser.txt"]`)))
	dir, err := chromedp.Run(ctx, chromedp.Value(chromedp.ID("files-path")))
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.client.ReadFile(t.Context(), id, dir+"/notes-from-the-browser.txt")
	if err != nil {
		t.Fatalf("read what the page uploaded: %v", err)
	}
	if string(got) != content {
		t.Errorf("the uploaded file holds %q, want %q", got, content)
	}
	screenshot(t, ctx, "files.png")

	// Browse up and back down, and download the file: the browser saves
	// the bytes the sandbox has.
	parent := filepath.Base(dir)
	step(t, ctx, "browse to the parent directory",
		chromedp.Click(chromedp.CSS(`#files-table a.up`)),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#files-table tr[data-name=%q] a.dir`, parent))))
	step(t, ctx, "browse back into "+dir,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#files-table tr[data-name=%q] a.dir`, parent))),
		chromedp.WaitVisible(chromedp.CSS(`#files-table tr[data-name="notes-from-the-browser.txt"]`)))
	downloads := t.TempDir()
	if _, err := chromedp.CallBrowser(ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads,
	}); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "download the file", chromedp.Click(chromedp.CSS(`#files-table tr[data-name="notes-from-the-browser.txt"] button`)))
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(downloads, "notes-from-the-browser.txt"))
		if err == nil && string(b) == content {
			break
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(downloads)
			t.Fatalf("the browser saved no download of the file with its content (%q, %v; the directory has %v)", b, err, entries)
		}
	}

	// The terminal outlives a look at another tab.
	step(t, ctx, "return to the terminal",
		chromedp.Click(chromedp.ID("tab-terminal")),
		chromedp.WaitVisible(chromedp.CSS("#terminal .xterm")),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll("#terminal .xterm-rows > div")].some((r) => r.textContent.trim() === "hi") &&
			document.getElementById("terminal-status").textContent.startsWith("connected")`, chromedp.WithPollingTimeout(5*time.Second)))

	step(t, ctx, "see the refused lookup in the egress log", chromedp.Click(chromedp.ID("tab-egress")),
		chromedp.Poll[chromedp.Void](`document.getElementById("egress-state").textContent === "live" &&
			[...document.querySelectorAll("#egress-table tr.denied")].some((r) => r.textContent.includes("evil.test"))`,
			chromedp.WithPollingTimeout(10*time.Second)))
	screenshot(t, ctx, "egress.png")

	// Back to the list: the terminal's shell is hung up as the page leaves it.
	step(t, ctx, "go back to the list", chromedp.Click(chromedp.CSS("a.back")), chromedp.WaitVisible(chromedp.CSS(row)))
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, err := d.client.ListProcesses(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, p := range procs {
			if p.TTY != nil && p.Running {
				running++
			}
		}
		if running == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the dashboard left %d terminal processes running after leaving the page: %+v", running, procs)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Delete it from the list: a second click confirms.
	step(t, ctx, "delete the sandbox",
		chromedp.Click(chromedp.CSS(row+" button.danger")),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).textContent.includes("Really delete?")`, row+" button.danger"),
			chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.Click(chromedp.CSS(row+" button.danger")),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`!document.querySelector(%q)`, row), chromedp.WithPollingTimeout(30*time.Second)))
	if _, err := d.client.GetSandbox(t.Context(), id); !errdefs.IsNotFound(err) {
		t.Errorf("the sandbox after the list's delete: %v, want not found", err)
	}

	// A tenant's key sees only its tenant's sandboxes (not the admin's one
	// made here), and a key revoked while the page is open sends it back to
	// the login page with the daemon's word.
	hidden, err := d.client.CreateSandbox(t.Context(), api.CreateSandboxRequest{Labels: map[string]string{"owner": "dashboard-test"}})
	if err != nil {
		t.Fatal(err)
	}
	tk, err := d.client.CreateAPIKey(t.Context(), api.CreateAPIKeyRequest{Tenant: "team-dash", Scope: api.ScopeWrite, Name: "dashboard test"})
	if err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "sign in with the tenant's key",
		chromedp.Click(chromedp.ID("signout")),
		chromedp.WaitVisible(chromedp.ID("login-key")),
		chromedp.SendKeys(chromedp.ID("login-key"), tk.Key),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#sandbox-table td.empty")))
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#sandbox-table tbody tr[data-id]").length`)); n != 0 {
		t.Errorf("the tenant's key lists %d sandboxes, want none (%s is the admin's)", n, hidden.ID)
	}
	if _, err := d.client.RevokeAPIKey(t.Context(), tk.ID); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "see the revoked key refused",
		chromedp.WaitVisible(chromedp.ID("login-error")),
		chromedp.Poll[chromedp.Void](`document.getElementById("login-error").textContent.includes("refused the key")`, chromedp.WithPollingTimeout(5*time.Second)))

	// The page and its files carry the policy that keeps them to this origin.
	res, err := http.Get(d.url + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("GET / Content-Security-Policy %q", csp)
	}
}

// BenchmarkDashboardFirstLoad measures the dashboard's first load in a
// browser with its cache off: the bytes it transferred (bodies as sent,
// gzip, with their headers) and the milliseconds from the navigation to
// the sandbox list on screen, with one sandbox in it.
func BenchmarkDashboardFirstLoad(b *testing.B) {
	chromium(b)
	d := startDaemon(b, "")
	if _, err := d.client.CreateSandbox(b.Context(), api.CreateSandboxRequest{Labels: map[string]string{"bench": "dashboard"}}); err != nil {
		b.Fatal(err)
	}
	key := dashboardKey(b, d)
	ctx := browser(b)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(d.url+"/"),
		chromedp.WaitVisible(chromedp.ID("login-key")),
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`sessionStorage.setItem("berth.key", %q)`, key)),
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, network.SetCacheDisabled, network.SetCacheDisabledParams{CacheDisabled: true})
			return err
		}),
	); err != nil {
		b.Fatal(err)
	}
	type load struct {
		Bytes float64 `json:"bytes"`
		Ms    float64 `json:"ms"`
	}
	var total load
	b.ResetTimer()
	for i := range b.N {
		l, err := chromedp.Run(ctx, func(ctx context.Context, t *chromedp.Target) (load, error) {
			if err := chromedp.Do(ctx,
				chromedp.Navigate(fmt.Sprintf("%s/?load=%d", d.url, i)),
				chromedp.WaitVisible(chromedp.CSS(`#sandbox-table tbody tr[data-id]`)),
			); err != nil {
				return load{}, err
			}
			return chromedp.Run(ctx, chromedp.Poll[load](`(() => {
				const mark = performance.getEntriesByName("berth:list-rendered")[0];
				if (!mark) return null;
				const nav = performance.getEntriesByType("navigation")[0];
				const res = performance.getEntriesByType("resource").filter((e) => e.startTime <= mark.startTime);
				return { bytes: nav.transferSize + res.reduce((s, e) => s + e.transferSize, 0), ms: mark.startTime };
			})()`, chromedp.WithPollingTimeout(10*time.Second)))
		})
		if err != nil {
			b.Fatal(err)
		}
		total.Bytes += l.Bytes
		total.Ms += l.Ms
	}
	b.ReportMetric(total.Bytes/float64(b.N), "bytes/load")
	b.ReportMetric(total.Ms/float64(b.N), "ms/load")
}
