package queue

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// The heartbeat extends the leases of the worker's runs and tells it which it lost; it is sent over the
// liveness connection, by the loop in liveness.go.
//
// Unlike enqueue, lease and complete, a heartbeat does not wait for replicas (Options.Replicas): it only moves
// deadlines forward and holds no fencing state, the epoch having been replicated with the lease. A heartbeat
// lost in a failover costs at most one interval of lease, and the next one extends the lease on the new
// primary, or finds it gone and cancels the handler. Waiting here would hold the liveness connection, whose
// traffic must stay prompt, for up to the replica timeout each beat.

// heartbeatState returns what a heartbeat asks about, read at one instant: the (id, epoch) pairs of the runs
// that hold a lease, and the lease call number below which a lease of this worker's that is not among them can
// only be one whose answer was lost. A lease call out meanwhile does not change that: Redis numbers it after
// every call whose answer came back, so its leases are never below the number (unless a failover lost the
// counter's last increments: heartbeat.lua then takes no lease for lost until an answer brings the worker's
// number back under the counter). (Asking for none while a call
// was out left the lost leases in place for as long as the fetcher kept a call out at each beat, which under
// load is nearly always: an outside tester saw them wait out a whole lease after a failover, and stall.)
func (w *Worker) heartbeatState() (pairs []any, orphansBefore int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.livePairsLocked(), w.leasedUpTo
}

// heartbeat marks the worker seen, extends the leases of its runs, cancels each run whose lease is gone, and
// hands back leases it was given but never heard of.
func (w *Worker) heartbeat(ctx context.Context, l *liveness) error {
	pairs, orphansBefore := w.heartbeatState()
	args := append([]any{w.id, w.seenFor().Milliseconds(), w.leaseFor().Milliseconds(), orphansBefore}, pairs...)
	k := w.q.keys
	res, err := heartbeatScript.Run(ctx, l.client(),
		[]string{k.jobs, k.leases, k.workers, k.owned, k.ready, k.marker, k.leaseSeq}, args...).StringSlice()
	if err != nil {
		return fmt.Errorf("queue: heartbeat: %w", err)
	}
	if res[0] != "0" {
		w.log.Warn("handed back jobs leased to this worker whose lease never reached it", "jobs", res[0])
	}
	w.mu.Lock()
	cleared := w.inDoubt > 0 && w.doubtAfter > 0 && orphansBefore >= w.doubtAfter
	if cleared {
		w.inDoubt, w.doubtAfter = 0, 0 // handed back now, if the lost calls leased anything
	}
	w.mu.Unlock()
	if cleared {
		w.slotFreed()
	}
	for i := 1; i+1 < len(res); i += 2 {
		epoch, err := strconv.ParseInt(res[i+1], 10, 64)
		if err != nil {
			return fmt.Errorf("queue: heartbeat: bad epoch %q", res[i+1])
		}
		w.lose(runKey{id: res[i], epoch: epoch})
	}
	return nil
}

// leaseFor is the lease a lease or heartbeat sets: LeaseTTL counted from the next heartbeat due, so that a
// pause shorter than LeaseTTL never costs a live worker its job, wherever it falls between two beats.
func (w *Worker) leaseFor() time.Duration { return w.cfg.LeaseTTL + w.cfg.HeartbeatInterval }

// seenFor is how long a heartbeat makes the worker count as alive in Stats.
func (w *Worker) seenFor() time.Duration { return 3 * w.cfg.HeartbeatInterval }
