package dedup

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// planned are the statements of the store's hot paths (a request, a claim, a delivery's outcome, the logs of
// replays and attempts) and the gateway's other writes: each runs as a prepared statement on long-lived
// connections, which keep its generic plan (gateway.newPool sets plan_cache_mode = force_generic_plan), made
// at its first run from the table sizes of that moment: on a new database, empty tables.
var planned = []string{"insert", "insert_batch", "get", "get_batch", "fence", "read_payloads", "finish",
	"reschedule", "replays", "attempts", "insert_leased", "claim_effect", "type_paused", "send_back", "resolve",
	"lock_leases", "defer", "extend_lease", "free_dangling_key", "barrier", "leased_effects", "claim_new"}

// Not planned generically, and why: list and purge run in the simple protocol, planned for their values at
// each run (Store.List, Store.Purge); backlog has no parameter, so Postgres plans it once whatever the
// connection's plan_cache_mode, and it counts the whole outbox by design.

// pinnedStatements are run behind pin.sql (pinned): an UPDATE, DELETE or locking read joined to a batch,
// whose best plan Postgres finds only from statistics that a queue's tables outrun.
var pinnedStatements = map[string]string{"claim": "claimSQL", "claim_limited": "claimLimitedSQL", "release": "releaseSQL", "hand_back": "handBackSQL",
	"finish_batch": "finishBatchSQL", "terminal": "terminalSQL", "claim_probe": "claimProbeSQL"}

// TestPinnedStatementsAreRunPinned holds the call sites to pinnedStatements: each runs its statement through
// pinned or pinnedExec, and no statement is in both lists. (Preparing one, in a list of statements as
// PrepareOutcomes does, is not running it.)
func TestPinnedStatementsAreRunPinned(t *testing.T) {
	var src strings.Builder
	for _, f := range []string{"store.go", "lifecycle.go", "batch.go", "oplog.go", "perform.go", "effect.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	for name, v := range pinnedStatements {
		if slices.Contains(planned, name) {
			t.Errorf("%s is both planned as it comes and pinned", name)
		}
		uses := regexp.MustCompile(`\b`+v+`\b[,)]`).FindAllStringIndex(src.String(), -1)
		pinnedUses := regexp.MustCompile(`pinned(Exec)?\(ctx, [a-z.]+, `+v+`\b`).FindAllStringIndex(src.String(), -1)
		if len(uses) == 0 || len(uses) != len(pinnedUses) {
			t.Errorf("%s is run %d times, %d of them pinned", v, len(uses), len(pinnedUses))
		}
	}
}

// pinnedTx begins a transaction behind pin.sql (as pinned runs its statements), rolled back when the test ends.
func pinnedTx(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	return pgtest.Tx(t, pool, pinSQL)
}

// TestPinnedStatementsPlanIndexScansOnEmptyTables: behind pin.sql, even the generic plan made while the
// tables are empty is ordered index scans and nested loops, the plan for any size. Without it the claim's
// plan read every due row and sorted them to take a batch (14 ms at 4,500 due rows in issue 14's benchmark)
// and the others joined their batch to the table by sequential or bitmap scans.
func TestPinnedStatementsPlanIndexScansOnEmptyTables(t *testing.T) {
	_, pool := newStore(t)
	ctx := context.Background()
	for name := range pinnedStatements {
		func() {
			tx := pinnedTx(t, pool)
			defer func() { _ = tx.Rollback(ctx) }()
			for _, n := range pgtest.GenericPlanNodes(t, tx.Conn(), name, query(name)) {
				for _, bad := range []string{"Seq Scan", "Bitmap", "Sort", "Hash Join", "Merge Join", "Full"} {
					// A claim ranks the rows each tenant with work brings, a batch at most of each (claim), and a
					// limited claim its candidates, at most four batches, by destination (claim_limited): bounded
					// sorts, not a sort of the backlog.
					if (name == "claim" || name == "claim_limited") && bad == "Sort" {
						continue
					}
					if strings.HasPrefix(n, bad) {
						t.Errorf("%s: the pinned generic plan, made on empty tables, has %s", name, n)
					}
				}
			}
		}()
	}
}

