// Package postgres is the analytics-insert provider: each effect inserts one event row into a table of the
// gateway's own database. The insert runs in the transaction that marks the effect delivered, and the table
// has a unique constraint on the effect's stable id (effect_id), so the event is recorded exactly once: there
// is no crash window. A key used again after retention is a new effect, and its event a new row.
package postgres

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncegate/oncegate/providers"
)

//go:embed insert.sql
var insertSQL string

//go:embed insert_batch.sql
var insertBatchSQL string

//go:embed check.sql
var checkSQL string

//go:embed columns.sql
var columnsSQL string

// columnTypes are the types each column the insert names may have (format_type's spelling): what holds the
// value whole. occurred_at as a timestamp without time zone, or a date, would keep less than was sent, and a
// varchar of a length ("character varying(20)") would refuse a longer key.
var columnTypes = map[string][]string{
	"id":          {"bigint", "integer"},
	"tenant":      {"text", "character varying"},
	"key":         {"text", "character varying"},
	"name":        {"text", "character varying"},
	"properties":  {"jsonb", "json"},
	"occurred_at": {"timestamp with time zone"},
	"effect_id":   {"text", "character varying"},
}

// columnOrder is the order in which a problem with the columns is told.
var columnOrder = []string{"id", "tenant", "key", "name", "properties", "occurred_at", "effect_id"}

// DefaultTable is the table a migration creates.
const DefaultTable = "analytics_events"

