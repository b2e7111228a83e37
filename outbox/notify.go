package outbox

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/internal/notifier"
)

// notifyLoop tells the other gateways which effects this one finished (notifier.TopicEffectDone), so that
// requests waiting there answer at once: one notification for all that finished while the previous one was
// sent, at most every 5 ms. A NOTIFY inside each Finish would serialise their commits on Postgres's
// notification queue lock; batching here keeps them apart.
func (d *Dispatcher) notifyLoop(ctx context.Context) {
	for {
		select {
		case <-d.notifyNow:
		case <-ctx.Done():
		}
		d.finishedMu.Lock()
		ids := d.finished
		d.finished = nil
		d.finishedMu.Unlock()
		for _, payload := range notifier.JoinIDs(ids) {
			nctx, cancel := d.dbContext()
			if err := notifier.Send(nctx, d.pool, notifier.TopicEffectDone, payload); err != nil {
				d.log.Warn("notifying other gateways of finished effects failed; their waiters poll on", "err", err)
			}
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		sleep(ctx, 5*time.Millisecond)
	}
}
