package server_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/auth"
	"github.com/berthsh/berth/server"
	"github.com/berthsh/berth/store"
)

// pingGroup is one route that does nothing, so that a request's cost is
// the edge's own.
type pingGroup struct{}

func (pingGroup) Name() string { return "ping" }
func (pingGroup) Routes(r *server.Router) {
	r.Handle("GET /v1/ping/{id}", func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

// BenchmarkEdgeAuth is what authentication adds to a request at the edge:
// the same route served without keys (--insecure-no-auth) and with a key
// among 1,000, in process (no network), reporting each one's median and
// p99. The difference of the medians is the check's cost.
//
//	go test -run '^$' -bench EdgeAuth -benchtime 200000x ./server/
func BenchmarkEdgeAuth(b *testing.B) {
	st, err := store.Open(b.Context(), filepath.Join(b.TempDir(), "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	keys, err := auth.NewKeyring(b.Context(), st, nil)
	if err != nil {
		b.Fatal(err)
	}
	var key string
	for i := range 1000 {
		k, err := keys.Create(b.Context(), api.CreateAPIKeyRequest{Tenant: "t" + string(rune('a'+i%26))})
		if err != nil {
			b.Fatal(err)
		}
		key = k.Key
	}
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name string
		cfg  server.Config
		key  string
	}{
		{"no-auth", server.Config{Log: log}, ""},
		{"key", server.Config{Log: log, Authenticate: keys.Authenticate}, key},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := server.New(tc.cfg, pingGroup{})
			req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:7680/v1/ping/sb-1", nil)
			var durs []time.Duration
			b.ReportAllocs()
			for b.Loop() {
				r := req.Clone(req.Context())
				if tc.key != "" {
					r.Header.Set("Authorization", "Bearer "+tc.key)
				}
				w := httptest.NewRecorder()
				t0 := time.Now()
				h.ServeHTTP(w, r)
				durs = append(durs, time.Since(t0))
				if w.Code != http.StatusNoContent {
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
			slices.Sort(durs)
			b.ReportMetric(float64(durs[len(durs)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(durs[len(durs)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}
