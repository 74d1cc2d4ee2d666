package dashboard

import (
	"context"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/server"
)

// TestDashboardWithoutTerminalLibrary: a binary built without make
// dashboard-assets (no assets/vendor) still serves the dashboard, and a
// sandbox's terminal tab says that the terminal is unavailable in this
// build. In a real chromium, against a stand-in for the /v1 API (e2e's
// TestDashboard drives a real daemon with the library in).
func TestDashboardWithoutTerminalLibrary(t *testing.T) {
	chrome := os.Getenv("BERTH_CHROMIUM")
	if chrome == "" {
		testutil.RequireProgram(t, "chromium")
		chrome, _ = exec.LookPath("chromium")
	}
	lean := fstest.MapFS{}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "assets/vendor/") {
			return err
		}
		b, err := assets.ReadFile(p)
		lean[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	g := newGroup(lean)
	if g.HasTerminal() {
		t.Fatal("HasTerminal without assets/vendor")
	}

	const sb = `{"id":"sb-lean","state":"running","image":"host","runtime":"native","workdir":"/home/user","user":"user",` +
		`"labels":{"build":"lean"},"limits":{},"timeouts":{},"network":{"mode":"none"},"created_at":"2026-01-02T03:04:05Z"}`
	done := make(chan struct{})
	api := http.NewServeMux()
	reply := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer lean-key" {
				http.Error(w, `{"error":{"class":"unauthenticated","message":"no key"}}`, http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(body))
		}
	}
	api.Handle("GET /v1/version", reply(`{"version":"lean","api":"v1","runtimes":["native"]}`))
	api.Handle("GET /v1/sandboxes", reply(`{"sandboxes":[`+sb+`]}`))
	api.Handle("GET /v1/sandboxes/{id}", reply(sb))
	api.Handle("GET /v1/sandboxes/{id}/stats", reply(`{"cpu_seconds":1,"memory_bytes":1048576}`))
	api.HandleFunc("GET /v1/sandboxes/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-done:
		}
	})
	top := http.NewServeMux()
	top.Handle("/v1/", api)
	top.Handle("/", server.New(server.Config{}, g))
	srv := httptest.NewServer(top)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) })

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chrome, err)
	}
	tctx, tcancel := context.WithTimeout(ctx, time.Minute)
	defer tcancel()
	if err := chromedp.Do(tctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.SendKeys(chromedp.ID("login-key"), "lean-key"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(`#sandbox-table tr[data-id="sb-lean"]`)),
		chromedp.Click(chromedp.CSS(`#sandbox-table tr[data-id="sb-lean"] td a`)),
		chromedp.WaitVisible(chromedp.ID("terminal-unavailable")),
	); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("%v\npage text:\n%s", err, body)
	}
	msg, err := chromedp.Run(tctx, chromedp.Text(chromedp.ID("terminal-unavailable")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg, "terminal is unavailable") || !strings.Contains(msg, "make dashboard-assets") {
		t.Errorf("the terminal tab of a lean build says %q", msg)
	}
}
