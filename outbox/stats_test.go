package outbox

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// staleTables runs the question statsLoop asks, once the statistics of this session's writes are flushed.
func staleTables(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	ctx := context.Background()
	// A backend sends its table counters at most once a second; the next one sent is forced.
	if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, staleStatsSQL)
	if err != nil {
		t.Fatal(err)
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return stale
}

// The outbox of a gateway keeping up is a queue: nearly empty, its rows inserted and deleted hundreds of
// times a second. Its statistics say so, and they are right. The check asked whether more rows had changed
// since the last ANALYZE than it had noted, which such a queue always has, so a dispatcher analysed it every
// 5 s (27 ANALYZEs in a 4-minute `scripts/bench retention -rate 400`). Each ANALYZE makes every connection of
// every gateway plan again each statement that reads the outbox (claims, requests, outcomes): 3 to 10 ms of
// Postgres's CPU a plan, and accepts whose bind took 15–50 ms. Only a burst the statistics do not know of,
// live rows far past what they noted, is worth an ANALYZE.
func TestStaleStatisticsMeanABurstNotAQueueAtWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.Database(t))
	pool.Config().MaxConns = 1
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	one := conn.Conn()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := one.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// A drained outbox: pages kept, no row, and statistics that say so.
	exec("INSERT INTO oncegate_outbox (effect_id, type) SELECT g, 'stats' FROM generate_series(1, 5000) g")
	exec("DELETE FROM oncegate_outbox")
	exec("VACUUM (TRUNCATE false) oncegate_outbox") // a busy table keeps its pages: truncating waits for a moment nobody writes
	exec("ANALYZE oncegate_outbox")
	var pages, tuples float64
	if err := one.QueryRow(ctx, "SELECT relpages, reltuples FROM pg_class WHERE oid = 'oncegate_outbox'::regclass").
		Scan(&pages, &tuples); err != nil {
		t.Fatal(err)
	}
	if pages == 0 || tuples >= pages {
		t.Fatalf("setup: the drained outbox has %v pages and %v rows noted", pages, tuples)
	}

	// A queue at work: 6,000 rows in and out, never more than 300 at once.
	for i := range 20 {
		exec("INSERT INTO oncegate_outbox (effect_id, type) SELECT g, 'stats' FROM generate_series($1::bigint, $1 + 149) g",
			int64(10_000+i*150))
		exec("DELETE FROM oncegate_outbox")
	}
	conn.Release()
	if stale := staleTables(t, pool); slices.Contains(stale, "oncegate_outbox") {
		t.Fatalf("a queue at work, 150 rows at a time, was taken for stale statistics: it would be analysed every 5 s")
	}

	// A burst the statistics do not know of: the planner would take 5,000 rows for none.
	if _, err := pool.Exec(ctx, "INSERT INTO oncegate_outbox (effect_id, type) SELECT g, 'stats' FROM generate_series(100000, 104999) g"); err != nil {
		t.Fatal(err)
	}
	if stale := staleTables(t, pool); !slices.Contains(stale, "oncegate_outbox") {
		t.Fatalf("a burst of 5,000 rows into an outbox noted empty was not found stale: %v", stale)
	}
}
