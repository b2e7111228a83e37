package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/internal/stall"
	"github.com/oncegate/oncegate/providers"
)

// errBreakerFailure tells the breaker that an attempt failed in a way that says the destination is unwell.
var errBreakerFailure = errors.New("outbox: destination failure")

// deliver takes one claimed row to its next state: it asks decide, calls the provider when told to, asks
// decide again about the outcome, and records what decide said under the row's lease.
func (d *Dispatcher) deliver(ctx context.Context, t *effectType, r dedup.Claimed) {
	// The delivery continues the trace of the request that created the effect.
	ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(r.Trace))
	stableID := r.StableID
	ctx, span := tracer.Start(ctx, "outbox.dispatch "+t.Name, trace.WithAttributes(
		attribute.String("effect.type", t.Name), attribute.String("idempotency.key", r.Key),
		attribute.Int("effect.attempt", nextAttempt(r)), attribute.Bool("effect.rescued", r.Rescued),
		attribute.String("effect.stable_id", stableID)))
	defer span.End()
	log := d.log.With("type", t.Name, "effect", r.EffectID, "tenant", r.Tenant, "key", r.Key, "attempt", nextAttempt(r))
	destination(t, &r)

	if r.Rescued {
		d.metrics.Rescued.WithLabelValues(t.Name).Inc()
		d.recordAttempt(t, r, leaseStart(r, t.lease), providers.Outcome{}, false)
	}
	lc := newLeaseClock(r, t.lease)
	act := decide(event{stage: stageClaimed}, r, t.policy)
	var accepted time.Time
	if act.kind == actDeliver {
		if !d.leaseForCall(log, t, r, lc) {
			return
		}
		ev, recorded := d.attempt(ctx, log, t, r, stableID, lc, false)
		if ev.stage == stageAttempted {
			traceOutcome(span, ev.outcome)
		}
		if recorded {
			return
		}
		act, accepted = decide(ev, r, t.policy), ev.at
	}
	d.applyUnder(log, t, r, act, lc, accepted)
}

// destination is where r is delivered (providers.Destination), worked out once and kept in r.
func destination(t *effectType, r *dedup.Claimed) string {
	if r.Destination == "" {
		r.Destination = providers.Destination(t.Provider, r.Payload)
	}
	return r.Destination
}

// leaseForCall makes sure that r's lease leaves room for a whole call and the record of its outcome before the
// call starts, and says whether it may start. A claim's lease is the type's timeout plus lease_margin, counted
// from before the claim was sent, but a call may start late: the claim reads its rows' payloads in a second
// statement, and a stall of the database between the two (a PgBouncer PAUSE, a failover) held the read
// while the lease ran. A call begun with too little lease outlived it, was rescued by another dispatcher and
// made again (an 8 s PAUSE resent 4 webhooks of 128 in a CI run; TestACallIsNotStartedOnALeaseTooShortForIt).
// So a call with less than its timeout and half the margin left extends the lease first (a full lease from
// now, fenced by the token). A row whose lease cannot be extended is not called: it is handed back,
// uncharged, or, with the database away, left to be rescued when its lease runs out.
func (d *Dispatcher) leaseForCall(log *slog.Logger, t *effectType, r dedup.Claimed, lc *leaseClock) bool {
	if time.Until(lc.expires()) >= t.Timeout+d.cfg.LeaseMargin/2 {
		return true
	}
	err := d.extendLease(r, lc, min(d.cfg.DBTimeout, extendTimeout))
	switch {
	case err == nil:
		return true
	case errors.Is(err, dedup.ErrLeaseLost):
		log.Warn("lease lost before the call; another dispatcher owns the row")
	default:
		log.Warn("the lease left is too short for the call and could not be extended; the row is handed back uncalled",
			"lease_left", time.Until(lc.expires()).Round(time.Millisecond).String(), "err", err)
		_ = d.apply(log, t, r, action{kind: actReschedule})
	}
	return false
}

