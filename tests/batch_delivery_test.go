package tests

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// The postgres provider's rows claimed together insert their events and record them in one transaction
// (issue 14). Gateways SIGKILLed while they drain a backlog of such rows leave, once a last gateway has
// rescued what they held, exactly one event per effect, and each effect's result names its own event: a batch
// commits whole or not at all, and a rescued row's second attempt finds its event from the first.
func TestKilledGatewaysMidBatchDeliveryLeaveOneEventPerEffect(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Gateways SIGKILLed while delivering postgres-provider batches (one transaction per claim)",
		"One event per effect, each effect's result naming its event; nothing lost")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	ctx := context.Background()
	const n = 30000
	if _, err := pool.Exec(ctx, `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'acme', 'k' || i, 'analytics', '\x00', json_build_object('name', 'click', 'properties', json_build_object('i', i)),
			       'eff_batch' || i
			FROM generate_series(1, $1) AS i
			RETURNING id, type
		)
		INSERT INTO oncegate_outbox (effect_id, type) SELECT id, type FROM e`, n); err != nil {
		t.Fatal(err)
	}
	// A short timeout makes a short lease, so the rows a killed gateway held are rescued within seconds.
	config := gatewayConfig(t, dbURL, "    timeout: 1s")
	delivered := func() int {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`)
	}
	kills := 0
	for round := 1; round <= 4; round++ {
		gw := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config))
		gatewayBase(t, gw)
		target := n * round / 6
		testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d effects delivered", target), func() bool {
			return delivered() >= target
		})
		gw.Kill()
		kills++
	}
	_, _ = startGateway(t, config)
	testenv.Eventually(t, 120*time.Second, "every effect delivered", func() bool { return delivered() == n })

	events := pgtest.Count(t, pool, `SELECT count(*) FROM analytics_events`)
	wrong := pgtest.Count(t, pool, `
		SELECT count(*) FROM oncegate_effects e
		LEFT JOIN analytics_events a ON a.effect_id = e.stable_id
		WHERE a.id IS NULL OR (e.result->>'event_id')::bigint <> a.id
		   OR (a.properties->>'i')::int <> substr(e.key, 2)::int`)
	t.Logf("%d kills; %d effects delivered, %d events, %d effects whose result does not name their own event",
		kills, n, events, wrong)
	if events != n || wrong != 0 {
		t.Fatalf("%d events for %d effects, %d effects without their own event", events, n, wrong)
	}
	result(fmt.Sprintf("%d kills while draining %d effects: %d events, each effect's result naming its own", kills, n, events))
}
