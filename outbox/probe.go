package outbox

import (
	"context"
	"crypto/rand"
	_ "embed"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/workers"
	"github.com/oncegate/oncegate/providers"
)

// A destination's pause ends with one call (migration 00030). When a pause ran out, every row that waited for
// it was claimed in the same instant: an outside test saw 7 calls within 5 ms, and 10 of 31 rows charged an
// attempt by a receiver that still throttled. A breaker's half-open state lets one call through first; a pause
// now does the same for the fleet. Past the pause's end its rows stay held (held_until, which every claim
// reads) while one gateway's probe, a call of the pause's oldest waiting row, asks the destination whether it
// is ready:
//   - an answer that asks to wait again (429 or 503 with Retry-After) sets the next pause, however short;
//   - no answer to go by (a timeout, a refused connection, a 5xx) pauses the destination again, as long as
//     before (probeEnd);
//   - any other answer (delivered, or a failure the destination answered itself) lifts the pause, and a
//     notification wakes every gateway's claims of the type;
//   - a probe that made no call (the gateway stopped, the row was not to be called) is freed for the next one
//     at once; a gateway that dies with its probe out leaves it to the next gateway once the probe's lease has
//     run out.
//
// Every gateway looks for pauses due for their probe at least every probePoll, and the gateway that got the
// 429 at its end; one of them takes each probe (claim_probe.sql). The rows stay held until a probe's answer
// lifts the pause, however long no probe can go (the type paused by an operator, the fleet down): with a
// hold of some seconds instead, an outside test's held rows all went at once into a failing receiver when an
// operator's pause of the type ended, and when a fleet stopped longer than the hold came back. A gateway
// older than 00030 reads the pause's end alone, and claims the rows then, as it always did.
//
// The probe is the pause's one call: its breaker neither refuses nor counts it (attempt). Counted, its
// failures opened every gateway's breaker within a few pauses of a failing destination, and the probes, then
// refused, stopped for the breakers' open period after the destination had recovered.
//
// A probe of a limited type takes no token: one call a pause, beside the limit.

//go:embed sql/probes_due.sql
var probesDueSQL string

// probePoll is the longest a dispatcher goes without asking whether a pause of its types is due for its probe.
const probePoll = time.Second

// probes are the probes out in this dispatcher, by the effect ID of their row.
type probes struct {
	mu sync.Mutex
	at map[int64]dedup.Probe
}

func (p *probes) put(id int64, pr dedup.Probe) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at == nil {
		p.at = map[int64]dedup.Probe{}
	}
	p.at[id] = pr
}

// take returns and forgets the probe that row id is, if it is one: its call, or the decision not to make it,
// ends the probe.
func (p *probes) take(id int64) (dedup.Probe, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.at[id]
	delete(p.at, id)
	return pr, ok
}

// signalProbe has the probe loop look for due probes now.
func (d *Dispatcher) signalProbe() {
	select {
	case d.probeWake <- struct{}{}:
	default:
	}
}

// probeLoop takes the probes of pauses of this dispatcher's types as they come due, until ctx ends.
func (d *Dispatcher) probeLoop(ctx, deliveries context.Context, inflight *workers.Pool) {
	timer := time.NewTimer(probePoll)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-d.probeWake:
		}
		timer.Reset(min(d.probeDue(ctx, deliveries, inflight), probePoll))
	}
}

// probeDue takes and starts the probes due now, and returns how long until the next pause it knows of ends.
func (d *Dispatcher) probeDue(ctx, deliveries context.Context, inflight *workers.Pool) time.Duration {
	names := make([]string, len(d.types))
	for i, t := range d.types {
		names[i] = t.Name
	}
	qctx, cancel := d.dbContext()
	defer cancel()
	rows, err := d.pool.Query(qctx, probesDueSQL, names)
	if err != nil {
		d.log.Warn("asking for paused destinations due for their probe failed", "err", err)
		return probePoll
	}
	type due struct {
		typ, dest, tenant string
		ms                int64
	}
	var all []due
	for rows.Next() {
		var p due
		if err := rows.Scan(&p.typ, &p.dest, &p.tenant, &p.ms); err != nil {
			rows.Close()
			d.log.Warn("asking for paused destinations due for their probe failed", "err", err)
			return probePoll
		}
		all = append(all, p)
	}
	rows.Close()
	next := probePoll
	for _, p := range all {
		if p.ms > 0 {
			// A little past the end by the database's clock, which the probe's claim goes by.
			next = min(next, time.Duration(p.ms)*time.Millisecond+time.Millisecond)
			continue
		}
		t, err := d.typeOf(p.typ)
		if err != nil || ctx.Err() != nil {
			continue
		}
		if t.inflight.Load() >= int32(t.Concurrency) {
			next = min(next, minRefusedWait) // a slot frees soon
			continue
		}
		d.startProbe(ctx, deliveries, inflight, t, dedup.Probe{Type: p.typ, Destination: p.dest, Tenant: p.tenant})
	}
	return next
}

