package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/berthsh/berth/errdefs"
)

func TestSecrets(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	if err := s.CreateSecret(ctx, Secret{Tenant: "t1", Name: "openai", Value: []byte("sk-1")}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSecret(ctx, Secret{Tenant: "t1", Name: "openai", Value: []byte("sk-2")}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second create: %v", err)
	}
	if err := s.CreateSecret(ctx, Secret{Tenant: "t2", Name: "openai", Value: []byte("other")}); err != nil {
		t.Fatalf("the same name for another tenant: %v", err)
	}
	if err := s.UpdateSecret(ctx, "t1", "openai", []byte("sk-3")); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSecret(ctx, "t1", "openai")
	if err != nil || string(got.Value) != "sk-3" || got.UpdatedAt.Before(got.CreatedAt) {
		t.Fatalf("get: %+v %v", got, err)
	}
	list, err := s.ListSecrets(ctx, "t1")
	if err != nil || len(list) != 1 || list[0].Name != "openai" || list[0].Value != nil {
		t.Fatalf("list (no values): %+v %v", list, err)
	}
	if err := s.DeleteSecret(ctx, "t1", "openai"); err != nil {
		t.Fatal(err)
	}
	for op, err := range map[string]error{
		"get":    func() error { _, err := s.GetSecret(ctx, "t1", "openai"); return err }(),
		"update": s.UpdateSecret(ctx, "t1", "openai", []byte("x")),
		"delete": s.DeleteSecret(ctx, "t1", "openai"),
	} {
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), `"openai"`) {
			t.Errorf("%s of a deleted secret: %v", op, err)
		}
	}
	if got, _ := s.GetSecret(ctx, "t2", "openai"); string(got.Value) != "other" {
		t.Fatal("deleting t1's secret touched t2's")
	}
}

func TestEgressAndCA(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	if err := s.CreateSandbox(ctx, sample("sb-1", nil)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutCA(ctx, "sb-none", []byte("c"), []byte("k")); !errdefs.IsNotFound(err) {
		t.Fatalf("CA of a missing sandbox: %v", err)
	}
	if err := s.PutCA(ctx, "sb-1", []byte("c"), []byte("k")); err != nil {
		t.Fatal(err)
	}
	if c, k, err := s.GetCA(ctx, "sb-1"); err != nil || string(c) != "c" || string(k) != "k" {
		t.Fatalf("CA: %q %q %v", c, k, err)
	}
	var entries []EgressEntry
	for i := int64(1); i <= EgressKept+5; i++ {
		entries = append(entries, EgressEntry{Sandbox: "sb-1", Seq: i, Allowed: i%2 == 0,
			Record: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i))})
	}
	entries = append(entries, EgressEntry{Sandbox: "sb-gone", Seq: 1, Record: json.RawMessage(`{}`)})
	if err := s.AppendEgress(ctx, entries); err != nil {
		t.Fatal(err)
	}
	if last, err := s.LastEgressSeq(ctx, "sb-1"); err != nil || last != EgressKept+5 {
		t.Fatalf("last seq %d %v", last, err)
	}
	all, err := s.ListEgress(ctx, "sb-1", EgressQuery{})
	if err != nil || len(all) != 1000 || string(all[0]) != `{"seq":6}` {
		t.Fatalf("first page: %d records, first %s (%v): want the oldest 5 trimmed", len(all), all[0], err)
	}
	denied, err := s.ListEgress(ctx, "sb-1", EgressQuery{After: EgressKept, DeniedOnly: true})
	if err != nil || len(denied) != 3 || string(denied[0]) != fmt.Sprintf(`{"seq":%d}`, EgressKept+1) {
		t.Fatalf("denied after %d: %s %v", EgressKept, denied, err)
	}
	if err := s.DeleteSandbox(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if rest, _ := s.ListEgress(ctx, "sb-1", EgressQuery{}); len(rest) != 0 {
		t.Fatal("records outlived their sandbox")
	}
	if _, _, err := s.GetCA(ctx, "sb-1"); !errdefs.IsNotFound(err) {
		t.Fatal("the CA outlived its sandbox")
	}
}