// Config configures the provider for one effect type.
type Config struct {
	// Table receives the events: (tenant, key, name, properties, occurred_at, effect_id) with
	// UNIQUE (effect_id), in the gateway's database; Check says at start-up when it is not so. An identifier, optionally schema-qualified. Defaults to DefaultTable.
	Table string `yaml:"table"`
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Provider inserts analytics events.
type Provider struct {
	query  string
	batch  string
	table  string
	quoted string
}

// Validate reports the first setting that New would refuse, without building a provider.
func (c Config) Validate() error {
	_, err := New(c) // a postgres provider is its query: building it is checking it
	return err
}

// New checks the configuration and returns a provider.
func New(c Config) (*Provider, error) {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	parts := strings.Split(c.Table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("postgres: table %q: at most schema.table", c.Table)
	}
	for _, p := range parts {
		if !identifier.MatchString(p) {
			return nil, fmt.Errorf("postgres: table %q is not an identifier (letters, digits, _; at most 63)", c.Table)
		}
	}
	table := pgx.Identifier(parts).Sanitize()
	return &Provider{query: strings.ReplaceAll(insertSQL, "{{table}}", table),
		batch: strings.ReplaceAll(insertBatchSQL, "{{table}}", table), table: c.Table, quoted: table}, nil
}

// Payload is an analytics event.
type Payload struct {
	Name       string          `json:"name"`
	Properties json.RawMessage `json:"properties,omitempty"`
	OccurredAt string          `json:"occurred_at,omitempty"` // RFC 3339; defaults to when the effect was requested
	occurred   *time.Time
}

func parse(raw json.RawMessage) (Payload, error) {
	var p Payload
	if err := providers.DecodeStrict(raw, &p); err != nil {
		return p, err
	}
	if strings.TrimSpace(p.Name) == "" {
		return p, providers.Invalid("name", "is required")
	}
	if len(p.Name) > 200 {
		return p, providers.Invalid("name", "is %d bytes, at most 200", len(p.Name))
	}
	if len(p.Properties) > 0 && p.Properties[0] != '{' && string(p.Properties) != "null" {
		return p, providers.Invalid("properties", "must be an object")
	}
	if p.OccurredAt != "" {
		t, err := time.Parse(time.RFC3339Nano, p.OccurredAt)
		// Go reads offsets RFC 3339 does not have (+24:00 and beyond: hours are 00 to 23).
		if _, offset := t.Zone(); err != nil || offset <= -24*3600 || offset >= 24*3600 {
			return p, providers.Invalid("occurred_at", "%q is not an RFC 3339 time", p.OccurredAt)
		}
		p.occurred = &t
	}
	return p, nil
}

func (*Provider) Validate(payload json.RawMessage) error {
	_, err := parse(payload)
	return err
}

// Destination is the table: every event of the effect type goes there, so its breaker is the type's (per
// tenant).
func (p *Provider) Destination(json.RawMessage) string { return p.table }

// Check reports a table that cannot take events: missing, or without the unique index on effect_id that
// keeps one event per effect (a table made for an older version had UNIQUE (tenant, key) instead). Without
// it every delivery would fail; the gateway refuses to start instead, naming the table.
func (p *Provider) Check(ctx context.Context, db providers.Querier) error {
	var exists, unique, rules bool
	var kind string
	if err := db.QueryRow(ctx, checkSQL, p.quoted).Scan(&exists, &kind, &unique, &rules); err != nil {
		return fmt.Errorf("postgres: table %s: %w: %w", p.table, providers.ErrCannotCheck, err)
	}
	switch {
	case !exists:
		return fmt.Errorf("postgres: table %s does not exist (the name is quoted: its case counts): run "+
			"`gateway migrate` for %s, or create it (docs/configuration.md)", p.table, DefaultTable)
	case kind != "r" && kind != "p":
		return fmt.Errorf("postgres: %s is not a table (relkind %q): the provider inserts into a table", p.table, kind)
	case rules:
		return fmt.Errorf("postgres: table %s has a rule on INSERT or UPDATE, and Postgres refuses the insert's "+
			"ON CONFLICT on such a table: drop the rule (a trigger can do its work)", p.table)
	case !unique && kind == "p":
		return fmt.Errorf("postgres: table %s is partitioned and has no unique index on effect_id alone, which "+
			"a partitioned table can have only when partitioned by effect_id (hash): partition it by "+
			"effect_id, or use a table that is not partitioned", p.table)
	case !unique:
		return fmt.Errorf("postgres: table %s has no unique index on effect_id alone: add the column and "+
			"`ALTER TABLE %s ADD UNIQUE (effect_id)` (not deferrable, not partial, valid; see "+
			"migrations/00005_stable_id_per_effect.sql)", p.table, p.quoted)
	}
	return p.checkColumns(ctx, db)
}

// checkColumns reports the columns of the table that cannot take what the insert writes: every one it names,
// of a type that holds the value whole (id, which it reads back, filled by a default), and no other column
// that must be given a value.
func (p *Provider) checkColumns(ctx context.Context, db providers.Querier) error {
	var described []struct {
		Name       string `json:"name"`
		Type       string `json:"type"`
		NotNull    bool   `json:"not_null"`
		HasDefault bool   `json:"has_default"`
		Identity   bool   `json:"identity"`
		Sequence   bool   `json:"sequence"`
		Generated  bool   `json:"generated"`
	}
	if err := db.QueryRow(ctx, columnsSQL, p.quoted).Scan(&described); err != nil {
		return fmt.Errorf("postgres: table %s: %w: %w", p.table, providers.ErrCannotCheck, err)
	}
	type column struct {
		typ                          string
		notNull, sequence, generated bool
	}
	cols := map[string]column{}
	var extra []string // columns the insert does not name that it would have to
	for _, d := range described {
		cols[d.Name] = column{typ: d.Type, notNull: d.NotNull, sequence: d.Sequence, generated: d.Generated}
		if _, named := columnTypes[d.Name]; !named && d.NotNull && !d.HasDefault && !d.Identity && !d.Generated {
			extra = append(extra, d.Name)
		}
	}
	var problems []string
	for _, want := range columnOrder {
		c, ok := cols[want]
		types := columnTypes[want]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("no column %s (%s)", want, types[0]))
		case !slices.Contains(types, c.typ):
			problems = append(problems, fmt.Sprintf("column %s is %s, want %s", want, c.typ, strings.Join(types, " or ")))
		case want == "id" && !c.sequence:
			// A constant default gave every event the same event_id.
			problems = append(problems, "column id draws no new value for each row: the insert leaves it out and reads it back (make it bigserial or an identity)")
		case want != "id" && c.generated:
			problems = append(problems, fmt.Sprintf("column %s is generated, and the insert writes it", want))
		case want == "properties" && c.notNull:
			problems = append(problems, "column properties is NOT NULL, and an event may have none (properties is optional)")
		}
	}
	for _, col := range extra {
		problems = append(problems, fmt.Sprintf("column %s is NOT NULL without a default, and the insert gives it no value", col))
	}
	if len(problems) > 0 {
		return fmt.Errorf("postgres: table %s cannot take events: %s (docs/configuration.md has the table's shape)",
			p.table, strings.Join(problems, "; "))
	}
	return nil
}

