package store

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/errdefs"
)

func TestSnapshots(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	img := Image{ID: "sha256:img", Config: json.RawMessage(`{}`), Layers: []string{"sha256:l1"}, Source: "x", CreatedAt: time.Now()}
	if err := s.PutImage(ctx, "", img, []string{"base:1"}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 24, 9, 0, 0, 7, time.UTC)
	sn := Snapshot{ID: "snap-1", Tenant: "t1", Name: "prepared", Sandbox: "sb-1", Base: img.ID, Image: "base:1",
		Layers: []string{"snapshot:aa"}, Size: 42, Labels: map[string]string{"k": "v"}, Frozen: 3 * time.Millisecond, CreatedAt: at}
	if err := s.PutSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	got, err := s.SnapshotByName(ctx, "t1", "prepared")
	if err != nil || got.ID != "snap-1" || got.Base != img.ID || got.Layers[0] != "snapshot:aa" || got.Labels["k"] != "v" ||
		got.Frozen != 3*time.Millisecond || !got.CreatedAt.Equal(at) || string(got.Config) != "{}" {
		t.Fatalf("by name: %+v %v", got, err)
	}
	if _, err := s.SnapshotByName(ctx, "t2", "prepared"); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant's name: %v", err)
	}
	dup := sn
	dup.ID = "snap-2"
	if err := s.PutSnapshot(ctx, dup); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second snapshot of the name: %v", err)
	}
	dup.Tenant = "t2" // names are per tenant
	if err := s.PutSnapshot(ctx, dup); err != nil {
		t.Fatal(err)
	}
	anon := Snapshot{ID: "snap-3", Tenant: "t1", Sandbox: "sb-1", Base: "host", Image: "host", Layers: []string{"snapshot:bb"}, CreatedAt: at}
	if err := s.PutSnapshot(ctx, anon); err != nil {
		t.Fatal(err)
	}
	if list, err := s.ListSnapshots(ctx, "t1"); err != nil || len(list) != 1 || list[0].ID != "snap-1" {
		t.Fatalf("list (named only): %+v %v", list, err)
	}
	layers, err := s.SnapshotLayers(ctx)
	if err != nil || !layers["snapshot:aa"] || !layers["snapshot:bb"] || len(layers) != 2 {
		t.Fatalf("layers: %v %v", layers, err)
	}
	// The base image and the snapshot in use stay.
	if err := s.DeleteImage(ctx, img.ID); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "snapshot prepared") {
		t.Fatalf("delete of a snapshot's base: %v", err)
	}
	user := sample("sb-2", nil)
	user.ImageID = "snap-1"
	if err := s.CreateSandbox(ctx, user); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(ctx, "snap-1"); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "sb-2") {
		t.Fatalf("delete of a snapshot in use: %v", err)
	}
	user3 := sample("sb-3", nil)
	user3.ImageID = "snap-3"
	if err := s.CreateSandbox(ctx, user3); err != nil {
		t.Fatal(err)
	}
	if gone, err := s.DeleteUnusedSnapshot(ctx, "snap-3"); err != nil || gone {
		t.Fatalf("a fork's snapshot in use: %v %v", gone, err)
	}
	if err := s.DeleteSandbox(ctx, "sb-3"); err != nil {
		t.Fatal(err)
	}
	if gone, err := s.DeleteUnusedSnapshot(ctx, "snap-3"); err != nil || !gone {
		t.Fatalf("a fork's snapshot unused: %v %v", gone, err)
	}
	if gone, err := s.DeleteUnusedSnapshot(ctx, "snap-1"); err != nil || gone {
		t.Fatalf("a named snapshot is not a fork's: %v %v", gone, err)
	}
	if err := s.DeleteSandbox(ctx, "sb-2"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"snap-1", "snap-2"} {
		if err := s.DeleteSnapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteSnapshot(ctx, "snap-1"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
	if err := s.DeleteImage(ctx, img.ID); err != nil {
		t.Fatal(err)
	}
}
