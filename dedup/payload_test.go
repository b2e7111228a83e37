package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
)

func TestNULEscape(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]bool{
		`{"a":"\u0000"}`:          true,
		`{"\u0000":1}`:            true,
		`["x\"\u0000"]`:           true,
		`{"a":"\\u0000"}`:         false, // a backslash, then the text u0000
		`{"a":"\\\u0000"}`:        true,
		`{"a":"\u00001"}`:         true,
		`{"a":"\u0001","b":"\n"}`: false,
		`{"a":"u0000"}`:           false,
		`"\\"`:                    false,
	} {
		if got := nulEscape([]byte(doc)); got != want {
			t.Errorf("nulEscape(%s) = %v, want %v", doc, got, want)
		}
	}
}

// What is stored is what was sent, byte for byte; ClaimLeases leases rows without it and Payload reads it
// under the lease, and not under another.
func TestPayloadIsStoredAsSentAndReadUnderTheLease(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	sent := "{ \"z\" : 1.50,\n \"a\": [1e300, -0], \"Z\": \"caf\\u00e9\" }"
	if _, _, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(sent)}); err != nil {
		t.Fatal(err)
	}
	rows, err := s.ClaimLeases(ctx, ClaimParams{Type: "typ", Limit: 10, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 1 || rows[0].Payload != nil || rows[0].Key != "k" {
		t.Fatalf("ClaimLeases: %+v, %v", rows, err)
	}
	p, err := s.Payload(ctx, rows[0].Lease)
	if err != nil || string(p) != sent {
		t.Fatalf("Payload: %q, %v; sent %q", p, err, sent)
	}
	other := rows[0].Lease
	other.Token[0]++
	if _, err := s.Payload(ctx, other); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Payload under another lease: %v", err)
	}
}

// Rows handed back after a failed read are due at once, unattempted, and a rescued row is still rescued, so
// that on_crash decides about it as before.
func TestReleaseKeepsRescuedRowsRescued(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	create(t, s, "fresh")
	create(t, s, "rescued")
	if _, err := pool.Exec(ctx, `UPDATE oncegate_outbox SET lease_token = gen_random_uuid(), lease_owner = 'dead',
		lease_expires_at = now() - interval '1 second' WHERE effect_id = (SELECT id FROM oncegate_effects WHERE key = 'rescued')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET status = 'delivering' WHERE key = 'rescued'`); err != nil {
		t.Fatal(err)
	}
	p := ClaimParams{Type: "typ", Limit: 10, Owner: "me", Lease: time.Minute}
	rows, err := s.ClaimLeases(ctx, p)
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %+v, %v", rows, err)
	}
	if err := s.release(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(ctx, "t", "fresh"); e.Status != effect.StatusPending || e.Attempts != 0 {
		t.Fatalf("handed back: %+v", e)
	}
	if e, _ := s.Get(ctx, "t", "rescued"); e.Status != effect.StatusDelivering || e.Attempts != 0 {
		t.Fatalf("handed back rescued: %+v", e)
	}
	again, err := s.Claim(ctx, p)
	if err != nil || len(again) != 2 {
		t.Fatalf("claim again: %+v, %v", again, err)
	}
	for _, r := range again {
		if r.Rescued != (r.Key == "rescued") || string(r.Payload) != `{}` {
			t.Fatalf("claimed again: %+v", r)
		}
	}
}

// A rescued row handed back before its delivery (its payload unreadable, its destination out of tokens or
// paused) keeps the name of the gateway whose attempt was interrupted, so that the claim that takes it next
// logs that attempt under it, once, and counts it once. Before, every hand-back forgot it, and the attempt
// log named the gateway "(not known)".
func TestHandedBackRescuedRowsKeepTheirInterruptedHolder(t *testing.T) {
	t.Parallel()
	backs := map[string]func(s *Store, ctx context.Context, rows []Claimed) error{
		"release":   (*Store).release,
		"hand back": (*Store).handBack,
		"defer": func(s *Store, ctx context.Context, rows []Claimed) error {
			return s.Defer(ctx, rows, make([]time.Duration, len(rows)), make([]string, len(rows)), nil)
		},
	}
	for name, back := range backs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, pool := newStore(t)
			ctx := context.Background()
			create(t, s, "rescued")
			if _, err := pool.Exec(ctx, `UPDATE oncegate_outbox SET lease_token = gen_random_uuid(), lease_owner = 'dead',
				lease_expires_at = now() - interval '1 second'`); err != nil {
				t.Fatal(err)
			}
			p := ClaimParams{Type: "typ", Limit: 10, Owner: "me", Lease: time.Minute}
			for round := range 2 { // handed back twice: the holder survives a hand-back of a row handed back
				rows, err := s.ClaimLeases(ctx, p)
				if err != nil || len(rows) != 1 || !rows[0].Rescued || rows[0].Interrupted.Owner != "dead" ||
					rows[0].InterruptedAttempts != 1 {
					t.Fatalf("claim %d: %+v, %v; want the row rescued from dead, one interrupted attempt", round, rows, err)
				}
				if err := back(s, ctx, rows); err != nil {
					t.Fatal(err)
				}
			}
			again, err := s.Claim(ctx, p)
			if err != nil || len(again) != 1 || !again[0].Rescued || again[0].Interrupted.Owner != "dead" ||
				again[0].InterruptedAttempts != 1 {
				t.Fatalf("claimed again: %+v, %v; want the row rescued from dead, one interrupted attempt", again, err)
			}
		})
	}
}

