package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/internal/workers"
	"github.com/oncegate/oncegate/providers/postgres"
)

func (f *fixture) createClick(key, payload string) {
	f.t.Helper()
	if _, _, err := f.store.Create(context.Background(), dedup.NewEffect{Tenant: "t", Key: key, Type: "clicks",
		Payload: json.RawMessage(payload)}); err != nil {
		f.t.Fatal(err)
	}
}

// txCounter counts the transactions a pool's connections commit: a statement sent outside a transaction is
// one, and so is an explicit COMMIT.
type txCounter struct{ commits atomic.Int64 }

func (c *txCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	switch sql := strings.ToLower(strings.TrimSpace(d.SQL)); {
	case sql == "commit":
		c.commits.Add(1)
	case sql == "begin" || strings.HasPrefix(sql, "begin "):
	case conn.PgConn().TxStatus() == 'I':
		c.commits.Add(1)
	}
	return ctx
}
func (c *txCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func analyticsProvider(t *testing.T, table string) *postgres.Provider {
	t.Helper()
	p, err := postgres.New(postgres.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue 14: the postgres provider delivered a third of what the gateway accepts, because every delivery was a
// transaction of its own and paid a commit. Rows claimed together now commit together: each effect still gets
// exactly one event, and its result names that event's row.
func TestPostgresDeliveriesCommitTogether(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n = 300
	for i := range n {
		f.createClick(fmt.Sprintf("k%03d", i), fmt.Sprintf(`{"name":"click","properties":{"i":%d}}`, i))
	}
	var counter txCounter
	pool := pgtest.TracedPool(t, f.pool.Config().ConnString(), &counter)
	attempts := dedup.NewAttemptLog(f.pool, time.Hour, quietLog())
	d, err := New(pool, Config{PollInterval: 50 * time.Millisecond, Logger: quietLog(), Attempts: attempts,
		Types: []EffectType{{Name: "clicks", Provider: analyticsProvider(t, ""), Concurrency: 64, TenantConcurrency: 64}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = d.Run(ctx); close(stopped) }()
	testenv.Eventually(t, 30*time.Second, "every click delivered", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`) == n
	})
	cancel()
	<-stopped
	commits := counter.commits.Load()
	if err := attempts.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effect_attempts WHERE outcome = 'delivered'
		AND destination = 'analytics_events'`); got != n {
		t.Fatalf("%d delivered attempts to the analytics table in the operator's log for %d deliveries", got, n)
	}
	if got := pgtest.Count(t, f.pool, `SELECT count(*) FROM analytics_events`); got != n {
		t.Fatalf("%d events for %d effects", got, n)
	}
	mismatched := pgtest.Count(t, f.pool, `
		SELECT count(*) FROM oncegate_effects e
		LEFT JOIN analytics_events a ON a.effect_id = e.stable_id
		WHERE a.id IS NULL OR (e.result->>'event_id')::bigint <> a.id
		   OR (a.properties->>'i')::int <> substr(e.key, 2)::int`)
	if mismatched != 0 {
		t.Fatalf("%d effects whose result does not name their own event", mismatched)
	}
	// One transaction per delivery would be n commits at least; a batch is a claim and a delivery.
	if commits >= n/2 {
		t.Fatalf("%d commits for %d deliveries: rows claimed together did not commit together", commits, n)
	}
	t.Logf("%d deliveries in %d commits", n, commits)
}

// A row the batch statement cannot insert must fail by itself: the batch rolls back and each row is delivered
// alone, so the others are delivered and the row at fault is failed with Postgres's reason.
func TestOneRowPostgresRefusesFailsAloneInItsBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.pool.Exec(context.Background(), `CREATE TABLE short_events (id bigserial PRIMARY KEY,
		tenant text NOT NULL, key text NOT NULL, name varchar(8) NOT NULL, properties jsonb,
		occurred_at timestamptz NOT NULL, effect_id text UNIQUE)`); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		name := "ok"
		if i == 7 {
			name = "much-longer-than-eight"
		}
		f.createClick(fmt.Sprintf("k%02d", i), fmt.Sprintf(`{"name":%q}`, name))
	}
	f.run(EffectType{Name: "clicks", Provider: analyticsProvider(t, "short_events"), Concurrency: 64,
		TenantConcurrency: 64})
	bad := f.waitStatus("k07", effect.StatusFailed)
	if bad.LastError == nil || !strings.Contains(*bad.LastError, "too long") {
		t.Fatalf("the refused row's error does not say why: %v", deref(bad.LastError))
	}
	for i := range 20 {
		if i != 7 {
			f.waitStatus(fmt.Sprintf("k%02d", i), effect.StatusDelivered)
		}
	}
	if got := pgtest.Count(t, f.pool, `SELECT count(*) FROM short_events`); got != 19 {
		t.Fatalf("%d events, want 19", got)
	}
}

// A batch writes nothing for a row whose lease another dispatcher took meanwhile (its lease ran out while
// this one was slow): that row is the other's to deliver and record, and writing its event here would
// commit an effect that this dispatcher cannot record.
func TestBatchWritesNothingForALostLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for i := range 3 {
		f.createClick(fmt.Sprintf("k%d", i), `{"name":"click"}`)
	}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "clicks", Provider: analyticsProvider(t, ""),
		Concurrency: 8, TenantConcurrency: 8}}})
	rows, err := f.store.Claim(context.Background(), dedup.ClaimParams{Type: "clicks", Limit: 3, Owner: "a",
		Lease: time.Minute})
	if err != nil || len(rows) != 3 {
		t.Fatalf("claimed %d rows: %v", len(rows), err)
	}
	stolen := rows[1]
	if _, err := f.pool.Exec(context.Background(),
		`UPDATE oncegate_outbox SET lease_token = gen_random_uuid(), lease_owner = 'b' WHERE effect_id = $1`,
		stolen.EffectID); err != nil {
		t.Fatal(err)
	}
	et := d.types[0]
	for _, r := range rows {
		et.admit(r.Tenant, false)
		et.inflight.Add(1)
	}
	inflight := workers.New(time.Second)
	d.startBatch(context.Background(), inflight, et, rows)
	inflight.Wait()
	inflight.Close()

	if got := pgtest.Count(t, f.pool, `SELECT count(*) FROM analytics_events WHERE effect_id = $1`, stolen.StableID); got != 0 {
		t.Fatal("the batch wrote an event for a row whose lease it had lost")
	}
	if got := pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_outbox WHERE effect_id = $1 AND lease_owner = 'b'`,
		stolen.EffectID); got != 1 {
		t.Fatal("the batch changed a row whose lease it had lost")
	}
	for _, r := range []dedup.Claimed{rows[0], rows[2]} {
		if e := f.get(r.Key); e.Status != effect.StatusDelivered {
			t.Fatalf("%s is %s, want delivered", r.Key, e.Status)
		}
	}
	if et.inflight.Load() != 0 {
		t.Fatalf("%d slots still held after the batch", et.inflight.Load())
	}
}
