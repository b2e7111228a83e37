package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// Driver errors become the store's sentinels here, and nowhere else: the gateway branches on them alone.
func TestTranslate(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "msg " + code} }
	cases := []struct {
		err                     error
		unavailable, unstorable bool
	}{
		{pg("08006"), true, false},  // connection failure
		{pg("57P01"), true, false},  // admin shutdown
		{pg("57P03"), true, false},  // cannot connect now
		{pg("53300"), true, false},  // too many connections
		{pg("25006"), true, false},  // read-only transaction: a demoted primary
		{pg("22P05"), false, true},  // untranslatable character (\u0000 in jsonb)
		{pg("22021"), false, true},  // invalid byte sequence
		{pg("54000"), false, true},  // program limit exceeded
		{pg("23505"), false, false}, // a unique violation is a bug here, not either
		{&net.OpError{Op: "dial", Err: errors.New("refused")}, true, false},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), true, false},
		{pgconn.ErrConnClosed, true, false},
		{context.Canceled, false, false},
		{errors.New("something else"), false, false},
	}
	for _, c := range cases {
		err := translate("op", c.err)
		if errors.Is(err, ErrUnavailable) != c.unavailable || errors.Is(err, ErrUnstorable) != c.unstorable {
			t.Errorf("translate(%v) = %v: unavailable %v, unstorable %v", c.err, err,
				errors.Is(err, ErrUnavailable), errors.Is(err, ErrUnstorable))
		}
		if !errors.Is(err, c.err) {
			t.Errorf("translate(%v) lost the driver's error", c.err)
		}
	}
	var ue *UnstorableError
	if !errors.As(translate("op", pg("22P05")), &ue) || ue.Reason != "msg 22P05" {
		t.Fatalf("an unstorable error without Postgres's reason: %+v", ue)
	}
}

func newStore(t testing.TB) (*Store, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.Database(t))
	return NewStore(pool), pool
}