// Deliver is not used: the dispatcher calls DeliverTx. It exists so that Provider is satisfied.
func (p *Provider) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	return providers.Failed(errors.New("postgres provider delivers only inside a transaction"), false)
}

// DeliverTx inserts the event in tx; the caller commits it with the effect's delivered mark.
func (p *Provider) DeliverTx(ctx context.Context, tx pgx.Tx, d providers.Delivery) providers.Outcome {
	ev, err := parse(d.Payload)
	if err != nil {
		return providers.Failed(err, true)
	}
	var props any
	if len(ev.Properties) > 0 && string(ev.Properties) != "null" {
		props = ev.Properties
	}
	var id int64
	if err := tx.QueryRow(ctx, p.query, d.Tenant, d.Key, ev.Name, props, occurredAt(ev, d), d.StableID).Scan(&id); err != nil {
		var pgErr *pgconn.PgError
		// Class 22 (data exception) will fail the same way every time; anything else (connection, a missing
		// table an operator can create) may pass on a later attempt.
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
			return providers.Failed(fmt.Errorf("insert event: %w", err), true)
		}
		return providers.Retry(fmt.Errorf("insert event: %w", err))
	}
	return delivered(id)
}

// occurredAt is the event's time: the payload's occurred_at, else when the effect was requested, the same on
// every attempt (the time of the insert, a retry's hours later, said when the delivery went, not the event).
func occurredAt(ev Payload, d providers.Delivery) *time.Time {
	switch {
	case ev.occurred != nil:
		return ev.occurred
	case !d.CreatedAt.IsZero():
		return &d.CreatedAt
	}
	return nil
}

func delivered(id int64) providers.Outcome {
	return providers.Delivered(map[string]int64{"event_id": id})
}

// DeliverTxBatch inserts the events of many effects with one statement in tx. An invalid payload fails its
// own delivery and is left out of the statement; when the statement fails, the dispatcher delivers each row
// alone (DeliverTx), which tells a row at fault from the others.
func (p *Provider) DeliverTxBatch(ctx context.Context, tx pgx.Tx, ds []providers.Delivery) ([]providers.Outcome, error) {
	out := make([]providers.Outcome, len(ds))
	var tenants, keys, names, effectIDs []string
	var props, occurred []*string
	at := make(map[string]int, len(ds)) // stable id → index in ds
	for i, d := range ds {
		ev, err := parse(d.Payload)
		if err != nil {
			out[i] = providers.Failed(err, true)
			continue
		}
		if _, twice := at[d.StableID]; twice {
			return nil, fmt.Errorf("postgres: effect %s twice in one batch", d.StableID)
		}
		at[d.StableID] = i
		tenants, keys, names, effectIDs = append(tenants, d.Tenant), append(keys, d.Key), append(names, ev.Name),
			append(effectIDs, d.StableID)
		var pr, oc *string
		if len(ev.Properties) > 0 && string(ev.Properties) != "null" {
			s := string(ev.Properties)
			pr = &s
		}
		if at := occurredAt(ev, d); at != nil {
			s := at.Format(time.RFC3339Nano)
			oc = &s
		}
		props, occurred = append(props, pr), append(occurred, oc)
	}
	if len(effectIDs) == 0 {
		return out, nil
	}
	rows, err := tx.Query(ctx, p.batch, tenants, keys, names, props, occurred, effectIDs)
	if err != nil {
		return nil, fmt.Errorf("insert events: %w", err)
	}
	var effectID string
	var id int64
	_, err = pgx.ForEachRow(rows, []any{&effectID, &id}, func() error {
		if i, ok := at[effectID]; ok && out[i].Kind == 0 {
			out[i] = delivered(id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("insert events: %w", err)
	}
	for i := range out {
		if out[i].Kind == 0 {
			return nil, fmt.Errorf("insert events: no row came back for effect %s", ds[i].StableID)
		}
	}
	return out, nil
}
