package postgres

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/pgtest"
	"github.com/oncegate/oncegate/providers"
	"github.com/oncegate/oncegate/providers/providertest"
)

// dest is the gateway's own database; a transient failure is a table that is missing, a hang is a table that
// another transaction holds locked.
type dest struct {
	t       *testing.T
	pool    *pgxpool.Pool
	p       *Provider
	missing *Provider
	failing bool
	locker  pgx.Tx
}

func (d *dest) Provider() providers.Provider { return d.p }

func (d *dest) Deliver(ctx context.Context, del providers.Delivery) providers.Outcome {
	p := d.p
	if d.failing {
		p = d.missing
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return providers.Retry(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	o := p.DeliverTx(ctx, tx, del)
	if o.Kind == providers.KindDelivered {
		if err := tx.Commit(ctx); err != nil {
			return providers.Retry(err)
		}
	}
	return o
}

func (d *dest) Set(b providertest.Behaviour) bool {
	if d.locker != nil {
		_ = d.locker.Rollback(context.Background())
		d.locker = nil
	}
	d.failing = b == providertest.FailTransient
	switch b {
	case providertest.FailPermanent:
		return false // a valid event cannot be refused for good by the table
	case providertest.Hang:
		tx, err := d.pool.Begin(context.Background())
		if err != nil {
			d.t.Fatal(err)
		}
		if _, err := tx.Exec(context.Background(), "LOCK TABLE analytics_events IN ACCESS EXCLUSIVE MODE"); err != nil {
			d.t.Fatal(err)
		}
		d.locker = tx
	}
	return true
}

func (d *dest) Received(del providers.Delivery) int {
	return pgtest.Count(d.t, d.pool, "SELECT count(*) FROM analytics_events WHERE tenant = $1 AND key = $2", del.Tenant, del.Key)
}
func (d *dest) ValidPayload() json.RawMessage {
	return json.RawMessage(`{"name":"click","properties":{"button":"buy"},"occurred_at":"2026-11-29T12:00:00Z"}`)
}
func (d *dest) InvalidPayloads() map[string]json.RawMessage {
	return map[string]json.RawMessage{
		"payload.name":        json.RawMessage(`{"properties":{}}`),
		"payload.properties":  json.RawMessage(`{"name":"a","properties":[1]}`),
		"payload.occurred_at": json.RawMessage(`{"name":"a","occurred_at":"yesterday"}`),
		"payload.colour":      json.RawMessage(`{"name":"a","colour":"red"}`),
	}
}

func newDest(t *testing.T) providertest.Destination {
	pool := pgtest.Pool(t, pgtest.Database(t))
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	missing, _ := New(Config{Table: "no_such_table"})
	d := &dest{t: t, pool: pool, p: p, missing: missing}
	t.Cleanup(func() { d.Set(providertest.Succeed) })
	return d
}

func TestConformance(t *testing.T) {
	providertest.Exercise(t, providertest.Capabilities{ExactlyOnce: true}, newDest)
}

func TestTableNameMustBeAnIdentifier(t *testing.T) {
	for _, ok := range []string{"", "events", "analytics.events", "_x1"} {
		if _, err := New(Config{Table: ok}); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"events; DROP TABLE x", "a.b.c", "1abc", `"quoted"`, "a-b"} {
		if _, err := New(Config{Table: bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