// TestGenericPlansMadeOnEmptyTablesUseIndexes is the finding of issue 14's benchmark: a gateway that starts on
// a new database plans its statements while the tables are empty, and a plan that joins the batch to
// oncegate_effects by a sequential scan is as cheap as any other then. Postgres keeps that plan for the
// connection's life (until an ANALYZE): each batch read the whole table, 11 ms at 50,000 effects, and the
// gateway's accepts fell as the table grew. Every statement here must reach its rows through an index even
// in a plan made on empty tables, whatever the table grows to.
func TestGenericPlansMadeOnEmptyTablesUseIndexes(t *testing.T) {
	_, pool := newStore(t)
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	names := map[string]bool{}
	_ = fs.WalkDir(sqlFiles, "sql", func(path string, d fs.DirEntry, _ error) error {
		names[strings.TrimSuffix(strings.TrimPrefix(path, "sql/"), ".sql")] = !d.IsDir()
		return nil
	})
	for _, name := range planned {
		if !names[name] {
			t.Fatalf("sql/%s.sql is listed here but does not exist", name)
		}
		if scans := pgtest.GenericPlanSeqScans(t, conn.Conn(), name, query(name)); len(scans) > 0 {
			t.Errorf("%s: the generic plan, made on empty tables, reads %v by a sequential scan", name, scans)
		}
	}
}

