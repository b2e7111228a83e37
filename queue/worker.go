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
	DefaultConcurrency       = 10
	DefaultLeaseTTL          = 30 * time.Second
	DefaultHeartbeatInterval = time.Second
	DefaultSweepInterval     = 100 * time.Millisecond
	DefaultReconnectGrace    = 500 * time.Millisecond
	DefaultDrainTimeout      = 10 * time.Second
	DefaultIdleBlock         = time.Second
)

// WorkerConfig configures a worker process. A nil *WorkerConfig means all defaults.
//
// A worker process that dies has its jobs back in ready within about SweepInterval + ReconnectGrace + a
// sweep (well under a second by default): its liveness connection closes with it. A process that is alive but
// frozen or cut off from Redis keeps its jobs until their LeaseTTL runs out; a live process extends the leases
// of its running jobs however long they run. Workers of one queue should share their liveness settings, since
// whichever of them sweeps applies its own.
type WorkerConfig struct {
	// Concurrency is how many jobs run at once. Defaults to DefaultConcurrency.
	Concurrency int
	// LeaseTTL is how long a job's lease lasts without a heartbeat: how long a frozen or partitioned worker
	// keeps its jobs. At least 3 heartbeat intervals. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// HeartbeatInterval is how often the worker extends its leases and learns which it lost. Defaults to
	// DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// SweepInterval is how often a sweep for lost jobs runs across all workers of the queue. Defaults to
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// ReconnectGrace is how long a worker whose liveness connection closed has to connect again before it
	// counts as dead (a network blip is not a death). After a Redis restart or failover, workers get four
	// times as long, at least two heartbeat intervals. Defaults to DefaultReconnectGrace.
	ReconnectGrace time.Duration
	// DrainTimeout is how long a graceful close waits for running handlers before it hands their jobs back.
	// Defaults to DefaultDrainTimeout.
	DrainTimeout time.Duration
	// IdleBlock bounds one blocking wait for new jobs, and so how long Run takes to notice its context ended
	// while idle. Defaults to DefaultIdleBlock.
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
	def(&o.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&o.SweepInterval, DefaultSweepInterval)
	def(&o.ReconnectGrace, DefaultReconnectGrace)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	def(&o.IdleBlock, DefaultIdleBlock)
	if o.RetryBase <= 0 || o.RetryMax <= 0 {
		p := backoff.Policy{Base: o.RetryBase, Max: o.RetryMax}.WithDefaults()
		o.RetryBase, o.RetryMax = p.Base, p.Max
	}
	return o
}

// validate refuses settings under which the worker cannot keep its promises.
func (c WorkerConfig) validate() error {
	const floor = 10 * time.Millisecond
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"HeartbeatInterval", c.HeartbeatInterval}, {"SweepInterval", c.SweepInterval},
		{"ReconnectGrace", c.ReconnectGrace}, {"IdleBlock", c.IdleBlock}} {
		if d.v < floor {
			return fmt.Errorf("queue: %s %v is under %v", d.name, d.v, floor)
		}
	}
	if c.LeaseTTL < 3*c.HeartbeatInterval {
		return fmt.Errorf("queue: LeaseTTL %v is under 3 heartbeat intervals (3 × %v): a live worker's leases "+
			"would run out between its heartbeats and its jobs would run twice; raise LeaseTTL or lower "+
			"HeartbeatInterval", c.LeaseTTL, c.HeartbeatInterval)
	}
	if c.SweepInterval > c.ReconnectGrace/3 {
		return fmt.Errorf("queue: SweepInterval %v is over a third of ReconnectGrace %v: the worker would notice "+
			"its own closed connection too late to reconnect, or to give its jobs up, within the grace",
			c.SweepInterval, c.ReconnectGrace)
	}
	if c.SweepInterval > c.LeaseTTL {
		return fmt.Errorf("queue: SweepInterval %v is over LeaseTTL %v: expired leases would wait for the sweep "+
			"longer than they lasted", c.SweepInterval, c.LeaseTTL)
	}
	if c.RetryBase > c.RetryMax {
		return fmt.Errorf("queue: RetryBase %v is over RetryMax %v", c.RetryBase, c.RetryMax)
	}
	return nil
}

