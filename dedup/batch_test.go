package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// batchedStore returns a store that batches with one batch in flight, and a function that holds the next
// batch in the database until released: it takes key "gate" in a transaction of its own, so the batch that
// carries "gate" waits on that row's lock, and every Create after it queues behind, forming one batch.
func batchedStore(t *testing.T) (s *Store, pool *pgxpool.Pool, hold func() (release func())) {
	t.Helper()
	base, pool := newStore(t)
	s, hold = batchedOver(t, base, pool)
	return s, pool, hold
}

// batchedOver is batchedStore over the database of base.
func batchedOver(t *testing.T, base *Store, pool *pgxpool.Pool) (s *Store, hold func() (release func())) {
	t.Helper()
	s = base.WithGroupCommit(GroupCommit{MaxBatch: 500, Parallel: 1, Timeout: 30 * time.Second})
	hold = func() func() {
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The key alone: its primary key is what a create of the same key waits on.
		if _, err := tx.Exec(ctx, `INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint)
			VALUES ('t', 'gate', 0, '\x00')`); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Rolled back below, so this insert creates the effect once the lock is gone.
			_, _, _ = s.Create(ctx, NewEffect{Tenant: "t", Key: "gate", Type: "typ", Payload: json.RawMessage(`{}`)})
		}()
		testenv.Eventually(t, 10*time.Second, "the gate's batch waits on the lock", func() bool {
			return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
				AND datname = current_database()`) > 0
		})
		return func() {
			if err := tx.Rollback(ctx); err != nil {
				t.Error(err)
			}
			<-done
		}
	}
	return s, hold
}

// queued waits until n Creates wait for the next batch.
func queued(t *testing.T, s *Store, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d requests queued", n), func() bool {
		return s.batcher.creates.queued() >= n
	})
}

type answer struct {
	e        *Effect
	replayed bool
	err      error
}

// A batch gives each request exactly the answer it would get alone: of requests on one key, one creates and
// the others replay it (same request) or are refused (another request), whether their keys meet inside the
// batch or in the table; every created effect has its one outbox row.
func TestBatchAnswersEachRequestAsAlone(t *testing.T) {
	t.Parallel()
	s, pool, hold := batchedStore(t)
	ctx := context.Background()
	create(t, s, "stored") // in the table before the batch, with payload {}
	release := hold()
	const callers, keys = 200, 50
	answers := make([]answer, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", i%keys)
			payload := `{}`
			if i%keys == 7 && i >= keys {
				payload = `{"other":true}` // another request under key k7 than caller 7's
			}
			if i == 3 {
				key = "stored"
			}
			e, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: key, Type: "typ", Payload: json.RawMessage(payload)})
			answers[i] = answer{e, replayed, err}
		})
	}
	queued(t, s, callers)
	release()
	wg.Wait()

	// Of the two requests under k7, the one the batch records first wins, whichever it is (the callers queue
	// in no set order): its callers get the effect, the other's get KeyReusedError.
	other := func(i int) bool { return i%keys == 7 && i >= keys }
	otherWon := answers[7].err != nil
	created := map[string]int{}
	for i, a := range answers {
		var reused *KeyReusedError
		switch {
		case i%keys == 7 && other(i) != otherWon:
			if !errors.As(a.err, &reused) {
				t.Errorf("caller %d, the request under k7 that lost: %v, want KeyReusedError", i, a.err)
			}
		case a.err != nil:
			t.Errorf("caller %d: %v", i, a.err)
		case !a.replayed:
			created[a.e.Key]++
		}
	}
	for k := range keys {
		if key := fmt.Sprintf("k%d", k); created[key] != 1 && !(k == 3 && created[key] == 0) {
			t.Errorf("%s created %d times", key, created[key])
		}
	}
	if created["stored"] != 0 || answers[3].e == nil || !answers[3].replayed {
		t.Errorf("a key stored before the batch: %+v", answers[3])
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); n != keys+2 {
		t.Errorf("%d outbox rows, want %d", n, keys+2)
	}
	st, _ := s.BatchStats()
	if st.Largest < callers-1 || st.Split != 0 {
		t.Errorf("batches: %+v; want one of about %d, none split", st, callers)
	}
	t.Logf("%+v", st)
}

// A row Postgres refuses (a NUL byte in a key) fails its own request only: the batch is recorded again one
// request at a time, and the others are created as if alone.
func TestBatchWithARowPostgresRefusesFailsOnlyThatRequest(t *testing.T) {
	t.Parallel()
	s, pool, hold := batchedStore(t)
	ctx := context.Background()
	release := hold()
	answers := make([]answer, 20)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", i)
			if i == 11 {
				key = "bad\x00key"
			}
			e, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: key, Type: "typ", Payload: json.RawMessage(`{}`)})
			answers[i] = answer{e, replayed, err}
		})
	}
	queued(t, s, len(answers))
	release()
	wg.Wait()
	for i, a := range answers {
		switch {
		case i == 11:
			if !errors.Is(a.err, ErrUnstorable) {
				t.Errorf("the bad row: %v, want ErrUnstorable", a.err)
			}
		case a.err != nil || a.replayed:
			t.Errorf("caller %d: %v (replayed %v)", i, a.err, a.replayed)
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); n != len(answers) {
		t.Errorf("%d outbox rows, want %d (19 and the gate)", n, len(answers))
	}
	if st, _ := s.BatchStats(); st.Split != 1 {
		t.Errorf("batches: %+v; want one split", st)
	}
}

// A request that gives up while its batch waits gets its context's error at once; the batch goes on for
// the others, and the abandoned request's row is committed all the same (its client finds it as a replay).
func TestRequestThatGivesUpDoesNotCancelItsBatch(t *testing.T) {
	t.Parallel()
	s, pool, hold := batchedStore(t)
	release := hold()
	impatient, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, _, err := s.Create(impatient, NewEffect{Tenant: "t", Key: "impatient", Type: "typ", Payload: json.RawMessage(`{}`)})
		errc <- err
	}()
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			if _, _, err := s.Create(context.Background(), NewEffect{Tenant: "t", Key: fmt.Sprint(i), Type: "typ",
				Payload: json.RawMessage(`{}`)}); err != nil {
				t.Error(err)
			}
		})
	}
	queued(t, s, 11)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the impatient request: %v", err)
	}
	release()
	wg.Wait()
	e, replayed, err := s.Create(context.Background(), NewEffect{Tenant: "t", Key: "impatient", Type: "typ",
		Payload: json.RawMessage(`{}`)})
	if err != nil || !replayed || e == nil {
		t.Fatalf("the impatient request sent again: %v, replayed %v", err, replayed)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); n != 12 {
		t.Errorf("%d outbox rows, want 12", n)
	}
}

// A lone request does not wait for company: with nothing in flight, its batch starts at once.
func TestLoneRequestIsABatchOfOne(t *testing.T) {
	t.Parallel()
	s, _, _ := batchedStore(t)
	for i := range 5 {
		create(t, s, fmt.Sprint(i))
	}
	if st, _ := s.BatchStats(); st.Batches != 5 || st.Largest != 1 {
		t.Fatalf("batches: %+v, want 5 of one", st)
	}
}

// Outcomes finished together are recorded in one statement, each under its own lease: a lease that is no
// longer the row's gets ErrLeaseLost and changes nothing, the others are recorded.
func TestBatchedFinishesKeepEachLease(t *testing.T) {
	t.Parallel()
	base, pool := newStore(t)
	s := base.WithGroupCommit(GroupCommit{MaxBatch: 100, Parallel: 1, Timeout: 30 * time.Second})
	ctx := context.Background()
	for i := range 40 {
		create(t, base, fmt.Sprint(i))
	}
	rows, err := base.Claim(ctx, ClaimParams{Type: "typ", Limit: 100, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 40 {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	// Every fourth row's lease is lost: an operator's retry took the row back meanwhile.
	lost := map[int64]bool{}
	for i, r := range rows {
		if i%4 == 0 {
			lost[r.EffectID] = true
			if _, err := pool.Exec(ctx, "UPDATE oncegate_outbox SET lease_token = gen_random_uuid() WHERE effect_id = $1", r.EffectID); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Hold the first batch on a row lock so the rest of the finishes queue behind it and go as one batch.
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locker.Exec(ctx, "SELECT 1 FROM oncegate_outbox WHERE effect_id = $1 FOR UPDATE", rows[1].EffectID); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(rows))
	var wg sync.WaitGroup
	wg.Go(func() {
		errs[1] = s.Finish(ctx, rows[1].Lease, Finish{Status: effect.StatusDelivered, Attempted: true})
	})
	testenv.Eventually(t, 10*time.Second, "the first finish waits on the lock", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database()`) > 0
	})
	for i, r := range rows {
		if i == 1 {
			continue
		}
		wg.Go(func() {
			errs[i] = s.Finish(ctx, r.Lease, Finish{Status: effect.StatusDelivered, Result: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
				Attempted: true})
		})
	}
	testenv.Eventually(t, 10*time.Second, "39 finishes queued", func() bool { return s.batcher.finishes.queued() == 39 })
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, r := range rows {
		switch {
		case lost[r.EffectID] && !errors.Is(errs[i], ErrLeaseLost):
			t.Errorf("row %d, lease lost: %v, want ErrLeaseLost", i, errs[i])
		case !lost[r.EffectID] && errs[i] != nil:
			t.Errorf("row %d: %v", i, errs[i])
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'delivered' AND finished_at IS NOT NULL"); n != 30 {
		t.Errorf("%d effects delivered, want 30", n)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); n != 10 {
		t.Errorf("%d outbox rows left, want the 10 whose lease was lost", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects WHERE result->>'n' = '5' AND attempts = 1`); n != 1 {
		t.Errorf("row 5's result and attempt were not recorded")
	}
	if _, st := s.BatchStats(); st.Largest != 39 || st.Split != 0 {
		t.Errorf("finish batches: %+v, want one of 39", st)
	}
}

// A Finish whose wait for its batch runs out (the database is slow or away) is unavailable, as a statement
// that ran out of time is: its caller may try again under the same lease. A bare context error made the
// dispatcher give up on the outcome at once and leave the row to be rescued and resent (issue 28).
func TestQueuedFinishThatRunsOutOfTimeIsUnavailable(t *testing.T) {
	t.Parallel()
	base, pool := newStore(t)
	s := base.WithGroupCommit(GroupCommit{MaxBatch: 100, Parallel: 1, Timeout: 30 * time.Second})
	ctx := context.Background()
	create(t, base, "a")
	create(t, base, "b")
	rows, err := base.Claim(ctx, ClaimParams{Type: "typ", Limit: 2, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx) //nolint:errcheck
	if _, err := locker.Exec(ctx, "SELECT 1 FROM oncegate_outbox WHERE effect_id = $1 FOR UPDATE", rows[0].EffectID); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- s.Finish(ctx, rows[0].Lease, Finish{Status: effect.StatusDelivered, Attempted: true}) }()
	testenv.Eventually(t, 10*time.Second, "the first finish waits on the lock", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database()`) > 0
	})
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = s.Finish(short, rows[1].Lease, Finish{Status: effect.StatusDelivered, Attempted: true})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a queued finish that ran out of time: %v, want ErrUnavailable", err)
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// The outcome of an effect that happened outside the database is never queued behind other writes: with
// the batch slot held (a statement waiting on a lock) and another Finish queued for the next batch, an
// External Finish commits at once, in a statement of its own; a gateway killed meanwhile would resend it.
func TestExternalFinishIsNotQueuedBehindOtherWrites(t *testing.T) {
	t.Parallel()
	base, pool := newStore(t)
	s := base.WithGroupCommit(GroupCommit{MaxBatch: 100, Parallel: 1, Timeout: 30 * time.Second})
	ctx := context.Background()
	for _, k := range []string{"held", "queued", "external", "external-queued"} {
		create(t, base, k)
	}
	rows, err := base.Claim(ctx, ClaimParams{Type: "typ", Limit: 4, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 4 {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx) //nolint:errcheck
	if _, err := locker.Exec(ctx, "SELECT 1 FROM oncegate_outbox WHERE effect_id = ANY($1) FOR UPDATE",
		[]int64{rows[0].EffectID, rows[3].EffectID}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	go func() { errs <- s.Finish(ctx, rows[0].Lease, Finish{Status: effect.StatusFailed, Attempted: true}) }()
	testenv.Eventually(t, 10*time.Second, "the first finish waits on the lock", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database()`) > 0
	})
	go func() { errs <- s.Finish(ctx, rows[1].Lease, Finish{Status: effect.StatusFailed, Attempted: true}) }()
	testenv.Eventually(t, 10*time.Second, "a finish queued", func() bool { return s.batcher.finishes.queued() == 1 })
	// An External finish does not queue behind that one: it takes the reserve slot, and here waits on the
	// lock too, since its row is locked as well.
	go func() {
		errs <- s.Finish(ctx, rows[3].Lease, Finish{Status: effect.StatusDelivered, Attempted: true, External: true})
	}()
	testenv.Eventually(t, 10*time.Second, "two finishes wait on the lock", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database()`) == 2
	})
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Now with the slot held again and a finish queued, an External finish commits alone, at once.
	locker, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx) //nolint:errcheck
	create(t, base, "held-2")
	create(t, base, "queued-2")
	more, err := base.Claim(ctx, ClaimParams{Type: "typ", Limit: 2, Owner: "me", Lease: time.Minute})
	if err != nil || len(more) != 2 {
		t.Fatalf("claim: %d rows, %v", len(more), err)
	}
	if _, err := locker.Exec(ctx, "SELECT 1 FROM oncegate_outbox WHERE effect_id = $1 FOR UPDATE", more[0].EffectID); err != nil {
		t.Fatal(err)
	}
	go func() { errs <- s.Finish(ctx, more[0].Lease, Finish{Status: effect.StatusFailed, Attempted: true}) }()
	testenv.Eventually(t, 10*time.Second, "the held finish waits on the lock", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database()`) > 0
	})
	go func() { errs <- s.Finish(ctx, more[1].Lease, Finish{Status: effect.StatusFailed, Attempted: true}) }()
	testenv.Eventually(t, 10*time.Second, "a finish queued", func() bool { return s.batcher.finishes.queued() == 1 })
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Finish(short, rows[2].Lease, Finish{Status: effect.StatusDelivered, Attempted: true, External: true}); err != nil {
		t.Fatalf("an External finish behind a held batch: %v (after %v)", err, time.Since(start))
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox WHERE effect_id = $1", rows[2].EffectID); n != 0 {
		t.Fatal("the External finish did not commit")
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