// attempt calls the provider through the breaker of the delivery's destination, timed and counted, and says
// what became of the call. recorded is set when a TxProvider's delivery was recorded (or lost its lease) in
// the provider's transaction. An attempt in a request (the dedup proxy: inRequest) was held back already if
// its destination is paused or out of tokens (holdInRequest), and is not asked again here; a 429 or 503 with
// Retry-After that it gets pauses the destination for the fleet, as a dispatcher's does (SPEC §2): its
// client gets that answer, and every other caller waits.
func (d *Dispatcher) attempt(ctx context.Context, log *slog.Logger, t *effectType, r dedup.Claimed,
	stableID string, lc *leaseClock, inRequest bool) (ev event, recorded bool) {
	del := delivery(r)
	dest := destination(t, &r)
	// A destination that asked the fleet to wait after this row was claimed is not called: the row waits
	// with it, uncharged, as a row its breaker refuses.
	// The fleet's table is asked again first (pausedFor, forced): rows of a paused destination reach this
	// point only when claimed before the pause, or after an operator lifted it.
	// The probe of a pause that has run out (probe.go) is the one call its destination gets meanwhile.
	pr, probing := d.probes.take(r.EffectID)
	if !inRequest && !probing {
		if left := d.pausedFor(t, pauseTenant(r), dest, time.Now(), true); left > 0 {
			return event{stage: stageRefused, wait: left + rand.N(minRefusedWait), paused: true}, false
		}
	}
	b := d.breakers.get(t, r.Tenant, dest)
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	start := time.Now()
	call := func() (providers.Outcome, error) {
		b.noteCall(time.Now().Add(t.Timeout))
		actx, cancel := stall.Default().WithTimeout(ctx, t.Timeout)
		defer cancel()
		var o providers.Outcome
		if txp, ok := t.Provider.(providers.TxProvider); ok {
			o, recorded = d.attemptTx(actx, log, txp, t, r, del)
		} else {
			o = func() providers.Outcome {
				defer d.keepLease(log, r, lc)() // stopped even when the provider panics (recoverDelivery)
				return t.Provider.Deliver(actx, del)
			}()
		}
		// A delivery that the gateway cancelled (its shutdown's drain ran out) says nothing of the destination.
		if destinationFailure(o, true) && ctx.Err() == nil {
			return o, errBreakerFailure
		}
		return o, nil
	}
	var out providers.Outcome
	var err error
	if probing {
		// The pause's one call goes whatever this gateway's breaker says, and is not counted there: a failed
		// probe pauses the destination again (probeEnd), which paces the calls as an open breaker would (probe.go).
		out, _ = call()
	} else {
		out, err = b.cb.Execute(call)
	}
	if open := errors.Is(err, gobreaker.ErrOpenState); open || errors.Is(err, gobreaker.ErrTooManyRequests) {
		// The row waits, uncharged, until the breaker can let a call through again: handed back at once, it
		// would be claimed and refused again in a loop while the breaker's probe is in flight.
		return event{stage: stageRefused, wait: b.refusedWait(time.Now(), open, t.BreakerOpenFor)}, false
	}
	answered := time.Now()
	switch {
	case out.Kind == providers.KindRetry && out.Throttled != 0 && out.RetryAfter > 0 && ctx.Err() == nil:
		var asked *dedup.Probe
		if probing {
			asked = &pr
		}
		d.pauseDestination(log, t, pauseTenant(r), dest, out.RetryAfter, out.Throttled, asked)
	case probing:
		d.endProbe(log, t, pr, probeEnd(out, ctx.Err() != nil))
	}
	d.metrics.DispatchLatency.WithLabelValues(t.Name).Observe(answered.Sub(start).Seconds())
	// The attempt log and the metric say what the attempt came to, as decide will finish it.
	seen := t.policy.seen(r, out, ctx.Err() != nil)
	d.recordAttempt(t, r, start, seen, true)
	d.metrics.Attempts.WithLabelValues(t.Name, seen.Kind.String()).Inc()
	return event{stage: stageAttempted, outcome: out, stopping: ctx.Err() != nil, at: answered}, recorded
}

// destinationFailure reports whether an outcome counts against the destination in its breaker: transient
// failures and doubt do, and so does a permanent failure that the destination did not answer itself.
// A destination that asked for time (Throttled) is up, and paused when pausing (rates.go): its answer is then
// not a failure. Unpaused (a batch of a TxProvider's rows, whose answers carry no Retry-After), nothing else
// would hold the calls back, and the breaker does.
func destinationFailure(o providers.Outcome, pausing bool) bool {
	if pausing && o.Kind == providers.KindRetry && o.Throttled != 0 && o.RetryAfter > 0 {
		return false
	}
	return o.Kind == providers.KindRetry || o.Kind == providers.KindInDoubt ||
		(o.Kind == providers.KindFailed && !o.DestinationUp)
}

