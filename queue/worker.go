package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/internal/backoff"
)

// Handler runs a job. Returning nil completes it; an error fails the attempt, which is retried after a backoff
// unless it is Permanent or attempts are used up (see RetryAfter for a delay of the handler's choosing).
//
// ctx is cancelled when the worker loses the job's lease (cause ErrLeaseLost) or when a graceful close runs out
// of drain time: a handler should stop then, since another worker may already run the job.
type Handler interface {
	Handle(ctx context.Context, job *Job) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job *Job) error

func (f HandlerFunc) Handle(ctx context.Context, job *Job) error { return f(ctx, job) }

// Mux routes jobs to handlers by Job.Kind. A job of a kind with no handler fails permanently.
type Mux struct{ byKind map[string]Handler }

func NewMux() *Mux { return &Mux{byKind: map[string]Handler{}} }

// Register sets the handler of a kind. It is not safe to call while a worker uses the Mux.
func (m *Mux) Register(kind string, h Handler) { m.byKind[kind] = h }

// RegisterFunc sets a function as the handler of a kind.
func (m *Mux) RegisterFunc(kind string, f func(context.Context, *Job) error) {
	m.Register(kind, HandlerFunc(f))
}

func (m *Mux) Handle(ctx context.Context, job *Job) error {
	h, ok := m.byKind[job.Kind]
	if !ok {
		return Permanent(fmt.Errorf("no handler for job kind %q", job.Kind))
	}
	return h.Handle(ctx, job)
}

const (
	DefaultConcurrency   = 10
	DefaultLeaseTTL      = 30 * time.Second
	DefaultLivenessTTL   = 3 * time.Second
	DefaultSweepInterval = time.Second
	DefaultDrainTimeout  = 10 * time.Second
	DefaultIdleBlock     = time.Second
)

