package audit

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/store"
)

// TestOneTenantCannotPushOutAnother: the table is bounded per tenant, so
// a tenant (or the operator) that makes many calls trims only its own
// oldest records: another tenant's, and the operator's, stay; a log
// opened again over the same table keeps counting from what is there.
func TestOneTenantCannotPushOutAnother(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const keep = 20
	rec := func(tenant string, i int) api.AuditRecord {
		return api.AuditRecord{At: time.Now(), Tenant: tenant, Method: "POST", Route: "/v1/sandboxes", Path: fmt.Sprintf("/v1/sandboxes/%d", i), Status: 201}
	}
	l := New(st, slog.New(slog.DiscardHandler), keep)
	for i := range 5 {
		l.Audit(rec("victim", i))
		l.Audit(rec("", i))
	}
	l.flush(ctx)
	for round := range 2 {
		if round == 1 {
			l.Close()
			l = New(st, slog.New(slog.DiscardHandler), keep)
		}
		for i := range 500 {
			l.Audit(rec("flooder", i))
			if i%50 == 0 {
				l.flush(ctx) // several batches
			}
		}
		for tenant, want := range map[string]int{"victim": 5, "": 5} {
			got, err := l.List(ctx, tenant, false, "", 0, 10000)
			if err != nil || len(got) != want {
				t.Fatalf("round %d: tenant %q after another's flood: %d records, %v", round, tenant, len(got), err)
			}
		}
		got, err := l.List(ctx, "flooder", false, "", 0, 10000)
		if err != nil || len(got) < keep || len(got) > 2*keep || got[len(got)-1].Path != "/v1/sandboxes/499" {
			t.Fatalf("round %d: the flooder keeps %d records (bound %d), %v", round, len(got), keep, err)
		}
	}
	l.Close()
}
