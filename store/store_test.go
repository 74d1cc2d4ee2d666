package store

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
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

func newStore(t *testing.T) *Store {
	return open(t, filepath.Join(t.TempDir(), "berth.db"))
}

// sample is a sandbox with every field set, its times off UTC and with
// nanoseconds, so that a round trip shows both kept.
func sample(id string, lbls map[string]string) Sandbox {
	at := time.Date(2026, 11, 22, 11, 0, 0, 123456789, time.FixedZone("CET", 3600))
	return Sandbox{ID: id, Tenant: "t1", State: "running", Image: "ubuntu:24.04", Runtime: "native",
		Spec: json.RawMessage(`{"image":"ubuntu:24.04","env":{"A":"1"}}`), Labels: lbls,
		RuntimeState: json.RawMessage(`{"pid":7,"cgroup":"/berth/x"}`), Error: "",
		CreatedAt: at, UpdatedAt: at.Add(time.Nanosecond)}
}

// same compares sandboxes field by field, times by instant and location.
func same(t *testing.T, got, want Sandbox) {
	t.Helper()
	if got.ID != want.ID || got.Tenant != want.Tenant || got.State != want.State || got.Image != want.Image ||
		got.Runtime != want.Runtime || got.Error != want.Error || got.IDRange != want.IDRange ||
		string(got.Spec) != string(want.Spec) || string(got.RuntimeState) != string(want.RuntimeState) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	if !reflect.DeepEqual(got.Labels, want.Labels) && (len(got.Labels) != 0 || len(want.Labels) != 0) {
		t.Fatalf("labels %v, want %v", got.Labels, want.Labels)
	}
	for _, tm := range []struct {
		name      string
		got, want time.Time
	}{{"created", got.CreatedAt, want.CreatedAt}, {"updated", got.UpdatedAt, want.UpdatedAt}, {"stopped", got.StoppedAt, want.StoppedAt}} {
		if !tm.got.Equal(tm.want) || (!tm.got.IsZero() && tm.got.Location() != time.UTC) {
			t.Fatalf("%s at %v, want %v in UTC", tm.name, tm.got, tm.want)
		}
	}
}

func ids(list []Sandbox) string {
	var out []string
	for _, sb := range list {
		out = append(out, sb.ID)
	}
	return strings.Join(out, ",")
}

func TestOpenSettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dir with ?#% chars", "berth.db")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	s := open(t, path)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("the store is not at %s: %v", path, err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if err := s.CreateSandbox(t.Context(), sample("sb-1", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + "-wal"); err != nil { // SQLite has the file we made, not one of another name
		t.Errorf("no write-ahead log beside %s: %v", path, err)
	}
	for pragma, want := range map[string]string{
		"journal_mode": "wal", "busy_timeout": "5000", "foreign_keys": "1", "synchronous": "1", // 1 = NORMAL
		"user_version": fmt.Sprint(len(migrations())),
	} {
		var got string
		if err := s.w.QueryRowContext(t.Context(), "PRAGMA "+pragma).Scan(&got); err != nil || got != want {
			t.Errorf("PRAGMA %s = %q (%v), want %q", pragma, got, err, want)
		}
	}
	var index string
	err = s.r.QueryRowContext(t.Context(), `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'sandbox_labels' AND sql LIKE '%(key, value)%'`).Scan(&index)
	if err != nil {
		t.Errorf("no (key, value) index on sandbox_labels: %v", err)
	}
	if _, err := s.r.ExecContext(t.Context(), `DELETE FROM sandboxes`); err == nil {
		t.Error("a read connection could write")
	}
	if _, err := Open(t.Context(), filepath.Join(t.TempDir(), "missing", "berth.db")); err == nil {
		t.Error("Open in a missing directory succeeded")
	}
}

