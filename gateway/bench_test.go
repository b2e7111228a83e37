package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// benchGateway is a gateway over a database of the benchmark's own that dispatches nothing, serving its
// handler in-process: what the benchmarks below measure is the gateway's own work per request (routing,
// authentication, parsing, the statement, the answer) without a network in between, so that
// `-cpuprofile` shows where a request's CPU goes.
func benchGateway(b *testing.B) http.Handler {
	b.Helper()
	cfg := &Config{DatabaseURL: pgtest.Database(b), Listen: "127.0.0.1:0",
		Tenants: map[string]Tenant{"acme": {APIKeys: []string{acmeKey},
			Rate: RateLimit{RequestsPerSecond: Unlimited, BytesPerSecond: Unlimited}}}}
	cfg.Dispatcher.Disabled = true
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		b.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(g.Close)
	if err := g.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return g.Handler()
}

func benchPost(b *testing.B, h http.Handler, key string) int {
	r := httptest.NewRequest("POST", "/v1/effects", strings.NewReader(`{"type":"analytics","payload":{"name":"signup","properties":{"user":42}}}`))
	r.Header.Set("Authorization", "Bearer "+acmeKey)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusAccepted && w.Code != http.StatusOK {
		b.Fatalf("%s: %d %s", key, w.Code, w.Body)
	}
	return w.Code
}

// BenchmarkReplay repeats one of 1,000 keys already used: the path that writes nothing.
func BenchmarkReplay(b *testing.B) {
	h := benchGateway(b)
	for i := range 1000 {
		benchPost(b, h, fmt.Sprintf("k-%d", i))
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			benchPost(b, h, fmt.Sprintf("k-%d", n.Add(1)%1000))
		}
	})
}

// BenchmarkAccept records a new effect per request.
func BenchmarkAccept(b *testing.B) {
	h := benchGateway(b)
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			benchPost(b, h, fmt.Sprintf("new-%d", n.Add(1)))
		}
	})
}
