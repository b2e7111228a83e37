package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/migrations"
)

// Migration 00019 turns a populated oncegate_effect_attempts into a partitioned table whose first partition
// is the old table, whole: every attempt is still there and read by its effect, new attempts' ids go on
// from the old ones, the foreign key is gone (an effect deleted leaves its attempts to their partition),
// and the migration run again, as after a kill, changes nothing.
func TestAttemptsMigrationKeepsEveryAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.EmptyDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.UpTo(ctx, db, 18); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO oncegate_effects (tenant, key, type, payload, fingerprint, status)
		SELECT 't', 'k' || i, 'typ', '{}', '\x00', 'delivered' FROM generate_series(1, 200) i;
		INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome)
		SELECT e.id, a, now() - interval '1 day' + a * interval '1 second', 'g', 'delivered'
		FROM oncegate_effects e, generate_series(1, 5) a`); err != nil {
		t.Fatal(err)
	}
	maxID := pgtest.Count(t, pool, "SELECT max(id) FROM oncegate_effect_attempts")
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effect_attempts"); got != 1000 {
		t.Fatalf("%d attempts after the migration, want 1000", got)
	}
	if got := pgtest.Count(t, pool, `SELECT count(*) FROM pg_partitioned_table
		WHERE partrelid = 'oncegate_effect_attempts'::regclass`); got != 1 {
		t.Fatal("oncegate_effect_attempts is not partitioned")
	}
	if got := pgtest.Count(t, pool, `SELECT count(*) FROM pg_inherits
		WHERE inhrelid = 'oncegate_effect_attempts_legacy'::regclass`); got != 1 {
		t.Fatal("the old table is not a partition")
	}
	var id int
	if err := pool.QueryRow(ctx, `INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome)
		SELECT min(id), 6, now(), 'g', 'delivered' FROM oncegate_effects RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if id <= maxID {
		t.Fatalf("a new attempt's id %d, not after the old ones' %d", id, maxID)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM oncegate_effects WHERE id = (SELECT min(id) FROM oncegate_effects)"); err != nil {
		t.Fatalf("an effect with attempts cannot be deleted (the foreign key is still there?): %v", err)
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effect_attempts"); got != 1001 {
		t.Fatalf("%d attempts after an effect was deleted, want 1001: they go with their partition", got)
	}
	// Resumable: goose runs the whole file again after a kill; each step looks before it acts.
	for _, stmt := range splitDo(t) {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("run again: %v", err)
		}
	}
}

// splitDo returns the DO blocks of migration 00019.
func splitDo(t *testing.T) []string {
	var out []string
	for _, part := range strings.Split(migrations.Source("00019_attempts_partitioned.sql"), "-- +goose StatementBegin") {
		if body, _, ok := strings.Cut(part, "-- +goose StatementEnd"); ok {
			out = append(out, body)
		}
	}
	if len(out) != 3 {
		t.Fatalf("%d steps in 00019", len(out))
	}
	return out
}
