package gateway

import (
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
