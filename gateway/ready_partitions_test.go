package gateway

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
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
