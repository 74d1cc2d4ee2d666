package store

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/errdefs"
)

// TestImageNamesArePerTenant: a name is unique per tenant, so two tenants'
// one name points at two images; a tenant resolves its own name first,
// then the operator's; another tenant's is not_found.
func TestImageNamesArePerTenant(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	for _, c := range []struct{ tenant, id, name string }{
		{"", "sha256:op", "app:1"},
		{"a", "sha256:aa", "app:1"},
		{"b", "sha256:bb", "mine:1"},
	} {
		if err := s.PutImage(ctx, c.tenant, Image{ID: c.id, Config: []byte("{}"), CreatedAt: time.Now()}, []string{c.name}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ tenant, name, id, owner string }{
		{"", "app:1", "sha256:op", ""},
		{"a", "app:1", "sha256:aa", "a"},
		{"b", "app:1", "sha256:op", ""},
		{"b", "mine:1", "sha256:bb", "b"},
	} {
		img, owner, err := s.ImageByName(ctx, c.tenant, c.name)
		if err != nil || img.ID != c.id || owner != c.owner {
			t.Errorf("tenant %q: %s: %s of %q, %v; want %s of %q", c.tenant, c.name, img.ID, owner, err, c.id, c.owner)
		}
	}
	for _, tenant := range []string{"", "a", "c"} {
		if _, _, err := s.ImageByName(ctx, tenant, "mine:1"); !errdefs.IsNotFound(err) {
			t.Errorf("tenant %q finds b's name: %v", tenant, err)
		}
	}
	for _, c := range []struct {
		tenant, id string
		want       bool
	}{
		{"", "sha256:bb", true}, {"a", "sha256:op", true}, {"a", "sha256:aa", true},
		{"a", "sha256:bb", false}, {"c", "sha256:aa", false}, {"", "sha256:none", false},
	} {
		if got, err := s.ImageVisible(ctx, c.tenant, c.id); err != nil || got != c.want {
			t.Errorf("tenant %q sees %s: %v, %v", c.tenant, c.id, got, err)
		}
	}
	if imgs, err := s.ListImages(ctx, "a"); err != nil || len(imgs) != 2 {
		t.Errorf("a lists %d images (%v), want its own and the operator's", len(imgs), err)
	}
	if err := s.Untag(ctx, "b", "app:1"); !errdefs.IsNotFound(err) {
		t.Errorf("b untags others' name: %v", err)
	}
	if err := s.Untag(ctx, "a", "app:1"); err != nil {
		t.Fatal(err)
	}
	if img, _, err := s.ImageByName(ctx, "a", "app:1"); err != nil || img.ID != "sha256:op" {
		t.Errorf("after a's untag, a resolves %s, %v; want the operator's", img.ID, err)
	}
}

// TestImageNamesMigrateToTheOperator: the names of a store from before
// tenants had images become the operator's.
func TestImageNamesMigrateToTheOperator(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	ctx := t.Context()
	s := open(t, path)
	rows, err := s.w.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		tables = append(tables, n)
	}
	rows.Close()
	if _, err := s.w.ExecContext(ctx, `PRAGMA foreign_keys = OFF`); err != nil {
		t.Fatal(err)
	}
	for _, n := range tables {
		if _, err := s.w.ExecContext(ctx, `DROP TABLE `+n); err != nil {
			t.Fatal(err)
		}
	}
	ms := migrations()
	before := -1
	for i, m := range ms {
		if strings.Contains(m, "CREATE TABLE image_names_by_tenant") {
			before = i
		}
	}
	if before < 0 {
		t.Fatal("no image_names_by_tenant migration")
	}
	for _, m := range ms[:before] {
		if _, err := s.w.ExecContext(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d; PRAGMA foreign_keys = ON;
		INSERT INTO images (id, config, layers, size, source, created_at) VALUES ('sha256:old', '{}', '[]', 0, 'old', 1);
		INSERT INTO image_names (name, image_id) VALUES ('old:1', 'sha256:old');`, before)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path)
	img, owner, err := s.ImageByName(ctx, "team", "old:1")
	if err != nil || img.ID != "sha256:old" || owner != "" {
		t.Fatalf("a migrated name: %s of %q, %v; want the operator's sha256:old", img.ID, owner, err)
	}
	if len(img.Names) != 1 || img.Names[0] != (ImageName{Tenant: "", Name: "old:1"}) {
		t.Errorf("migrated names %+v", img.Names)
	}
}
