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
)

// expire moves the key's expiry into the past, as the passing of its retention would.
func expire(t *testing.T, pool *pgxpool.Pool, tenant, key string) {
	t.Helper()
	if n := pgtest.Count(t, pool, `WITH x AS (UPDATE oncegate_keys SET expires_at = now() - interval '1 second'
		WHERE tenant = $1 AND key = $2 RETURNING effect_id), e AS (
			-- A key is held for retention after its effect finished too (SPEC §2): that passes as well.
			UPDATE oncegate_effects SET finished_at = finished_at - interval '25 hours'
			WHERE id = (SELECT effect_id FROM x) AND finished_at IS NOT NULL)
		SELECT count(*) FROM x`, tenant, key); n != 1 {
		t.Fatalf("expired %d keys %s/%s", n, tenant, key)
	}
}

// SPEC §2: a key is kept at least its retention after its effect is terminal. An effect retried past its
// key's expiry (a receiver down longer than retention.keys) held its key only until it finished: a job that
// ran again right after the delivery made a second effect, delivered again under a new stable id (an outside
// test: 40 webhooks for 20 actions). Through every path that claims a key.
//
// A store that follows a fleet whose settings a canary with a minute's retention just took over from an
// hour's holds such a key for the hour the old settings promised (Follow's hold): an outside tester's job run
// again 72 s after its late delivery, promised 2 minutes, was delivered twice.
func TestAKeyIsHeldForRetentionAfterItsEffectFinished(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.Database(t))
	ctx := context.Background()
	taken := &Follow{}
	taken.Set(time.Minute, time.Hour, false)
	for j, plain := range []*Store{NewStore(pool).WithRetention(time.Hour), NewStore(pool).Following(taken)} {
		for i, path := range []string{"alone", "batched", "leased"} {
			typ, key := fmt.Sprintf("typ%s%d", path, j), fmt.Sprintf("k%s%d", path, j)
			ne := NewEffect{Tenant: "t", Key: key, Type: typ, Payload: json.RawMessage(`{"n":1}`)}
			first, _, err := plain.Create(ctx, ne)
			if err != nil {
				t.Fatal(err)
			}
			// Its key expires while it is retried; it is delivered after that.
			if _, err := pool.Exec(ctx, `UPDATE oncegate_keys SET expires_at = now() - interval '1 second' WHERE key = $1`, key); err != nil {
				t.Fatal(err)
			}
			deliver(t, plain, typ)
			// Half an hour on: past the canary's minute, within the hour.
			if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET finished_at = now() - interval '30 minutes' WHERE id = $1`, first.ID); err != nil {
				t.Fatal(err)
			}
			again := func() (*Effect, bool) {
				t.Helper()
				switch i {
				case 0:
					e, replayed, err := plain.Create(ctx, ne)
					if err != nil {
						t.Fatal(err)
					}
					return e, replayed
				case 1:
					e, replayed, err := plain.WithGroupCommit(DefaultGroupCommit).Create(ctx, ne)
					if err != nil {
						t.Fatal(err)
					}
					return e, replayed
				}
				e, _, replayed, err := plain.CreateLeased(ctx, ne, nil, Holder{Owner: "proxy", Lease: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				return e, replayed
			}
			if e, replayed := again(); !replayed || e.ID != first.ID {
				t.Fatalf("%s: the request again, half an hour after its late delivery: replayed %v, effect %d, want a replay of %d",
					path, replayed, e.ID, first.ID)
			}
			// An hour after it finished, the key is free.
			if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET finished_at = now() - interval '61 minutes' WHERE id = $1`, first.ID); err != nil {
				t.Fatal(err)
			}
			if e, replayed := again(); replayed || e.ID == first.ID {
				t.Fatalf("%s: the request again, retention after its effect finished: replayed %v, effect %d (the old %d)",
					path, replayed, e.ID, first.ID)
			}
		}
	}
}