// attemptTx runs a TxProvider and, when it delivered, records that in the same transaction, with the same
// dedup.Store.Finish as any other outcome: the effect and its record commit together, or neither does.
func (d *Dispatcher) attemptTx(ctx context.Context, log *slog.Logger, p providers.TxProvider, t *effectType,
	r dedup.Claimed, del providers.Delivery) (out providers.Outcome, recorded bool) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return providers.Retry(fmt.Errorf("begin: %w", err)), false
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	out = p.DeliverTx(ctx, tx, del)
	if out.Kind != providers.KindDelivered {
		return out, false
	}
	act := decide(event{stage: stageAttempted, outcome: out}, r, t.policy)
	err = d.store.WithTx(tx).Finish(ctx, r.Lease, act.finish)
	if errors.Is(err, dedup.ErrLeaseLost) {
		log.Warn("lease lost before the delivery committed; another dispatcher owns the row, nothing recorded")
		return out, true
	}
	if err != nil {
		return providers.Retry(fmt.Errorf("record delivery: %w", err)), false
	}
	if err := tx.Commit(ctx); err != nil {
		// Whether the commit happened is unknown; if it did not, the lease expires and the row is delivered
		// again, which the provider's own constraint keeps to one effect.
		log.Warn("commit of a delivery failed; the row will be rescued after its lease", "err", err)
		return out, true
	}
	d.finishedEffect(t, act.finish.Status, r.EffectID)
	return out, true
}

func traceOutcome(span trace.Span, out providers.Outcome) {
	span.SetAttributes(attribute.String("effect.outcome", out.Kind.String()))
	if out.Err != nil {
		span.RecordError(out.Err)
		if out.Kind != providers.KindDelivered {
			span.SetStatus(codes.Error, out.Err.Error())
		}
	}
}

// apply records an action decided for a claimed row, under its lease. A write that fails leaves the row
// leased: it is rescued when the lease runs out, so the failure costs time, never the effect. It returns the
// write's error (dedup.ErrLeaseLost when another holder owns the row), which the dispatcher only logs.
func (d *Dispatcher) apply(log *slog.Logger, t *effectType, r dedup.Claimed, act action) error {
	return d.applyUnder(log, t, r, act, nil, time.Time{})
}

// applyUnder is apply for a delivery that keeps the clock of its lease (lc; nil makes one from the claim),
// and whose destination accepted the effect at accepted (zero when it did not, or had nothing to accept):
// the time from then to the commit that records it is the crash window (oncegate_outcome_record_seconds).
func (d *Dispatcher) applyUnder(log *slog.Logger, t *effectType, r dedup.Claimed, act action, lc *leaseClock,
	accepted time.Time) error {
	if lc == nil {
		lc = newLeaseClock(r, t.lease)
	}
	act.countInterrupted(r, t.policy)
	if act.msg != "" {
		args := []any{"err", act.err}
		if act.kind == actReschedule {
			args = append(args, "in", act.reschedule.Delay.String())
		}
		log.Log(context.Background(), act.level, act.msg, args...)
	}
	switch act.kind {
	case actFinish:
		fin := act.finish
		// When the try that recorded it was handed off. Atomic: a try that ran out of time may still be
		// handed off by its batch while the next try runs.
		var handedOff atomic.Int64
		if !accepted.IsZero() {
			fin.OnHandoff = func() { handedOff.Store(time.Now().UnixNano()) }
			// At debug level each step is logged as it happens, so that the log of a gateway killed in the
			// window says which step its outcome had reached (killtest --gateway-log-level debug -v).
			if log.Enabled(context.Background(), slog.LevelDebug) {
				log.Debug("the destination accepted the effect; recording it", "accepted", accepted,
					"after", time.Since(accepted))
				fin.OnHandoff = func() {
					now := time.Now()
					handedOff.Store(now.UnixNano())
					log.Debug("the outcome's statement is handed to Postgres", "after", now.Sub(accepted))
				}
			}
		}
		err := d.record(log, r, lc, func(ctx context.Context) error { return d.store.Finish(ctx, r.Lease, fin) })
		switch {
		case errors.Is(err, dedup.ErrLeaseLost):
			log.Warn("lease lost before the outcome was recorded; another dispatcher owns the row", "status", act.finish.Status)
		case err != nil:
			log.Error("recording the outcome failed; the row will be rescued after its lease", "status", act.finish.Status, "err", err)
		default:
			if !accepted.IsZero() && act.finish.Status == effect.StatusDelivered {
				d.metrics.OutcomeRecord.WithLabelValues(t.Name, t.kind).Observe(time.Since(accepted).Seconds())
				d.metrics.OutcomeHandoff.WithLabelValues(t.Name, t.kind).Observe(time.Unix(0, handedOff.Load()).Sub(accepted).Seconds())
				if log.Enabled(context.Background(), slog.LevelDebug) {
					log.Debug("the outcome is recorded", "after", time.Since(accepted))
				}
			}
			d.finishedEffect(t, act.finish.Status, r.EffectID)
		}
		return err
	case actReschedule:
		err := d.record(log, r, lc, func(ctx context.Context) error { return d.store.Reschedule(ctx, r.Lease, act.reschedule) })
		switch {
		case errors.Is(err, dedup.ErrLeaseLost):
			log.Warn("lease lost before the row was rescheduled; another dispatcher owns it")
		case err != nil:
			log.Error("rescheduling failed; the row will be rescued after its lease", "err", err)
		}
		return err
	}
	return nil
}

