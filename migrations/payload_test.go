package migrations_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/migrations"
)

// Migration 00004 keeps the payloads of rows already stored (jsonb, now legacy_payload) readable, and stores
// new ones as sent (json): a row pending across the upgrade is still delivered, with jsonb's rendering of its
// payload, and every row has exactly one of the two.
func TestPayloadMigrationKeepsPendingRowsReadable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyDatabase(t))
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	if err := migrations.UpTo(ctx, db, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `WITH e AS (
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload)
		VALUES ('t', 'old', 'typ', '\x00', '{"b": 1,  "a": 1e2}') RETURNING id, type)
		INSERT INTO oncegate_outbox (effect_id, type) SELECT id, type FROM e`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	store := dedup.NewStore(pool)
	sent := `{"b": 1,  "a": 1e2}`
	if _, _, err := store.Create(ctx, dedup.NewEffect{Tenant: "t", Key: "new", Type: "typ", Payload: json.RawMessage(sent)}); err != nil {
		t.Fatal(err)
	}
	rows, err := store.Claim(ctx, dedup.ClaimParams{Type: "typ", Limit: 10, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	got := map[string]string{}
	for _, r := range rows {
		got[r.Key] = string(r.Payload)
		p, err := store.Payload(ctx, r.Lease)
		if err != nil || string(p) != string(r.Payload) {
			t.Fatalf("Payload of %s: %s, %v; the claim read %s", r.Key, p, err, r.Payload)
		}
	}
	if got["old"] != `{"a": 100, "b": 1}` || got["new"] != sent {
		t.Fatalf("payloads read back: %v", got)
	}
	// Since migration 00025 a row may hold neither payload column: its body is in oncegate_effect_bodies
	// (retention.payloads), and the check that asked for exactly one is gone.
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_effects (tenant, key, type, fingerprint) VALUES ('t', 'none', 'typ', '\x00')`); err != nil {
		t.Fatalf("a row without a payload column (its body kept apart): %v", err)
	}
}

// Migration 00021 names the tenant of outbox rows written before 00016, so that a claim takes them tenant by
// tenant instead of by the walk it keeps for rows that name none.
func TestOutboxTenantBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyDatabase(t))
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.UpTo(ctx, db, 20); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `WITH e AS (
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
		SELECT 't' || (i % 3), 'k' || i, 'typ', '\x00', '{}', 'eff_' || i FROM generate_series(1, 3000) i
		RETURNING id, type)
		INSERT INTO oncegate_outbox (effect_id, type) SELECT id, type FROM e`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	var unnamed, wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE o.tenant IS NULL),
		count(*) FILTER (WHERE o.tenant <> e.tenant)
		FROM oncegate_outbox o JOIN oncegate_effects e ON e.id = o.effect_id`).Scan(&unnamed, &wrong); err != nil {
		t.Fatal(err)
	}
	if unnamed != 0 || wrong != 0 {
		t.Fatalf("after 00021: %d outbox rows name no tenant, %d another tenant than their effect's", unnamed, wrong)
	}
}
