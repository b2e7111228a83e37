package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/migrations"
)

// Migration 00018 moves the uniqueness of idempotency keys from oncegate_effects to oncegate_keys on a
// populated database: every effect stored before it keeps its key, which replays it (pending or finished,
// through a plain and a batched create), with an expiry not yet known, so that it is held as before until the
// purge deletes its effect; the old constraint is gone, and a key freed by the purge makes a new effect.
func TestKeysMigrationKeepsEveryStoredKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyDatabase(t))
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	if err := migrations.UpTo(ctx, db, 16); err != nil {
		t.Fatal(err)
	}
	// As the previous version wrote them: pending ones with their outbox rows, finished ones without, one
	// finished long ago (the purge's), in two tenants that share key names.
	type row struct {
		tenant, key, status string
		finishedAgo         time.Duration // 0: not finished
	}
	rows := []row{{"a", "pending", "pending", 0}, {"b", "pending", "pending", 0}, {"a", "done", "delivered", time.Minute},
		{"a", "dead", "dead", time.Minute}, {"a", "old", "delivered", 48 * time.Hour}}
	payload := json.RawMessage(`{"n":1}`)
	fp, err := dedup.Fingerprint("typ", payload)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[[2]string]int64{}
	for _, r := range rows {
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id,
			status, finished_at, created_at)
			VALUES ($1, $2, 'typ', $3, $4, $5, $6, CASE WHEN $7::bigint > 0 THEN now() - make_interval(secs => $7::bigint) END,
				now() - interval '3 days')
			RETURNING id`, r.tenant, r.key, fp, string(payload), effect.NewStableID(r.tenant, r.key), r.status,
			int64(r.finishedAgo.Seconds())).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if r.finishedAgo == 0 {
			if _, err := pool.Exec(ctx, `INSERT INTO oncegate_outbox (effect_id, type, tenant) VALUES ($1, 'typ', $2)`,
				id, r.tenant); err != nil {
				t.Fatal(err)
			}
		}
		ids[[2]string{r.tenant, r.key}] = id
	}

	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_keys k JOIN oncegate_effects e ON e.id = k.effect_id
		AND e.tenant = k.tenant AND e.key = k.key AND e.fingerprint = k.fingerprint WHERE k.expires_at IS NULL`); n != len(rows) {
		t.Fatalf("%d of %d effects have their key, with an expiry not yet known", n, len(rows))
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_constraint WHERE conname = 'oncegate_effects_tenant_key'`); n != 0 {
		t.Fatal("oncegate_effects still has its unique constraint on (tenant, key)")
	}
	// Created three days ago with a one-day retention: an expiry counted from the creation would have passed,
	// but a key whose expiry is not known is held.
	plain := dedup.NewStore(pool).WithRetention(24 * time.Hour)
	batched := dedup.NewStore(pool).WithRetention(24 * time.Hour).WithGroupCommit(dedup.DefaultGroupCommit)
	for _, s := range []*dedup.Store{plain, batched} {
		for _, r := range rows {
			e, replayed, err := s.Create(ctx, dedup.NewEffect{Tenant: r.tenant, Key: r.key, Type: "typ", Payload: payload})
			if err != nil || !replayed || e.ID != ids[[2]string{r.tenant, r.key}] {
				t.Fatalf("%s/%s after the upgrade: %v %v %+v; want a replay of %d", r.tenant, r.key, err, replayed, e,
					ids[[2]string{r.tenant, r.key}])
			}
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects`); n != len(rows) {
		t.Fatalf("%d effects after the replays, want %d", n, len(rows))
	}
	// The purge deletes the effect finished long ago, with its key, which is then free.
	if n, err := plain.Purge(ctx, 24*time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("purged %d, %v", n, err)
	}
	if _, err := plain.Get(ctx, "a", "old"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("the purged effect's key: %v", err)
	}
	e, replayed, err := plain.Create(ctx, dedup.NewEffect{Tenant: "a", Key: "old", Type: "typ", Payload: payload})
	if err != nil || replayed || e.ID == ids[[2]string{"a", "old"}] {
		t.Fatalf("create under the freed key: %v %v %+v", err, replayed, e)
	}
}

