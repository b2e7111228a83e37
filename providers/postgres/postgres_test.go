package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/providertest"
	"github.com/oncegate/oncegate/providers"
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
	return pgtest.Count(d.t, d.pool, "SELECT count(*) FROM analytics_events WHERE effect_id = $1", del.StableID)
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

// Issue 13: a key used again after retention is a new effect with a new stable id, and its event is a new
// row, not the old row's id reported as delivered. The same effect delivered again stays one row.
func TestKeyUsedAgainIsANewEvent(t *testing.T) {
	d := newDest(t).(*dest)
	ctx := context.Background()
	first := providers.Delivery{Tenant: "acme", Key: "click:1", StableID: effect.NewStableID("acme", "click:1"),
		Payload: json.RawMessage(`{"name":"first"}`), Attempt: 1}
	again := first
	again.StableID, again.Payload = effect.NewStableID("acme", "click:1"), json.RawMessage(`{"name":"second"}`)
	ids := map[string]any{}
	for i, del := range []providers.Delivery{first, first, again} {
		o := d.Deliver(ctx, del)
		if o.Kind != providers.KindDelivered {
			t.Fatalf("delivery %d: %v", i, o)
		}
		ids[fmt.Sprint(i)] = string(o.Result)
	}
	if ids["0"] != ids["1"] {
		t.Fatalf("one effect delivered twice answered %v and %v", ids["0"], ids["1"])
	}
	if ids["0"] == ids["2"] {
		t.Fatalf("the second effect under the key reported the first one's event: %v", ids["2"])
	}
	var names []string
	rows, err := d.pool.Query(ctx, "SELECT name FROM analytics_events WHERE tenant = 'acme' AND key = 'click:1' ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(names) != "[first second]" {
		t.Fatalf("rows under the key: %v, want [first second]", names)
	}
}

