package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/oncegate/oncegate/dedup"
)

// A delivery whose outcome is known but not yet recorded must not be rescued: the rescue would resend an
// effect that happened (issue 28: a PgBouncer PAUSE or a Postgres restart of a few seconds resent webhooks,
// no gateway dying). So the dispatcher keeps the lease of such a row for as long as it holds the outcome:
//
//   - it tries the recording write again for as long as the lease runs (record, deliver.go), not for a fixed
//     margin that one slow try could use up;
//   - while the database is away or slow, and the lease would run out before the next try can end, it
//     extends the lease (dedup.Store.ExtendLease, fenced by the token), beside the write;
//   - a provider call that runs long has its lease extended while it runs (keepLease), so that when its
//     answer comes, most of a lease is left for recording it.
//
// Everything is fenced by the lease token: an extension or a write of a lease that another dispatcher took
// meanwhile changes nothing and says so (dedup.ErrLeaseLost). A stall that outlasts the lease cannot be
// bridged (docs/effects.md): when the database comes back, whichever reaches it first wins, this
// dispatcher's fenced write (the outcome is recorded and nothing is resent) or another's claim (the row is
// rescued: resent under at_least_once, finished unknown under at_most_once, and the write here is refused).

// leaseClock is how long this dispatcher may count on a row's lease, by its own clock: each start is taken
// before the statement that began or extended the lease was sent, so the clock never overstates the lease.
type leaseClock struct {
	lease time.Duration
	mu    sync.Mutex
	until time.Time
}

func newLeaseClock(r dedup.Claimed, lease time.Duration) *leaseClock {
	start := r.LeasedAt
	if start.IsZero() {
		start = time.Now()
	}
	return &leaseClock{lease: lease, until: start.Add(lease)}
}

func (c *leaseClock) expires() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.until
}

func (c *leaseClock) extended(sent time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u := sent.Add(c.lease); u.After(c.until) {
		c.until = u
	}
}

// extendLease extends r's lease by a full lease from now, within timeout, and moves the clock.
func (d *Dispatcher) extendLease(r dedup.Claimed, c *leaseClock, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sent := time.Now()
	if err := d.store.ExtendLease(ctx, r.Lease, c.lease); err != nil {
		return err
	}
	c.extended(sent)
	d.metrics.LeaseExtensions.Inc()
	return nil
}

// keepLease extends r's lease while a provider call runs long: a third of the lease into the call, and every
// third after, so that the call's answer finds at least two thirds of a lease left to be recorded in. A call
// that ends sooner, as most do, costs nothing. It returns the function that stops it.
func (d *Dispatcher) keepLease(log *slog.Logger, r dedup.Claimed, c *leaseClock) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		every := c.lease / 3
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if err := d.extendLease(r, c, every); err != nil {
					log.Debug("extending the lease of a delivery in flight failed", "err", err)
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
