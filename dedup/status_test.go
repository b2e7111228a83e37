package dedup

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// rowVersion is the effect row's physical version: a statement that writes the row changes it.
func rowVersion(t *testing.T, s *Store, key string) string {
	t.Helper()
	var v string
	if err := s.db.QueryRow(context.Background(), `SELECT ctid::text || '/' || xmin::text FROM oncegate_effects
		WHERE tenant = 't' AND key = $1`, key).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A claim leases the outbox row and writes nothing to the effect's row (a new version of it, and an entry in
// each of its indexes, at every delivery), and yet every read reports the claimed effect delivering and the
// others pending: a read by key, a replay, alone or in a batch, and the list filtered by either status.
func TestAClaimedEffectIsDeliveringWithoutItsRowRewritten(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	create(t, s, "claimed")
	before := rowVersion(t, s, "claimed")
	c := claimOne(t, s)
	create(t, s, "waiting") // after the claim, so that it stays unclaimed
	if after := rowVersion(t, s, "claimed"); after != before {
		t.Errorf("the claim rewrote the effect's row: version %s, then %s", before, after)
	}

	want := map[string]effect.Status{"claimed": effect.StatusDelivering, "waiting": effect.StatusPending}
	for key, status := range want {
		if e, err := s.Get(ctx, "t", key); err != nil || e.Status != status {
			t.Errorf("Get %s: %v (%v), want %s", key, e, err, status)
		}
		e, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: key, Type: "typ", Payload: json.RawMessage(`{}`)})
		if err != nil || !replayed || e.Status != status {
			t.Errorf("replay of %s: %v replayed %v (%v), want %s", key, e, replayed, err, status)
		}
	}
	for status, keys := range map[effect.Status][]string{effect.StatusDelivering: {"claimed"}, effect.StatusPending: {"waiting"}} {
		page, err := s.List(ctx, "t", Filter{Status: status, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, e := range page.Effects {
			listed = append(listed, e.Key)
		}
		if len(listed) != len(keys) || listed[0] != keys[0] {
			t.Errorf("list of %s effects: %v, want %v", status, listed, keys)
		}
	}

	// The same replays in one batch (insert_batch.sql, which answers a taken key from the table).
	batched, hold := batchedOver(t, s, pool)
	release := hold()
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]effect.Status{}
	for key := range want {
		wg.Go(func() {
			e, _, err := batched.Create(ctx, NewEffect{Tenant: "t", Key: key, Type: "typ", Payload: json.RawMessage(`{}`)})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got[key] = e.Status
			mu.Unlock()
		})
	}
	queued(t, batched, len(want))
	release()
	wg.Wait()
	if st, _ := batched.BatchStats(); st.Largest < len(want) {
		t.Errorf("batches: %+v, want the replays in one", st)
	}
	for key, status := range want {
		if got[key] != status {
			t.Errorf("replay of %s in a batch: %s, want %s", key, got[key], status)
		}
	}

	// A lease that ran out (its gateway died) leaves the effect delivering until the next claim, as before;
	// a reschedule makes it pending again.
	if _, err := pool.Exec(ctx, `UPDATE oncegate_outbox SET lease_expires_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(ctx, "t", "claimed"); e.Status != effect.StatusDelivering {
		t.Errorf("with its lease run out: %s, want delivering", e.Status)
	}
	if err := s.Reschedule(ctx, c.Lease, Reschedule{LastError: "503", Attempted: true}); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(ctx, "t", "claimed"); e.Status != effect.StatusPending {
		t.Errorf("rescheduled: %s, want pending", e.Status)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'delivering'"); n != 0 {
		t.Errorf("%d effects stored as delivering", n)
	}
}

// A claim changes only the outbox row's lease, which no index holds: with room left in the row's page, the new
// version is a heap-only tuple (HOT), and neither of the outbox's indexes gets an entry for it. With full pages
// (the default fillfactor) every claim added an entry to both, three or four WAL records a row for a table
// whose rows live for seconds (issue 14).
func TestAClaimIsAHeapOnlyUpdateOfTheOutboxRow(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	// Enough rows to fill the outbox's first pages, which the claim takes its rows from (oldest first).
	const n = 40
	for i := range 400 {
		create(t, s, fmt.Sprintf("k%d", i))
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := s.WithTx(tx).Claim(ctx, ClaimParams{Type: "typ", Limit: n, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != n {
		t.Fatalf("claim: %d rows, err %v", len(rows), err)
	}
	var updated, hot int
	if err := tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
		WHERE relname = 'oncegate_outbox'`).Scan(&updated, &hot); err != nil {
		t.Fatal(err)
	}
	if updated != n || hot != n {
		t.Fatalf("the claim updated %d outbox rows, %d of them heap-only; want %d and %d", updated, hot, n, n)
	}
}
