package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/internal/workers"
)

// claimBackoff is how long the claim loop leaves a type alone after its claims failed, so that one type's
// failing claim neither stops the others nor is retried in a tight loop.
var claimBackoff = backoff.Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// suspectFor is how long a type whose batch claim failed is claimed one row at a time (claimEach). The rows
// of the failed claim are handed back at once, so the row at fault is found within the first pass; the rest
// of the minute guards against more such rows coming due.
const suspectFor = time.Minute

// claimState is what the claim loop remembers of one type between rounds.
type claimState struct {
	failures     int       // consecutive failed claims
	retryAt      time.Time // no claim before
	suspectUntil time.Time // claim one row at a time until
	backlog      bool      // the last claim came back full: more rows are due than were taken
	// idle: the last claim found no row due and skipped no tenant. A delivery of another type that ends
	// brings this type none, so it is claimed again only on a notification, a claim retry or the poll:
	// a gateway that delivers one busy type among idle ones made an empty claim of each idle type at every
	// delivery that ended, each a statement Postgres plans and runs for nothing.
	idle bool
	// emptySkip: the last claim found no row due while it skipped these tenants (their share in flight). A
	// delivery that ends and leaves the same tenants skipped brings no row a claim could take: claimed
	// again then, a type with one busy tenant made an empty claim at every delivery of that tenant's.
	emptySkip []string
	rate      rateState // a limited type's last take of tokens (rates.go)

	mu   sync.Mutex
	busy bool // a one-by-one claim runs (claimEach); the loop leaves the type to it
	err  error
}

// claimLoop claims due rows and starts their deliveries (under deliveries, in inflight) until ctx ends. It
// claims again at once while claims come back full, and otherwise waits for a notification (Wake), a freed
// delivery slot, a type's claim backoff to run out, or the poll interval.
func (d *Dispatcher) claimLoop(ctx, deliveries context.Context, inflight *workers.Pool) {
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	states := make(map[*effectType]*claimState, len(d.types))
	for _, t := range d.types {
		states[t] = &claimState{}
	}
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for ctx.Err() == nil {
		more, retryAt := d.claimAll(ctx, deliveries, inflight, states)
		d.signals.claimRound.signal(struct{}{})
		if more {
			// The next round comes at once; a notification or the poll that came meanwhile still wakes the
			// idle types, or they would wait for this type's backlog to drain.
			select {
			case <-d.wake:
				wakeWoken(states)
			case <-poll.C:
				wakeIdle(states)
			default:
			}
			continue
		}
		var retryC <-chan time.Time
		if !retryAt.IsZero() {
			retry.Reset(time.Until(retryAt))
			retryC = retry.C
		}
		newRows := true // rows may have come due: every type is claimed in the next round
		select {
		case <-ctx.Done():
		case <-d.wake:
			wakeWoken(states)
			newRows = false
		case <-d.freed:
			newRows = false
		case <-poll.C:
		case <-retryC:
		}
		if newRows {
			wakeIdle(states)
		}
	}
}

// wakeIdle has every type claimed in the next round: rows may have come due.
func wakeIdle(states map[*effectType]*claimState) {
	for _, st := range states {
		st.idle, st.emptySkip = false, nil
	}
}

// wakeWoken has the types that a notification named (Wake, WakeType) claimed in the next round. Waking every
// type at every notification made each idle type's claim run for nothing once a notification: with one busy
// type beside five idle ones, 26,000 of 32,000 claims in a minute at 385 accepts a second found nothing.
func wakeWoken(states map[*effectType]*claimState) {
	for t, st := range states {
		if t.woken.Swap(false) {
			st.idle, st.emptySkip = false, nil
		}
	}
}

