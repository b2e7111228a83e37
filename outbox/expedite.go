package outbox

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/workers"
)

// maxDirect bounds the direct claims (Created) in flight in one dispatcher. Each is a statement and a payload
// read for one row, where the claim loop takes up to a batch in the same two: past a few at once, new effects
// are no longer a quiet tenant's now and then, and the loop claims them more cheaply together.
const maxDirect = 4

// running is what Created needs of a running dispatcher: Run's contexts and its pool of deliveries, while it
// claims. Created starts nothing once Run has stopped claiming, so that Run's wait for the deliveries in flight
// is the last word on them.
type running struct {
	mu         sync.Mutex
	claiming   bool
	ctx        context.Context // Run's: ends when the dispatcher stops claiming
	deliveries context.Context
	inflight   *workers.Pool
	direct     atomic.Int32 // direct claims in flight
}

func (r *running) start(ctx, deliveries context.Context, inflight *workers.Pool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.claiming, r.ctx, r.deliveries, r.inflight = true, ctx, deliveries, inflight
}

func (r *running) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.claiming = false
}

// NewEffect is an effect this gateway has just created, as the request that created it knows it: what its
// delivery needs, so that a direct claim reads nothing back.
type NewEffect struct {
	ID                        int64
	Tenant, Key, Type, Stable string
	CreatedAt                 time.Time
	Payload                   json.RawMessage // as stored
}

// Created tells the dispatcher of an effect this gateway has just created, once its transaction has
// committed. When the effect's tenant has nothing of its type in flight here and the type has a free slot,
// the dispatcher claims the effect's row by its ID at once (claim_new.sql) and delivers it, instead of
// leaving it to the claim loop's next round: beside another tenant's backlog, that round is a claim of the
// backlog's rows first, each taking milliseconds of busy cores, and the quiet tenant's new effect waited for
// it (issue 31). It reports whether it took the effect on; when it did not, the caller wakes the claim loop
// (WakeType) as for any new row, and so does Created itself when its claim finds the row gone or fails.
//
// Limited types (Rate) take tokens in their claims, and batched types (a BatchTxProvider) deliver rows
// together: both are left to the claim loop. So is a tenant that has deliveries of the type in flight here:
// its next rows come with the loop's claims, in their order.
func (d *Dispatcher) Created(n NewEffect) bool {
	t, err := d.typeOf(n.Type)
	if err != nil || t.Rate != nil || t.batchTx {
		return false
	}
	r := &d.running
	if r.direct.Add(1) > maxDirect {
		r.direct.Add(-1)
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.claiming || r.ctx.Err() != nil || !d.reserve(t, n.Tenant) {
		r.direct.Add(-1)
		return false
	}
	ctx, deliveries, inflight := r.ctx, r.deliveries, r.inflight
	inflight.Go(func() {
		if !d.claimNew(ctx, deliveries, inflight, t, n) {
			d.release(t, n.Tenant)
		}
	})
	return true
}

// reserve counts a delivery of tenant's in flight for t, if t has a free slot and tenant none in flight.
func (d *Dispatcher) reserve(t *effectType, tenant string) bool {
	t.tenantsMu.Lock()
	defer t.tenantsMu.Unlock()
	if t.tenants[tenant] > 0 {
		return false
	}
	if t.inflight.Add(1) > int32(t.Concurrency) {
		t.inflight.Add(-1)
		return false
	}
	if t.tenants == nil {
		t.tenants = map[string]int{}
	}
	t.tenants[tenant]++
	return true
}

// claimNew claims and delivers the row of effect n, whose slot reserve counted. It reports whether a
// delivery started (it releases the slot); when not, the row is the claim loop's, woken for it.
func (d *Dispatcher) claimNew(ctx, deliveries context.Context, inflight *workers.Pool, t *effectType,
	n NewEffect) bool {
	defer d.running.direct.Add(-1)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ClaimTimeout)
	r, ok, paused, err := d.store.ClaimNew(cctx, n.ID, dedup.ClaimParams{Type: t.Name, Owner: d.cfg.Owner, Lease: t.lease})
	cancel()
	switch {
	case err != nil:
		d.metrics.Direct.WithLabelValues(t.Name, "failed").Inc()
		d.log.Debug("claiming a new effect by its ID failed; the claim loop has it", "type", t.Name,
			"effect", n.ID, "err", err)
		d.WakeType(t.Name)
		return false
	case paused:
		// The claim loop knows when the pause ends (or learns it from the claim it is woken for).
		d.metrics.Direct.WithLabelValues(t.Name, "paused").Inc()
		d.WakeType(t.Name)
		return false
	case !ok:
		d.metrics.Direct.WithLabelValues(t.Name, "taken").Inc()
		d.WakeType(t.Name)
		return false
	}
	d.metrics.Direct.WithLabelValues(t.Name, "claimed").Inc()
	r.Tenant, r.Key, r.Payload, r.StableID, r.CreatedAt = n.Tenant, n.Key, n.Payload, n.Stable, n.CreatedAt
	// The pauses this gateway knows still hold, as for any claim's rows (the statement read the fleet's). A
	// row handed back for one is the claim loop's when the pause ends, as it would be had the loop claimed it.
	var rs rateState
	if kept, _ := d.holdBack(ctx, t, &rs, []dedup.Claimed{r}); len(kept) == 0 {
		d.release(t, r.Tenant)
		if !rs.wake.IsZero() {
			time.AfterFunc(time.Until(rs.wake), func() { d.WakeType(t.Name) })
		}
		return true
	}
	d.startDelivery(deliveries, inflight, t, r)
	return true
}
