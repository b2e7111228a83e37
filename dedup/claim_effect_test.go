package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
)

// A request that waited for an attempt (the dedup proxy's waiter, in any gateway) claims with that attempt's
// lease as its fence: it may rescue that very attempt once its lease ran out, and never take a row whose
// awaited attempt ended, handed back pending or leased anew. Without the fence, the row handed back was
// claimable at once, and a waiter in another gateway performed the request a second time.
func TestClaimEffectIsFencedByTheAwaitedAttempt(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	gatewayA := Holder{Owner: "a", Lease: time.Minute}
	gatewayB := Holder{Owner: "b", Lease: time.Minute}
	_, c, _, err := s.CreateLeased(ctx, NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{}`)}, nil, gatewayA)
	if err != nil || c == nil {
		t.Fatalf("create leased: %v", err)
	}
	// B finds A's attempt in flight: not claimed, and told which lease holds it.
	ec, err := s.ClaimEffect(ctx, c.EffectID, gatewayB, nil)
	if err != nil || ec.Found || ec.Holding == nil || *ec.Holding != c.Token {
		t.Fatalf("claim while A holds it: %+v %v", ec, err)
	}
	fence := *ec.Holding
	// A's attempt ends transiently: the row is handed back, due at once.
	if err := s.Reschedule(ctx, c.Lease, Reschedule{LastError: "503", Attempted: true}); err != nil {
		t.Fatal(err)
	}
	if ec, err := s.ClaimEffect(ctx, c.EffectID, gatewayB, &fence); err != nil || ec.Found || ec.Holding != nil {
		t.Fatalf("the waiter claimed a row whose awaited attempt ended: %+v %v", ec, err)
	}
	// A request that waited for nothing may take it.
	fresh, err := s.ClaimEffect(ctx, c.EffectID, gatewayA, nil)
	if err != nil || !fresh.Found || fresh.Rescued {
		t.Fatalf("a fresh claim: %+v %v", fresh, err)
	}
	// Leased anew: the waiter with the old fence is told of the new lease, and takes nothing.
	if ec, err := s.ClaimEffect(ctx, c.EffectID, gatewayB, &fence); err != nil || ec.Found || ec.Holding == nil ||
		*ec.Holding != fresh.Token {
		t.Fatalf("claim against an attempt leased anew: %+v %v", ec, err)
	}
	// The new attempt's holder dies: its lease runs out. A waiter fenced by that attempt rescues it; one
	// fenced by the old attempt still does not.
	if _, err := pool.Exec(ctx, `UPDATE oncegate_outbox SET lease_expires_at = now() - interval '1 second' WHERE effect_id = $1`, c.EffectID); err != nil {
		t.Fatal(err)
	}
	if ec, err := s.ClaimEffect(ctx, c.EffectID, gatewayB, &fence); err != nil || ec.Found {
		t.Fatalf("an old fence rescued another attempt: %+v %v", ec, err)
	}
	rescued, err := s.ClaimEffect(ctx, c.EffectID, gatewayB, &fresh.Token)
	if err != nil || !rescued.Found || !rescued.Rescued || string(rescued.Payload) != `{}` {
		t.Fatalf("rescue of the awaited attempt: %+v %v", rescued, err)
	}
	// Terminal: no row, nothing held.
	if err := s.Finish(ctx, rescued.Lease, Finish{Status: effect.StatusDelivered}); err != nil {
		t.Fatal(err)
	}
	if ec, err := s.ClaimEffect(ctx, c.EffectID, gatewayA, nil); err != nil || ec.Found || ec.Holding != nil {
		t.Fatalf("claim of a terminal effect: %+v %v", ec, err)
	}
	// A paused type is refused to a request that would have taken the row.
	_, c2, _, err := s.CreateLeased(ctx, NewEffect{Tenant: "t", Key: "k2", Type: "typ", Payload: json.RawMessage(`{}`)}, nil, gatewayA)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reschedule(ctx, c2.Lease, Reschedule{LastError: "503", Attempted: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_paused_types (type, paused_by, reason) VALUES ('typ', 'op', 'x')`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimEffect(ctx, c2.EffectID, gatewayB, nil); !errors.Is(err, ErrTypePaused) {
		t.Fatalf("claim of a paused type: %v", err)
	}
}

// A rescue by a request counts the interrupted attempt on the row and says whose it was, as a claim's does:
// each holder that dies adds one, so that the outcome finally recorded counts every attempt that may have
// reached the provider, and the attempt log names the gateway that made it. Before, the request's rescue
// counted nothing on the row and brought no lease: two kills in a row counted one, and the interrupted
// attempt was not logged at all.
func TestClaimEffectCountsEachRescue(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	gatewayA := Holder{Owner: "a", Lease: time.Minute}
	gatewayB := Holder{Owner: "b", Lease: time.Minute}
	gatewayC := Holder{Owner: "c", Lease: time.Minute}
	_, c, _, err := s.CreateLeased(ctx, NewEffect{Tenant: "t", Key: "k", Type: "typ", Payload: json.RawMessage(`{}`)}, nil, gatewayA)
	if err != nil || c == nil {
		t.Fatalf("create leased: %v", err)
	}
	expire := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE oncegate_outbox SET lease_expires_at = now() - interval '1 second'
			WHERE effect_id = $1`, c.EffectID); err != nil {
			t.Fatal(err)
		}
	}
	expire() // A dies mid-call
	byB, err := s.ClaimEffect(ctx, c.EffectID, gatewayB, nil)
	if err != nil || !byB.Found || !byB.Rescued {
		t.Fatalf("B's rescue: %+v %v", byB, err)
	}
	if byB.InterruptedAttempts != 1 || byB.Interrupted.Owner != "a" || byB.Interrupted.Token == nil ||
		*byB.Interrupted.Token != c.Token || byB.Interrupted.Expired.IsZero() {
		t.Fatalf("B's rescue counted %d interrupted attempts, from %+v; want 1, from A's lease",
			byB.InterruptedAttempts, byB.Interrupted)
	}
	expire() // B dies mid-call too
	byC, err := s.ClaimEffect(ctx, c.EffectID, gatewayC, nil)
	if err != nil || !byC.Found || !byC.Rescued {
		t.Fatalf("C's rescue: %+v %v", byC, err)
	}
	if byC.InterruptedAttempts != 2 || byC.Interrupted.Owner != "b" || *byC.Interrupted.Token != byB.Token {
		t.Fatalf("C's rescue counted %d interrupted attempts, from %+v; want 2, from B's lease",
			byC.InterruptedAttempts, byC.Interrupted)
	}
	if err := s.Finish(ctx, byC.Lease, Finish{Status: effect.StatusDelivered, Attempted: true,
		Interrupted: byC.InterruptedAttempts}); err != nil {
		t.Fatal(err)
	}
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT attempts FROM oncegate_effects WHERE id = $1`, c.EffectID).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 3 {
		t.Fatalf("the effect counts %d attempts, want 3 (two interrupted, one delivered)", attempts)
	}
}