// WorkerConfig configures a worker process. A nil *WorkerConfig means all defaults.
//
// The worst-case time to notice a killed worker is about LivenessTTL + SweepInterval (4 s by default); the
// lease TTL only matters when a process is alive but a job's lease cannot be extended. A live process extends
// the leases of its running jobs however long they run.
type WorkerConfig struct {
	// Concurrency is how many jobs run at once. Defaults to DefaultConcurrency.
	Concurrency int
	// LeaseTTL is how long a job's lease lasts without a heartbeat. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// LivenessTTL is how long the process counts as alive after its last heartbeat, which it sends every
	// LivenessTTL/3. Defaults to DefaultLivenessTTL.
	LivenessTTL time.Duration
	// SweepInterval is how often a sweep for lost jobs runs across all workers of the queue. Defaults to
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// DrainTimeout is how long a graceful close waits for running handlers before it hands their jobs back.
	// Defaults to DefaultDrainTimeout.
	DrainTimeout time.Duration
	// IdleBlock bounds one blocking wait for new jobs, and so how long Run takes to notice its context ended
	// while idle. It must stay under the Redis client's ReadTimeout. Defaults to DefaultIdleBlock.
	IdleBlock time.Duration
	// RetryBase and RetryMax shape the delay before a failed job's next attempt: a random delay in
	// [0, min(RetryMax, RetryBase*2^(attempt-1))]. Default to 1s and 10m.
	RetryBase, RetryMax time.Duration
	// Logger defaults to the queue's logger.
	Logger *slog.Logger
	// OnJobDone, when set, is called after each handler run with the job, what came of it ("completed",
	// "retry", "dead", "lease_lost", "stopped", "error") and how long the handler took: a hook for metrics.
	OnJobDone func(job *Job, outcome string, took time.Duration)
	// OnSweep, when set, is called with the result of each sweep this worker ran.
	OnSweep func(SweepResult)
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c *WorkerConfig) WithDefaults() WorkerConfig {
	var o WorkerConfig
	if c != nil {
		o = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	def(&o.LeaseTTL, DefaultLeaseTTL)
	def(&o.LivenessTTL, DefaultLivenessTTL)
	def(&o.SweepInterval, DefaultSweepInterval)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	def(&o.IdleBlock, DefaultIdleBlock)
	p := backoff.Policy{Base: o.RetryBase, Max: o.RetryMax}.WithDefaults()
	o.RetryBase, o.RetryMax = p.Base, p.Max
	return o
}

func (c WorkerConfig) validate() error {
	if c.LeaseTTL < 100*time.Millisecond || c.LivenessTTL < 100*time.Millisecond {
		return fmt.Errorf("queue: LeaseTTL and LivenessTTL must be at least 100ms")
	}
	return nil
}

// Worker leases jobs from one queue and runs them. One Worker is one process's worth of workers: it has one
// liveness record, one heartbeat and one fetcher for all its concurrent handlers.
type Worker struct {
	q       *Queue
	h       Handler
	cfg     WorkerConfig
	id      string
	log     *slog.Logger
	retry   backoff.Policy
	started atomic.Bool

	mu    sync.Mutex
	held  map[string]*heldJob
	freed chan struct{} // rung when a slot frees up

	completions chan completion
	handlers    sync.WaitGroup
}

type heldJob struct {
	epoch  int64
	cancel context.CancelCauseFunc
}

// NewWorker returns a worker that runs h for the jobs of q.
func NewWorker(q *Queue, h Handler, cfg *WorkerConfig) (*Worker, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	log := c.Logger
	if log == nil {
		log = q.opts.Logger
	}
	id := randomID()[:16]
	return &Worker{
		q: q, h: h, cfg: c, id: id,
		log:         log.With("queue", q.name, "worker", id),
		retry:       backoff.Policy{Base: c.RetryBase, Max: c.RetryMax},
		held:        map[string]*heldJob{},
		freed:       make(chan struct{}, 1),
		completions: make(chan completion),
	}, nil
}

// ID returns the worker process's ID, as recorded as the owner of the jobs it holds.
func (w *Worker) ID() string { return w.id }

// Run leases and runs jobs until ctx ends, then closes gracefully: it stops leasing, waits up to DrainTimeout
// for running handlers, hands the jobs still running back to ready at once, cancels their handlers and waits
// for them to return. A worker runs once.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("queue: worker already started")
	}
	for _, warning := range CheckRedis(ctx, w.q.rdb) {
		w.log.Warn(warning)
	}

	// Handlers, the heartbeat, the sweeper and completions outlive ctx: they are stopped in order below.
	handlerCtx, cancelHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHandlers(nil)
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Go(func() { w.heartbeatLoop(bgCtx) })
	bg.Go(func() { w.sweepLoop(bgCtx) })
	bg.Go(func() { w.completeLoop(bgCtx) })

	fetched := make(chan struct{})
	go func() {
		defer close(fetched)
		w.fetchLoop(ctx, handlerCtx)
	}()
	<-ctx.Done()
	drainBy := time.Now().Add(w.cfg.DrainTimeout)
	wake := w.q.keys.wake(w.id)
	if err := w.q.rdb.ZAdd(bgCtx, wake, redis.Z{Member: "close"}).Err(); err != nil {
		w.log.Warn("could not wake the fetcher; it stops within IdleBlock", "err", err)
	}
	<-fetched
	_ = w.q.rdb.Del(bgCtx, wake).Err()

	drained := make(chan struct{})
	go func() { w.handlers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(time.Until(drainBy)):
		w.log.Warn("drain timeout: handing unfinished jobs back", "jobs", len(w.heldPairs())/2)
	}
	// Handing back first, then cancelling: a handler that stops early then finds its lease gone and records
	// nothing.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	n, err := w.release(rctx)
	cancel()
	if err != nil {
		w.log.Error("hand back unfinished jobs", "err", err)
	} else if n > 0 {
		w.log.Info("handed unfinished jobs back to ready", "jobs", n)
	}
	cancelHandlers(errors.New("queue: worker closed"))
	<-drained
	stopBackground()
	bg.Wait()
	return nil
}

func (w *Worker) heldPairs() []any {
	w.mu.Lock()
	defer w.mu.Unlock()
	pairs := make([]any, 0, 2*len(w.held))
	for id, h := range w.held {
		pairs = append(pairs, id, h.epoch)
	}
	return pairs
}

func (w *Worker) freeSlots() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cfg.Concurrency - len(w.held)
}

func (w *Worker) fetchLoop(ctx, handlerCtx context.Context) {
	var failures int
	for ctx.Err() == nil {
		free := w.freeSlots()
		if free <= 0 {
			select {
			case <-w.freed:
			case <-ctx.Done():
			}
			continue
		}
		leasedAt := time.Now()
		jobs, now, next, err := w.lease(ctx, free)
		if err != nil {
			failures++
			d := backoff.Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(failures)
			w.log.Warn("lease failed; retrying", "err", err, "in", d)
			sleep(ctx, d)
			continue
		}
		failures = 0
		for _, job := range jobs {
			w.traceLease(job, leasedAt)
			w.start(handlerCtx, job)
		}
		if len(jobs) > 0 {
			continue
		}
		wait := w.cfg.IdleBlock
		if next > 0 {
			wait = min(wait, time.Duration(next-now)*time.Millisecond)
		}
		if wait >= time.Millisecond {
			w.block(ctx, wait)
		}
	}
}

