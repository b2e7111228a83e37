package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/internal/backoff"
)

// The fetcher leases jobs for the worker's free slots, all of them in one script call, and blocks on Redis
// while there is nothing to do. A lease's answer must reach the worker: a lease taken in Redis but lost on the
// way is a job held by a live worker that does not know it (the heartbeat hands such leases back).

// freeSlots is how many more jobs the worker may lease: a slot is taken while a handler runs, not while its
// outcome is recorded, so that the next job's lease goes out beside the last one's completion instead of
// after it (the group commit of completions makes a slot wait for the batch before it). Leases held, those
// being recorded included, stay below twice Concurrency, so that a slow Redis cannot make a worker hold ever
// more jobs while their outcomes wait.
//
// probe is true when the leases in doubt alone leave no room and no answered lease call has come since they
// went into doubt: a call that leases nothing then gives the heartbeat the number it needs to hand them back.
func (w *Worker) freeSlots() (free int, probe bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	running := 0
	for _, r := range w.runs {
		if !r.finishing {
			running++
		}
	}
	free = min(w.cfg.Concurrency-running, 2*w.cfg.Concurrency-len(w.runs)-w.inDoubt)
	return free, free <= 0 && w.inDoubt > 0 && w.doubtAfter == 0
}

// leaseSize halves the jobs a lease call asks for after a call whose answer was lost, down to one, and
// doubles them back after each answered call that leased any. An outside tester's four jobs of 200 MB took
// longer to send than a lease call waits: every call was lost, the heartbeat handed its jobs back, the next
// call asked for the four again, and no job ran.
type leaseSize struct{ limit int }

func (s *leaseSize) of(free int) int {
	if s.limit > 0 && free > s.limit {
		return s.limit
	}
	return free
}

func (s *leaseSize) lost(asked int) { s.limit = max(1, asked/2) }

// answered lets the size grow back; past most, it is no longer limited.
func (s *leaseSize) answered(most int) {
	if s.limit > 0 {
		if s.limit *= 2; s.limit >= most {
			s.limit = 0
		}
	}
}

func (w *Worker) fetchLoop(ctx, handlerCtx context.Context) {
	var failures int
	var size leaseSize
	for ctx.Err() == nil {
		free, probe := w.freeSlots()
		if free <= 0 && !probe {
			w.waitFreed(ctx)
			continue
		}
		leasedAt := time.Now()
		asked := size.of(max(free, 0))
		jobs, now, next, call, err := w.lease(ctx, asked)
		if err != nil {
			if asked > 0 {
				size.lost(asked)
			}
			failures++
			d := backoff.Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(failures)
			w.log.Warn("lease failed; retrying", "err", err, "in", d)
			sleep(ctx, d)
			continue
		}
		failures = 0
		if len(jobs) > 0 { // an answer with no job says nothing of how long jobs take to send
			size.answered(2 * w.cfg.Concurrency)
		}
		ctxs := w.register(handlerCtx, jobs, call)
		for i, l := range jobs {
			w.launch(ctxs[i], l, leasedAt)
		}
		if len(jobs) > 0 {
			continue
		}
		if probe {
			w.waitFreed(ctx) // the next heartbeat hands the leases in doubt back, and rings freed
			continue
		}
		due := time.Duration(-1)
		if next > 0 {
			if due = time.Duration(next-now) * time.Millisecond; due <= 0 {
				continue // a delayed job fell due meanwhile
			}
		}
		w.block(ctx, due)
	}
}

// waitFreed waits until a slot frees up, or leases in doubt are handed back (slotFreed).
func (w *Worker) waitFreed(ctx context.Context) {
	select {
	case <-w.freed:
	case <-ctx.Done():
	}
}

// block waits on the marker until an enqueue (or anything else that makes work) rings it, the worker's own
// wake key is rung (by Run at close, or by a timer when the next delayed job falls due), or IdleBlock runs
// out. Redis checks blocking timeouts only every 100 ms, so a delayed job's time is kept by a timer here,
// which rings the wake key, rather than by the blocking command's timeout. due < 0 means no delayed job.
// BZPOPMIN is sent by hand because go-redis rounds its timeout up to whole seconds.
func (w *Worker) block(ctx context.Context, due time.Duration) {
	wake := w.q.keys.wake(w.id)
	if due >= 0 && due < w.cfg.IdleBlock {
		timer := time.AfterFunc(due, func() {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = w.rdb.ZAdd(tctx, wake, redis.Z{Member: "due"}).Err()
		})
		defer timer.Stop()
	}
	bctx, cancel := context.WithTimeout(ctx, w.cfg.IdleBlock+2*time.Second)
	defer cancel()
	secs := strconv.FormatFloat(w.cfg.IdleBlock.Seconds(), 'f', 3, 64)
	err := w.rdb.Do(bctx, "BZPOPMIN", w.q.keys.marker, wake, secs).Err()
	if err != nil && !errors.Is(err, redis.Nil) && ctx.Err() == nil {
		w.log.Warn("waiting for jobs failed", "err", err)
		sleep(ctx, 100*time.Millisecond)
	}
}

