package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// A store with bodies apart (retention.payloads) writes every payload and answer to oncegate_effect_bodies,
// through every path: a create of its own (insert.sql) and in a batch (insert_batch.sql), an outcome of its own
// (finish.sql) and in a batch (finish_batch.sql). Every reader finds them there: a claim's payloads, Get, a
// replay. Once the bodies are gone the effects stay, say so (BodyExpired, no result), replay as themselves, and
// refuse to be sent again (ErrBodyExpired).
func TestBodiesApartGoThroughEveryPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	single, pool := newStore(t)
	single = single.WithBodiesApart()
	batched := single.WithGroupCommit(GroupCommit{MaxBatch: 100, Parallel: 1, Timeout: 30 * time.Second})
	payload := func(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"to": "u%d@example.com"}`, i)) }

	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		s := map[bool]*Store{true: single, false: batched}[i%4 == 0]
		wg.Go(func() {
			_, _, errs[i] = s.Create(ctx, NewEffect{Tenant: "t", Key: fmt.Sprint("k", i), Type: "typ", Payload: payload(i)})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if c := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects e JOIN oncegate_effect_bodies b ON b.effect_id = e.id
		WHERE e.payload IS NULL AND e.legacy_payload IS NULL`); c != n {
		t.Fatalf("%d of %d effects with their payload apart", c, n)
	}
	rows, err := single.Claim(ctx, ClaimParams{Type: "typ", Limit: n, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != n {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	for i, r := range rows {
		var k int
		fmt.Sscan(r.Key[1:], &k)
		if string(r.Payload) != string(payload(k)) {
			t.Fatalf("the claim read %s for %s", r.Payload, r.Key)
		}
		s := map[bool]*Store{true: single, false: batched}[i%2 == 0]
		status := effect.StatusDelivered
		if k == 0 {
			status = effect.StatusFailed
		}
		wg.Go(func() {
			errs[i] = s.Finish(ctx, r.Lease, Finish{Status: status, Result: json.RawMessage(fmt.Sprintf(`{"n": %d}`, k)),
				Attempted: true, External: true})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if c := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects WHERE result IS NULL AND finished_at IS NOT NULL`); c != n {
		t.Fatalf("%d of %d answers kept out of the effects' rows", c, n)
	}
	for i := range n {
		e, replayed, err := batched.Create(ctx, NewEffect{Tenant: "t", Key: fmt.Sprint("k", i), Type: "typ", Payload: payload(i)})
		if err != nil || !replayed || string(e.Result) != fmt.Sprintf(`{"n": %d}`, i) || e.BodyExpired {
			t.Fatalf("replay of k%d: %+v, %v, %v", i, e, replayed, err)
		}
	}

	// The partitions of bodies are dropped (here, their rows deleted: partitions_test drops them).
	if _, err := pool.Exec(ctx, "DELETE FROM oncegate_effect_bodies"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		e, err := single.Get(ctx, "t", fmt.Sprint("k", i))
		if err != nil || !e.BodyExpired || e.Result != nil {
			t.Fatalf("k%d after its body went: %+v, %v", i, e, err)
		}
		e, replayed, err := batched.Create(ctx, NewEffect{Tenant: "t", Key: fmt.Sprint("k", i), Type: "typ", Payload: payload(i)})
		if err != nil || !replayed || !e.BodyExpired {
			t.Fatalf("replay of k%d after its body went: %+v, %v, %v", i, e, replayed, err)
		}
	}
	if _, err := single.Retry(ctx, "t", "k0"); !errors.Is(err, ErrBodyExpired) {
		t.Fatalf("retry of a failed effect whose body went: %v, want ErrBodyExpired", err)
	}
	if _, err := single.Retry(ctx, "t", "k1"); !errors.Is(err, ErrNotRetryable) {
		t.Fatalf("retry of a delivered effect whose body went: %v, want ErrNotRetryable", err)
	}
	if c := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); c != 0 {
		t.Fatalf("%d outbox rows after refused retries", c)
	}
}
