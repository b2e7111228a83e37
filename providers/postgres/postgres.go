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
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncegate/oncegate/providers"
)

//go:embed insert.sql
var insertSQL string

//go:embed check.sql
var checkSQL string

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
	return &Provider{query: strings.ReplaceAll(insertSQL, "{{table}}", table), table: c.Table, quoted: table}, nil
}

// Payload is an analytics event.
type Payload struct {
	Name       string          `json:"name"`
	Properties json.RawMessage `json:"properties,omitempty"`
	OccurredAt string          `json:"occurred_at,omitempty"` // RFC 3339; defaults to the time of insert
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
		if err != nil {
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
	var exists, unique bool
	if err := db.QueryRow(ctx, checkSQL, p.quoted).Scan(&exists, &unique); err != nil {
		return fmt.Errorf("postgres: table %s: %w: %w", p.table, providers.ErrCannotCheck, err)
	}
	switch {
	case !exists:
		return fmt.Errorf("postgres: table %s does not exist: run `gateway migrate` for %s, or create it "+
			"(docs/configuration.md)", p.table, DefaultTable)
	case !unique:
		return fmt.Errorf("postgres: table %s has no unique index on effect_id alone: add the column and "+
			"`ALTER TABLE %s ADD UNIQUE (effect_id)` (see migrations/00005_stable_id_per_effect.sql)", p.table, p.quoted)
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
	if err := tx.QueryRow(ctx, p.query, d.Tenant, d.Key, ev.Name, props, ev.occurred, d.StableID).Scan(&id); err != nil {
		var pgErr *pgconn.PgError
		// Class 22 (data exception) will fail the same way every time; anything else (connection, a missing
		// table an operator can create) may pass on a later attempt.
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
			return providers.Failed(fmt.Errorf("insert event: %w", err), true)
		}
		return providers.Retry(fmt.Errorf("insert event: %w", err))
	}
	return providers.Delivered(map[string]int64{"event_id": id})
}
