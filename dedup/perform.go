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
	insertLeasedSQL = query("insert_leased")
	claimEffectSQL  = query("claim_effect")
	typePausedSQL   = query("type_paused")
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
	for try := range 3 { // as Create's
		if try == 2 {
			if freed, err := s.freeDangling(ctx, ne.Tenant, ne.Key); err != nil || !freed {
				return nil, nil, false, cmp.Or(err, vanished(ne.Key))
			}
		}
		sent := time.Now()
		var e Effect
		var stored *string
		var created bool
		var token pgtype.UUID
		var pausedMS *int64
		err := s.db.QueryRow(ctx, insertLeasedSQL, ne.Tenant, ne.Key, ne.Type, fp, ne.Payload, tc, stableID,
			h.Owner, h.Lease.Milliseconds(), effect.StatusDelivering, orNull(ne.Tags), orNull(ne.Terms), s.keyRetention(), s.bodiesApart(), orNil(ne.Destination), s.keyHold()).Scan(&created, &e.ID, &e.Tenant, &e.Key, &e.Type,
			&e.Fingerprint, &e.Status, &e.Attempts, &e.Result, &e.LastError, &e.CreatedAt, &e.UpdatedAt,
			&e.DeliveredAt, &e.NextAttemptAt, &stored, &e.BodyExpired, &token, &pausedMS)
		existing := &e
		switch {
		case err == nil && created:
			e.StableID = stableIDOf(e.Tenant, e.Key, stored)
			c := &Claimed{Lease: Lease{EffectID: e.ID, Token: token.Bytes}, Tenant: e.Tenant, Key: e.Key, Type: e.Type,
				Payload: ne.Payload, CreatedAt: e.CreatedAt, StableID: e.StableID, LeasedAt: sent,
				PauseAsked: ne.Destination}
			if pausedMS != nil {
				c.PauseLeft = time.Duration(*pausedMS) * time.Millisecond
			}
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
	return nil, nil, false, vanished(ne.Key)
}

// EffectClaim is what ClaimEffect came to: the row leased to the caller (Found), or else the token of the
// lease that held it (Holding; nil when the row had no lease, or there is no row because the effect is terminal).
type EffectClaim struct {
	Claimed
	Found   bool
	Holding *[16]byte
}

// ClaimEffect leases the outbox row of the effect id to h, due or not, unless another holder's lease on it
// is still running. A row whose lease expired comes back Rescued. The Claimed carries its payload. A row of a
// paused type is not claimed: ErrTypePaused.
//
// fence, when not nil, is the lease token of the attempt the caller waited for (an earlier claim's Holding):
// the row is then taken only while that lease is on it and has run out, its holder gone without an outcome.
// An attempt that ended is never taken over by a caller that waited for it, in this process or any other:
// the caller is owed that attempt's answer, not a second call (docs/proxy.md).
func (s *Store) ClaimEffect(ctx context.Context, id int64, h Holder, fence *[16]byte) (EffectClaim, error) {
	var ec EffectClaim
	var fenceArg, holding pgtype.UUID
	var paused *bool
	if fence != nil {
		fenceArg = pgtype.UUID{Bytes: *fence, Valid: true}
	}
	var (
		cid              *int64
		token            pgtype.UUID
		rescued          *bool
		tenant, key, typ *string
		attempts         *int
		createdAt        *time.Time
		trace            map[string]string
		stableID         *string
		prevOwner        *string
		prevToken        pgtype.UUID
		prevExpires      pgtype.Timestamptz
		interrupted      *int
	)
	sent := time.Now()
	err := s.db.QueryRow(ctx, claimEffectSQL, id, h.Owner, h.Lease.Milliseconds(), effect.StatusDelivering,
		fenceArg).Scan(&ec.Found, &holding, &paused, &cid, &token, &rescued, &tenant, &key, &typ, &attempts, &createdAt,
		&trace, &stableID, &prevOwner, &prevToken, &prevExpires, &interrupted)
	if err != nil {
		return ec, translate("claim effect", err)
	}
	if !ec.Found {
		if paused != nil && *paused {
			return ec, ErrTypePaused
		}
		if holding.Valid {
			ec.Holding = &holding.Bytes
		}
		return ec, nil
	}
	ec.Claimed = Claimed{Lease: Lease{EffectID: *cid, Token: token.Bytes}, Rescued: *rescued, Tenant: *tenant,
		Key: *key, Type: *typ, Attempts: *attempts, CreatedAt: *createdAt, Trace: trace, LeasedAt: sent,
		InterruptedAttempts: *interrupted}
	ec.Interrupted = interruptedLease(prevOwner, prevToken, prevExpires)
	ec.StableID = stableIDOf(ec.Tenant, ec.Key, stableID)
	if ec.Payload, err = s.Payload(ctx, ec.Lease); err != nil {
		// Handed back at once, unattempted, rather than left leased until the lease runs out.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if rerr := s.release(rctx, []Claimed{ec.Claimed}); rerr != nil {
			err = fmt.Errorf("%w; and handing the row back: %w", err, rerr)
		}
		return EffectClaim{}, err
	}
	return ec, nil
}

// TypePaused reports whether an operator paused delivery of effect type typ.
func (s *Store) TypePaused(ctx context.Context, typ string) (bool, error) {
	var paused bool
	err := s.db.QueryRow(ctx, typePausedSQL, typ).Scan(&paused)
	return paused, translate("read paused types", err)
}
