package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/stall"
	"github.com/oncegate/oncegate/internal/workers"
	"github.com/oncegate/oncegate/providers"
)

// A BatchTxProvider's rows claimed together are delivered together: their effects, and the records of them,
// commit in one transaction instead of one each. One transaction per effect made the postgres provider
// deliver a third of what the gateway accepts (issue 14), every delivery paying a commit's WAL flush.
//
// The transaction first locks every row whose lease is still held (dedup.Store.LockLeases): from then on no
// claim can take them and no write can change them, so the effects written next, and FinishAll's records of
// them, commit only for leases held to the end, the fence one row's DeliverTx gets from its Finish. A row
// whose lease was lost is left out before anything is written for it.
//
// Nothing here makes one row's fault another's: when the provider's statement fails, the transaction is
// rolled back and each row is delivered alone (attemptTx), so that a row Postgres refuses fails by itself.

// batchRow is one row of a batch and what became of it.
type batchRow struct {
	r       dedup.Claimed
	ctx     context.Context
	span    trace.Span
	log     *slog.Logger
	out     providers.Outcome
	settled bool // its outcome was recorded, or its lease found lost: nothing left to do
}

// startBatch delivers rows of t, a BatchTxProvider's type, in a goroutine of its own; each is already
// counted in t.inflight.
func (d *Dispatcher) startBatch(deliveries context.Context, inflight *workers.Pool, t *effectType, rows []dedup.Claimed) {
	inflight.Go(func() {
		batch := make([]*batchRow, len(rows))
		for i, r := range rows {
			batch[i] = &batchRow{r: r}
		}
		defer func() {
			for _, b := range batch {
				d.release(t, b.r.Tenant)
			}
		}()
		defer d.recoverBatch(t, batch)
		d.deliverBatch(deliveries, t, batch)
	})
}

// deliverBatch is deliver for a batch: decide, one provider call per breaker, decide again, record.
func (d *Dispatcher) deliverBatch(ctx context.Context, t *effectType, batch []*batchRow) {
	groups := map[*breaker][]*batchRow{}
	var order []*breaker
	for _, b := range batch {
		r := b.r
		b.ctx, b.span = tracer.Start(otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(r.Trace)),
			"outbox.dispatch "+t.Name, trace.WithAttributes(
				attribute.String("effect.type", t.Name), attribute.String("idempotency.key", r.Key),
				attribute.Int("effect.attempt", nextAttempt(r)), attribute.Bool("effect.rescued", r.Rescued),
				attribute.String("effect.stable_id", r.StableID), attribute.Int("effect.batch", len(batch))))
		defer b.span.End()
		b.log = d.rowLog(t, r).With("attempt", nextAttempt(r))
		if r.Rescued {
			d.metrics.Rescued.WithLabelValues(t.Name).Inc()
			d.recordAttempt(t, r, leaseStart(r, t.lease), providers.Outcome{}, false)
		}
		if act := decide(event{stage: stageClaimed}, r, t.policy); act.kind != actDeliver {
			b.settled = true
			d.apply(b.log, t, r, act)
			continue
		}
		br := d.breakers.get(t, r.Tenant, destination(t, &b.r))
		if _, ok := groups[br]; !ok {
			order = append(order, br)
		}
		groups[br] = append(groups[br], b)
	}
	for _, br := range order {
		d.attemptGroup(ctx, t, br, groups[br])
	}
}

// attemptGroup delivers the rows of one breaker through one call of it, so that a failed statement counts
// once against the destination, as one failed delivery would.
//
// A half-open breaker's probe is one row, as a delivery of a provider that does not batch would be: the
// probe of a whole group charged an attempt to each of its rows against a destination that had just failed
// (TestBreakerOpensRowsWaitThenDrain saw all 10 rows charged at each probe). The rest go through the
// breaker after it, delivered if it closed and waiting uncharged if it opened again. The probe is the row
// charged least so far, so that a destination down for long spreads its probes' attempts over its rows
// instead of spending one row's (a row probed at every half-open ended dead while the others waited).
func (d *Dispatcher) attemptGroup(ctx context.Context, t *effectType, br *breaker, rows []*batchRow) {
	if len(rows) > 1 && br.cb.State() == gobreaker.StateHalfOpen {
		least := 0
		for i, b := range rows {
			if b.r.Attempts < rows[least].r.Attempts {
				least = i
			}
		}
		rows[0], rows[least] = rows[least], rows[0]
		d.attemptGroup(ctx, t, br, rows[:1])
		rows = rows[1:]
	}
	br.inflight.Add(1)
	defer br.inflight.Add(-1)
	start := time.Now()
	_, err := br.cb.Execute(func() (providers.Outcome, error) {
		br.noteCall(time.Now().Add(t.Timeout))
		actx, cancel := stall.Default().WithTimeout(ctx, t.Timeout)
		defer cancel()
		d.attemptTxBatch(actx, t, rows)
		for _, b := range rows {
			if !b.settled && destinationFailure(b.out, false) {
				return b.out, errBreakerFailure
			}
		}
		return providers.Outcome{}, nil
	})
	if open := errors.Is(err, gobreaker.ErrOpenState); open || errors.Is(err, gobreaker.ErrTooManyRequests) {
		wait := br.refusedWait(time.Now(), open, t.BreakerOpenFor)
		for _, b := range rows {
			b.settled = true
			d.apply(b.log, t, b.r, decide(event{stage: stageRefused, wait: wait}, b.r, t.policy))
		}
		return
	}
	took := time.Since(start).Seconds()
	stopping := ctx.Err() != nil
	for _, b := range rows {
		if b.out.Kind == 0 { // its lease was lost before anything was tried
			continue
		}
		d.metrics.DispatchLatency.WithLabelValues(t.Name).Observe(took)
		seen := t.policy.seen(b.r, b.out, stopping)
		d.recordAttempt(t, b.r, start, seen, true)
		d.metrics.Attempts.WithLabelValues(t.Name, seen.Kind.String()).Inc()
		traceOutcome(b.span, b.out)
		if b.settled {
			continue
		}
		b.settled = true
		d.apply(b.log, t, b.r, decide(event{stage: stageAttempted, outcome: b.out, stopping: stopping}, b.r, t.policy))
	}
}