// An outcome is recorded even when its details are what Postgres cannot store: a result holding \u0000 (an
// upstream's body, say) or an error text with a NUL or bytes that are not UTF-8. Were the write refused, the
// row would be rescued after its lease and delivered again, for ever.
func TestOutcomeDetailsThatPostgresRefusesAreMadeStorable(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	create(t, s, "k")
	c := claimOne(t, s)
	if err := s.Reschedule(ctx, c.Lease, Reschedule{LastError: "upstream said \x00\xff", Attempted: true}); err != nil {
		t.Fatalf("reschedule: %v", err)
	}
	if e, _ := s.Get(ctx, "t", "k"); e.LastError == nil || *e.LastError != "upstream said \ufffd\ufffd" {
		t.Fatalf("last error %q", deref(e.LastError))
	}
	c = claimOne(t, s)
	err := s.Finish(ctx, c.Lease, Finish{Status: effect.StatusDelivered, Attempted: true,
		Result: json.RawMessage(`{"body":"a\u0000b\\u0000","n":1}`), LastError: "\x00"})
	if err != nil {
		t.Fatalf("finish: %v", err)
	}
	e, _ := s.Get(ctx, "t", "k")
	var res map[string]any
	if e.Status != effect.StatusDelivered || json.Unmarshal(e.Result, &res) != nil || res["body"] != "a\ufffdb\\u0000" {
		t.Fatalf("finished: %+v, result %s", e, e.Result)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// A claim leases its rows without reading their effects (claim.sql says why), and reads them after. While a
// partition of the effects is locked (VACUUM FULL, CLUSTER, a REINDEX, pg_repack's swap), that read waits out
// its bound, and the rows must go back unleased, as they were: a hand-back that wrote the effects too waited
// on the same lock, the leases ran out, and the next claim took the rows for a crash's (an outside test: six
// effects never sent ended unknown under on_crash at_most_once).
func TestRowsClaimedWhileTheirEffectsAreLockedGoBackUnattempted(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b"} {
		if _, _, err := s.Create(ctx, NewEffect{Tenant: "t", Key: k, Type: "typ", Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	var part string
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM oncegate_effects LIMIT 1`).Scan(&part); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+part+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	for _, claim := range []func(context.Context, ClaimParams) ([]Claimed, error){s.Claim, s.ClaimLeases} {
		// ctx has no bound: the read gives up at half the lease by itself (were it to wait for the lock, the
		// test would never end). A claim timeout longer than a short type's lease let the leases run out
		// while the read waited, and another gateway rescue the rows.
		rows, err := claim(ctx, ClaimParams{Type: "typ", Limit: 1, Owner: "me", Lease: time.Second})
		if err == nil {
			t.Fatalf("claimed %+v while the effects were locked", rows)
		}
	}
	var leased int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM oncegate_outbox WHERE lease_expires_at IS NOT NULL`).Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if leased != 0 {
		t.Fatalf("%d rows stayed leased after their claims failed", leased)
	}
	_ = tx.Rollback(ctx)
	rows, err := s.Claim(ctx, ClaimParams{Type: "typ", Limit: 10, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 2 {
		t.Fatalf("Claim after the lock: %+v, %v", rows, err)
	}
	for _, r := range rows {
		if r.Rescued {
			t.Errorf("%s: claimed as rescued, as though a delivery had been interrupted", r.Key)
		}
	}
}
