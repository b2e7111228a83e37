package outbox

import (
	"context"
	"time"
)

// purgeLoop applies retention every PurgeInterval until ctx ends. It has a goroutine of its own, so that a
// long purge never delays claiming, and it purges in batches that skip the rows another gateway's purge
// holds, so that gateways share the work instead of waiting on each other.
func (d *Dispatcher) purgeLoop(ctx context.Context) {
	tick := time.NewTicker(d.cfg.PurgeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_, _ = d.Purge(ctx)
		}
	}
}

// Purge deletes the effects past retention now, batch by batch, until a batch comes back short or ctx ends,
// and returns how many it deleted. Rows that another purge has locked are left to it.
func (d *Dispatcher) Purge(ctx context.Context) (int64, error) {
	var total int64
	var err error
	began := time.Now()
	for ctx.Err() == nil {
		if d.signals.purgeHold != nil {
			d.signals.purgeHeld.signal(struct{}{})
			select {
			case <-d.signals.purgeHold:
			case <-ctx.Done():
				return total, ctx.Err()
			}
		}
		var n int64
		n, err = d.store.Purge(ctx, d.cfg.Retention, d.cfg.PurgeBatchSize)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("purging expired effects failed", "err", err)
			}
			break
		}
		total += n
		d.signals.purgeBatch.signal(n)
		if n < int64(d.cfg.PurgeBatchSize) {
			break
		}
	}
	if total > 0 {
		d.log.Info("purged effects past retention", "effects", total, "retention", d.cfg.Retention.String(),
			"took_ms", time.Since(began).Milliseconds())
	}
	return total, err
}
