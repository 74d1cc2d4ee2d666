package store

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/labels"
)

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func sample(id string, lbls map[string]string) Sandbox {
	now := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)
	return Sandbox{ID: id, Tenant: "t1", State: "running", Image: "host", Runtime: "native",
		Spec: json.RawMessage(`{"image":"host"}`), Labels: lbls, RuntimeState: json.RawMessage(`{"pid":7}`),
		CreatedAt: now, UpdatedAt: now}
}

func TestRoundTripAndClasses(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "berth.db"))
	ctx := t.Context()
	in := sample("sb-1", map[string]string{"thread_id": "42"})
	if err := s.CreateSandbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, in); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate create: %v", err)
	}
	got, err := s.GetSandbox(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != in.ID || got.Tenant != in.Tenant || got.State != in.State || string(got.Spec) != string(in.Spec) ||
		string(got.RuntimeState) != string(in.RuntimeState) || !got.CreatedAt.Equal(in.CreatedAt) || got.Labels["thread_id"] != "42" {
		t.Fatalf("round trip: %+v", got)
	}
	if _, err := s.GetSandbox(ctx, "sb-none"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	if err := s.UpdateState(ctx, "sb-1", "stopped", "idle", in.CreatedAt.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSandbox(ctx, "sb-1"); !got.StoppedAt.Equal(in.CreatedAt.Add(time.Hour)) || got.Error != "idle" {
		t.Fatalf("stopped: %+v", got)
	}
	if err := s.UpdateState(ctx, "sb-1", "error", "boom", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateState(ctx, "sb-none", "error", "", time.Now()); !errdefs.IsNotFound(err) {
		t.Fatalf("update missing: %v", err)
	}
	if err := s.SetRuntimeState(ctx, "sb-1", json.RawMessage(`{"pid":8}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetLabels(ctx, "sb-1", map[string]string{"a": "b"}); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "sb-1")
	if got.State != "error" || got.Error != "boom" || !got.StoppedAt.IsZero() || string(got.RuntimeState) != `{"pid":8}` || len(got.Labels) != 1 || got.Labels["a"] != "b" {
		t.Fatalf("after updates: %+v", got)
	}
	if err := s.DeleteSandbox(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "sb-1"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
	var n int
	s.db.QueryRow(`SELECT count(*) FROM sandbox_labels`).Scan(&n)
	if n != 0 {
		t.Fatalf("%d label rows left after delete", n)
	}
}

func TestListBySelector(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "berth.db"))
	ctx := t.Context()
	s.CreateSandbox(ctx, sample("sb-a", map[string]string{"thread_id": "1", "env": "prod"}))
	s.CreateSandbox(ctx, sample("sb-b", map[string]string{"thread_id": "2"}))
	other := sample("sb-c", nil)
	other.Tenant = "t2"
	s.CreateSandbox(ctx, other)
	for sel, want := range map[string]string{
		"":                   "sb-a,sb-b,sb-c",
		"thread_id=1":        "sb-a",
		"thread_id":          "sb-a,sb-b",
		"!thread_id":         "sb-c",
		"env!=prod":          "sb-b,sb-c",
		"thread_id,env=prod": "sb-a",
	} {
		sl, err := labels.ParseSelector(sel)
		if err != nil {
			t.Fatal(err)
		}
		list, err := s.ListSandboxes(ctx, "", sl)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range list {
			ids = append(ids, sb.ID)
		}
		if got := strings.Join(ids, ","); got != want {
			t.Errorf("selector %q: %v, want %v", sel, ids, want)
		}
	}
	list, _ := s.ListSandboxes(ctx, "t2", labels.Selector{})
	if len(list) != 1 || list[0].ID != "sb-c" {
		t.Errorf("tenant t2: %+v", list)
	}
}

func TestConcurrentWritersAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	s := open(t, path)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.CreateSandbox(t.Context(), sample(fmt.Sprintf("sb-%02d", i), map[string]string{"n": fmt.Sprint(i)}))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s2 := open(t, path) // reopening runs no migration twice and sees the rows
	list, err := s2.ListSandboxes(t.Context(), "", labels.Selector{})
	if err != nil || len(list) != 50 {
		t.Fatalf("after reopen: %d rows, %v", len(list), err)
	}
}