// block waits on the marker until an enqueue (or anything else that makes work) rings it, the worker's own
// wake key is rung by Run at close, or wait runs out.
// BZPOPMIN is sent by hand because go-redis rounds its timeout up to whole seconds.
func (w *Worker) block(ctx context.Context, wait time.Duration) {
	bctx, cancel := context.WithTimeout(ctx, wait+2*time.Second)
	defer cancel()
	secs := strconv.FormatFloat(wait.Seconds(), 'f', 3, 64)
	err := w.q.rdb.Do(bctx, "BZPOPMIN", w.q.keys.marker, w.q.keys.wake(w.id), secs).Err()
	if err != nil && !errors.Is(err, redis.Nil) && ctx.Err() == nil {
		w.log.Warn("waiting for jobs failed", "err", err)
		sleep(ctx, 100*time.Millisecond)
	}
}

// lease runs the lease script. Its context is never cancelled midway: a lease taken in Redis but lost on the
// way back would leave a job held by a live worker that does not know it.
func (w *Worker) lease(ctx context.Context, n int) (jobs []*Job, now, next int64, err error) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	k := w.q.keys
	res, err := leaseScript.Run(lctx, w.q.rdb,
		[]string{k.jobs, k.payloads, k.ready, k.delayed, k.leases, k.owned, k.workers, k.marker},
		w.id, n, w.cfg.LeaseTTL.Milliseconds(), w.cfg.LivenessTTL.Milliseconds()).Slice()
	if err != nil {
		return nil, 0, 0, err
	}
	now, next = res[0].(int64), res[1].(int64)
	for i := 2; i+1 < len(res); i += 2 {
		job, err := decodeJob(res[i].(string), []byte(res[i+1].(string)))
		if err != nil {
			// The lease stands; the sweeper will reclaim it as a stall and, past MaxStalls, bury it with a reason.
			w.log.Error("undecodable job leased", "err", err)
			continue
		}
		jobs = append(jobs, job)
	}
	return jobs, now, next, nil
}

// traceLease records the lease in the job's trace: a short consumer span from the lease call to the handler.
func (w *Worker) traceLease(job *Job, leasedAt time.Time) {
	ctx := w.q.opts.Propagator.Extract(context.Background(), propagation.MapCarrier(job.TraceContext))
	_, span := w.q.tracer.Start(ctx, "queue.lease "+w.q.name, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(leasedAt), trace.WithAttributes(attribute.String("messaging.system", "oncegate"),
			attribute.String("messaging.destination.name", w.q.name), attribute.String("messaging.message.id", job.ID),
			attribute.Int64("job.epoch", job.Epoch), attribute.String("worker.id", w.id)))
	span.End()
}

func (w *Worker) start(handlerCtx context.Context, job *Job) {
	ctx, cancel := context.WithCancelCause(handlerCtx)
	w.mu.Lock()
	w.held[job.ID] = &heldJob{epoch: job.Epoch, cancel: cancel}
	w.mu.Unlock()
	w.handlers.Go(func() {
		defer cancel(nil)
		w.runJob(ctx, job)
		w.mu.Lock()
		if h := w.held[job.ID]; h != nil && h.epoch == job.Epoch {
			delete(w.held, job.ID)
		}
		w.mu.Unlock()
		select {
		case w.freed <- struct{}{}:
		default:
		}
	})
}

