package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/consoletest"
	"github.com/oncegate/oncegate/outbox"
)

// Every field docs/cli.md lists for `breaker ls` is there, an absent one as null.
func TestBreakerJSONHasEveryDocumentedField(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(admin.Breaker{Gateway: "gw", BreakerState: outbox.BreakerState{Type: "hook", State: "closed"}})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"gateway", "gateway_alive", "type", "tenant", "destination", "state", "open_until",
		"last_used", "in_flight"} {
		if _, ok := m[f]; !ok {
			t.Errorf("%s is missing: %s", f, b)
		}
	}
	if m["open_until"] != nil || m["in_flight"] != float64(0) {
		t.Errorf("a closed, idle breaker: %s", b)
	}
}

// Gateways gone for over an hour are folded into a count, with their breakers (an on-call engineer saw 14
// breaker rows after two restarts, hundreds in a fleet); --all shows them.
func TestGoneGatewaysAreFolded(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	if err := consoletest.Gateways(ctx, pool); err != nil {
		t.Fatal(err)
	}
	fleet, err := svc.Gateways(ctx, viv, admin.FleetFilter{})
	if err != nil || fleet.Folded != 1 || len(fleet.Gateways) != 2 {
		t.Fatalf("gateways: %+v %v", fleet, err)
	}
	for _, g := range fleet.Gateways {
		if g.ID == "gw-0" {
			t.Fatal("gw-0, gone three hours ago, is listed")
		}
	}
	bs, err := svc.Breakers(ctx, viv, admin.FleetFilter{})
	if err != nil || bs.Folded != 1 || len(bs.Breakers) != 3 {
		t.Fatalf("breakers: %+v %v", bs, err)
	}
	all, err := svc.Breakers(ctx, viv, admin.FleetFilter{All: true})
	if err != nil || all.Folded != 0 || len(all.Breakers) != 4 {
		t.Fatalf("breakers --all: %+v %v", all, err)
	}
}

// Each destination's success rate and latencies over the last hour, by type, as the gateways' attempt logs
// roll them up per minute: two flushes (two gateways) add to the same minutes; an operator's change (no type,
// no destination) is no attempt; a minute older than the hour is left out.
func TestDestinationRates(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "r", 1, effect.StatusDelivered)
	var id int64
	if err := pool.QueryRow(ctx, `SELECT id FROM oncegate_effects`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for g := range 2 {
		log := dedup.NewAttemptLog(pool, time.Hour, nil)
		for n := range 5 {
			outcome := "delivered"
			if g == 1 && n == 4 {
				outcome = "retry"
			}
			log.Record(dedup.Attempt{EffectID: id, Attempt: 1, Start: now, Gateway: fmt.Sprint("gw", g), Outcome: outcome,
				Latency: time.Duration(10*(n+1)) * time.Millisecond, Called: true, Type: "hook", Destination: "hooks.a.test"})
		}
		log.Record(dedup.Attempt{EffectID: id, Attempt: 1, Start: now.Add(-2 * time.Hour), Gateway: "gw", Outcome: "failed",
			Called: true, Type: "hook", Destination: "hooks.a.test"})
		log.Record(dedup.Attempt{EffectID: id, Attempt: 1, Start: now, Gateway: "gw", Outcome: "failed", Called: true,
			Latency: 7 * time.Millisecond, Type: "hook", Destination: "hooks.b.test"})
		if err := log.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := svc.DestinationRates(ctx, viv)
	if err != nil || len(ds) != 2 {
		t.Fatalf("destinations: %+v %v", ds, err)
	}
	a, b := ds[0], ds[1]
	if a.Destination != "hooks.a.test" || a.Attempts != 10 || a.Delivered != 9 || a.Retried != 1 || a.SuccessRate != 0.9 ||
		a.P50MS == nil || *a.P50MS != 50 || a.P99MS == nil || *a.P99MS != 50 {
		t.Errorf("hooks.a.test: %+v (p50 %v, p99 %v; latencies 10 to 50 ms, bucket bounds 20 and 50)", a, a.P50MS, a.P99MS)
	}
	if b.Destination != "hooks.b.test" || b.Attempts != 2 || b.Failed != 2 || b.SuccessRate != 0 || b.P50MS == nil || *b.P50MS != 10 {
		t.Errorf("hooks.b.test: %+v", b)
	}
}
