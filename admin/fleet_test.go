package admin_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/oncegate/oncegate/admin"
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

// Each destination's success rate over the last hour, by type, from the attempt log: an operator's change
// (attempt 0) is no attempt, and attempts older than the hour are left out.
func TestDestinationRates(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "r", 1, effect.StatusDelivered)
	if _, err := pool.Exec(ctx, `
		INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome, latency_ms, type, destination)
		SELECT e.id, n, now() - interval '5 minutes', 'gw', CASE WHEN n = 10 THEN 'retry' ELSE 'delivered' END, n * 10,
		       'hook', 'hooks.a.test'
		FROM oncegate_effects e, generate_series(1, 10) n
		UNION ALL SELECT e.id, 1, now() - interval '2 hours', 'gw', 'failed', 5, 'hook', 'hooks.a.test' FROM oncegate_effects e
		UNION ALL SELECT e.id, 0, now(), 'operator alice', 'retried', NULL, NULL, NULL FROM oncegate_effects e
		UNION ALL SELECT e.id, 1, now(), 'gw', 'failed', 7, 'hook', 'hooks.b.test' FROM oncegate_effects e`); err != nil {
		t.Fatal(err)
	}
	ds, err := svc.DestinationRates(ctx, viv)
	if err != nil || len(ds) != 2 {
		t.Fatalf("destinations: %+v %v", ds, err)
	}
	a, b := ds[0], ds[1]
	if a.Destination != "hooks.a.test" || a.Attempts != 10 || a.Delivered != 9 || a.Retried != 1 || a.SuccessRate != 0.9 ||
		a.P50MS == nil || *a.P50MS != 55 {
		t.Errorf("hooks.a.test: %+v (p50 %v)", a, a.P50MS)
	}
	if b.Destination != "hooks.b.test" || b.Attempts != 1 || b.Failed != 1 || b.SuccessRate != 0 {
		t.Errorf("hooks.b.test: %+v", b)
	}
}