func (w *Worker) runJob(ctx context.Context, job *Job) {
	ctx = w.q.opts.Propagator.Extract(ctx, propagation.MapCarrier(job.TraceContext))
	ctx, span := w.q.tracer.Start(ctx, "queue.handle "+job.Kind, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.system", "oncegate"),
			attribute.String("messaging.destination.name", w.q.name),
			attribute.String("messaging.message.id", job.ID), attribute.String("job.kind", job.Kind),
			attribute.Int64("job.epoch", job.Epoch), attribute.Int("job.attempt", job.Attempt),
			attribute.Int("job.stalls", job.Stalls)))
	defer span.End()

	started := time.Now()
	outcome := "error"
	defer func() {
		if w.cfg.OnJobDone != nil {
			w.cfg.OnJobDone(job, outcome, time.Since(started))
		}
	}()
	err := w.call(ctx, job)
	if cause := context.Cause(ctx); cause != nil {
		// The lease was lost or handed back at close: the job is someone else's now, there is nothing to record.
		w.log.InfoContext(ctx, "handler stopped", "job", job.ID, "epoch", job.Epoch, "cause", cause, "err", err)
		outcome = "stopped"
		return
	}
	if err == nil {
		err = w.complete(job)
		switch {
		case errors.Is(err, ErrLeaseLost):
			w.log.WarnContext(ctx, "job finished after its lease was lost; another worker owns it", "job", job.ID,
				"epoch", job.Epoch)
			outcome = "lease_lost"
		case err != nil:
			w.log.ErrorContext(ctx, "complete failed; the job will run again after its lease", "job", job.ID, "err", err)
		default:
			outcome = "completed"
		}
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	result, ferr := w.fail(job, err)
	switch {
	case errors.Is(ferr, ErrLeaseLost):
		w.log.WarnContext(ctx, "job failed after its lease was lost", "job", job.ID, "err", err)
		outcome = "lease_lost"
	case ferr != nil:
		w.log.ErrorContext(ctx, "recording a failure failed; the job will run again after its lease", "job", job.ID,
			"err", err, "record_err", ferr)
	case result == "dead":
		w.log.ErrorContext(ctx, "job is dead", "job", job.ID, "attempt", job.Attempt, "err", err)
		outcome = "dead"
	default:
		w.log.InfoContext(ctx, "job failed; will retry", "job", job.ID, "attempt", job.Attempt, "err", err)
		outcome = "retry"
	}
}

// call runs the handler, turning a panic into an error so that one bad job cannot kill the process and
// strand every other job it holds.
func (w *Worker) call(ctx context.Context, job *Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("handler panicked", "job", job.ID, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return w.h.Handle(ctx, job)
}

type completion struct {
	id    string
	epoch int64
	done  chan error
}

// complete hands the completion to the batcher and retries briefly while Redis is unreachable.
func (w *Worker) complete(job *Job) error {
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		c := completion{id: job.ID, epoch: job.Epoch, done: make(chan error, 1)}
		w.completions <- c
		if err = <-c.done; err == nil || errors.Is(err, ErrLeaseLost) {
			return err
		}
		time.Sleep(backoff.Policy{Base: 100 * time.Millisecond, Max: 2 * time.Second}.Delay(attempt))
	}
	return err
}

// completeLoop is a group commit: completions that arrive while one batch runs go together in the next, so
// under load one script call completes many jobs.
func (w *Worker) completeLoop(ctx context.Context) {
	const maxBatch = 256
	batch := make([]completion, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case c := <-w.completions:
			batch = append(batch, c)
		case <-ctx.Done():
			return
		}
	gather:
		for len(batch) < maxBatch {
			select {
			case c := <-w.completions:
				batch = append(batch, c)
			default:
				break gather
			}
		}
		args := make([]any, 0, 2+2*len(batch))
		args = append(args, w.q.opts.RetainCompleted, w.q.opts.RetainCompletedFor.Milliseconds(), w.q.dedupWindowMs())
		for _, c := range batch {
			args = append(args, c.id, c.epoch)
		}
		k := w.q.keys
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		res, err := completeScript.Run(cctx, w.q.rdb,
			[]string{k.jobs, k.payloads, k.leases, k.owned, k.done, k.seen}, args...).Int64Slice()
		cancel()
		for i, c := range batch {
			switch {
			case err != nil:
				c.done <- fmt.Errorf("queue: complete %q: %w", c.id, err)
			case res[i] == 1:
				c.done <- nil
			default:
				c.done <- ErrLeaseLost
			}
		}
	}
}

func (w *Worker) fail(job *Job, herr error) (string, error) {
	var perm *PermanentError
	var after *RetryAfterError
	permanent := errors.As(herr, &perm)
	delay := w.retry.Delay(job.Attempt)
	if errors.As(herr, &after) {
		delay = max(after.Delay, 0)
	}
	flag := "0"
	if permanent {
		flag = "1"
	}
	k := w.q.keys
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var res []any
		res, err = failScript.Run(ctx, w.q.rdb,
			[]string{k.jobs, k.leases, k.owned, k.ready, k.delayed, k.dead, k.marker},
			job.ID, job.Epoch, truncate(herr.Error(), 2048), flag, delay.Milliseconds()).Slice()
		cancel()
		if err == nil {
			if outcome := res[0].(string); outcome != "lost" {
				return outcome, nil
			}
			return "", ErrLeaseLost
		}
		time.Sleep(backoff.Policy{Base: 100 * time.Millisecond, Max: 2 * time.Second}.Delay(attempt))
	}
	return "", fmt.Errorf("queue: fail %q: %w", job.ID, err)
}

