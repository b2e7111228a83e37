package dedup

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/effect"
)

var (
	insertLeasedSQL     = query("insert_leased")
	claimEffectSQL      = query("claim_effect")
	typePausedSQL       = query("type_paused")
	effectTypePausedSQL = query("effect_type_paused")
)

// Holder names who leases a row and for how long: a request that performs its effect at once (the dedup
// proxy) holds the row as a dispatcher would, under the same fencing token.
type Holder struct {
	Owner string
	Lease time.Duration
}

// CreateLeased is Create for an effect performed at once by the caller: the new effect is recorded
// delivering, with its outbox row leased to h, in one statement, and comes back with that lease as a Claimed
// (its Payload is ne.Payload). A key already taken comes back as Create's does (replayed, or a
// *KeyReusedError), with a nil Claimed: the caller may then try ClaimEffect.
//
// fingerprint, when not nil, is what identifies the request instead of Fingerprint(type, payload): the proxy
// stores headers that a retry may send differently (an SDK's telemetry) but that do not make it another request.
func (s *Store) CreateLeased(ctx context.Context, ne NewEffect, fingerprint []byte, h Holder) (*Effect, *Claimed, bool, error) {
	if nulEscape(ne.Payload) {
		return nil, nil, false, &UnstorableError{Reason: `a string in the payload holds \u0000 (NUL), which ` +
			"Postgres text and jsonb cannot hold", Err: errNUL}
	}
	fp := fingerprint
	if fp == nil {
		var err error
		if fp, err = Fingerprint(ne.Type, ne.Payload); err != nil {
			return nil, nil, false, err
		}
	}
	ctx, span := tracer.Start(ctx, "dedup.record", trace.WithAttributes(attribute.String("effect.type", ne.Type),
		attribute.String("idempotency.key", ne.Key)))
	defer span.End()
	tc := traceContext(ctx)
	stableID := effect.NewStableID(ne.Tenant, ne.Key)
	for range 2 {
		var e Effect
		var stored *string
		var created bool
		var token pgtype.UUID
		err := s.db.QueryRow(ctx, insertLeasedSQL, ne.Tenant, ne.Key, ne.Type, fp, ne.Payload, tc, stableID,
			h.Owner, h.Lease.Milliseconds(), effect.StatusDelivering).Scan(&created, &e.ID, &e.Tenant, &e.Key, &e.Type,
			&e.Fingerprint, &e.Status, &e.Attempts, &e.Result, &e.LastError, &e.CreatedAt, &e.UpdatedAt,
			&e.DeliveredAt, &e.NextAttemptAt, &stored, &token)
		existing := &e
		switch {
		case err == nil && created:
			e.StableID = stableIDOf(e.Tenant, e.Key, stored)
			c := &Claimed{Lease: Lease{EffectID: e.ID, Token: token.Bytes}, Tenant: e.Tenant, Key: e.Key, Type: e.Type,
				Payload: ne.Payload, CreatedAt: e.CreatedAt, StableID: e.StableID}
			return &e, c, false, nil
		case err == nil:
			e.StableID = stableIDOf(e.Tenant, e.Key, stored)
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, nil, false, translate("record effect", err)
		default:
			// Taken by a transaction the statement's snapshot could not see.
			existing, err = s.Get(ctx, ne.Tenant, ne.Key)
			if errors.Is(err, ErrNotFound) {
				if paused, perr := s.TypePaused(ctx, ne.Type); perr != nil || paused {
					return nil, nil, false, cmp.Or(perr, ErrTypePaused)
				}
				continue // purged between the insert and the read
			}
			if err != nil {
				return nil, nil, false, err
			}
		}
		if !bytes.Equal(existing.Fingerprint, fp) {
			return nil, nil, false, &KeyReusedError{Key: ne.Key, Existing: existing}
		}
		span.SetAttributes(attribute.Bool("idempotency.replayed", true))
		return existing, nil, true, nil
	}
	return nil, nil, false, fmt.Errorf("dedup: effect %q vanished twice while being read", ne.Key)
}

// ClaimEffect leases the outbox row of the effect id to h, due or not, unless another holder's lease on it
// is still running (then found is false, as it is for an effect without an outbox row: a terminal one). A
// row whose lease expired comes back Rescued. The Claimed carries its payload. A row of a paused type is
// not claimed: ErrTypePaused.
func (s *Store) ClaimEffect(ctx context.Context, id int64, h Holder) (c Claimed, found bool, err error) {
	rs, err := s.db.Query(ctx, claimEffectSQL, id, h.Owner, h.Lease.Milliseconds(), effect.StatusDelivering)
	if err != nil {
		return c, false, translate("claim effect", err)
	}
	rows, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (Claimed, error) {
		var c Claimed
		var stableID *string
		err := r.Scan(&c.EffectID, &c.Token, &c.Rescued, &c.Tenant, &c.Key, &c.Type, &c.Attempts, &c.CreatedAt,
			&c.Trace, &stableID)
		c.StableID = stableIDOf(c.Tenant, c.Key, stableID)
		return c, err
	})
	if err != nil {
		return c, false, translate("claim effect", err)
	}
	if len(rows) == 0 {
		if paused, err := s.TypePausedFor(ctx, id); err != nil || paused {
			return c, false, cmp.Or(err, ErrTypePaused)
		}
		return c, false, nil
	}
	c = rows[0]
	if c.Payload, err = s.Payload(ctx, c.Lease); err != nil {
		// Handed back at once, unattempted, rather than left leased until the lease runs out.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if rerr := s.release(rctx, []Claimed{c}); rerr != nil {
			err = fmt.Errorf("%w; and handing the row back: %w", err, rerr)
		}
		return c, false, err
	}
	return c, true, nil
}

// TypePaused reports whether an operator paused delivery of effect type typ.
func (s *Store) TypePaused(ctx context.Context, typ string) (bool, error) {
	var paused bool
	err := s.db.QueryRow(ctx, typePausedSQL, typ).Scan(&paused)
	return paused, translate("read paused types", err)
}

// TypePausedFor reports whether delivery of the type of effect id is paused, the effect waiting for it.
func (s *Store) TypePausedFor(ctx context.Context, id int64) (bool, error) {
	var paused bool
	err := s.db.QueryRow(ctx, effectTypePausedSQL, id).Scan(&paused)
	return paused, translate("read paused types", err)
}