// deliver claims the one due effect of typ and records it delivered, as a dispatcher would.
func deliver(t *testing.T, s *Store, typ string) {
	t.Helper()
	ctx := context.Background()
	rows, err := s.Claim(ctx, ClaimParams{Type: typ, Limit: 10, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim %s: %d rows, %v", typ, len(rows), err)
	}
	if err := s.Finish(ctx, rows[0].Lease, Finish{Status: effect.StatusDelivered, Attempted: true}); err != nil {
		t.Fatal(err)
	}
}

// Issue 30: two requests for a key whose retention has passed make one new effect. Each round, a key's
// effect is delivered and its key expires; then eight requests race for it through every path that claims
// keys (a statement alone, two group-commit batchers, the proxy's leased create). Exactly one creates; every
// other replays that new effect, never the old one, whichever statement's snapshot saw which state.
func TestConcurrentCreatesOfAnExpiredKeyMakeOneEffect(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.Database(t))
	ctx := context.Background()
	plain := NewStore(pool)
	stores := []*Store{plain, NewStore(pool).WithGroupCommit(DefaultGroupCommit),
		NewStore(pool).WithGroupCommit(DefaultGroupCommit)}
	const rounds, racers = 40, 8
	for round := range rounds {
		typ, key := fmt.Sprintf("typ%d", round), fmt.Sprintf("k%d", round)
		ne := NewEffect{Tenant: "t", Key: key, Type: typ, Payload: json.RawMessage(`{"n":1}`)}
		old, _, err := plain.Create(ctx, ne)
		if err != nil {
			t.Fatal(err)
		}
		deliver(t, plain, typ)
		expire(t, pool, "t", key)

		type outcome struct {
			e       *Effect
			created bool
			err     error
		}
		out := make([]outcome, racers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				<-start
				if i%4 == 3 {
					e, c, replayed, err := plain.CreateLeased(ctx, ne, nil, Holder{Owner: "proxy", Lease: time.Minute})
					out[i] = outcome{e, c != nil && !replayed, err}
					return
				}
				e, replayed, err := stores[i%len(stores)].Create(ctx, ne)
				out[i] = outcome{e, !replayed, err}
			})
		}
		close(start)
		wg.Wait()
		var created *Effect
		for i, o := range out {
			if o.err != nil {
				t.Fatalf("round %d, racer %d: %v", round, i, o.err)
			}
			if o.created {
				if created != nil {
					t.Fatalf("round %d: effects %d and %d were both created for key %s", round, created.ID, o.e.ID, key)
				}
				created = o.e
			}
		}
		if created == nil || created.ID == old.ID || created.StableID == old.StableID {
			t.Fatalf("round %d: created %+v after the old effect %d expired", round, created, old.ID)
		}
		for i, o := range out {
			if o.e.ID != created.ID {
				t.Fatalf("round %d, racer %d answered with effect %d, not the new %d (the old one was %d)", round, i,
					o.e.ID, created.ID, old.ID)
			}
		}
		if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects WHERE tenant = 't' AND key = $1`, key); n != 2 {
			t.Fatalf("round %d: %d effects under the key, want the old and the new", round, n)
		}
	}
}

// A key past its expiry whose effect is not terminal (pending, waiting for a retry, or being delivered) is
// still held: a create replays it, through every path, and no new effect is made.
func TestExpiredKeyOfAnEffectNotTerminalIsReplayed(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	batched := NewStore(pool).WithGroupCommit(DefaultGroupCommit)
	ne := NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{}`)}
	first, _, err := s.Create(ctx, ne)
	if err != nil {
		t.Fatal(err)
	}
	expire(t, pool, "t", "k")
	replays := func(state string) {
		t.Helper()
		for i, st := range []*Store{s, batched} {
			e, replayed, err := st.Create(ctx, ne)
			if err != nil || !replayed || e.ID != first.ID {
				t.Fatalf("%s, store %d: %v %v %+v; want a replay of %d", state, i, err, replayed, e, first.ID)
			}
		}
		e, c, replayed, err := s.CreateLeased(ctx, ne, nil, Holder{Owner: "proxy", Lease: time.Minute})
		if err != nil || !replayed || c != nil || e.ID != first.ID {
			t.Fatalf("%s, leased: %v %v %+v; want a replay of %d", state, err, replayed, e, first.ID)
		}
	}
	replays("pending")
	c := claimOne(t, s)
	replays("delivering")
	if err := s.Reschedule(ctx, c.Lease, Reschedule{Delay: time.Hour, LastError: "503", Attempted: true}); err != nil {
		t.Fatal(err)
	}
	replays("retrying")
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects`); n != 1 {
		t.Fatalf("%d effects", n)
	}
}

// A key claimed again names a new effect, with a new id and stable id, whatever its request (a new payload is
// not a reused key: the old request is past its retention). Every read by key, and a retry by key, is of the
// new effect; the old one stays readable by its id. A replay of the new key writes nothing, not even a lock
// on the key's row.
func TestReclaimedKeyIsANewEffect(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	old := create(t, s, "k")
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET status = 'dead', finished_at = now()`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM oncegate_outbox`); err != nil {
		t.Fatal(err)
	}
	// Not yet expired: a replay of the dead effect, and another payload is a reused key.
	if e, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{}`)}); err != nil || !replayed || e.ID != old.ID {
		t.Fatalf("before expiry: %v %v %+v", err, replayed, e)
	}
	var reused *KeyReusedError
	if _, _, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{"v":2}`)}); !errors.As(err, &reused) {
		t.Fatalf("another payload before expiry: %v", err)
	}
	expire(t, pool, "t", "k")
	ne := NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{"v":2}`)}
	fresh, replayed, err := s.Create(ctx, ne)
	if err != nil || replayed || fresh.ID == old.ID || fresh.StableID == old.StableID || fresh.Status != effect.StatusPending {
		t.Fatalf("after expiry: %v %v %+v (old %+v)", err, replayed, fresh, old)
	}
	if got, err := s.Get(ctx, "t", "k"); err != nil || got.ID != fresh.ID {
		t.Fatalf("Get after the re-claim: %v %+v, want %d", err, got, fresh.ID)
	}
	var keyExpiry, created time.Time
	if err := pool.QueryRow(ctx, `SELECT k.expires_at, e.created_at FROM oncegate_keys k JOIN oncegate_effects e
		ON e.id = k.effect_id WHERE k.tenant = 't' AND k.key = 'k'`).Scan(&keyExpiry, &created); err != nil {
		t.Fatal(err)
	}
	if d := keyExpiry.Sub(created); d != DefaultRetention {
		t.Fatalf("the new key expires %v after its effect's creation, want %v", d, DefaultRetention)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects WHERE id = $1 AND status = 'dead'`, old.ID); n != 1 {
		t.Fatal("the old effect is not readable by its id")
	}
	// A retry by key is of the key's effect: the new one, pending, is not retryable; the dead one stays dead.
	if _, err := s.Retry(ctx, "t", "k"); !errors.Is(err, ErrNotRetryable) {
		t.Fatalf("retry by key: %v", err)
	}
	// A row lock would write the replay's transaction id into the row's xmax.
	const version = `SELECT ctid::text || '/' || xmax::text FROM oncegate_keys WHERE tenant = 't' AND key = 'k'`
	var before, after string
	if err := pool.QueryRow(ctx, version).Scan(&before); err != nil {
		t.Fatal(err)
	}
	again, replayed, err := s.Create(ctx, ne)
	if err != nil || !replayed || again.ID != fresh.ID {
		t.Fatalf("replay of the new effect: %v %v %+v", err, replayed, again)
	}
	if err := pool.QueryRow(ctx, version).Scan(&after); err != nil || after != before {
		t.Fatalf("the key's row was %s before the replay and %s after (%v): the replay wrote it", before, after, err)
	}
}

// The purge deletes effects past retention with the keys that still point at them, and never a key claimed
// again: that key points at its new effect, which it keeps.
func TestPurgeNeverDeletesAReclaimedKey(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	old := create(t, s, "reclaimed")
	deliver(t, s, "typ")
	if _, _, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "gone", Type: "other", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	deliver(t, s, "other")
	expire(t, pool, "t", "reclaimed")
	fresh, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "reclaimed", Type: "later", Payload: json.RawMessage(`{}`)})
	if err != nil || replayed || fresh.ID == old.ID {
		t.Fatalf("re-claim: %v %v %+v", err, replayed, fresh)
	}
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET finished_at = now() - interval '2 hours'
		WHERE finished_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx, time.Hour, 100); err != nil || n != 2 {
		t.Fatalf("purged %d, %v; want the two delivered effects", n, err)
	}
	if got, err := s.Get(ctx, "t", "reclaimed"); err != nil || got.ID != fresh.ID {
		t.Fatalf("the re-claimed key after the purge: %v %+v, want effect %d", err, got, fresh.ID)
	}
	if _, err := s.Get(ctx, "t", "gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the purged effect's key: %v", err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_keys`); n != 1 {
		t.Fatalf("%d keys left, want the re-claimed one", n)
	}
	// The freed key is free: a new effect.
	if _, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "gone", Type: "typ", Payload: json.RawMessage(`{}`)}); err != nil || replayed {
		t.Fatalf("create under the purged key: %v %v", err, replayed)
	}
}
