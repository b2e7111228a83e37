package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/migrations"
	"github.com/oncegate/oncegate/partitions"
)

// previousInsert is how a gateway of the previous version (migration 00022's schema) records an effect: an
// id from oncegate_effects' own sequence, its key, the effect, its outbox row, in one statement.
const previousInsert = `
WITH claimed AS (
    INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at)
    VALUES ('t', $1, nextval('oncegate_effects_id_seq'), '\x00', now() + interval '1 day')
    RETURNING effect_id
), effect AS (
    INSERT INTO oncegate_effects (id, tenant, key, type, fingerprint, payload)
    OVERRIDING SYSTEM VALUE
    SELECT effect_id, 't', $1, 'typ', '\x00', '{}' FROM claimed
    RETURNING id, type, tenant
)
INSERT INTO oncegate_outbox (effect_id, type, tenant) SELECT id, type, tenant FROM effect RETURNING effect_id`

// Migration 00023 turns a populated oncegate_effects and oncegate_effect_replays into tables partitioned by
// effect id, online: gateways of the previous version go on recording effects, replaying them and reading
// them by key while it runs, and none of their statements fails. After it every effect, key, outbox row and
// replay counter is there, the old tables are the legacy partitions with their own indexes (none built
// again), a gateway of this version records effects under ids that tell their time, in the partition made
// for them, and the previous version's inserts still work. Run again, as goose does after a kill, it changes
// nothing.
func TestEffectsMigrationIsOnlineAndKeepsEveryEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.EmptyDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.UpTo(ctx, db, 22); err != nil {
		t.Fatal(err)
	}
	const seeded = 50000
	if _, err := pool.Exec(ctx, `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, payload, fingerprint, status, finished_at)
			SELECT 't', 'seed-' || i, 'typ', '{}', '\x00', CASE WHEN i % 10 = 0 THEN 'pending' ELSE 'delivered' END,
				CASE WHEN i % 10 = 0 THEN NULL ELSE now() END
			FROM generate_series(1, `+fmt.Sprint(seeded)+`) i
			RETURNING id, tenant, key, status
		), k AS (
			INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at)
			SELECT tenant, key, id, '\x00', CASE WHEN id % 7 = 0 THEN NULL ELSE now() + interval '1 day' END FROM e
		), r AS (
			INSERT INTO oncegate_effect_replays (effect_id, replays, last_replay_at) SELECT id, 3, now() FROM e WHERE id % 3 = 0
		)
		INSERT INTO oncegate_outbox (effect_id, type, tenant) SELECT id, 'typ', tenant FROM e WHERE status = 'pending'`); err != nil {
		t.Fatal(err)
	}
	legacyIndexes := pgtest.Count(t, pool, "SELECT count(*) FROM pg_index WHERE indrelid = 'oncegate_effects'::regclass")
	// A read-only role, as docs/cli.md has an operator make: it can still read the effects after.
	role := "ro_" + strings.ReplaceAll(strings.TrimPrefix(pool.Config().ConnConfig.Database, "og_"), "-", "_")
	if _, err := pool.Exec(ctx, fmt.Sprintf(`DROP ROLE IF EXISTS %[1]s; CREATE ROLE %[1]s;
		GRANT SELECT ON ALL TABLES IN SCHEMA public TO %[1]s; GRANT UPDATE (status) ON oncegate_effects TO %[1]s;
		ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC`, role)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %[1]s; DROP ROLE IF EXISTS %[1]s", role))
	})

	// The previous version's gateways at work: records, replays (the counter's upsert) and reads by key.
	var written, failed atomic.Int64
	var firstErr atomic.Value
	var longest atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				var id int64
				err := pool.QueryRow(ctx, previousInsert, fmt.Sprintf("during-%d-%d", w, i)).Scan(&id)
				if err == nil {
					_, err = pool.Exec(ctx, `INSERT INTO oncegate_effect_replays AS r (effect_id, replays, last_replay_at)
						VALUES ($1, 1, now()) ON CONFLICT (effect_id) DO UPDATE SET replays = r.replays + 1`, id)
				}
				if err == nil {
					var n int
					err = pool.QueryRow(ctx, `SELECT count(*) FROM oncegate_keys k JOIN oncegate_effects e ON e.id = k.effect_id
						AND e.tenant = k.tenant WHERE k.tenant = 't' AND k.key = $1`, fmt.Sprintf("seed-%d", 1+i%seeded)).Scan(&n)
					if err == nil && n != 1 {
						err = fmt.Errorf("seed-%d read %d effects", 1+i%seeded, n)
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				written.Add(1)
				if d := time.Since(start).Milliseconds(); d > longest.Load() {
					longest.Store(d)
				}
			}
		})
	}
	for written.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	// A reader holds the effects table (a report, pg_dump, a psql BEGIN left open) while the upgrade starts:
	// the upgrade waits for it, and writes go on meanwhile rather than queueing behind the upgrade's wait.
	reader := pgtest.Reader(t, pool, "oncegate_effects")
	began := time.Now()
	upDone := make(chan error, 1)
	go func() { _, err := migrations.Up(ctx, db, nil); upDone <- err }()
	time.Sleep(time.Second) // the upgrade is waiting for the reader's lock by then; not a timing assertion
	base := written.Load()
	time.Sleep(time.Second)
	duringReader := written.Load() - base
	if err := reader.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	upErr := <-upDone
	took := time.Since(began)
	if duringReader == 0 {
		t.Fatal("no write went through while the upgrade waited for a reader: writes queued behind it")
	}
	at := written.Load()
	for written.Load() < at+100 && failed.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if upErr != nil {
		t.Fatal(upErr)
	}
	if failed.Load() > 0 {
		t.Fatalf("%d statements of the previous version failed during the upgrade, the first: %v", failed.Load(),
			firstErr.Load())
	}
	t.Logf("upgrade of %d effects: %v; %d writes of the previous version meanwhile, the longest %d ms", seeded, took,
		written.Load(), longest.Load())

	during := int(written.Load())
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects"); got != seeded+during {
		t.Fatalf("%d effects after the upgrade, want %d", got, seeded+during)
	}
	if got := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_keys k JOIN oncegate_effects e ON e.id = k.effect_id
		AND e.tenant = k.tenant AND e.key = k.key`); got != seeded+during {
		t.Fatalf("%d keys reach their effect, want %d", got, seeded+during)
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); got != seeded/10+during {
		t.Fatalf("%d outbox rows, want %d", got, seeded/10+during)
	}
	if got := pgtest.Count(t, pool, "SELECT coalesce(sum(replays), 0) FROM oncegate_effect_replays"); got != 3*(seeded/3)+during {
		t.Fatalf("%d replays counted, want %d", got, 3*(seeded/3)+during)
	}
	for _, tbl := range []string{"oncegate_effects", "oncegate_effect_replays"} {
		if pgtest.Count(t, pool, "SELECT count(*) FROM pg_partitioned_table WHERE partrelid = $1::regclass", tbl) != 1 {
			t.Fatalf("%s is not partitioned", tbl)
		}
		if pgtest.Count(t, pool, "SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass", tbl) != 2 {
			t.Fatalf("%s: want the legacy partition and the first of new ids", tbl)
		}
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM pg_index WHERE indrelid = 'oncegate_effects_legacy'::regclass"); got != legacyIndexes {
		t.Fatalf("the legacy partition has %d indexes, the old table had %d: some were built again", got, legacyIndexes)
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects_legacy"); got != seeded+during {
		t.Fatalf("%d effects in the legacy partition, want all %d", got, seeded+during)
	}

	// oncegate_effect_bodies (migration 00025) is new: a role that could read the effects can read their bodies.
	for _, tbl := range []string{"oncegate_effects", "oncegate_effect_replays", "oncegate_effect_bodies"} {
		var can bool
		if err := pool.QueryRow(ctx, "SELECT has_table_privilege($1, $2, 'SELECT')", role, tbl).Scan(&can); err != nil || !can {
			t.Fatalf("the read-only role lost SELECT on %s (%v)", tbl, err)
		}
	}
	// The functions of migration 00026 read effects by key: a role that could, still can, even where the
	// owner's default privileges keep EXECUTE from PUBLIC (an outside tester's read-only role lost it).
	for _, fn := range []string{"oncegate_key_effect(text, text)", "oncegate_body_result(bigint)", "oncegate_body_kept(bigint)"} {
		var can bool
		if err := pool.QueryRow(ctx, "SELECT has_function_privilege($1, $2, 'EXECUTE')", role, fn).Scan(&can); err != nil || !can {
			t.Fatalf("the read-only role cannot call %s (%v)", fn, err)
		}
	}
	var col bool
	if err := pool.QueryRow(ctx, "SELECT has_column_privilege($1, 'oncegate_effects', 'status', 'UPDATE')", role).Scan(&col); err != nil || !col {
		t.Fatalf("the role lost its grant on a column (%v)", err)
	}

	// This version: an id that tells its time, in the partition of new ids; a replay finds it.
	s := dedup.NewStore(pool).WithRetention(24 * time.Hour)
	before := time.Now().Truncate(time.Second)
	e, replayed, err := s.Create(ctx, dedup.NewEffect{Tenant: "t", Key: "new", Type: "typ", Payload: json.RawMessage(`{}`)})
	if err != nil || replayed {
		t.Fatalf("create after the upgrade: %v %v", err, replayed)
	}
	if at := partitions.EffectTime(e.ID); at.Before(before) || at.After(time.Now()) {
		t.Fatalf("the new effect's id %d tells %v, not the time it was made", e.ID, at)
	}
	var part string
	if err := pool.QueryRow(ctx, "SELECT tableoid::regclass::text FROM oncegate_effects WHERE id = $1", e.ID).Scan(&part); err != nil ||
		!strings.HasPrefix(part, "oncegate_effects_p") {
		t.Fatalf("the new effect is in %q (%v)", part, err)
	}
	fp, err := dedup.Fingerprint("typ", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `WITH k AS (UPDATE oncegate_keys SET fingerprint = $1 WHERE key = 'seed-7')
		UPDATE oncegate_effects SET fingerprint = $1 WHERE key = 'seed-7'`, fp); err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := s.Create(ctx, dedup.NewEffect{Tenant: "t", Key: "seed-7", Type: "typ", Payload: json.RawMessage(`{}`)}); err != nil || !replayed {
		t.Fatalf("a replay of an old key: %v %v", err, replayed)
	}
	var old int64
	if err := pool.QueryRow(ctx, previousInsert, "previous-after").Scan(&old); err != nil || old >= e.ID {
		t.Fatalf("the previous version's insert after the upgrade: id %d, %v", old, err)
	}

	// Resumable: each step looks at the catalogue before it acts. Goose runs the whole file again after a
	// kill, which makes the function of step 3 again and calls it.
	for _, stmt := range steps(t, "00023_effects_partitioned.sql", 5) {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("run again: %v", err)
		}
	}
	for _, tbl := range [][2]string{{"oncegate_effects", "id"}, {"oncegate_effect_replays", "effect_id"}} {
		if _, err := pool.Exec(ctx, "SELECT oncegate_partition_by_effect_id($1, $2)", tbl[0], tbl[1]); err != nil {
			t.Fatalf("run again: %v", err)
		}
	}
	if _, err := pool.Exec(ctx, "DROP FUNCTION oncegate_partition_by_effect_id(text, text); DROP FUNCTION oncegate_patiently(text)"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects"); got != seeded+during+2 {
		t.Fatalf("%d effects after running the steps again", got)
	}
}

// steps returns the DO blocks of a migration.
func steps(t *testing.T, file string, want int) []string {
	var out []string
	for _, part := range strings.Split(migrations.Source(file), "-- +goose StatementBegin") {
		if body, _, ok := strings.Cut(part, "-- +goose StatementEnd"); ok {
			out = append(out, body)
		}
	}
	if len(out) != want {
		t.Fatalf("%d steps in %s, want %d", len(out), file, want)
	}
	return out
}

// Migration 00024 turns JIT off for the database's new sessions: a listing over partitioned effects is costed
// past jit_above_cost and spent seconds compiling itself.
func TestJITIsOffForTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.EmptyDatabase(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	db.Close()
	pool.Close()
	fresh, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	var jit string
	if err := fresh.QueryRow(ctx, "SHOW jit").Scan(&jit); err != nil || jit != "off" {
		t.Fatalf("jit in a new session: %q, %v", jit, err)
	}
}
