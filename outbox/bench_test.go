package outbox

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/providers/webhook"
)

// BenchmarkWebhookDeliveries drains b.N signed webhooks to a local receiver through one dispatcher set up as
// a gateway sets it up (group commit, the attempt log): claim, payload read, signed POST, outcome, attempt.
// Its ns/op and allocs/op are the whole process's per delivery, the receiver's included; Postgres's share is
// not in them. `scripts/bench gateway` measures the same path in a gateway process, CPU split by process.
//
//	go test ./outbox -run '^$' -bench WebhookDeliveries -benchtime 20000x
func BenchmarkWebhookDeliveries(b *testing.B) {
	pool := pgtest.Pool(b, pgtest.Database(b))
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	p, err := webhook.New(webhook.Config{URL: srv.URL + "/hook", Secret: testSecret, AllowPrivateNetworks: true})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	// As the gateway writes them: effect and outbox row, which names the destination and the tenant.
	if _, err := pool.Exec(ctx, `WITH e AS (
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
		SELECT 'bench', 'h' || g, 'hook', '\x00',
			'{"event":"order.paid","data":{"order":42,"total":"19.99"}}'::json, 'eff_h' || g
		FROM generate_series(1, $1) g
		RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, destination, tenant) SELECT id, type, $2, tenant FROM e`,
		b.N, srv.URL); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE oncegate_outbox`); err != nil {
		b.Fatal(err)
	}
	d, err := New(pool, Config{PollInterval: 50 * time.Millisecond, Logger: quietLog(),
		Attempts: dedup.NewAttemptLog(pool, time.Hour, quietLog()),
		Types:    []EffectType{{Name: "hook", Provider: p, Concurrency: 64, TenantConcurrency: 64}}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	runCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { _ = d.Run(runCtx); close(stopped) }()
	for pgtest.Count(b, pool, `SELECT count(*) FROM oncegate_outbox`) > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	cancel()
	<-stopped
	if n := got.Load(); n != int64(b.N) {
		b.Fatalf("the receiver got %d webhooks for %d effects", n, b.N)
	}
}
