package server_test

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/ports"
	"github.com/berthsh/berth/server"
)

// TestRoutesMatchOpenAPI checks that the daemon's groups (the API and the
// port proxy) serve exactly the operations api/openapi.yaml documents. A
// route for any method (a relay) is documented by one operation at its
// path, which ends in a {path} parameter where the pattern ends in "/".
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
	srv := server.New(server.Config{Log: slog.New(slog.DiscardHandler)}, server.API(nil, nil), server.ImagesAPI(nil, nil), server.TemplatesAPI(nil, nil), server.KeysAPI(nil, nil), server.TenantsAPI(nil), ports.New(ports.Config{}, nil))
	for _, r := range srv.Routes() {
		if r.Method != "" {
			// A {name...} wildcard is one path parameter to OpenAPI.
			served = append(served, r.Method+" "+strings.ReplaceAll(r.Pattern, "...}", "}"))
			continue
		}
		path := r.Pattern
		if strings.HasSuffix(path, "/") {
			path += "{path}"
		}
		i := slices.IndexFunc(doc, func(d string) bool { return strings.HasSuffix(d, " "+path) })
		if i < 0 {
			t.Errorf("served but not documented: any method at %s", r.Pattern)
			continue
		}
		served = append(served, doc[i])
	}
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