// record runs a write that records an outcome under r's lease, and tries it again while the database is
// unavailable, for as long as the lease runs and LeaseMargin more (lease.go says why). When the next try
// might end after the lease, the lease is extended first, if the database lets it be. A write that failed
// for good leaves the row to be rescued when its lease runs out, and a rescue resends (at_least_once) or
// gives up to an operator (at_most_once) an effect that was in fact delivered: a pooler's PAUSE or a
// failover of a few seconds must not do that (an outside test saw webhooks sent twice at every PgBouncer
// PAUSE of 5 or 8 s: one try may take timeouts.database, and the tries stopped after lease_margin). The
// write is fenced by the lease token, so trying again is safe even if the lease has meanwhile gone to
// another dispatcher.
func (d *Dispatcher) record(log *slog.Logger, r dedup.Claimed, lc *leaseClock, write func(ctx context.Context) error) error {
	doubt := false
	for try := 1; ; try++ {
		ctx, cancel := d.dbContext()
		err := write(ctx)
		cancel()
		if errors.Is(err, dedup.ErrLeaseLost) && doubt {
			return fmt.Errorf("%w, or an earlier try that ran out of time recorded the outcome after all", err)
		}
		if err == nil || !errors.Is(err, dedup.ErrUnavailable) {
			return err
		}
		// A try that ran out of time may still commit: the token then refuses the next one.
		doubt = doubt || errors.Is(err, context.DeadlineExceeded)
		wait := recordBackoff.Delay(try)
		if time.Now().Add(wait).After(lc.expires().Add(d.cfg.LeaseMargin)) {
			return err
		}
		if time.Until(lc.expires()) < wait+d.cfg.DBTimeout {
			xerr := d.extendLease(r, lc, min(d.cfg.DBTimeout, extendTimeout))
			if errors.Is(xerr, dedup.ErrLeaseLost) {
				if doubt {
					return fmt.Errorf("%w, or an earlier try that ran out of time recorded the outcome after all", xerr)
				}
				return xerr
			}
		}
		log.Warn("recording an outcome failed, the database is unavailable; trying again while the lease lasts",
			"err", err, "in", wait.String(), "lease_left", time.Until(lc.expires()).Round(time.Millisecond).String())
		time.Sleep(wait)
	}
}

// extendTimeout bounds one extension of a lease: short, so that an extension the database cannot answer
// delays the next try of the write by little.
const extendTimeout = time.Second

// recordBackoff spaces the tries of record.
var recordBackoff = backoff.Policy{Base: 50 * time.Millisecond, Max: 500 * time.Millisecond}

// finishedEffect counts an effect this dispatcher brought to a terminal status, wakes this gateway's waiters
// at once, and queues the ID for the other gateways (notify.go).
func (d *Dispatcher) finishedEffect(t *effectType, s effect.Status, id int64) {
	d.metrics.Finished.WithLabelValues(t.Name, string(s)).Inc()
	if d.cfg.OnFinished != nil {
		d.cfg.OnFinished(id)
	}
	d.done.Add(strconv.FormatInt(id, 10))
}
