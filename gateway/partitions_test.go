package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/partitions"
)

// Of two gateways on one database, one runs the partition manager: its advisory lock is held by one session
// (package partitions tests that a second manager waits). Behind PgBouncer in transaction mode without
// listen_url, a gateway runs none, and says so.
func TestOneGatewayManagesPartitions(t *testing.T) {
	t.Parallel()
	db := pgtest.Database(t)
	every := func(c *Config) { c.Partitions.Interval = Duration(4 * time.Second) } // a pass a second
	a := startGatewayOn(t, db, every)
	b := startGatewayOn(t, db, every)
	holders := func() int {
		return a.count(`SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted AND s.datname = current_database()
			AND (l.classid::bigint << 32 | l.objid::bigint) = $1`, partitions.LockKey)
	}
	testenv.Eventually(t, 10*time.Second, "a gateway holds the partition manager's lock", func() bool { return holders() == 1 })
	_ = b

	pooled := startGatewayOn(t, pgtest.ThroughPgBouncer(t, db), every)
	testenv.Eventually(t, 10*time.Second, "a gateway behind a pooler says it runs no partition manager", func() bool {
		return strings.Contains(pooled.logs.String(), "partitions are not managed by this gateway")
	})
}

// The keys' retention and where bodies go are the fleet's (oncegate_partition_settings), whatever a gateway's
// own configuration says while a gateway alive runs with the fleet's. An outside tester started a gateway
// with `retention.keys: 1m` and no `retention.payloads` beside a fleet of 3 minutes and 1: its partition
// manager stood aside, as documented, but its requests wrote keys of a minute (a job run again two minutes
// on made a second effect, delivered again) and kept their bodies in the effects' rows past the fleet's
// bound. Both gateways' requests, and the gateway behind PgBouncer that runs no manager, now write the fleet's.
func TestEveryGatewayWritesWithTheFleetsRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.Database(t)
	fleet := startGatewayOn(t, db, func(c *Config) {
		c.Retention.Keys, c.Retention.Payloads = Duration(3*time.Minute), Duration(time.Minute)
		c.Partitions.Interval = Duration(time.Minute)
	})
	testenv.Eventually(t, 10*time.Second, "the fleet's settings are recorded", func() bool {
		return fleet.count(`SELECT count(*) FROM oncegate_partition_settings WHERE settings LIKE '%retention.keys=3m0s%'`) == 1
	})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) { chargeAnswer(w, r, n) })
	other := func(c *Config) {
		c.Retention.Keys, c.Retention.Payloads = Duration(time.Minute), 0
		c.EffectTypes["payments"] = proxyType(up)
	}
	canary := startGatewayOn(t, db, other)
	pooled := startGatewayOn(t, pgtest.ThroughPgBouncer(t, db), other)
	for name, h := range map[string]*harness{"fleet": fleet, "canary": canary, "pooled": pooled} {
		if r := h.post("k-"+name, analytics(name)); r.status != 202 {
			t.Fatalf("%s: %d %s", name, r.status, r.raw)
		}
	}
	// The dedup proxy's effects are the dispatcher's store's.
	if r := canary.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"amount":1}`, "Idempotency-Key: k-proxy"); r.status >= 300 {
		t.Fatalf("proxy: %d %s", r.status, r.raw)
	}
	for _, name := range []string{"fleet", "canary", "pooled", "proxy"} {
		var kept time.Duration
		var inline bool
		if err := fleet.pool.QueryRow(t.Context(), `SELECT k.expires_at - e.created_at, e.payload IS NOT NULL
			FROM oncegate_keys k JOIN oncegate_effects e ON e.id = k.effect_id WHERE k.key = $1`, "k-"+name).
			Scan(&kept, &inline); err != nil {
			t.Fatal(err)
		}
		if kept != 3*time.Minute || inline {
			t.Errorf("%s's request: its key kept %v, its body in the effect's row %v; want the fleet's 3m0s, apart",
				name, kept, inline)
		}
	}
}