// claimAll claims due rows for every type with free capacity and no claim backoff running. Breakers are per
// destination, so the claim cannot ask them; a row whose breaker refuses it is rescheduled until that
// breaker's next probe (deliver.go), uncharged. A type whose claim fails is backed off on its own and the
// round goes on with the next type. It reports whether some claim came back full, so that more rows may be
// due, and the earliest time a backed-off type may claim again (zero if none is backed off).
func (d *Dispatcher) claimAll(ctx, deliveries context.Context, inflight *workers.Pool,
	states map[*effectType]*claimState) (more bool, retryAt time.Time) {
	now := time.Now()
	for _, t := range d.types {
		st := states[t]
		st.mu.Lock()
		busy, err := st.busy, st.err
		st.err = nil
		st.mu.Unlock()
		if busy {
			continue
		}
		// A type whose destinations ran out of tokens, or were paused, is claimed again when the next token
		// is due or the pause ends: the claim left them out, so nothing else would wake it before the poll.
		if !st.rate.wake.IsZero() {
			if now.Before(st.rate.wake) {
				if retryAt.IsZero() || st.rate.wake.Before(retryAt) {
					retryAt = st.rate.wake
				}
			} else {
				st.rate.wake, st.idle = time.Time{}, false
			}
		}
		if st.idle {
			continue
		}
		if err != nil {
			d.claimFailed(t, st, now, err)
		}
		if now.Before(st.retryAt) {
			if retryAt.IsZero() || st.retryAt.Before(retryAt) {
				retryAt = st.retryAt
			}
			continue
		}
		free := int(int32(t.Concurrency) - t.inflight.Load())
		if free <= 0 {
			continue
		}
		// With a backlog, every delivery that ends frees a slot: claiming for each would cost a claim and a
		// payload read per delivery. A quarter of the slots free is claimed at once instead; rows that just
		// came due (no backlog) are claimed as soon as any slot is free.
		if st.backlog && free < max(1, min(d.cfg.BatchSize, t.Concurrency)/4) {
			continue
		}
		_, headroom := t.claimLimits()
		n := min(free, d.cfg.BatchSize, headroom)
		if n <= 0 {
			continue
		}
		if now.Before(st.suspectUntil) {
			d.claimEach(ctx, deliveries, inflight, t, st, n)
			continue
		}
		skip := t.saturated()
		if st.emptySkip != nil && slices.Equal(skip, st.emptySkip) {
			continue
		}
		rows, err := d.claim(ctx, t, n, skip)
		if err != nil {
			if errors.Is(err, dedup.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
				d.claimFailed(t, st, now, err)
				continue
			}
			// Postgres refused the claim's read of the payloads, or did not finish it in time: a row in the
			// batch may be one that cannot be read. Claim has handed the rows back.
			st.suspectUntil = now.Add(suspectFor)
			d.log.Warn("claim failed; claiming this type's rows one at a time for a while, to find a row at fault",
				"type", t.Name, "for", suspectFor.String(), "err", err)
			d.claimEach(ctx, deliveries, inflight, t, st, n)
			continue
		}
		st.failures = 0
		claimed := len(rows)
		if t.Rate != nil {
			st.rate.claimed(claimed, now, t.Rate.interval(), d.cfg.PollInterval)
		}
		rows, heldBack := d.holdBack(ctx, t, &st.rate, rows)
		var together []dedup.Claimed
		for _, r := range rows {
			// A batch may bring one tenant more rows than its share: the rest go back, uncharged, and the
			// next claims skip that tenant until one of its deliveries ends. A row that names no tenant is
			// counted, not capped: the claims cannot skip it, and handed back it would be claimed again at once.
			if !t.admit(r.Tenant, !r.Untenanted) {
				d.apply(d.rowLog(t, r), t, r, action{kind: actReschedule})
				continue
			}
			t.inflight.Add(1)
			if t.batchTx {
				together = append(together, r)
				continue
			}
			d.startDelivery(deliveries, inflight, t, r)
		}
		switch {
		case len(together) == 1:
			d.startDelivery(deliveries, inflight, t, together[0])
		case len(together) > 1:
			d.startBatch(deliveries, inflight, t, together)
		}
		// Rows held back by a limit or a pause are not a backlog to claim again at once: their claim waits for
		// the next token (st.rate.wait), or for the rows to come due.
		st.backlog = claimed == n && heldBack == 0
		st.idle = claimed == 0 && len(skip) == 0
		st.emptySkip = nil
		if claimed == 0 && len(skip) > 0 {
			st.emptySkip = skip
		}
		if st.backlog {
			more = true
			select {
			case d.backlogSeen <- struct{}{}:
			default:
			}
		}
	}
	return more, retryAt
}

func (d *Dispatcher) claimFailed(t *effectType, st *claimState, now time.Time, err error) {
	st.failures++
	wait := claimBackoff.Delay(st.failures)
	st.retryAt = now.Add(wait)
	d.log.Warn("claiming outbox rows failed", "type", t.Name, "err", err, "retry_in", wait.String())
}

func (d *Dispatcher) claim(ctx context.Context, t *effectType, n int, skipTenants []string) ([]dedup.Claimed, error) {
	// The claim itself is never cancelled midway: rows leased in the database but lost on the way back would
	// sit out their lease for nothing.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ClaimTimeout)
	defer cancel()
	p := dedup.ClaimParams{Type: t.Name, Limit: n, Owner: d.cfg.Owner, Lease: t.lease, SkipTenants: skipTenants}
	if t.Rate != nil {
		p.Burst = t.Rate.Burst
	}
	return d.store.Claim(cctx, p)
}

