package outbox

import (
	"context"
	"sync"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/backoff"
)

// claimLoop claims due rows and starts their deliveries (under deliveries, in inflight) until ctx ends. It
// claims again at once while claims come back full, and otherwise waits for a notification (Wake), a freed
// delivery slot, or the poll interval.
func (d *Dispatcher) claimLoop(ctx, deliveries context.Context, inflight *sync.WaitGroup) {
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	var failures int
	for ctx.Err() == nil {
		more, err := d.claimAll(ctx, deliveries, inflight)
		d.signals.claimRound.signal(struct{}{})
		if err != nil && ctx.Err() == nil {
			failures++
			wait := backoff.Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(failures)
			d.log.Warn("claiming outbox rows failed", "err", err, "retry_in", wait.String())
			sleep(ctx, wait)
			continue
		}
		failures = 0
		if more {
			continue
		}
		select {
		case <-ctx.Done():
		case <-d.wake:
		case <-d.freed:
		case <-poll.C:
		}
	}
}

// claimAll claims due rows for every type with free capacity. It
// reports whether some claim came back full, so that more rows may be due.
func (d *Dispatcher) claimAll(ctx, deliveries context.Context, inflight *sync.WaitGroup) (more bool, err error) {
	for _, t := range d.types {
		// Breakers are per destination, so the claim cannot ask them; a row whose breaker refuses it is
		// rescheduled until that breaker's next probe (deliver.go), uncharged.
		free := int(int32(t.Concurrency) - t.inflight.Load())
		if free <= 0 {
			continue
		}
		n := min(free, d.cfg.BatchSize)
		rows, err := d.claim(ctx, t, n)
		if err != nil {
			return false, err
		}
		for _, r := range rows {
			t.inflight.Add(1)
			inflight.Go(func() {
				defer func() {
					t.inflight.Add(-1)
					select {
					case d.freed <- struct{}{}:
					default:
					}
				}()
				d.deliver(deliveries, t, r)
			})
		}
		if len(rows) == n {
			more = true
		}
	}
	return more, nil
}

func (d *Dispatcher) claim(ctx context.Context, t *effectType, n int) ([]dedup.Claimed, error) {
	// The claim itself is never cancelled midway: rows leased in the database but lost on the way back would
	// sit out their lease for nothing.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ClaimTimeout)
	defer cancel()
	return d.store.Claim(cctx, dedup.ClaimParams{Type: t.Name, Limit: n, Owner: d.cfg.Owner, Lease: t.lease})
}
