package outbox

import (
	"context"
	"fmt"

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
}

// Holder returns the lease a caller takes to perform an effect of typ itself (the dedup proxy): this
// dispatcher's owner name and the type's lease, as a claim would take. ok is false for a type the
// dispatcher does not deliver.
func (d *Dispatcher) Holder(typ string) (h dedup.Holder, ok bool) {
	for _, t := range d.types {
		if t.Name == typ {
			return dedup.Holder{Owner: d.cfg.Owner, Lease: t.lease}, true
		}
	}
	return h, false
}

// Perform delivers a row that the caller leased with Holder's lease (dedup.Store.CreateLeased or
// ClaimEffect) now, in the caller's goroutine, by the same path as a claimed row: decide (a rescued row
// of an at_most_once type is not resent), the destination's breaker, the provider with the type's timeout,
// decide again, and the outcome recorded under the row's lease. It does not count against the type's
// Concurrency: the caller's own limits bound it. ctx carries the caller's trace; cancelling it does not stop
// the attempt, which is bounded by the type's timeout, so that an effect begun is recorded.
func (d *Dispatcher) Perform(ctx context.Context, r dedup.Claimed) (Performed, error) {
	var t *effectType
	for _, et := range d.types {
		if et.Name == r.Type {
			t = et
		}
	}
	if t == nil {
		return Performed{}, fmt.Errorf("outbox: perform: effect type %q is not delivered by this dispatcher", r.Type)
	}
	ctx = context.WithoutCancel(ctx)
	log := d.rowLog(t, r).With("attempt", r.Attempts+1, "performed", "in request")
	if r.Rescued {
		d.metrics.Rescued.WithLabelValues(t.Name).Inc()
	}
	var p Performed
	act := decide(event{stage: stageClaimed}, r, t.policy)
	if act.kind == actDeliver {
		ctx, span := tracer.Start(ctx, "outbox.perform "+t.Name)
		ev, recorded := d.attempt(ctx, log, t, r, r.StableID)
		if ev.stage == stageAttempted {
			traceOutcome(span, ev.outcome)
			p.Attempted, p.Outcome = true, ev.outcome
		}
		span.End()
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
	p.Recorded = d.apply(log, t, r, act) == nil
	return p, nil
}
