package partitions

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

var fleetSQL = sqlFile("fleet")

// Retentions are the two retentions of a fleet's settings that every gateway's requests write by, whether
// or not it runs the manager: how long a key is held (retention.keys) and how long a body is kept apart
// (retention.payloads; 0: bodies stay in their effects' rows).
type Retentions struct {
	Keys, Payloads time.Duration
	// Hold is how long a key is held after its effect finished (SPEC §2): Keys, or, until it has passed since
	// the last takeover of the fleet's settings, the longer retention.keys of the settings before (Fleet
	// sets it; ParseRetentions makes it Keys). A key the old settings promised to hold is not re-claimed
	// sooner because a canary with a shorter retention took the settings over (an outside test: a job run
	// again 72 s after its late delivery, promised 2 minutes, was delivered twice).
	Hold time.Duration
}

// of is how long r keeps t's partitions: a body's retention.payloads, or retention.keys without it; every
// other table's retention.keys.
func (r Retentions) of(t Table) time.Duration {
	if t.Name == Bodies.Name && r.Payloads > 0 {
		return r.Payloads
	}
	return r.Keys
}

// Querier is what Fleet reads with: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Fleet reads the fleet's retentions from oncegate_partition_settings. ok is false while no manager has
// recorded settings (a new database, or every gateway with partitions.disabled): each gateway then writes
// with its own.
func Fleet(ctx context.Context, q Querier) (r Retentions, ok bool, err error) {
	f, ok, err := readFleet(ctx, q)
	if !ok || err != nil {
		return Retentions{}, false, err
	}
	if r, err = ParseRetentions(f.settings); err != nil {
		return Retentions{}, false, err
	}
	if old, ok := f.floor(); ok && f.now.Before(f.setAt.Add(old.Keys)) {
		r.Hold = max(r.Hold, old.Keys)
	}
	return r, true, nil
}

// fleetRow is the row of oncegate_partition_settings (fleet.sql).
type fleetRow struct {
	settings   string
	was        *string   // the settings before the last takeover, or the floor it kept (Manager.floor)
	setAt, now time.Time // when the settings were recorded, and now, by the database's clock
}

// readFleet reads the fleet's settings; ok is false while there are none.
func readFleet(ctx context.Context, q Querier) (f fleetRow, ok bool, err error) {
	if err := q.QueryRow(ctx, fleetSQL).Scan(&f.settings, &f.was, &f.setAt, &f.now); errors.Is(err, pgx.ErrNoRows) {
		return fleetRow{}, false, nil
	} else if err != nil {
		return fleetRow{}, false, fmt.Errorf("partitions: the fleet's settings: %w", err)
	}
	return f, true, nil
}

// floor is the retentions of the last takeover's floor, when it is still in force.
func (f fleetRow) floor() (Retentions, bool) {
	if f.was == nil {
		return Retentions{}, false
	}
	old, err := ParseRetentions(*f.was)
	if err != nil || !f.now.Before(f.setAt.Add(max(old.Keys, old.Payloads))) {
		return Retentions{}, false
	}
	return old, true
}

// ParseRetentions reads the retentions out of a Config.Settings text.
func ParseRetentions(settings string) (Retentions, error) {
	var r Retentions
	var keys bool
	for _, f := range strings.Fields(settings) {
		name, v, _ := strings.Cut(f, "=")
		var dst *time.Duration
		switch name {
		case "retention.keys":
			dst, keys = &r.Keys, true
		case "retention.payloads":
			dst = &r.Payloads
		default:
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return Retentions{}, fmt.Errorf("partitions: the fleet's settings %q: %s is not a duration", settings, name)
		}
		*dst = d
	}
	if !keys {
		return Retentions{}, fmt.Errorf("partitions: the fleet's settings %q name no retention.keys", settings)
	}
	r.Hold = r.Keys
	return r, nil
}