// A table that cannot keep one event per effect stops the start, naming the table and the fix.
func TestCheckNamesATableThatCannotTakeEvents(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Database(t))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE SCHEMA old;
		CREATE TABLE old.events (id bigserial PRIMARY KEY, tenant text, key text, name text, properties jsonb,
			occurred_at timestamptz, recorded_at timestamptz DEFAULT now(), UNIQUE (tenant, key));
		CREATE TABLE old.partial (id bigserial PRIMARY KEY, tenant text, key text, name text, properties jsonb,
			occurred_at timestamptz, recorded_at timestamptz DEFAULT now(), effect_id text);
		CREATE UNIQUE INDEX ON old.partial (effect_id, tenant);
		CREATE TABLE old.good (id bigserial PRIMARY KEY, tenant text, key text, name text, properties jsonb,
			occurred_at timestamptz, recorded_at timestamptz DEFAULT now(), effect_id text UNIQUE);
		CREATE TABLE old.identity (id bigint GENERATED ALWAYS AS IDENTITY, tenant varchar, key text, name text,
			properties json, occurred_at timestamptz, effect_id text UNIQUE, note text);
		-- The table an outside tester made from the docs' list of columns: no id, a date, text properties.
		CREATE TABLE old.shaped (tenant text, key text, name text, properties text, occurred_at date,
			effect_id text UNIQUE);
		CREATE TABLE old.noid (id bigint, tenant text, key text, name text, properties jsonb,
			occurred_at timestamp, effect_id varchar(20) UNIQUE, source text NOT NULL);
		-- Shapes a second tester found passing the check, then failing every event.
		CREATE TABLE old.generated (id bigint GENERATED ALWAYS AS (1) STORED, tenant text, key text,
			name text GENERATED ALWAYS AS ('x') STORED, properties jsonb NOT NULL, occurred_at timestamptz,
			effect_id text UNIQUE);
		CREATE TABLE old.deferrable (id bigserial, tenant text, key text, name text, properties jsonb,
			occurred_at timestamptz, effect_id text UNIQUE DEFERRABLE INITIALLY IMMEDIATE);
		CREATE TABLE old.ruled (id bigserial, tenant text, key text, name text, properties jsonb,
			occurred_at timestamptz, effect_id text UNIQUE);
		CREATE RULE log_update AS ON UPDATE TO old.ruled DO ALSO NOTIFY ruled;
		CREATE TABLE old.constant (id bigint NOT NULL DEFAULT 0, tenant text, key text, name text, properties jsonb,
			occurred_at timestamptz, effect_id text UNIQUE);
		CREATE VIEW old.viewed AS SELECT * FROM old.good;
		CREATE TABLE old.ranged (id bigserial, tenant text, key text, name text, properties jsonb,
			occurred_at timestamptz, effect_id text) PARTITION BY RANGE (occurred_at);
		CREATE TABLE old.hashed (id bigserial, tenant text, key text, name text, properties jsonb,
			occurred_at timestamptz, effect_id text UNIQUE) PARTITION BY HASH (effect_id);`); err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]string{
		"":             "",
		"old.good":     "",
		"old.identity": "",
		"old.events":   "no unique index on effect_id",
		"old.partial":  "no unique index on effect_id",
		"old.shaped": "no column id (bigint); column properties is text, want jsonb or json; " +
			"column occurred_at is date, want timestamp with time zone",
		"old.noid": "column id draws no new value for each row: the insert leaves it out and reads it back (make it bigserial or an identity); " +
			"column occurred_at is timestamp without time zone, want timestamp with time zone; " +
			"column effect_id is character varying(20), want text or character varying; " +
			"column source is NOT NULL without a default, and the insert gives it no value",
		"old.generated": "column id draws no new value for each row: the insert leaves it out and reads it back (make it bigserial or an identity); " +
			"column name is generated, and the insert writes it; " +
			"column properties is NOT NULL, and an event may have none (properties is optional)",
		"old.deferrable": "no unique index on effect_id alone",
		"old.ruled":      "has a rule on INSERT or UPDATE",
		"old.constant":   "column id draws no new value for each row",
		"old.viewed":     `is not a table (relkind "v")`,
		"old.ranged":     "is partitioned and has no unique index on effect_id alone",
		"old.hashed":     "",
		"old.missing":    "does not exist",
		"no_such_table":  "does not exist",
	} {
		p, err := New(Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		err = p.Check(ctx, pool)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("table %q: Check = %v, want %q", table, err, want)
		}
	}
	// The check reads catalogs only: a table another session holds (a migration, a test's LOCK) does not hold
	// up a gateway's start. Reading a column's default with pg_get_expr locked it, and a start waited.
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx) //nolint:errcheck
	if _, err := locker.Exec(ctx, "LOCK TABLE old.good IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	p, _ := New(Config{Table: "old.good"})
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := p.Check(bounded, pool); err != nil {
		t.Fatalf("Check of a locked table: %v", err)
	}
}

// An event without occurred_at happened when its effect was requested, not when a delivery (a retry's,
// hours later) inserted it: alone and in a batch. An offset RFC 3339 does not have is refused.
func TestAnEventWithoutATimeHappenedWhenItsEffectWasRequested(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.Database(t))
	ctx := context.Background()
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	requested := time.Date(2026, 11, 29, 8, 30, 0, 123456000, time.UTC)
	del := func(key string) providers.Delivery {
		return providers.Delivery{Tenant: "acme", Key: key, Type: "clicks", StableID: effect.NewStableID("acme", key),
			Payload: json.RawMessage(`{"name":"click"}`), CreatedAt: requested}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o := p.DeliverTx(ctx, tx, del("alone")); o.Kind != providers.KindDelivered {
		t.Fatalf("alone: %v", o)
	}
	if outs, err := p.DeliverTxBatch(ctx, tx, []providers.Delivery{del("b1"), del("b2")}); err != nil ||
		outs[0].Kind != providers.KindDelivered || outs[1].Kind != providers.KindDelivered {
		t.Fatalf("batch: %v %v", outs, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM analytics_events WHERE occurred_at = $1`, requested); n != 3 {
		t.Fatalf("%d of 3 events happened when their effects were requested", n)
	}
	for _, at := range []string{"2026-01-01T00:00:00+24:00", "2026-01-01T00:00:00-24:00", "2026-01-01T00:00:00+99:00"} {
		if err := p.Validate(json.RawMessage(`{"name":"a","occurred_at":"` + at + `"}`)); err == nil {
			t.Errorf("occurred_at %s was taken", at)
		}
	}
}