func create(t *testing.T, s *Store, key string) *Effect {
	t.Helper()
	e, _, err := s.Create(context.Background(), NewEffect{Tenant: "t", Key: key, Type: "typ", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func claimOne(t *testing.T, s *Store) Claimed {
	t.Helper()
	rows, err := s.Claim(context.Background(), ClaimParams{Type: "typ", Limit: 10, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %d rows, err %v", len(rows), err)
	}
	return rows[0]
}

// The lifecycle under a lease: a claim marks the effect delivering, a reschedule puts it back, and only the
// current lease's Finish records the outcome.
func TestLifecycleUnderLease(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	create(t, s, "k")
	first := claimOne(t, s)
	if e, _ := s.Get(ctx, "t", "k"); e.Status != effect.StatusDelivering {
		t.Fatalf("claimed effect is %s", e.Status)
	}
	if err := s.Reschedule(ctx, first.Lease, Reschedule{LastError: "503", Attempted: true}); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(ctx, "t", "k"); e.Status != effect.StatusPending || e.Attempts != 1 || *e.LastError != "503" {
		t.Fatalf("rescheduled effect: %+v", e)
	}
	second := claimOne(t, s)
	if err := s.Finish(ctx, first.Lease, Finish{Status: effect.StatusDelivered, Attempted: true}); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("finish under the old lease: %v, want ErrLeaseLost", err)
	}
	if err := s.Finish(ctx, second.Lease, Finish{Status: effect.StatusPending}); err == nil {
		t.Fatal("finish with a status that is not terminal was accepted")
	}
	if err := s.Finish(ctx, second.Lease, Finish{Status: effect.StatusDelivered, Result: json.RawMessage(`{"id":1}`),
		Attempted: true}); err != nil {
		t.Fatal(err)
	}
	e, _ := s.Get(ctx, "t", "k")
	if e.Status != effect.StatusDelivered || e.Attempts != 2 || e.DeliveredAt == nil || e.LastError != nil {
		t.Fatalf("finished effect: %+v", e)
	}
	if _, err := s.Retry(ctx, "t", "k"); !errors.Is(err, ErrNotRetryable) {
		t.Fatalf("retry of a delivered effect: %v", err)
	}
}

// Finish inside a transaction commits or rolls back with it: what a TxProvider's delivery relies on.
func TestFinishInTransaction(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	create(t, s, "k")
	c := claimOne(t, s)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WithTx(tx).Finish(ctx, c.Lease, Finish{Status: effect.StatusDelivered, Attempted: true}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(ctx, "t", "k"); e.Status != effect.StatusDelivering {
		t.Fatalf("a rolled-back finish left the effect %s", e.Status)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); n != 1 {
		t.Fatalf("a rolled-back finish took the outbox row: %d left", n)
	}
}

// What Postgres refuses and a database that is gone come back as the store's errors, from a real server.
func TestCreateErrorsAreTranslated(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	_, _, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "nul", Type: "typ", Payload: json.RawMessage(`{"x":"\u0000"}`)})
	var ue *UnstorableError
	if !errors.As(err, &ue) || !errors.Is(err, ErrUnstorable) || errors.Is(err, ErrUnavailable) || ue.Reason == "" {
		t.Fatalf("a \\u0000 payload: %v", err)
	}
	pool.Close()
	_, _, err = s.Create(ctx, NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{}`)})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("create on a closed pool: %v, want ErrUnavailable", err)
	}
}

// An effect keeps the stable id drawn at its creation through replays, claims and rescues; a row created
// before ids were stored (stable_id NULL) keeps the id derived from tenant and key that its deliveries carried.
func TestStableIDIsTheEffects(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	e := create(t, s, "k")
	again, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{}`)})
	if err != nil || !replayed || again.StableID != e.StableID {
		t.Fatalf("replay: %v %v %q, want the created effect's %q", err, replayed, again.StableID, e.StableID)
	}
	if c := claimOne(t, s); c.StableID != e.StableID {
		t.Fatalf("claimed with id %q, created with %q", c.StableID, e.StableID)
	}
	legacy := create(t, s, "legacy")
	if _, err := pool.Exec(ctx, "UPDATE oncegate_effects SET stable_id = NULL WHERE key = 'legacy'"); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "t", "legacy")
	if err != nil || got.StableID != effect.LegacyStableID("t", "legacy") || got.StableID == legacy.StableID {
		t.Fatalf("legacy row: %v %q, want %q", err, got.StableID, effect.LegacyStableID("t", "legacy"))
	}
	if c := claimOne(t, s); c.StableID != effect.LegacyStableID("t", "legacy") {
		t.Fatalf("legacy row claimed with id %q", c.StableID)
	}
}

// Migration 00008 dropped the outbox's foreign key (a check per row that the statement recording a batch
// already guarantees); the purge deletes any outbox row under an effect it deletes, as the cascade did, so
// that no claim leases a row whose effect is gone. The outbox row here is one no statement of the store
// leaves: an effect finished while its row stayed.
func TestPurgeTakesAnOutboxRowWithItsEffect(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	create(t, s, "kept")
	stray := create(t, s, "stray")
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET status = 'delivered', finished_at = now() - interval '2 hours'
		WHERE key = 'stray'`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx, time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("purged %d, %v; want the one effect", n, err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_outbox WHERE effect_id = $1`, stray.ID); n != 0 {
		t.Fatalf("%d outbox rows left under the purged effect", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_outbox`); n != 1 {
		t.Fatalf("%d outbox rows; want the kept effect's", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_constraint WHERE conname = 'oncegate_outbox_effect_id_fkey'`); n != 0 {
		t.Fatal("the outbox's foreign key is still there")
	}
}

