package server

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/berthsh/berth/api"
)

// TestRoutesMatchOpenAPI checks that the server serves exactly the
// operations api/openapi.yaml documents.
func TestRoutesMatchOpenAPI(t *testing.T) {
	documented, err := api.Routes()
	if err != nil {
		t.Fatal(err)
	}
	var doc []string
	for _, r := range documented {
		doc = append(doc, r.Method+" "+r.Path)
	}
	var served []string
	for _, r := range New(Config{Log: slog.New(slog.DiscardHandler)}, API(nil, nil)).Routes() {
		served = append(served, r.Method+" "+r.Pattern)
	}
	slices.Sort(doc)
	slices.Sort(served)
	for _, r := range served {
		if !slices.Contains(doc, r) {
			t.Errorf("served but not documented: %s", r)
		}
	}
	for _, r := range doc {
		if !slices.Contains(served, r) {
			t.Errorf("documented but not served: %s", r)
		}
	}
}
