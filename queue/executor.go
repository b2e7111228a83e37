package queue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The executor runs handlers, one per leased job, each in a slot of its own. A run is keyed by (job ID,
// epoch), so that losing a lease cancels exactly the run that held it, even when the same process leased the
// job again meanwhile.

// runKey names one run of a job: a job taken back and leased again by the same process is a new run, and
// losing a lease concerns exactly the run that held it.
type runKey struct {
	id    string
	epoch int64
}

type run struct {
	cancel context.CancelCauseFunc
	// lost is set once the lease is known to be gone (or handed back): heartbeats stop asking about it, but the
	// run keeps its slot until its handler returns.
	lost bool
	// finishing is set when the handler has returned and its outcome is being recorded: its slot is free
	// (freeSlots), though its lease is held, and heartbeated, until the outcome is written.
	finishing bool
}

func (w *Worker) launch(ctx context.Context, l leased, leasedAt time.Time) {
	k := runKey{id: l.id, epoch: l.epoch}
	w.calls.Add(1)
	w.handlers.Go(func() {
		called := sync.OnceFunc(w.calls.Done)
		defer called()
		unrecorded := false
		if job, err := decodeJob(l.record, []byte(l.payload)); err != nil {
			called()
			w.bury(ctx, l, err)
		} else {
			// The lease's own ID and epoch are the job's: every script keys it by the hash field, and a record
			// whose id said otherwise ran its handler as another job, whose completion found no lease.
			job.ID, job.Epoch = l.id, l.epoch
			// The enqueue's trace context, read once for both of the job's spans.
			ctx := w.q.opts.Propagator.Extract(ctx, propagation.MapCarrier(job.TraceContext))
			w.traceLease(ctx, job, leasedAt)
			unrecorded = w.runJob(ctx, job, called)
		}
		w.mu.Lock()
		r := w.runs[k]
		// A run a close stopped, or whose outcome it could not record, still holds its lease: it stays for
		// the close to hand its job back at once, rather than leave it leased to a worker that is gone.
		if !unrecorded || !w.closing.Load() {
			delete(w.runs, k)
		}
		w.mu.Unlock()
		if r != nil {
			r.cancel(nil)
		}
		w.slotFreed()
	})
}

// slotFreed wakes the fetcher, which may be waiting for a free slot.
func (w *Worker) slotFreed() {
	select {
	case w.freed <- struct{}{}:
	default:
	}
}

// runJob runs the handler under a span of its own, child of ctx's (the enqueue's), and records the outcome.
// called is called as the handler returns. It reports whether the run still holds its lease with nothing
// recorded: a close stopped it, or its outcome could not be recorded before the close.
func (w *Worker) runJob(ctx context.Context, job *Job, called func()) (unrecorded bool) {
	ctx, span := w.q.tracer.Start(ctx, "queue.handle "+job.Kind, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.system", "oncegate"),
			attribute.String("messaging.destination.name", w.q.name),
			attribute.String("messaging.message.id", job.ID), attribute.String("job.kind", job.Kind),
			attribute.Int64("job.epoch", job.Epoch), attribute.Int("job.attempt", job.Attempt),
			attribute.Int("job.stalls", job.Stalls)))
	defer span.End()

	started := time.Now()
	outcome := "error"
	var took time.Duration // the handler's time, not the recording of its outcome
	defer func() {
		if w.cfg.OnJobDone != nil {
			w.cfg.OnJobDone(job, outcome, took)
		}
	}()
	err := w.call(ctx, job)
	called()
	took = time.Since(started)
	w.mu.Lock()
	if r := w.runs[runKey{id: job.ID, epoch: job.Epoch}]; r != nil {
		r.finishing = true
	}
	w.mu.Unlock()
	w.slotFreed()
	if cause := context.Cause(ctx); cause != nil {
		// The lease was lost (the job is someone else's now), or a close stopped the handler (its job is
		// handed back): there is nothing to record either way.
		w.log.InfoContext(ctx, "handler stopped", "job", job.ID, "epoch", job.Epoch, "cause", cause, "err", err)
		if errors.Is(cause, ErrLeaseLost) {
			outcome = "lease_lost"
			return false
		}
		outcome = "stopped"
		return true
	}
	if err == nil {
		err = w.complete(job)
		switch {
		case errors.Is(err, ErrLeaseLost):
			w.log.WarnContext(ctx, "job finished after its lease was lost; another worker owns it", "job", job.ID,
				"epoch", job.Epoch)
			outcome = "lease_lost"
		case errors.Is(err, ErrNotReplicated):
			// Completed on the primary, but a failover now would lose that: the job may run again, and the
			// gateway deduplicates what it does.
			w.log.ErrorContext(ctx, "completion in doubt: not acknowledged by the replicas; the job may run "+
				"again after a failover", "job", job.ID, "epoch", job.Epoch, "err", err)
		case err != nil:
			w.log.ErrorContext(ctx, "completion not recorded by the end of the drain; the job is handed back and "+
				"will run again", "job", job.ID, "err", err)
			return true
		default:
			outcome = "completed"
		}
		return false
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	result, ferr := w.fail(job, err)
	switch {
	case errors.Is(ferr, ErrLeaseLost):
		w.log.WarnContext(ctx, "job failed after its lease was lost", "job", job.ID, "err", err)
		outcome = "lease_lost"
	case ferr != nil:
		w.log.ErrorContext(ctx, "failure not recorded by the end of the drain; the job is handed back and will "+
			"run again", "job", job.ID, "err", err, "record_err", ferr)
		return true
	case result == "dead":
		w.log.ErrorContext(ctx, "job is dead", "job", job.ID, "attempt", job.Attempt, "err", err)
		outcome = "dead"
	default:
		w.log.InfoContext(ctx, "job failed; will retry", "job", job.ID, "attempt", job.Attempt, "err", err)
		outcome = "retry"
	}
	return false
}

// call runs the handler, turning a panic into an error so that one bad job cannot kill the process and
// strand every other job it holds. The handler runs on a goroutine of its own, so that one that calls
// runtime.Goexit (t.FailNow in a shared helper, say) ends that goroutine and not the run's: the run then
// ended without a result, which is a failed attempt, as a panic is. Before, the run's goroutine ended mid-way:
// its job stayed leased, its heartbeat kept it, and its slot was never given back while the worker lived.
func (w *Worker) call(ctx context.Context, job *Job) error {
	done := make(chan error, 1)
	go func() {
		returned := false
		defer func() {
			if r := recover(); r != nil {
				w.log.Error("handler panicked", "job", job.ID, "panic", r, "stack", string(debug.Stack()))
				done <- fmt.Errorf("handler panicked: %v", r)
			} else if !returned {
				w.log.Error("handler called runtime.Goexit; the attempt failed", "job", job.ID)
				done <- errors.New("handler called runtime.Goexit before returning")
			}
		}()
		err := w.h.Handle(ctx, job)
		returned = true
		done <- err
	}()
	return <-done
}

// lose cancels one run whose lease is gone. Its slot stays taken until its handler returns.
func (w *Worker) lose(k runKey) {
	w.mu.Lock()
	r := w.runs[k]
	if r != nil {
		r.lost = true
	}
	w.mu.Unlock()
	if r != nil && !r.finishing {
		w.log.Warn("lease lost; cancelling the handler", "job", k.id, "epoch", k.epoch)
		r.cancel(ErrLeaseLost)
	}
}

// livePairs lists (id, epoch) of the runs whose lease the worker believes it still holds.
func (w *Worker) livePairs() []any {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.livePairsLocked()
}

func (w *Worker) livePairsLocked() []any {
	pairs := make([]any, 0, 2*len(w.runs))
	for k, r := range w.runs {
		if !r.lost {
			pairs = append(pairs, k.id, k.epoch)
		}
	}
	return pairs
}

// bury sends a job whose record the worker cannot read to dead, with the reason, instead of running it: no
// handler can be given the job, and a retry would read the same record. Dead, it is kept for an operator to
// inspect and requeue. Records are written by this package's scripts, so this takes a record written by
// another version or by hand.
//
// OnJobDone hears of it as "dead", with what could be read of the job, so that an alert on dead jobs sees it.
func (w *Worker) bury(ctx context.Context, l leased, err error) {
	w.log.ErrorContext(ctx, "undecodable job leased; it is sent to dead", "job", l.id, "epoch", l.epoch, "err", err)
	job := readJob(l.record, []byte(l.payload))
	job.ID, job.Epoch, job.State = l.id, l.epoch, StateActive
	outcome, ferr := w.fail(job, Permanent(err))
	if ferr != nil {
		w.log.ErrorContext(ctx, "undecodable job not recorded as dead by the end of the drain; it will be leased again",
			"job", l.id, "err", ferr)
		return
	}
	if outcome == "dead" && w.cfg.OnJobDone != nil {
		w.cfg.OnJobDone(job, "dead", 0)
	}
}