// startProbe takes the probe pr of a pause of t, if no other gateway has, and starts its call.
func (d *Dispatcher) startProbe(ctx, deliveries context.Context, inflight *workers.Pool, t *effectType, pr dedup.Probe) {
	_, _ = rand.Read(pr.Token[:])
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ClaimTimeout)
	r, ok, lifted, err := d.store.ClaimProbe(cctx, pr, dedup.ClaimParams{Type: t.Name, Owner: d.cfg.Owner, Lease: t.lease})
	cancel()
	log := d.log.With("type", t.Name, "destination", pr.Destination, "tenant", pr.Tenant)
	switch {
	case err != nil:
		log.Warn("taking the probe of a paused destination failed", "err", err)
		d.endProbe(log, t, pr, dedup.ProbeFree)
		return
	case lifted:
		log.Info("a destination's pause ended with no row waiting for it: lifted")
		d.pauses.lift(t.Name, pr.Tenant, pr.Destination)
		return
	case !ok:
		return
	}
	log.Info("a destination's pause ended: one call asks whether it is ready before its rows go", "effect", r.EffectID)
	d.metrics.Probes.WithLabelValues(t.Name).Inc()
	t.admit(r.Tenant, false) // one row: counted, not capped
	t.inflight.Add(1)
	d.probes.put(r.EffectID, pr)
	inflight.Go(func() {
		defer d.release(t, r.Tenant)
		defer func() {
			// The row was not called (decide set it aside, its lease was lost): the next probe goes at once.
			if pr, ok := d.probes.take(r.EffectID); ok {
				d.endProbe(log, t, pr, dedup.ProbeFree)
				d.signalProbe()
			}
		}()
		defer d.recoverDelivery(t, r)
		d.deliver(deliveries, t, r)
	})
}

// endProbe ends probe pr as end says (dedup.ProbeEnd): lifted, the pause is lifted for the fleet and this
// gateway's claims are woken; paused again, this gateway probes again when the new pause ends. A write that
// fails leaves the pause to the probe's lease.
func (d *Dispatcher) endProbe(log *slog.Logger, t *effectType, pr dedup.Probe, end dedup.ProbeEnd) {
	ctx, cancel := d.dbContext()
	defer cancel()
	lifted, again, err := d.store.EndProbe(ctx, pr, end)
	switch {
	case err != nil:
		log.Warn("ending a paused destination's probe failed; the next probe goes when its lease runs out", "err", err)
	case lifted:
		log.Info("the destination answered its probe without asking to wait: its pause is lifted for every gateway")
		d.pauses.lift(t.Name, pr.Tenant, pr.Destination)
		d.WakeType(t.Name)
	case again > 0:
		log.Warn("the probe of a paused destination got no answer to go by: it is paused again, as long as before",
			"for", again.String())
		d.pauses.note(t.Name, pr.Tenant, pr.Destination, time.Now().Add(again), true)
		time.AfterFunc(again, d.signalProbe)
	}
}

// probeEnd is what the outcome of a probe's call does to its pause (besides a 429 or 503 with Retry-After,
// which sets the next pause): an answer that shows the destination up lifts it, delivered or a permanent
// failure it answered itself; no answer to go by (a timeout, a refused connection, a 5xx, what a breaker
// counts as a failure: destinationFailure) pauses it again, as a breaker's failed half-open call opens it
// again: lifted, such a probe let every waiting row go at once into a destination that still throttled (an
// outside test: 15 calls in 7 ms, each charged a 429). A call that the gateway's shutdown cut short says
// nothing: the probe is freed.
func probeEnd(out providers.Outcome, stopping bool) dedup.ProbeEnd {
	switch {
	case stopping:
		return dedup.ProbeFree
	case destinationFailure(out, true):
		return dedup.ProbeAgain
	default:
		return dedup.ProbeLift
	}
}

// probeArg is pause.sql's $7: the token of the probe whose call got the answer, NULL for any other call.
func probeArg(pr *dedup.Probe) pgtype.UUID {
	if pr == nil {
		return pgtype.UUID{}
	}
	return pgtype.UUID{Bytes: pr.Token, Valid: true}
}