// Worker leases jobs from one queue and runs them. One Worker is one process's worth of workers: it has one
// liveness connection, one heartbeat and one fetcher for all its concurrent handlers.
type Worker struct {
	q       *Queue
	h       Handler
	cfg     WorkerConfig
	id      string
	log     *slog.Logger
	retry   backoff.Policy
	started atomic.Bool

	// rdb carries the worker's job traffic over connections of its own, set by Run.
	rdb redis.UniversalClient

	mu    sync.Mutex
	runs  map[runKey]*run
	freed chan struct{} // rung when a slot frees up
	// leasing is true while a lease call is out; leasedUpTo is the number of the last lease call whose answer
	// came back, its jobs registered as runs. Together they tell the heartbeat which leases of this worker's
	// it can never have heard of (see heartbeat.lua).
	leasing    bool
	leasedUpTo int64

	completions chan completion
	handlers    sync.WaitGroup
}

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
	// finishing is set when the handler has returned and its outcome is being recorded.
	finishing bool
}

// NewWorker returns a worker that runs h for the jobs of q. It refuses settings that cannot work.
func NewWorker(q *Queue, h Handler, cfg *WorkerConfig) (*Worker, error) {
	if h == nil {
		return nil, errors.New("queue: NewWorker needs a handler")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	switch q.rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
	default:
		return nil, fmt.Errorf("queue: a worker needs a *redis.Client or *redis.ClusterClient, not %T", q.rdb)
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
		runs:        map[runKey]*run{},
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
	rdb, err := ownJobClient(w.q.rdb, 2+min(w.cfg.Concurrency, 16), w.jobReadTimeout())
	if err != nil {
		return err
	}
	defer rdb.Close()
	w.rdb = rdb
	live := &liveness{log: w.log}
	live.connCheck.Store(true)
	if live.rdb, err = w.dialLiveness(ctx, live); err != nil {
		return err
	}

	// Handlers, the heartbeat, the sweeper and completions outlive ctx: they are stopped in order below.
	handlerCtx, cancelHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHandlers(nil)
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	// The first heartbeat connects and registers the liveness connection before any job is leased, so that a
	// crash is detectable from the first job on.
	if err := w.heartbeat(bgCtx, live); err != nil {
		w.log.Warn("first heartbeat failed; retrying in the background", "err", err)
	}
	if live.connCheck.Load() {
		w.checkClientList(bgCtx, live)
	}
	liveCtx, stopLiveness := context.WithCancel(bgCtx)
	var bg, liveLoop sync.WaitGroup
	liveLoop.Go(func() { w.livenessLoop(liveCtx, live) })
	bg.Go(func() { w.completeLoop(bgCtx) })

	fetched := make(chan struct{})
	go func() {
		defer close(fetched)
		w.fetchLoop(ctx, handlerCtx)
	}()
	<-ctx.Done()
	drainBy := time.Now().Add(w.cfg.DrainTimeout)
	wake := w.q.keys.wake(w.id)
	if err := w.rdb.ZAdd(bgCtx, wake, redis.Z{Member: "close"}).Err(); err != nil {
		w.log.Warn("could not wake the fetcher; it stops within IdleBlock", "err", err)
	}
	<-fetched
	_ = w.rdb.Del(bgCtx, wake).Err()

	drained := make(chan struct{})
	go func() { w.handlers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(time.Until(drainBy)):
		w.log.Warn("drain timeout: handing unfinished jobs back", "jobs", len(w.livePairs())/2)
	}
	// No more heartbeats, then hand back and leave the registry: the liveness connection that closes next is
	// then not taken for a crash. Handing back before cancelling means a handler that stops early finds its
	// lease gone and records nothing.
	// Closing the connection ends a heartbeat stuck on an unreachable Redis; the registration it leaves is
	// removed by the release below, long before the reconnect grace could make a sweeper act on it.
	stopLiveness()
	_ = live.rdb.Close()
	liveLoop.Wait()
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

// checkClientList makes sure at start that Redis answers CLIENT LIST ID, on which crash detection rests, so
// that a worker whose Redis forbids it says so at once rather than at its first sweep.
func (w *Worker) checkClientList(ctx context.Context, l *liveness) {
	err := l.rdb.Do(ctx, "CLIENT", "LIST", "ID", "0").Err()
	if err != nil && refused(err) {
		l.disable(fmt.Errorf("CLIENT LIST ID: %w", err))
	}
}

// heartbeatState returns what a heartbeat asks about, read at one instant: the (id, epoch) pairs of the runs
// that hold a lease, and the lease call number below which a lease of this worker's that is not among them can
// only be one whose answer was lost (0 while a lease call is out).
func (w *Worker) heartbeatState() (pairs []any, orphansBefore int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.leasing {
		orphansBefore = w.leasedUpTo
	}
	return w.livePairsLocked(), orphansBefore
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

func (w *Worker) freeSlots() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cfg.Concurrency - len(w.runs)
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
		jobs, now, next, call, err := w.lease(ctx, free)
		if err != nil {
			failures++
			d := backoff.Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(failures)
			w.log.Warn("lease failed; retrying", "err", err, "in", d)
			sleep(ctx, d)
			continue
		}
		failures = 0
		ctxs := w.register(handlerCtx, jobs, call)
		for i, job := range jobs {
			w.traceLease(job, leasedAt)
			w.launch(ctxs[i], job)
		}
		if len(jobs) > 0 {
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

// lease runs the lease script. Its context is never cancelled midway: a lease taken in Redis but lost on the
// way back would leave a job held by a live worker that does not know it.
func (w *Worker) lease(ctx context.Context, n int) (jobs []*Job, now, next, call int64, err error) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	k := w.q.keys
	w.mu.Lock()
	w.leasing = true // until register records the answer
	w.mu.Unlock()
	res, err := leaseScript.Run(lctx, w.rdb,
		[]string{k.jobs, k.payloads, k.ready, k.delayed, k.leases, k.owned, k.workers, k.marker, k.leaseSeq},
		w.id, n, w.leaseFor().Milliseconds(), w.seenFor().Milliseconds()).Slice()
	if err != nil {
		w.mu.Lock()
		w.leasing = false // the answer is lost: what the call leased, if anything, is an orphan now
		w.mu.Unlock()
		return nil, 0, 0, 0, err
	}
	now, next, call = res[0].(int64), res[1].(int64), res[2].(int64)
	for i := 3; i+1 < len(res); i += 2 {
		job, err := decodeJob(res[i].(string), []byte(res[i+1].(string)))
		if err != nil {
			// The lease stands; the sweeper will reclaim it as a stall and, past MaxStalls, bury it with a reason.
			w.log.Error("undecodable job leased", "err", err)
			continue
		}
		jobs = append(jobs, job)
	}
	return jobs, now, next, call, nil
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

// register records the runs of a lease's jobs, and the lease itself as answered, at one instant under the
// lock that heartbeatState reads under.
func (w *Worker) register(handlerCtx context.Context, jobs []*Job, leaseCall int64) []context.Context {
	ctxs := make([]context.Context, len(jobs))
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, job := range jobs {
		ctx, cancel := context.WithCancelCause(handlerCtx)
		w.runs[runKey{id: job.ID, epoch: job.Epoch}] = &run{cancel: cancel}
		ctxs[i] = ctx
	}
	w.leasing = false
	w.leasedUpTo = leaseCall
	return ctxs
}

func (w *Worker) launch(ctx context.Context, job *Job) {
	k := runKey{id: job.ID, epoch: job.Epoch}
	w.handlers.Go(func() {
		w.runJob(ctx, job)
		w.mu.Lock()
		r := w.runs[k]
		delete(w.runs, k)
		w.mu.Unlock()
		if r != nil {
			r.cancel(nil)
		}
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
	w.mu.Lock()
	if r := w.runs[runKey{id: job.ID, epoch: job.Epoch}]; r != nil {
		r.finishing = true
	}
	w.mu.Unlock()
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
		res, err := completeScript.Run(cctx, w.rdb,
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
		res, err = failScript.Run(ctx, w.rdb,
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

// release hands the jobs of the runs still holding a lease back and leaves the liveness registry. The runs
// are marked lost, so nothing asks about them again while their handlers wind down.
func (w *Worker) release(ctx context.Context) (int, error) {
	n, err := w.handBack(ctx, true, w.livePairs())
	if err != nil {
		return 0, err
	}
	w.mu.Lock()
	for _, r := range w.runs {
		r.lost = true
	}
	w.mu.Unlock()
	return n, nil
}

// handBack returns the jobs of the given (id, epoch) pairs to the head of the ready list, where this worker
// still holds them; leave also takes the worker out of the liveness registry.
func (w *Worker) handBack(ctx context.Context, leave bool, pairs []any) (int, error) {
	k := w.q.keys
	flag := "0"
	if leave {
		flag = "1"
	}
	n, err := releaseScript.Run(ctx, w.rdb,
		[]string{k.jobs, k.leases, k.owned, k.ready, k.marker, k.workers, k.conns, k.missing},
		append([]any{w.id, flag}, pairs...)...).Int()
	if err != nil {
		return 0, fmt.Errorf("queue: hand back jobs: %w", err)
	}
	return n, nil
}

// jitter returns a random duration in [0, d).
func jitter(d time.Duration) time.Duration { return time.Duration(rand.Int64N(int64(max(d, 1)))) }

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