// attemptTxBatch performs and records rows in one transaction, or each alone when the batch cannot be. It
// leaves each row settled (recorded, or its lease lost) or with the outcome decide must be asked about.
func (d *Dispatcher) attemptTxBatch(ctx context.Context, t *effectType, rows []*batchRow) {
	p := t.Provider.(providers.BatchTxProvider)
	err := d.recordBatch(ctx, t, p, rows)
	if err == nil {
		return
	}
	d.log.Warn("a batch of deliveries could not be recorded together; delivering each alone", "type", t.Name,
		"rows", len(rows), "err", err)
	for _, b := range rows {
		if b.settled {
			continue
		}
		var recorded bool
		b.out, recorded = d.attemptTx(ctx, b.log, p, t, b.r, delivery(b.r))
		b.settled = recorded
	}
}

// recordBatch is the one-transaction path. An error means nothing it wrote committed and no row was settled
// by it but those whose lease it found lost.
func (d *Dispatcher) recordBatch(ctx context.Context, t *effectType, p providers.BatchTxProvider, rows []*batchRow) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	store := d.store.WithTx(tx)
	leases := make([]dedup.Lease, len(rows))
	for i, b := range rows {
		leases[i] = b.r.Lease
	}
	held, err := store.LockLeases(ctx, leases)
	if err != nil {
		return err
	}
	var live []*batchRow
	var ds []providers.Delivery
	for _, b := range rows {
		if !held[b.r.EffectID] {
			b.settled = true
			b.log.Warn("lease lost before the delivery; another dispatcher owns the row, nothing done")
			continue
		}
		live = append(live, b)
		ds = append(ds, delivery(b.r))
	}
	if len(live) == 0 {
		return nil
	}
	outs, err := p.DeliverTxBatch(ctx, tx, ds)
	if err != nil {
		return err
	}
	if len(outs) != len(live) {
		return fmt.Errorf("the provider gave %d outcomes for %d deliveries", len(outs), len(live))
	}
	var done []*batchRow
	var fs []dedup.Finish
	leases = leases[:0]
	for i, b := range live {
		b.out = outs[i]
		if b.out.Kind != providers.KindDelivered {
			continue // recorded after the commit, as any other outcome
		}
		done = append(done, b)
		leases = append(leases, b.r.Lease)
		fs = append(fs, decide(event{stage: stageAttempted, outcome: b.out}, b.r, t.policy).finish)
	}
	recorded, err := store.FinishAll(ctx, leases, fs)
	if err != nil {
		return err
	}
	for _, b := range done {
		if !recorded[b.r.EffectID] {
			// Locked above, so it cannot happen; if it did, committing would leave an effect unrecorded.
			return fmt.Errorf("effect %d was locked under its lease but not recorded", b.r.EffectID)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// Whether the commit happened is unknown; if it did not, the leases expire and the rows are delivered
		// again, which the provider's constraint keeps to one effect each.
		d.log.Warn("commit of a batch of deliveries failed; its rows will be rescued after their leases",
			"type", t.Name, "rows", len(done), "err", err)
		for _, b := range done {
			b.settled = true
		}
		return nil
	}
	for i, b := range done {
		b.settled = true
		d.finishedEffect(t, fs[i].Status, b.r.EffectID)
	}
	return nil
}

// delivery is what a provider is told of a claimed row.
func delivery(r dedup.Claimed) providers.Delivery {
	return providers.Delivery{Tenant: r.Tenant, Key: r.Key, Type: r.Type, StableID: r.StableID, Payload: r.Payload,
		Attempt: nextAttempt(r), Rescued: r.Rescued, CreatedAt: r.CreatedAt}
}

// recoverBatch is recoverDelivery for a batch: every row not yet settled is set aside as panicked.
func (d *Dispatcher) recoverBatch(t *effectType, batch []*batchRow) {
	v := recover()
	if v == nil {
		return
	}
	d.log.Error("a batch delivery panicked", "type", t.Name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	for _, b := range batch {
		if !b.settled {
			d.apply(d.rowLog(t, b.r), t, b.r, decide(event{stage: stagePanicked}, b.r, t.policy))
		}
	}
}