// A new effect recorded leased to its request (the dedup proxy) comes back with what the fleet's pauses say
// of its destination, asked by the same statement: the request does not ask again before its call.
func TestCreateLeasedTellsTheDestinationsPause(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	h := Holder{Owner: "a", Lease: time.Minute}
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_destination_pauses (type, destination, until, status, paused_by, paused_at)
		VALUES ('typ', 'http://paused:80', now() + interval '30 seconds', 429, 'b', now()),
		       ('typ', 'http://over:80', now() - interval '1 second', 429, 'b', now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dest     string
		min, max time.Duration
		asked    string
	}{
		{"http://paused:80", 29 * time.Second, 30 * time.Second, "http://paused:80"},
		{"http://over:80", 0, 0, "http://over:80"},
		{"http://open:80", 0, 0, "http://open:80"},
		{"", 0, 0, ""},
	} {
		_, c, _, err := s.CreateLeased(ctx, NewEffect{Tenant: "t", Key: "k-" + tc.dest, Type: "typ", Payload: json.RawMessage(`{}`),
			Destination: tc.dest}, nil, h)
		if err != nil {
			t.Fatal(err)
		}
		if c.PauseAsked != tc.asked || c.PauseLeft < tc.min || c.PauseLeft > tc.max {
			t.Fatalf("%q: asked %q, left %v; want %q, %v to %v", tc.dest, c.PauseAsked, c.PauseLeft, tc.asked, tc.min, tc.max)
		}
	}
}