// DeliverTxBatch stores what DeliverTx stores, in every exec mode pgx has (PgBouncer needs exec or simple
// protocol): an event per valid payload with its properties and time, the first event's id again for an
// effect delivered before, and a failure, without a statement, for an invalid payload.
func TestBatchStoresWhatOneByOneStores(t *testing.T) {
	t.Parallel()
	base := pgtest.Database(t)
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool := pgtest.Pool(t, base+"&default_query_exec_mode="+mode)
			ctx := context.Background()
			del := func(key, payload string) providers.Delivery {
				return providers.Delivery{Tenant: mode, Key: key, Type: "clicks", StableID: effect.NewStableID(mode, key),
					Payload: json.RawMessage(payload)}
			}
			early := del("early", `{"name":"first"}`)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			first := p.DeliverTx(ctx, tx, early)
			if err := tx.Commit(ctx); err != nil || first.Kind != providers.KindDelivered {
				t.Fatalf("single delivery: %v %v", first, err)
			}
			ds := []providers.Delivery{
				del("a", `{"name":"click","properties":{"b":"café","n":1.5},"occurred_at":"2026-11-29T12:00:00.123456+02:00"}`),
				del("bad", `{"name":"x","properties":[1]}`),
				early,
				del("c", `{"name":"view","properties":null}`),
			}
			tx, err = pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			outs, err := p.DeliverTxBatch(ctx, tx, ds)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			kinds := fmt.Sprint(outs[0].Kind, outs[1].Kind, outs[2].Kind, outs[3].Kind)
			if kinds != "delivered failed delivered delivered" {
				t.Fatalf("outcomes %s", kinds)
			}
			if string(outs[2].Result) != string(first.Result) {
				t.Fatalf("an effect delivered before got %s, its first event is %s", outs[2].Result, first.Result)
			}
			var props, occurred string
			if err := pool.QueryRow(ctx, `SELECT properties::text, to_char(occurred_at AT TIME ZONE 'UTC',
				'YYYY-MM-DD"T"HH24:MI:SS.US') FROM analytics_events WHERE effect_id = $1`, ds[0].StableID).
				Scan(&props, &occurred); err != nil {
				t.Fatal(err)
			}
			if props != `{"b": "café", "n": 1.5}` || occurred != "2026-11-29T10:00:00.123456" {
				t.Fatalf("stored %s at %s", props, occurred)
			}
			if n := pgtest.Count(t, pool, `SELECT count(*) FROM analytics_events WHERE tenant = $1`, mode); n != 3 {
				t.Fatalf("%d events, want 3", n)
			}
			if n := pgtest.Count(t, pool, `SELECT count(*) FROM analytics_events WHERE effect_id = $1 AND properties IS NULL`,
				ds[3].StableID); n != 1 {
				t.Fatal("null properties were not stored as NULL")
			}
		})
	}
}

// TestGenericPlansMadeOnEmptyTablesUseIndexes: a gateway started on a new database plans its statements while
// the events table is empty, and keeps the plan as the table grows; a plan that joins a batch to the table
// by a sequential scan would read every event at every batch.
func TestGenericPlansMadeOnEmptyTablesUseIndexes(t *testing.T) {
	t.Parallel()
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, pgtest.Database(t))
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for name, sql := range map[string]string{"insert": p.query, "insert_batch": p.batch} {
		if scans := pgtest.GenericPlanSeqScans(t, conn.Conn(), name, sql); len(scans) > 0 {
			t.Errorf("%s: the generic plan, made on an empty table, reads %v by a sequential scan", name, scans)
		}
	}
}