// Migration 00018 copies the keys of a populated database while gateways of the previous version go on
// creating and purging effects: their writes are not held off for the copy (they were, for all of it, under
// the SHARE lock of its first version), the copy carries on from where it stopped when its connection is
// killed halfway, and at the end every effect, stored before or created during the copy, has its key, and no
// key points at an effect a purge deleted meanwhile.
func TestKeysMigrationCopiesOnlineAndCarriesOnAfterAKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.EmptyDatabase(t)
	pool := pgtest.Pool(t, url)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.UpTo(ctx, db, 17); err != nil {
		t.Fatal(err)
	}
	const seeded = 200000
	fp, err := dedup.Fingerprint("typ", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_effects (tenant, key, type, payload, fingerprint, status, finished_at)
		SELECT 't' || (i % 3), 'seed-' || i, 'typ', '{}', '\x00', 'delivered', now() - interval '2 days'
		FROM generate_series(1, `+fmt.Sprint(seeded)+`) i`); err != nil {
		t.Fatal(err)
	}

	// The previous version's writes: creates (its insert.sql named the old constraint by its columns) and its
	// purge, deleting finished effects oldest first.
	const previousInsert = `INSERT INTO oncegate_effects (tenant, key, type, payload, fingerprint, status)
		VALUES ('t1', $1, 'typ', '{}', $2, 'pending') ON CONFLICT (tenant, key) DO NOTHING RETURNING id`
	const previousPurge = `DELETE FROM oncegate_effects WHERE id IN (SELECT id FROM oncegate_effects
		WHERE status = 'delivered' ORDER BY id LIMIT 50)`
	var (
		stop                     = make(chan struct{})
		wg                       sync.WaitGroup
		created, purged, longest atomic.Int64
		refused                  atomic.Int64 // once the old constraint is dropped: expected
		firstErr                 atomic.Value
	)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			var id int64
			err := pool.QueryRow(ctx, previousInsert, fmt.Sprintf("during-%d", i), fp).Scan(&id)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42P10" {
				// No constraint for its ON CONFLICT: expected once the copy is done (the progress table goes in
				// the same transaction as the constraint), a failure before.
				var copying bool
				if pool.QueryRow(ctx, `SELECT to_regclass('oncegate_keys_' || 'backfill') IS NOT NULL`).Scan(&copying) == nil && !copying {
					refused.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
			}
			switch {
			case err != nil:
				firstErr.CompareAndSwap(nil, err.Error())
				return
			}
			created.Add(1)
			if d := time.Since(start).Milliseconds(); d > longest.Load() {
				longest.Store(d)
			}
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			tag, err := pool.Exec(ctx, previousPurge)
			if err != nil {
				firstErr.CompareAndSwap(nil, err.Error())
				return
			}
			purged.Add(tag.RowsAffected())
		}
	})

	// The first run is a client process (psql running the migration's file) SIGKILLed once the copy is under
	// way, as a killed `gateway migrate` leaves it: the server must stop copying within a second or two, not
	// carry on alone and finish the migration with nobody to record it.
	file := filepath.Join(t.TempDir(), "00018.sql")
	if err := os.WriteFile(file, []byte(migrations.Source("00018_keys.sql")), 0o600); err != nil {
		t.Fatal(err)
	}
	client := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", file)
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	progress := func() (copied int64) {
		_ = pool.QueryRow(ctx, `SELECT copied FROM oncegate_keys_backfill`).Scan(&copied)
		return copied
	}
	deadline := time.Now().Add(time.Minute)
	for progress() < 20000 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	_ = client.Process.Kill()
	_ = client.Wait()
	atKill := progress()
	time.Sleep(2 * time.Second) // Postgres checks for its client every second
	stopped := progress()
	time.Sleep(1500 * time.Millisecond)
	if after := progress(); atKill < 20000 || after != stopped {
		t.Fatalf("copied %d when its client was killed, %d two seconds later, %d after 1.5 s more: the copy went "+
			"on alone", atKill, stopped, after)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND pid <> pg_backend_pid() AND state <> 'idle' AND query LIKE '%oncegate_keys_backfill%'`); n != 0 {
		t.Fatalf("%d backends still run the migration after its client was killed", n)
	}
	// An operator's open transaction reading the progress, as the docs suggest, while the second run ends:
	// its last step waits for it rather than failing.
	reader, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Exec(ctx, `SELECT copied, total, updated_at FROM oncegate_keys_backfill`); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(time.Second)
		_ = reader.Commit(ctx)
	}()
	var resumedFrom int64
	if err := pool.QueryRow(ctx, `SELECT last_id FROM oncegate_keys_backfill`).Scan(&resumedFrom); err != nil || resumedFrom == 0 {
		t.Fatalf("the copy's progress after the kill: %d %v", resumedFrom, err)
	}
	began := time.Now()
	if err := migrations.UpTo(ctx, db, 18); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		t.Fatalf("a write of the previous version failed during the copy: %v", e)
	}
	if longest.Load() > 1000 {
		t.Fatalf("a create of the previous version waited %d ms during the copy (the second run took %v)",
			longest.Load(), took)
	}
	if created.Load() < 50 || purged.Load() == 0 {
		t.Fatalf("%d creates and %d purged during the copy", created.Load(), purged.Load())
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects e WHERE NOT EXISTS (SELECT FROM oncegate_keys k
		WHERE k.tenant = e.tenant AND k.key = e.key AND k.effect_id = e.id)`); n != 0 {
		t.Fatalf("%d effects without their key", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_keys k WHERE NOT EXISTS (SELECT FROM oncegate_effects e
		WHERE e.id = k.effect_id)`); n != 0 {
		t.Fatalf("%d keys point at an effect the purge deleted", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_constraint WHERE conname = 'oncegate_effects_tenant_key'`); n != 0 ||
		pgtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = 'oncegate_keys_backfill'`) != 0 {
		t.Fatal("the old constraint, or the copy's progress, is still there")
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_trigger WHERE tgname = 'oncegate_effects_keys'`); n != 1 {
		t.Fatalf("%d delete triggers left on the effects, want 1 (an old gateway's purge may run still)", n)
	}
	// The rest of the migrations, and a gateway of this version, over what the copy left.
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	s := dedup.NewStore(pool).WithRetention(24 * time.Hour)
	e, replayed, err := s.Create(ctx, dedup.NewEffect{Tenant: "t1", Key: "during-0", Type: "typ", Payload: json.RawMessage(`{}`)})
	if err != nil || !replayed {
		t.Fatalf("a key created during the copy, after the upgrade: %v %v %+v", err, replayed, e)
	}
	t.Logf("%d effects: client killed at %d copied, carried on from id %d; second run %v; meanwhile %d creates (longest %d ms) "+
		"and %d purged; %d creates refused after the constraint went", seeded, atKill, resumedFrom, took,
		created.Load(), longest.Load(), purged.Load(), refused.Load())
}

// On a new database migration 00018 has no effect of an older gateway to follow: no trigger is left on the
// effects, whose inserts and deletes would otherwise pay for it.
func TestANewDatabaseHasNoKeysTrigger(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.EmptyDatabase(t))
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		WHERE c.relname LIKE 'oncegate_effects%' AND NOT t.tgisinternal`); n != 0 {
		t.Fatalf("%d triggers on the effects of a new database", n)
	}
}