// leased is one job of a lease's answer, its record not yet decoded: the fetcher registers the run by id and
// epoch and goes on to the next lease call, and the record is decoded in the job's own goroutine, so that the
// one loop every job passes through does the least work (decoding was a fifth of a worker's CPU).
type leased struct {
	id              string
	epoch           int64
	record, payload string
}

// lease runs the lease script. Its context is never cancelled midway: a lease taken in Redis but lost on the
// way back would leave a job held by a live worker that does not know it.
func (w *Worker) lease(ctx context.Context, n int) (jobs []leased, now, next, call int64, err error) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	k := w.q.keys
	keys := []string{k.jobs, k.payloads, k.ready, k.delayed, k.leases, k.owned, k.workers, k.marker, k.leaseSeq,
		k.paused, k.epochFloor, k.dead}
	cmd, err := w.q.runDurable(lctx, w.rdb, w.q.replicas(lctx), leaseScript, keys,
		w.id, n, w.leaseFor().Milliseconds(), w.seenFor().Milliseconds())
	var res []any
	if err == nil {
		res, err = cmd.Slice()
	}
	if err != nil {
		w.mu.Lock()
		// The answer is lost: what the call leased, if anything, is an orphan now, handed back once a later
		// call's answer has come back.
		w.inDoubt += n
		w.doubtAfter = 0
		w.mu.Unlock()
		if errors.Is(err, ErrNotReplicated) {
			// The lease, and the epoch it bumped, may vanish in a failover, and another worker would then
			// lease the job under the same epoch: the jobs go back rather than to a handler.
			w.handBackUnreplicated(lctx, cmd)
		}
		return nil, 0, 0, 0, fmt.Errorf("queue: lease: %w", err)
	}
	now, next, call = res[0].(int64), res[1].(int64), res[2].(int64)
	jobs = leasedJobs(res)
	return jobs, now, next, call, nil
}

// leasedJobs reads the jobs of a lease script's answer: {now, next, call, id, epoch, record, payload, ...}.
func leasedJobs(res []any) []leased {
	jobs := make([]leased, 0, (len(res)-3)/4)
	for i := 3; i+3 < len(res); i += 4 {
		id, _ := res[i].(string)
		epoch, _ := res[i+1].(int64)
		record, _ := res[i+2].(string)
		payload, _ := res[i+3].(string)
		jobs = append(jobs, leased{id: id, epoch: epoch, record: record, payload: payload})
	}
	return jobs
}

// handBackUnreplicated hands back the jobs of a lease call whose WAIT came back short. The hand back is a
// write on the same primary and may not be replicated either: then the jobs are still ready on a successor,
// and on this primary the heartbeat or the sweeper hands them back.
func (w *Worker) handBackUnreplicated(ctx context.Context, cmd *redis.Cmd) {
	res, err := cmd.Slice()
	if err != nil || len(res) < 3 {
		return
	}
	var pairs []any
	for _, l := range leasedJobs(res) {
		pairs = append(pairs, l.id, l.epoch)
	}
	if len(pairs) == 0 {
		return
	}
	n, err := w.handBack(ctx, false, pairs)
	w.log.Warn("lease not acknowledged by the replicas: jobs handed back, not run", "jobs", len(pairs)/2,
		"handed_back", n, "err", err)
}

// traceLease records the lease in the job's trace (ctx carries the enqueue's trace context): a short consumer
// span from the lease call to the handler.
func (w *Worker) traceLease(ctx context.Context, job *Job, leasedAt time.Time) {
	_, span := w.q.tracer.Start(ctx, "queue.lease "+w.q.name, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(leasedAt), trace.WithAttributes(attribute.String("messaging.system", "oncegate"),
			attribute.String("messaging.destination.name", w.q.name), attribute.String("messaging.message.id", job.ID),
			attribute.Int64("job.epoch", job.Epoch), attribute.String("worker.id", w.id)))
	span.End()
}

// register records the runs of a lease's jobs, and the lease itself as answered, at one instant under the
// lock that heartbeatState reads under.
func (w *Worker) register(handlerCtx context.Context, jobs []leased, leaseCall int64) []context.Context {
	ctxs := make([]context.Context, len(jobs))
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, l := range jobs {
		ctx, cancel := context.WithCancelCause(handlerCtx)
		w.runs[runKey{id: l.id, epoch: l.epoch}] = &run{cancel: cancel}
		ctxs[i] = ctx
	}
	w.leasedUpTo = leaseCall
	if w.inDoubt > 0 && w.doubtAfter == 0 {
		w.doubtAfter = leaseCall
	}
	return ctxs
}