func (w *Worker) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.LivenessTTL / 3)
	defer t.Stop()
	var lastExtend time.Time
	for {
		extend := time.Since(lastExtend) >= w.cfg.LeaseTTL/3
		if err := w.heartbeat(ctx, extend); err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("heartbeat failed", "err", err)
		} else if extend {
			lastExtend = time.Now()
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// heartbeat refreshes the process's liveness and, when extend is set, its leases; it cancels the handlers
// whose lease is gone.
func (w *Worker) heartbeat(ctx context.Context, extend bool) error {
	leaseTTL := int64(0)
	if extend {
		leaseTTL = w.cfg.LeaseTTL.Milliseconds()
	}
	args := append([]any{w.id, w.cfg.LivenessTTL.Milliseconds(), leaseTTL}, w.heldPairs()...)
	hctx, cancel := context.WithTimeout(ctx, w.cfg.LivenessTTL)
	defer cancel()
	k := w.q.keys
	lost, err := heartbeatScript.Run(hctx, w.q.rdb, []string{k.jobs, k.leases, k.workers}, args...).StringSlice()
	if err != nil {
		return err
	}
	for _, id := range lost {
		w.mu.Lock()
		h := w.held[id]
		w.mu.Unlock()
		if h != nil {
			w.log.Warn("lease lost; cancelling the handler", "job", id, "epoch", h.epoch)
			h.cancel(ErrLeaseLost)
		}
	}
	return nil
}

func (w *Worker) sweepLoop(ctx context.Context) {
	// A random first delay keeps many workers started together from reaching for the guard in step.
	sleep(ctx, time.Duration(rand.Int64N(int64(w.cfg.SweepInterval))))
	t := time.NewTicker(w.cfg.SweepInterval)
	defer t.Stop()
	for ctx.Err() == nil {
		res, err := w.q.sweep(ctx, w.cfg.SweepInterval)
		switch {
		case err != nil && ctx.Err() == nil:
			w.log.Warn("sweep failed", "err", err)
		case err == nil && (res.Reclaimed > 0 || res.Dead > 0 || res.WorkersLost > 0):
			w.log.Info("sweep reclaimed stalled jobs", "reclaimed", res.Reclaimed, "dead", res.Dead,
				"workers_lost", res.WorkersLost)
		}
		if err == nil && res.Ran && w.cfg.OnSweep != nil {
			w.cfg.OnSweep(res)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}

// SweepResult says what one sweep did. Ran is false when another sweep ran within the interval.
type SweepResult struct {
	Ran                          bool
	Reclaimed, Dead, WorkersLost int
}

// sweep runs the sweeper once, unless another worker did within the interval. The guard lives a little less
// than the interval so that the worker which took it can take it again on its next tick.
func (q *Queue) sweep(ctx context.Context, interval time.Duration) (SweepResult, error) {
	k := q.keys
	guard := max(interval*9/10, time.Millisecond)
	res, err := sweepScript.Run(ctx, q.rdb,
		[]string{k.sweepGuard, k.jobs, k.workers, k.owned, k.leases, k.ready, k.dead, k.marker},
		guard.Milliseconds(), 1000).Int64Slice()
	if err != nil {
		return SweepResult{}, fmt.Errorf("queue: sweep: %w", err)
	}
	if res[0] < 0 {
		return SweepResult{}, nil
	}
	return SweepResult{Ran: true, Reclaimed: int(res[0]), Dead: int(res[1]), WorkersLost: int(res[2])}, nil
}

// release hands the held jobs back and forgets them, so heartbeats stop asking about jobs that are no longer
// this worker's while their handlers wind down.
func (w *Worker) release(ctx context.Context) (int, error) {
	k := w.q.keys
	pairs := w.heldPairs()
	n, err := releaseScript.Run(ctx, w.q.rdb,
		[]string{k.jobs, k.leases, k.owned, k.ready, k.marker, k.workers}, append([]any{w.id}, pairs...)...).Int()
	if err != nil {
		return 0, fmt.Errorf("queue: release: %w", err)
	}
	w.mu.Lock()
	for i := 0; i < len(pairs); i += 2 {
		delete(w.held, pairs[i].(string))
	}
	w.mu.Unlock()
	return n, nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
