package gateway

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// Gateways whose pools together can ask Postgres for more connections than it allows are told so: the fleet
// bench ran three gateways at the default pool of 40 on a Postgres of 100 connections, and under load a
// gateway refused a connection waited for one while the others held theirs. The check counts the gateways
// alive in oncegate_gateways, each at this gateway's pool size, and one LISTEN connection each.
func TestAFleetWhosePoolsOutgrowPostgresIsWarned(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		poolMax int
		warned  bool
	}{{40, true}, {10, false}} {
		dbURL := pgtest.Database(t)
		pool := pgtest.Pool(t, dbURL)
		// Three other gateways, alive.
		if _, err := pool.Exec(context.Background(), `INSERT INTO oncegate_gateways (id, started_at, last_seen)
			SELECT 'other-' || i, now(), now() FROM generate_series(1, 3) i`); err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("pool_max_conns", strconv.Itoa(tc.poolMax))
		u.RawQuery = q.Encode()
		h := startGatewayOn(t, u.String(), nil)
		const warning = "the gateways' pools together can ask Postgres for more connections than it allows"
		if tc.warned {
			testenv.Eventually(t, 10*time.Second, "the warning", func() bool { return strings.Contains(h.logs.String(), warning) })
			t.Logf("pool_max_conns %d: %s", tc.poolMax, lineWith(h.logs.String(), warning))
			continue
		}
		// The check runs with the first heartbeat: wait for that, then for one more beat.
		testenv.Eventually(t, 10*time.Second, "the heartbeat", func() bool {
			return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_gateways`) == 4
		})
		time.Sleep(HeartbeatInterval + time.Second)
		if strings.Contains(h.logs.String(), warning) {
			t.Fatalf("pool_max_conns %d, 4 gateways: warned though 44 connections fit: %s", tc.poolMax,
				lineWith(h.logs.String(), warning))
		}
	}
}

func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
