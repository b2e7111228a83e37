package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// A gateway with no partition of effects for the present cannot create an effect (no partition manager ran
// ahead: behind a transaction pooler without ddl_url, say): /readyz says so with a 503, so that a load
// balancer stops sending it requests it would fail, and says it is ready again once one is made.
func TestNotReadyWithoutAPartitionOfEffectsForThePresent(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) { c.Partitions.Disabled = true })
	ctx := context.Background()
	if r := h.req("GET", "/readyz", "", ""); r.status != 200 {
		t.Fatalf("readyz: %d %s", r.status, r.raw)
	}
	rows, err := h.pool.Query(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'oncegate_effects'::regclass AND c.relname <> 'oncegate_effects_legacy'`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := h.pool.Exec(ctx, "ALTER TABLE oncegate_effects DETACH PARTITION "+pgx.Identifier{n}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	r := h.req("GET", "/readyz", "", "")
	if r.status != 503 || r.body["type"] != "/problems/unavailable" {
		t.Fatalf("readyz without a partition for the present: %d %s", r.status, r.raw)
	}
	if _, err := h.pool.Exec(ctx, "ALTER TABLE oncegate_effects ATTACH PARTITION "+pgx.Identifier{names[len(names)-1]}.Sanitize()+
		" FOR VALUES FROM (oncegate_effect_id_at(now())) TO (oncegate_effect_id_at(now() + interval '1 day'))"); err != nil {
		t.Fatal(err)
	}
	if r := h.req("GET", "/readyz", "", ""); r.status != 200 {
		t.Fatalf("readyz once a partition is back: %d %s", r.status, r.raw)
	}
}

// ddl_url (or listen_url) is checked for a transaction pooler: the partition manager's session lock and
// settings through one would land on a pooled server connection, outliving the gateway and leaking into other
// clients' transactions, so the manager does not run there. A direct connection passes.
func TestTheManagersURLIsCheckedForATransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Database(t)
	for url, want := range map[string]bool{db: false, pgtest.ThroughPgBouncer(t, db): true} {
		shared, err := sharesServerConnections(ctx, url)
		if err != nil || shared != want {
			t.Fatalf("%s: shares server connections %v, %v; want %v", url, shared, err, want)
		}
	}
}

// A server that answers but takes no writes (default_transaction_read_only set by a failover tool, or a
// standby reached without target_session_attrs) refuses every create: /readyz is a 503 that says read-only,
// not 200 (an outside tester's load balancer kept sending such a gateway writes that were all 503s), and
// ready again once the server takes writes.
func TestNotReadyOnADatabaseThatTakesNoWrites(t *testing.T) {
	t.Parallel()
	db := pgtest.Database(t)
	h := startGatewayOn(t, db, nil)
	ctx := context.Background()
	if r := h.req("GET", "/readyz", "", ""); r.status != 200 {
		t.Fatalf("readyz: %d %s", r.status, r.raw)
	}
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The setting reaches new sessions: the gateway's are ended, and its pool opens new ones.
	readOnly := func(on bool) {
		t.Helper()
		set := "RESET default_transaction_read_only"
		if on {
			set = "SET default_transaction_read_only = on"
		}
		if _, err := conn.Exec(ctx, "BEGIN READ WRITE; ALTER DATABASE "+pgx.Identifier{dbName(t, conn)}.Sanitize()+" "+
			set+"; COMMIT; SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "+
			"AND pid <> pg_backend_pid()"); err != nil {
			t.Fatal(err)
		}
	}
	readOnly(true)
	var last response
	testenv.Eventually(t, 10*time.Second, "/readyz says read-only", func() bool {
		last = h.req("GET", "/readyz", "", "")
		return last.status == 503 && strings.Contains(last.raw, "read-only")
	})
	readOnly(false)
	testenv.Eventually(t, 10*time.Second, "/readyz ready again", func() bool {
		last = h.req("GET", "/readyz", "", "")
		return last.status == 200
	})
}

func dbName(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var name string
	if err := conn.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}