// claimEach claims up to n rows of t one at a time, in a goroutine of its own (the claim loop goes on with
// the other types meanwhile), and delivers each row whose payload reads. A batch claim reads its payloads in
// one result, so one row that cannot be read fails the claim of every row due beside it, on every try;
// leased alone (ClaimLeases) and then read alone (Payload), such a row is found out by its ID and set aside by
// decide: dead, with the reason. Each row's lease starts when it is claimed, so a slow read never eats into
// the lease of the rows after it, and Postgres reads one suspect row at a time.
//
// A database that is unavailable marks nothing: the row is handed back, or its lease runs out.
func (d *Dispatcher) claimEach(ctx, deliveries context.Context, inflight *workers.Pool, t *effectType,
	st *claimState, n int) {
	st.mu.Lock()
	st.busy = true
	st.mu.Unlock()
	inflight.Go(func() {
		var err error
		defer func() {
			st.mu.Lock()
			st.busy, st.err = false, err
			st.mu.Unlock()
			d.signalFreed()
		}()
		for range n {
			if ctx.Err() != nil {
				return
			}
			var r dedup.Claimed
			var found bool
			r, found, err = d.claimOne(ctx, t)
			if err != nil || !found {
				return
			}
			t.admit(r.Tenant, false) // one row at a time: counted, not capped
			t.inflight.Add(1)
			start := time.Now()
			r.Payload, err = d.readPayload(r)
			d.log.Debug("read a suspect row's payload", "type", t.Name, "effect", r.EffectID, "err", err,
				"took", time.Since(start).String())
			if err == nil {
				// The one-row claim reads no pauses: those this gateway knows still hold, and a limit's tokens
				// are taken as for any claim. st.rate is the claim loop's, which leaves this type alone meanwhile.
				if kept, _ := d.holdBack(ctx, t, &st.rate, []dedup.Claimed{r}); len(kept) == 0 {
					d.release(t, r.Tenant)
					continue
				}
				d.startDelivery(deliveries, inflight, t, r)
				continue
			}
			log := d.rowLog(t, r)
			switch {
			case errors.Is(err, dedup.ErrLeaseLost):
			case errors.Is(err, dedup.ErrUnavailable):
				d.apply(log, t, r, action{kind: actReschedule})
				d.release(t, r.Tenant)
				return
			default:
				d.apply(log, t, r, decide(event{stage: stageUnreadable, err: err}, r, t.policy))
			}
			err = nil
			d.release(t, r.Tenant)
		}
	})
}

func (d *Dispatcher) claimOne(ctx context.Context, t *effectType) (dedup.Claimed, bool, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ClaimTimeout)
	defer cancel()
	p := dedup.ClaimParams{Type: t.Name, Limit: 1, Owner: d.cfg.Owner, Lease: t.lease, SkipTenants: t.saturated()}
	if t.Rate != nil {
		p.Burst = t.Rate.Burst
	}
	rows, err := d.store.ClaimLeases(cctx, p)
	if err != nil || len(rows) == 0 {
		return dedup.Claimed{}, false, err
	}
	return rows[0], true, nil
}

// readPayload reads a row's payload within the claim timeout. A read that runs out of time while the
// database answers a ping is the row's fault (a payload Postgres takes that long to print, to fail in the
// end), and comes back as an error that is not dedup.ErrUnavailable.
func (d *Dispatcher) readPayload(r dedup.Claimed) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ClaimTimeout)
	p, err := d.store.Payload(ctx, r.Lease)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		return p, err
	}
	pctx, cancel := context.WithTimeout(context.Background(), d.cfg.DBTimeout)
	defer cancel()
	if perr := d.pool.Ping(pctx); perr != nil {
		return nil, err
	}
	return nil, fmt.Errorf("reading it took over %v, while the database answered other queries", d.cfg.ClaimTimeout)
}

// startDelivery delivers r in a goroutine of its own; r is already counted in t.inflight.
func (d *Dispatcher) startDelivery(deliveries context.Context, inflight *workers.Pool, t *effectType, r dedup.Claimed) {
	inflight.Go(func() {
		defer d.release(t, r.Tenant)
		defer d.recoverDelivery(t, r)
		d.deliver(deliveries, t, r)
	})
}

// recoverDelivery turns a panic in the delivery of r (a bug that one payload sets off, in a provider or
// here) into r's failure, set aside by decide. Left alone it would take the gateway down, and the row, rescued
// after its lease, would do the same to every gateway that took it. The panic's value and stack go to the log
// only: they may hold configuration that a tenant must not see.
func (d *Dispatcher) recoverDelivery(t *effectType, r dedup.Claimed) {
	v := recover()
	if v == nil {
		return
	}
	log := d.rowLog(t, r)
	log.Error("a delivery panicked", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	d.apply(log, t, r, decide(event{stage: stagePanicked}, r, t.policy))
}

// release frees a delivery slot of t and tenant's, and tells the claim loop.
func (d *Dispatcher) release(t *effectType, tenant string) {
	t.done(tenant)
	t.inflight.Add(-1)
	d.signalFreed()
}

func (d *Dispatcher) signalFreed() {
	select {
	case d.freed <- struct{}{}:
	default:
	}
}

func (d *Dispatcher) rowLog(t *effectType, r dedup.Claimed) *slog.Logger {
	return d.log.With("type", t.Name, "effect", r.EffectID, "tenant", r.Tenant, "key", r.Key)
}
