package outbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/providers"
)

// Performed is what became of an effect performed at once by Perform.
type Performed struct {
	// Attempted is set when the provider was called; Outcome is then what it answered.
	Attempted bool
	Outcome   providers.Outcome
	// Status is the effect's status as Perform recorded it: terminal, or pending when it waits for a retry
	// (or for the breaker). Recorded is false when the write did not happen (the lease was lost, or the
	// database was unavailable for longer than LeaseMargin): the row is then another holder's, or rescued when
	// its lease runs out, and Status is what Perform meant to record.
	Status   effect.Status
	Recorded bool
	// Finish is what was recorded for a terminal status: its Result is the stored result.
	Finish dedup.Finish
	// Held says why the provider was not called when it was meant to be, and Wait for how long the effect
	// waits (pending, uncharged): HeldByBreaker, HeldByLimit or HeldByPause. Empty when it was called, or
	// not meant to be.
	Held string
	Wait time.Duration
}

// Why Perform did not call the provider of an effect it was meant to deliver (Performed.Held).
const (
	HeldByBreaker = "breaker" // the destination's circuit breaker is open
	HeldByLimit   = "limit"   // the type's fleet-wide rate left the destination no token
	HeldByPause   = "pause"   // the destination asked the fleet to wait (a 429 or 503 with Retry-After)
)

// inRequestTokenWait is the longest a request that performs an effect itself waits for its destination's
// next token before it is answered with the wait instead: a burst of proxied calls is spread over a second
// at the fleet's rate, and a client is not held longer than that by a limit that may keep it waiting for
// minutes.
const inRequestTokenWait = time.Second

// Attempt is what a request that performs effects itself (the dedup proxy) got from PerformNew or
// PerformExisting: the attempt it made (Performed), or why it made none.
type Attempt struct {
	// Performed is set when the row was this request's and it delivered it.
	Performed *Performed
	// Lease is the lease the attempt ran under (when Performed is set).
	Lease dedup.Lease
	// Existing is, from PerformNew, the effect its key already held (Replayed: the same request), which
	// this call did not perform.
	Existing *dedup.Effect
	Replayed bool
	// Holding is, when nothing was performed, the token of the lease on the effect's row: an attempt in
	// flight elsewhere (or one its fence kept the request from). Nil when the row had no lease or is gone.
	Holding *[16]byte
}

// holder is the lease a request takes to perform an effect of t itself: this dispatcher's owner name and the
// type's lease, as a claim would take.
func (d *Dispatcher) holder(t *effectType) dedup.Holder {
	return dedup.Holder{Owner: d.cfg.Owner, Lease: t.lease}
}