func TestRoundTrip(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	in := sample("sb-1", map[string]string{"thread_id": "conv-42", "berth.sh/owner": "a b=c,d"})
	in.IDRange = 7
	if err := s.CreateSandbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	same(t, got, in)
	if got.CreatedAt.Nanosecond() != 123456789 {
		t.Errorf("created_at lost its nanoseconds: %v", got.CreatedAt)
	}

	// Optional fields: no labels, no runtime state, no spec, zero times.
	bare := Sandbox{ID: "sb-bare", State: "creating"}
	before := time.Now()
	if err := s.CreateSandbox(ctx, bare); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetSandbox(ctx, "sb-bare")
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels != nil || got.RuntimeState != nil || got.Spec != nil || got.CreatedAt.Before(before.Add(-time.Second)) ||
		!got.UpdatedAt.Equal(got.CreatedAt) || !got.StoppedAt.IsZero() {
		t.Fatalf("bare sandbox: %+v", got)
	}

	// Updates.
	stopAt := time.Date(2026, 11, 22, 12, 0, 0, 1, time.UTC)
	if err := s.UpdateState(ctx, "sb-1", "stopped", "idle timeout", stopAt); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "sb-1")
	if got.State != "stopped" || got.Error != "idle timeout" || !got.StoppedAt.Equal(stopAt) || !got.UpdatedAt.Equal(stopAt) {
		t.Fatalf("after stop: %+v", got)
	}
	if err := s.UpdateState(ctx, "sb-1", "running", "", stopAt.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRuntimeState(ctx, "sb-1", json.RawMessage(`{"pid":8}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSpec(ctx, "sb-1", json.RawMessage(`{"image":"alpine"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetLabels(ctx, "sb-1", map[string]string{"a": "b"}); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "sb-1")
	if got.State != "running" || got.Error != "" || !got.StoppedAt.IsZero() || string(got.RuntimeState) != `{"pid":8}` ||
		string(got.Spec) != `{"image":"alpine"}` || !reflect.DeepEqual(got.Labels, map[string]string{"a": "b"}) ||
		!got.CreatedAt.Equal(in.CreatedAt) {
		t.Fatalf("after updates: %+v", got)
	}
	if err := s.SetRuntimeState(ctx, "sb-1", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SetLabels(ctx, "sb-1", nil); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.GetSandbox(ctx, "sb-1"); got.RuntimeState != nil || got.Labels != nil {
		t.Fatalf("after clearing: %+v", got)
	}

	// Delete, labels included.
	if err := s.SetLabels(ctx, "sb-1", map[string]string{"a": "b", "c": "d"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSandbox(ctx, "sb-1"); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM sandbox_labels WHERE sandbox_id = 'sb-1'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d label rows left after delete (%v)", n, err)
	}
}

func TestErrorClasses(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	in := sample("sb-1", map[string]string{"k": "v"})
	in.IDRange = 7
	if err := s.CreateSandbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	dup := sample("sb-1", map[string]string{"other": "x"})
	err := s.CreateSandbox(ctx, dup)
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), `"sb-1"`) {
		t.Fatalf("duplicate create: %v, want already_exists naming sb-1", err)
	}
	if got, _ := s.GetSandbox(ctx, "sb-1"); !reflect.DeepEqual(got.Labels, in.Labels) {
		t.Fatalf("a failed create changed the labels: %v", got.Labels)
	}
	missing := map[string]error{}
	_, missing["get"] = s.GetSandbox(ctx, "sb-none")
	_, missing["status"] = s.GetStatus(ctx, "sb-none")
	missing["update state"] = s.UpdateState(ctx, "sb-none", "error", "x", time.Now())
	missing["runtime state"] = s.SetRuntimeState(ctx, "sb-none", json.RawMessage(`{}`))
	missing["spec"] = s.SetSpec(ctx, "sb-none", json.RawMessage(`{}`))
	missing["labels"] = s.SetLabels(ctx, "sb-none", map[string]string{"a": "b"})
	missing["delete"] = s.DeleteSandbox(ctx, "sb-none")
	missing["replace"] = s.ReplaceSandbox(ctx, "pooled", sample("sb-none", nil))
	for op, err := range missing {
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), `"sb-none"`) {
			t.Errorf("%s of a missing sandbox: %v, want not_found naming sb-none", op, err)
		}
	}
	taken := sample("sb-2", nil)
	taken.IDRange = in.IDRange
	if err := s.CreateSandbox(ctx, taken); !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "id range 7") {
		t.Errorf("create with another sandbox's id range: %v, want already_exists naming it", err)
	}
	for _, id := range []string{"sb-shared-1", "sb-shared-2"} { // range 0 is shared
		shared := sample(id, nil)
		shared.IDRange = 0
		if err := s.CreateSandbox(ctx, shared); err != nil {
			t.Errorf("create in range 0: %v", err)
		}
	}
	if err := s.CreateSandbox(ctx, Sandbox{State: "running"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("create without id: %v, want invalid_argument", err)
	}
	far := sample("sb-far", nil)
	far.CreatedAt = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.CreateSandbox(ctx, far); !errdefs.IsInvalidArgument(err) {
		t.Errorf("create in the year 3000: %v, want invalid_argument", err)
	}
	if _, err := Open(ctx, ""); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Open(\"\"): %v, want invalid_argument", err)
	}
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM sandbox_labels`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d label rows (%v), want 1: failed writes left rows behind", n, err)
	}
}

func TestReplaceSandbox(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	pooled := sample("sb-p", map[string]string{"pool": "1"})
	pooled.State, pooled.Tenant, pooled.IDRange = "pooled", "", 3
	if err := s.CreateSandbox(ctx, pooled); err != nil {
		t.Fatal(err)
	}
	claimed := sample("sb-p", map[string]string{"thread_id": "7"})
	claimed.Tenant, claimed.Image = "t9", "alpine"
	claimed.CreatedAt = claimed.CreatedAt.Add(time.Hour)
	claimed.UpdatedAt = claimed.CreatedAt
	claimed.RuntimeState = json.RawMessage(`{"ignored":true}`)
	claimed.IDRange = 99
	if err := s.ReplaceSandbox(ctx, "pooled", claimed); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sb-p")
	if err != nil {
		t.Fatal(err)
	}
	want := claimed
	want.RuntimeState, want.IDRange = pooled.RuntimeState, pooled.IDRange // kept
	same(t, got, want)
	if err := s.ReplaceSandbox(ctx, "pooled", claimed); !errdefs.IsNotFound(err) {
		t.Fatalf("second hand-over: %v, want not_found", err)
	}
}

func TestListBySelector(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, sb := range []struct {
		id, tenant string
		labels     map[string]string
	}{
		{"sb-a", "t1", map[string]string{"thread_id": "1", "env": "prod"}},
		{"sb-b", "t1", map[string]string{"thread_id": "2", "env": "dev"}},
		{"sb-c", "t2", nil},
		{"sb-d", "t2", map[string]string{"env": "prod", "berth.sh/team": "ml"}},
	} {
		rec := sample(sb.id, sb.labels)
		rec.Tenant = sb.tenant
		// sb-c and sb-d share a creation time: id breaks the tie.
		rec.CreatedAt = base.Add(time.Duration(min(i, 2)) * time.Nanosecond)
		if err := s.CreateSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ tenant, sel, want string }{
		{"", "", "sb-a,sb-b,sb-c,sb-d"},
		{"", "thread_id=1", "sb-a"},
		{"", "env=prod", "sb-a,sb-d"},
		{"", "env!=prod", "sb-b,sb-c"},
		{"", "thread_id", "sb-a,sb-b"},
		{"", "!thread_id", "sb-c,sb-d"},
		{"", "!env", "sb-c"},
		{"", "env=prod,!thread_id", "sb-d"},
		{"", "thread_id,env!=dev", "sb-a"},
		{"", "berth.sh/team=ml", "sb-d"},
		{"", "env=staging", ""},
		{"", "thread_id=1,thread_id=2", ""},
		{"t1", "", "sb-a,sb-b"},
		{"t2", "env", "sb-d"},
		{"t2", "!env", "sb-c"},
		{"t3", "", ""},
	} {
		sel, err := labels.ParseSelector(tc.sel)
		if err != nil {
			t.Fatal(err)
		}
		list, err := s.ListSandboxes(ctx, tc.tenant, sel)
		if err != nil {
			t.Fatal(err)
		}
		if list == nil {
			t.Errorf("tenant %q selector %q: nil slice", tc.tenant, tc.sel)
		}
		if got := ids(list); got != tc.want {
			t.Errorf("tenant %q selector %q: %s, want %s", tc.tenant, tc.sel, got, tc.want)
		}
		for _, sb := range list {
			if !sel.Matches(sb.Labels) {
				t.Errorf("selector %q: %s listed with labels %v", tc.sel, sb.ID, sb.Labels)
			}
		}
	}
	list, _ := s.ListSandboxes(ctx, "", labels.Selector{})
	if len(list) != 4 || !reflect.DeepEqual(list[3].Labels, map[string]string{"env": "prod", "berth.sh/team": "ml"}) || list[2].Labels != nil {
		t.Errorf("labels in the list: %+v", list)
	}
	same(t, list[0], func() Sandbox {
		w := sample("sb-a", map[string]string{"thread_id": "1", "env": "prod"})
		w.CreatedAt = base
		return w
	}())

	// A selector too long for SQL is applied in Go, with the same result.
	var terms []string
	for i := range sqlSelectorMax + 1 {
		terms = append(terms, fmt.Sprintf("!absent%d", i))
	}
	long, err := labels.ParseSelector(strings.Join(append(terms, "env=prod"), ","))
	if err != nil {
		t.Fatal(err)
	}
	if list, err := s.ListSandboxes(ctx, "", long); err != nil || ids(list) != "sb-a,sb-d" {
		t.Errorf("long selector: %s, %v; want sb-a,sb-d", ids(list), err)
	}
}

func TestConcurrentWriters(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("sb-%02d", i)
			errs <- s.CreateSandbox(ctx, sample(id, map[string]string{"n": fmt.Sprint(i), "group": fmt.Sprint(i % 2)}))
			errs <- s.UpdateState(ctx, id, "stopped", "", time.Now())
			if _, err := s.ListSandboxes(ctx, "", labels.SelectorFromMap(map[string]string{"group": "1"})); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err) // SQLITE_BUSY would show here
		}
	}
	list, err := s.ListSandboxes(ctx, "", labels.Selector{})
	if err != nil || len(list) != n {
		t.Fatalf("%d rows (%v), want %d", len(list), err, n)
	}
	for _, sb := range list {
		if sb.State != "stopped" || len(sb.Labels) != 2 {
			t.Fatalf("row %+v", sb)
		}
	}
}

func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	ctx := t.Context()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	in := sample("sb-1", map[string]string{"thread_id": "42"})
	if err := s.CreateSandbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // migrations are idempotent: reopening applies none twice
		s = open(t, path)
		got, err := s.GetSandbox(ctx, "sb-1")
		if err != nil {
			t.Fatal(err)
		}
		same(t, got, in)
		var version int
		if err := s.r.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil || version != len(migrations()) {
			t.Fatalf("user_version %d (%v), want %d", version, err, len(migrations()))
		}
		s.Close()
	}

	// A file from a newer berth is refused rather than misread.
	s = open(t, path)
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations())+1)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(ctx, path); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("opening a newer schema: %v", err)
	}
}

func TestMigratesOldSchema(t *testing.T) {
	// A file at schema version 1 (before stopped_at and id_range) gains
	// the columns and keeps its rows, in the id range sandboxes shared.
	path := filepath.Join(t.TempDir(), "berth.db")
	ctx := t.Context()
	s := open(t, path)
	if _, err := s.w.ExecContext(ctx, `DROP TABLE tenant_usage; DROP TABLE quotas; DROP TABLE audit; DROP TABLE api_keys; DROP TABLE snapshots; DROP TABLE build_cache; DROP TABLE layers; DROP TABLE image_names; DROP TABLE images; DROP TABLE egress; DROP TABLE sandbox_ca; DROP TABLE secrets; DROP TABLE sandbox_labels; DROP TABLE sandboxes; PRAGMA user_version = 0;`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, migrations()[0]+`; PRAGMA user_version = 1;
		INSERT INTO sandboxes (id, state, image, runtime, spec, created_at, updated_at) VALUES ('old', 'running', 'i', 'native', '{}', 5, 6);`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path)
	got, err := s.GetSandbox(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "running" || !got.StoppedAt.IsZero() || got.CreatedAt.UnixNano() != 5 || got.UpdatedAt.UnixNano() != 6 ||
		got.IDRange != 0 {
		t.Fatalf("migrated row: %+v", got)
	}
}

func TestGetStatusFollowsState(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	in := sample("sb-1", nil)
	in.Tenant = "team-a"
	if err := s.CreateSandbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	st, err := s.GetStatus(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if st != in.Status() {
		t.Fatalf("status %+v, want %+v", st, in.Status())
	}
	if err := s.UpdateState(ctx, "sb-1", "error", "guest gone", time.Now()); err != nil {
		t.Fatal(err)
	}
	st, err = s.GetStatus(ctx, "sb-1")
	if err != nil || st.State != "error" || st.Error != "guest gone" || st.Tenant != "team-a" {
		t.Fatalf("after an update: %+v, %v", st, err)
	}
}