// Inside an explicit transaction a pinned statement is planned pinned, and the transaction's next statements
// are not: unpin.sql puts each setting back to its default.
func TestPinnedStatementInATransactionUnpinsAfter(t *testing.T) {
	t.Parallel()
	_, pool := newStore(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	const settings = `SELECT string_agg(current_setting(n), ',' ORDER BY n)
		FROM unnest('{enable_seqscan,enable_bitmapscan,enable_hashjoin,enable_mergejoin,enable_sort}'::text[]) n`
	rows, err := pinned(ctx, tx, settings)
	if err != nil {
		t.Fatal(err)
	}
	var during string
	for rows.Next() {
		if err := rows.Scan(&during); err != nil {
			t.Fatal(err)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var after string
	if err := tx.QueryRow(ctx, settings).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if during != "off,off,off,off,off" || after != "on,on,on,on,on" {
		t.Fatalf("settings during the pinned statement %s, after it %s", during, after)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBatchStatementsSettleOnTheGenericPlan: Postgres plans a prepared statement's first five runs for their
// parameters, then keeps its generic plan for good unless those custom plans looked much cheaper. A custom
// plan that counted a small batch's array elements did: insert_batch.sql was then planned afresh for every
// batch, on every connection, and replays in small batches ran at a third of the rate. Run here with batches
// of two, as a quiet gateway sends them, each statement must settle on its generic plan.
func TestBatchStatementsSettleOnTheGenericPlan(t *testing.T) {
	t.Parallel()
	_, pool := newStore(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	two := func(a, b string) []string { return []string{a, b} }
	for i := range 8 {
		k1, k2 := fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i%2) // b0 and b1 come back: replays
		if _, err := tx.Exec(ctx, insertBatchSQL, two("t", "t"), two(k1, k2), two("typ", "typ"),
			[][]byte{{0}, {0}}, two("{}", "{}"), []*string{nil, nil}, two("s"+k1, fmt.Sprintf("s%d", i)),
			[]*string{nil, nil}, []*string{nil, nil}, []*string{nil, nil}, []int64{60000, 60000},
			[]bool{false, true}, []int64{60000, 60000}); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, getBatchSQL, two("t", "t"), two(k1, k2)); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := tx.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements`)
	if err != nil {
		t.Fatal(err)
	}
	plans := map[string][2]int64{}
	for rows.Next() {
		var stmt string
		var generic, custom int64
		if err := rows.Scan(&stmt, &generic, &custom); err != nil {
			t.Fatal(err)
		}
		plans[stmt] = [2]int64{generic, custom}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for name, sql := range map[string]string{"insert_batch": insertBatchSQL, "get_batch": getBatchSQL} {
		p, ok := plans[sql]
		if !ok {
			t.Fatalf("%s was not run as a prepared statement", name)
		}
		if p[0] == 0 {
			t.Errorf("%s: %d custom plans and no generic one in 8 runs: Postgres plans it afresh every time", name, p[1])
		}
	}
}

// TestPlansOnAVacuumedEmptyOutboxUseIndexConditions: an outbox that drained and was vacuumed keeps its pages
// with no row noted in them, and the planner believes it empty until the next ANALYZE. Pinned or not, a plan
// could then read the whole outbox by its primary key (an index scan without a condition) as the outer side
// of a join to its batch: each batch of outcomes read every row of a new burst (1.85 s a batch beside
// 100,000 in the fleet bench) and each claim hashed them all. Every statement must reach the outbox's rows
// through an index condition in that state too. (The query's shape cannot hold every plan there: the
// planner may pick any index of a table it believes empty; outbox.statsKeeper asks for the ANALYZE.)
func TestPlansOnAVacuumedEmptyOutboxUseIndexConditions(t *testing.T) {
	_, pool := newStore(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 't', 'k' || i, 'hook', '\x00', '{}', 'eff_' || i FROM generate_series(1, 20000) i
			RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, tenant) SELECT id, type, tenant FROM e;
		DELETE FROM oncegate_outbox`); err != nil {
		t.Fatal(err)
	}
	// Claims coming and going keep autovacuum from truncating the table: TRUNCATE false.
	if _, err := pool.Exec(ctx, `VACUUM (TRUNCATE false, ANALYZE) oncegate_outbox`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	check := func(name string, pin bool) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if pin {
			if _, err := tx.Exec(ctx, pinSQL); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range pgtest.GenericPlanNodes(t, tx.Conn(), name, query(name)) {
			if strings.HasSuffix(n, " on oncegate_outbox") && (strings.HasPrefix(n, "Full ") || strings.HasPrefix(n, "Seq Scan")) {
				t.Errorf("%s: on an outbox vacuumed empty, the plan has %s", name, n)
			}
		}
	}
	for name := range pinnedStatements {
		check(name, true)
	}
	for _, name := range append(planned, "purge") {
		check(name, false)
	}
}

// Freeing a retiring partition's keys probes the outbox effect by effect: planned as a hashed EXISTS, every
// batch of 500 keys read the whole outbox (40-70 ms beside 100,000 outbox rows, most of what retirement cost
// in `scripts/bench retention`).
func TestFreeingKeysProbesTheOutboxByItsKey(t *testing.T) {
	_, pool := newStore(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var part string
	if err := conn.QueryRow(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'oncegate_effects'::regclass ORDER BY c.relname DESC LIMIT 1`).Scan(&part); err != nil {
		t.Fatal(err)
	}
	q := strings.ReplaceAll(freeKeysSQL, "{{partition}}", pgx.Identifier{part}.Sanitize())
	for _, n := range pgtest.GenericPlanNodes(t, conn.Conn(), "free_keys", q) {
		if strings.HasSuffix(n, " on oncegate_outbox") && strings.HasPrefix(n, "Seq Scan") {
			t.Errorf("free_keys: the plan reads the outbox whole: %s", n)
		}
	}
}

// TestLoneReadsOpenOnePartition: a statement that reads an effect by the id its key points at, or reads its
// body kept apart, opens one partition, not all. Found by id = (SELECT k.effect_id ...), an id known only once
// the statement runs, Postgres opened an index scan on every partition of the effects as the statement
// started, for every request recorded alone, replay or not; and the body's subqueries (columns.sql) did the
// same on every partition of the bodies. Over 39 daily partitions (30 days kept) that was about 1 ms of
// Postgres's CPU an accept, against 0.3 ms now (pgbench, issue 32). Called with no key (NULLs), the generic
// plans here must open no partition at all.
func TestLoneReadsOpenOnePartition(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pgtest.Repartition(t, url, 24*time.Hour, time.Now().Add(-10*24*time.Hour))
	pool := pgtest.Pool(t, url)
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, name := range []string{"insert", "insert_leased", "get"} {
		for _, n := range pgtest.GenericPlanNodes(t, conn.Conn(), name, query(name)) {
			if strings.Contains(n, " on oncegate_effects_p") || strings.Contains(n, " on oncegate_effect_bodies_p") {
				t.Errorf("%s: the plan opens a partition for no key: %s", name, n)
			}
		}
	}
}

// TestClaimsPlanNoEffects: a claim reads and leases outbox rows only; what a delivery needs of its effect
// comes with the payloads (read_payloads.sql) or by a read of its own (leased_effects.sql). Joined to the
// effects, the claim, the costliest plan of the hot path (3 ms at 4 partitions of effects, 9.5 ms at 44), was
// planned again at every partition attached or detached, and at every vacuum of one: a third of all the
// planning in `scripts/bench retention`, in waves right when a retirement ran (issue 30).
func TestClaimsPlanNoEffects(t *testing.T) {
	_, pool := newStore(t)
	ctx := context.Background()
	for _, name := range []string{"claim", "claim_limited"} {
		func() {
			tx := pinnedTx(t, pool)
			defer func() { _ = tx.Rollback(ctx) }()
			for _, n := range pgtest.GenericPlanNodes(t, tx.Conn(), name, query(name)) {
				if strings.Contains(n, " on oncegate_effect") {
					t.Errorf("%s: the plan reads the effects: %s", name, n)
				}
			}
		}()
	}
}
