package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

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