func (d *Dispatcher) typeOf(name string) (*effectType, error) {
	for _, t := range d.types {
		if t.Name == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("outbox: effect type %q is not delivered by this dispatcher", name)
}

// PerformNew records a new effect already leased to this request (dedup.Store.CreateLeased) and performs it
// at once, by Perform. started, when not nil, is called with the lease before the provider is: the caller's
// waiters learn which attempt is theirs. A key that holds an effect already is not performed: Existing and
// Replayed say what it holds (a *dedup.KeyReusedError when it is another request).
func (d *Dispatcher) PerformNew(ctx context.Context, ne dedup.NewEffect, fingerprint []byte,
	started func(dedup.Lease)) (Attempt, error) {
	t, err := d.typeOf(ne.Type)
	if err != nil {
		return Attempt{}, err
	}
	dbctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	e, c, replayed, err := d.store.CreateLeased(dbctx, ne, fingerprint, d.holder(t))
	if err != nil || c == nil {
		return Attempt{Existing: e, Replayed: replayed}, err
	}
	return d.performLeased(ctx, *c, started)
}

// PerformExisting performs the effect id now if, and only if, this request may: its row is not leased by a
// live attempt, and, when fence is set (the lease token of the attempt this request waited for), that very
// attempt's lease ran out without an outcome (dedup.Store.ClaimEffect). A request that waited for an attempt
// that ended is never the one that performs again: it gets Holding, or nothing, and answers what the
// effect came to. dedup.ErrTypePaused when an operator paused the type.
func (d *Dispatcher) PerformExisting(ctx context.Context, typ string, id int64, fence *[16]byte,
	started func(dedup.Lease)) (Attempt, error) {
	t, err := d.typeOf(typ)
	if err != nil {
		return Attempt{}, err
	}
	dbctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	ec, err := d.store.ClaimEffect(dbctx, id, d.holder(t), fence)
	if err != nil || !ec.Found {
		return Attempt{Holding: ec.Holding}, err
	}
	return d.performLeased(ctx, ec.Claimed, started)
}

func (d *Dispatcher) performLeased(ctx context.Context, c dedup.Claimed, started func(dedup.Lease)) (Attempt, error) {
	if started != nil {
		started(c.Lease)
	}
	p, err := d.Perform(ctx, c)
	if err != nil {
		return Attempt{Lease: c.Lease}, err
	}
	return Attempt{Performed: &p, Lease: c.Lease}, nil
}

// Perform delivers a row that the caller leased with the dispatcher's lease (PerformNew, PerformExisting) now, in the caller's goroutine, by the same path as a claimed row: decide (a rescued row
// of an at_most_once type is not resent), the destination's breaker, the provider with the type's timeout,
// decide again, and the outcome recorded under the row's lease. It does not count against the type's
// Concurrency: the caller's own limits bound it. ctx carries the caller's trace; cancelling it does not stop
// the attempt, which is bounded by the type's timeout, so that an effect begun is recorded.
func (d *Dispatcher) Perform(ctx context.Context, r dedup.Claimed) (Performed, error) {
	t, err := d.typeOf(r.Type)
	if err != nil {
		return Performed{}, err
	}
	ctx = context.WithoutCancel(ctx)
	destination(t, &r)
	log := d.rowLog(t, r).With("attempt", nextAttempt(r), "performed", "in request")
	if r.Rescued {
		d.metrics.Rescued.WithLabelValues(t.Name).Inc()
		d.recordAttempt(t, r, leaseStart(r, t.lease), providers.Outcome{}, false)
	}
	var p Performed
	var lc *leaseClock
	var accepted time.Time
	act := decide(event{stage: stageClaimed}, r, t.policy)
	if act.kind == actDeliver {
		if held, wait := d.holdInRequest(ctx, t, r); held != "" {
			p.Held, p.Wait = held, wait
			act = decide(event{stage: stageRefused, wait: wait, paused: held == HeldByPause}, r, t.policy)
			d.wakeAfter(t, wait)
		}
	}
	if act.kind == actDeliver {
		ctx, span := tracer.Start(ctx, "outbox.perform "+t.Name)
		lc = newLeaseClock(r, t.lease)
		ev, recorded := d.attempt(ctx, log, t, r, r.StableID, lc, true)
		accepted = ev.at
		if ev.stage == stageAttempted {
			traceOutcome(span, ev.outcome)
			p.Attempted, p.Outcome = true, ev.outcome
		}
		span.End()
		if ev.stage == stageRefused {
			p.Held, p.Wait = HeldByBreaker, ev.wait
		}
		act = decide(ev, r, t.policy)
		if recorded { // a TxProvider recorded its delivery in its own transaction
			p.Status, p.Recorded, p.Finish = act.finish.Status, true, act.finish
			return p, nil
		}
	}
	switch act.kind {
	case actFinish:
		p.Status, p.Finish = act.finish.Status, act.finish
	default:
		p.Status = effect.StatusPending
	}
	p.Recorded = d.applyUnder(log, t, r, act, lc, accepted) == nil
	return p, nil
}

// holdInRequest says whether a request that performs r itself must leave its destination alone for now, and
// for how long: the destination is paused for the fleet, or the type's fleet-wide rate has no token for it
// within inRequestTokenWait. A row claimed by the dispatcher is held back the same way by its claim
// (holdBack); a request's own attempt takes its token here, so that the dedup proxy's calls count against
// the limit with the dispatcher's.
func (d *Dispatcher) holdInRequest(ctx context.Context, t *effectType, r dedup.Claimed) (string, time.Duration) {
	dest := destination(t, &r)
	now := time.Now()
	if left := d.pausedFor(t, pauseTenant(r), dest, now, false); left > 0 {
		return HeldByPause, left
	}
	if t.Rate == nil && r.PauseAsked != "" && r.PauseAsked == dest {
		// The statement that recorded the effect asked the fleet's table already (insert_leased.sql).
		if r.PauseLeft <= 0 {
			return "", 0
		}
		ms := r.PauseLeft.Milliseconds()
		d.pauses.set(t.Name, pauseTenant(r), dest, &ms, now)
		return HeldByPause, r.PauseLeft
	}
	if t.Rate == nil {
		// What this gateway knows of pauses is what its own claims and calls met; another gateway's pause is
		// in the fleet's table, asked here by one index probe (a limited type's take of tokens asks it below).
		// Bounded as any statement: Perform's context outlives its client, so a database that hangs must not
		// hold the request.
		qctx, cancel := d.dbContext()
		defer cancel()
		var ms *int64
		if err := d.pool.QueryRow(qctx, pauseLeftSQL, t.Name, dest, pauseTenant(r)).Scan(&ms); err != nil {
			d.log.Warn("asking whether a request's destination is paused failed; it is called", "type", t.Name,
				"destination", dest, "err", err)
			return "", 0
		}
		if ms == nil {
			return "", 0
		}
		d.pauses.set(t.Name, pauseTenant(r), dest, ms, now)
		return HeldByPause, time.Duration(*ms) * time.Millisecond
	}
	if _, refused := d.breakers.refuses(t, r.Tenant, dest, now, map[breakerKey]bool{}); refused {
		// This gateway's breaker refuses the call (attempt answers the request so): no token is spent on it.
		return "", 0
	}
	// The wait eats into the row's lease, which keepLease first extends a third of a lease into the call: a
	// third at most, so that the call starts with two thirds left.
	deadline := now.Add(min(inRequestTokenWait, t.lease/3))
	for {
		got, err := d.takeTokens(ctx, t, pauseTenant(r), []string{dest}, map[string]int{dest: 1})
		if err != nil {
			d.log.Warn("taking a delivery token for a request's own attempt failed; it is not sent now",
				"type", t.Name, "destination", dest, "err", err)
			return HeldByLimit, failedTakeWait
		}
		g := got[dest]
		switch {
		case g.paused:
			d.pauses.note(t.Name, pauseTenant(r), dest, time.Now().Add(g.next), true)
			return HeldByPause, g.next
		case g.granted > 0:
			return "", 0
		case time.Now().Add(g.next).After(deadline):
			return HeldByLimit, g.next
		}
		// Another gateway may take the token first: asked again, and held when the wait runs out.
		time.Sleep(g.next + rand.N(t.Rate.interval()/4+1))
	}
}

// wakeAfter has t claimed once wait has passed: a row a request held back for its destination's pause or
// token is due then, and nothing else would bring it before the poll (a claim of a row held back does the
// same through its claim state: rateState.wake).
func (d *Dispatcher) wakeAfter(t *effectType, wait time.Duration) {
	time.AfterFunc(wait+minRefusedWait/10, func() { d.WakeType(t.Name) })
}