// ExtendLease moves a lease's expiry under its token: a lease held, or one that ran out while no claim took
// the row since, is extended; a lease another claim took is not, and nothing changes.
func TestExtendLeaseIsFencedByTheToken(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	create(t, s, "k")
	rows, err := s.Claim(ctx, ClaimParams{Type: "typ", Limit: 1, Owner: "me", Lease: 100 * time.Millisecond})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	first := rows[0]
	if first.LeasedAt.IsZero() || first.LeasedAt.After(time.Now()) {
		t.Fatalf("LeasedAt %v", first.LeasedAt)
	}
	time.Sleep(150 * time.Millisecond) // run out, unclaimed
	if err := s.ExtendLease(ctx, first.Lease, time.Minute); err != nil {
		t.Fatalf("extending a lease that ran out with nobody taking the row: %v", err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox WHERE lease_expires_at > now() + interval '50 seconds'"); n != 1 {
		t.Fatal("the lease was not extended")
	}
	if rows, err := s.Claim(ctx, ClaimParams{Type: "typ", Limit: 1, Owner: "other", Lease: time.Minute}); err != nil || len(rows) != 0 {
		t.Fatalf("an extended lease was rescued: %d rows, %v", len(rows), err)
	}
	if _, err := pool.Exec(ctx, "UPDATE oncegate_outbox SET lease_expires_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	second := claimOne(t, s)
	if err := s.ExtendLease(ctx, first.Lease, time.Hour); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("extending a lease another claim took: %v, want ErrLeaseLost", err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox WHERE lease_expires_at > now() + interval '2 minutes'"); n != 0 {
		t.Fatal("a lost lease's extension changed the row")
	}
	if err := s.Finish(ctx, second.Lease, Finish{Status: effect.StatusDelivered, Attempted: true}); err != nil {
		t.Fatal(err)
	}
}

// A key pointing at an effect no longer stored (a gateway older than migration 00018, left running beside
// this version, purged it by its own retention) is what a purge would have freed: a request under it makes a
// new effect, through a statement of its own and through a batch, where it used to fail for good ("vanished
// twice") until the key expired.
func TestAKeyWhoseEffectIsGoneIsClaimedAgain(t *testing.T) {
	t.Parallel()
	plain, pool := newStore(t)
	ctx := context.Background()
	for name, s := range map[string]*Store{"alone": plain.WithRetention(time.Hour),
		"batched": plain.WithRetention(time.Hour).WithGroupCommit(DefaultGroupCommit)} {
		key := "gone-" + name
		old, _, err := s.Create(ctx, NewEffect{Tenant: "t", Key: key, Type: "typ", Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `WITH o AS (DELETE FROM oncegate_outbox WHERE effect_id = $1)
			DELETE FROM oncegate_effects WHERE id = $1`, old.ID); err != nil {
			t.Fatal(err)
		}
		e, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: key, Type: "typ", Payload: json.RawMessage(`{}`)})
		if err != nil || replayed || e.ID == old.ID {
			t.Fatalf("%s: a create under a key whose effect is gone: %v, replayed %v, %+v", name, err, replayed, e)
		}
		if _, replayed, err := s.Create(ctx, NewEffect{Tenant: "t", Key: key, Type: "typ",
			Payload: json.RawMessage(`{}`)}); err != nil || !replayed {
			t.Fatalf("%s: the next request under it: %v, replayed %v", name, err, replayed)
		}
	}
}

// A write that finds no partition for its effect (none covers the present: every gateway was down for longer
// than the partitions made ahead, and none has made its first pass yet) is the database not ready to take
// it, as the gateway's /readyz says, not a fault of the request: ErrUnavailable, which the gateway answers
// 503 with Retry-After. It was an internal error, a 500, for the first requests after such a restart.
func TestAWriteWithNoPartitionForItIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	rows, err := pool.Query(ctx, "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'oncegate_effects'::regclass")
	if err != nil {
		t.Fatal(err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if _, err := pool.Exec(ctx, "ALTER TABLE oncegate_effects DETACH PARTITION "+p); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err = s.Create(ctx, NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{}`)})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a create with no partition for it: %v; want ErrUnavailable", err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_keys"); n != 0 {
		t.Fatalf("%d keys were claimed for an effect that was not written", n)
	}
}
