package partitions_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/partitions"
)

// body writes the body of an effect kept apart (retention.payloads), as the gateway's insert does, and
// clears the effect's own payload.
func body(t *testing.T, pool *pgxpool.Pool, id int64) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `
		WITH b AS (INSERT INTO oncegate_effect_bodies (effect_id, tenant, payload, result) VALUES ($1, 't', '{"to":"a@b"}', '{"ok":true}'))
		UPDATE oncegate_effects SET payload = NULL WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// Bodies go after retention.payloads, their effects after retention: a partition of bodies whose effects all
// finished retention.payloads ago is dropped while its effects (and their keys) stay; one holding the body of
// an effect still on its way (an outbox row: its payload is still to be sent) or finished since is kept, and
// goes at a later pass once that has changed.
func TestBodiesGoBeforeTheirEffectsAndWaitForStragglers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	ago := func(d time.Duration) *time.Time { at := now.Add(-d); return &at }

	done := e.add("done", seeded{at: *ago(9 * time.Minute), finished: ago(9 * time.Minute), expires: now.Add(time.Hour)})
	straggler := e.add("straggler", seeded{at: *ago(8 * time.Minute), expires: now.Add(time.Hour)})
	for _, id := range []int64{done, straggler} {
		body(t, pool, id)
	}
	donePart, stragglerPart := partitionOf(t, pool, "oncegate_effect_bodies", done), partitionOf(t, pool, "oncegate_effect_bodies", straggler)
	if donePart == stragglerPart {
		t.Fatal("the seed is wrong: both bodies in one partition")
	}

	clock := now
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, 3*time.Minute),
		Interval: time.Minute, Retention: time.Hour, Now: func() time.Time { return clock }})
	rep, err := m.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Dropped, donePart) || exists(t, pool, donePart) {
		t.Fatalf("dropped %v: want %s", rep.Dropped, donePart)
	}
	if !slices.Contains(rep.Kept, stragglerPart) || !exists(t, pool, stragglerPart) {
		t.Fatalf("kept %v: want %s, whose effect is still to be sent", rep.Kept, stragglerPart)
	}
	for _, d := range rep.Dropped {
		if strings.HasPrefix(d, "oncegate_effects_") || strings.HasPrefix(d, "oncegate_effect_replays_") {
			t.Fatalf("%s went with the bodies: effects stay until retention", d)
		}
	}
	var payload *string
	var expired bool
	if err := pool.QueryRow(ctx, `SELECT COALESCE(e.payload, e.legacy_payload::json,
			(SELECT b.payload FROM oncegate_effect_bodies b WHERE b.effect_id = e.id))::text,
			NOT EXISTS (SELECT FROM oncegate_effect_bodies b WHERE b.effect_id = e.id)
		FROM oncegate_effects e WHERE e.id = $1`, done).Scan(&payload, &expired); err != nil || payload != nil || !expired {
		t.Fatalf("the effect whose body went: payload %v, expired %v, %v", payload, expired, err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_keys WHERE key = 'done'"); n != 1 {
		t.Fatalf("%d keys of the effect whose body went: a key stays until retention", n)
	}

	// The straggler is delivered now: its body stays retention.payloads more, then goes.
	if _, err := pool.Exec(ctx, `WITH o AS (DELETE FROM oncegate_outbox WHERE effect_id = $1)
		UPDATE oncegate_effects SET status = 'delivered', finished_at = now() WHERE id = $1`, straggler); err != nil {
		t.Fatal(err)
	}
	if rep, err := m.Pass(ctx); err != nil || !slices.Contains(rep.Kept, stragglerPart) {
		t.Fatalf("kept %v (%v): want %s, whose effect finished a moment ago", rep.Kept, err, stragglerPart)
	}
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET finished_at = now() - interval '4 minutes' WHERE id = $1`,
		straggler); err != nil {
		t.Fatal(err)
	}
	if rep, err := m.Pass(ctx); err != nil || !slices.Contains(rep.Dropped, stragglerPart) {
		t.Fatalf("dropped %v (%v): want %s", rep.Dropped, err, stragglerPart)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE id = ANY ($1)", []int64{done, straggler}); n != 2 {
		t.Fatalf("%d of the 2 effects left: effects stay until retention", n)
	}
}
