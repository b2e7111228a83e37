package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/effect"
)

// Lease names a claimed outbox row and the token that fences every write to it: only the current holder's
// Finish or Reschedule changes anything.
type Lease struct {
	EffectID int64
	Token    [16]byte
}

// Claimed is an outbox row leased to a dispatcher, with what delivering its effect needs.
type Claimed struct {
	Lease
	// Rescued is set when the row's previous lease expired: its dispatcher died mid-delivery, and that
	// attempt may have reached the provider.
	Rescued   bool
	Tenant    string
	Key       string
	Type      string
	Payload   json.RawMessage
	Attempts  int // failed attempts so far
	CreatedAt time.Time
	Trace     map[string]string // the creating request's W3C trace context
}

// ClaimParams says which rows to claim, for whom, and for how long.
type ClaimParams struct {
	Type  string
	Limit int
	Owner string
	Lease time.Duration
}

// Claim leases up to p.Limit due outbox rows of p.Type (new, due for a retry, or rescued from an expired
// lease) and marks their effects delivering. Claims in any number of gateways never wait on each other.
func (s *Store) Claim(ctx context.Context, p ClaimParams) ([]Claimed, error) {
	return s.claim(ctx, claimSQL, p)
}

// ClaimLeases is Claim without the payloads: every Claimed has a nil Payload, to be read by Payload. A claim
// returns its rows in one result, so a row that cannot be read (a payload Postgres cannot print) fails the
// whole Claim, however many good rows are due beside it; ClaimLeases names the rows, so that the caller can
// read each payload on its own and set aside, by ID, only the row that fails.
func (s *Store) ClaimLeases(ctx context.Context, p ClaimParams) ([]Claimed, error) {
	return s.claim(ctx, claimLeasesSQL, p)
}

func (s *Store) claim(ctx context.Context, sql string, p ClaimParams) ([]Claimed, error) {
	rs, err := s.db.Query(ctx, sql, p.Type, p.Limit, p.Owner, p.Lease.Milliseconds(), effect.StatusDelivering)
	if err != nil {
		return nil, translate("claim "+p.Type, err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (Claimed, error) {
		var c Claimed
		err := r.Scan(&c.EffectID, &c.Token, &c.Rescued, &c.Tenant, &c.Key, &c.Type, &c.Payload, &c.Attempts,
			&c.CreatedAt, &c.Trace)
		return c, err
	})
	if err != nil {
		return nil, translate("claim "+p.Type, err)
	}
	return out, nil
}

// Payload reads the payload of a row leased by ClaimLeases. It returns ErrLeaseLost when the lease is no
// longer the row's, ErrUnavailable when the database is, and otherwise an error that belongs to this row.
func (s *Store) Payload(ctx context.Context, lease Lease) (json.RawMessage, error) {
	var p json.RawMessage
	err := s.db.QueryRow(ctx, readPayloadSQL, lease.EffectID, lease.Token).Scan(&p)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrLeaseLost
	}
	if err != nil {
		return nil, translate("read payload", err)
	}
	return p, nil
}

// Finish is a terminal outcome.
type Finish struct {
	// Status must be terminal.
	Status effect.Status
	// Result replaces the stored result; nil keeps it.
	Result json.RawMessage
	// LastError replaces the stored error; empty clears it.
	LastError string
	// Attempted counts an attempt: false when no provider was called (an at-most-once rescue).
	Attempted bool
}

// Finish records a terminal outcome under lease: the outbox row goes and the effect takes its final status.
// It returns ErrLeaseLost, having changed nothing, when the lease is no longer the row's.
func (s *Store) Finish(ctx context.Context, lease Lease, f Finish) error {
	if !f.Status.Terminal() {
		return fmt.Errorf("dedup: finish with status %q, which is not terminal", f.Status)
	}
	var id int64
	err := s.db.QueryRow(ctx, finishSQL, lease.EffectID, lease.Token, f.Status, nullJSON(f.Result),
		nullString(f.LastError), attempts(f.Attempted), f.Status == effect.StatusDelivered).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return translate("finish effect", err)
}

// Reschedule is a row going back to wait.
type Reschedule struct {
	// Delay is how long from now (by the database's clock) the row waits.
	Delay time.Duration
	// LastError replaces the stored error; empty keeps it.
	LastError string
	// Attempted counts the attempt: false when the row is handed back unattempted (breaker open, shutdown).
	Attempted bool
}

// Reschedule puts a leased row back to wait, and its effect back to pending, under lease. It returns
// ErrLeaseLost, having changed nothing, when the lease is no longer the row's.
func (s *Store) Reschedule(ctx context.Context, lease Lease, r Reschedule) error {
	var id int64
	err := s.db.QueryRow(ctx, rescheduleSQL, lease.EffectID, lease.Token, r.Delay.Milliseconds(),
		nullString(r.LastError), attempts(r.Attempted), effect.StatusPending).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return translate("reschedule effect", err)
}

// Purge deletes up to limit effects that became terminal more than retention ago, and returns how many it
// deleted; their keys can be used again. Rows another purge holds are skipped, not waited for, so a caller
// loops until a batch comes back short.
func (s *Store) Purge(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	tag, err := s.db.Exec(ctx, purgeSQL, retention.Milliseconds(), limit)
	if err != nil {
		return 0, translate("purge effects", err)
	}
	return tag.RowsAffected(), nil
}

// Backlog is the outbox of one effect type: rows waiting, and the age of the oldest one that is due.
type Backlog struct {
	Type      string
	Rows      int64
	OldestDue time.Duration
}

// Backlogs reads the outbox backlog per effect type.
func (s *Store) Backlogs(ctx context.Context) ([]Backlog, error) {
	rs, err := s.db.Query(ctx, backlogSQL)
	if err != nil {
		return nil, translate("read backlog", err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (Backlog, error) {
		var b Backlog
		var secs float64
		err := r.Scan(&b.Type, &b.Rows, &secs)
		b.OldestDue = time.Duration(secs * float64(time.Second))
		return b, err
	})
	if err != nil {
		return nil, translate("read backlog", err)
	}
	return out, nil
}

func attempts(attempted bool) int {
	if attempted {
		return 1
	}
	return 0
}

func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
