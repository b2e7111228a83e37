package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/backoff"
)

const (
	DefaultConcurrency       = 10
	DefaultLeaseTTL          = 30 * time.Second
	DefaultHeartbeatInterval = time.Second
	DefaultSweepInterval     = 100 * time.Millisecond
	DefaultReconnectGrace    = 500 * time.Millisecond
	DefaultDrainTimeout      = 10 * time.Second
	DefaultStopGrace         = 5 * time.Second
	DefaultIdleBlock         = time.Second
)

// handBackTimeout bounds the one call with which a closing worker hands its unfinished jobs back. A hand back
// that fails costs nothing but time: the jobs come back by the sweeper, as a stall, once the closed worker's
// liveness connection is seen gone.
const handBackTimeout = 5 * time.Second

// WorkerConfig configures a worker process. A nil *WorkerConfig means all defaults.
//
// A worker process that dies has its jobs back in ready within about SweepInterval + ReconnectGrace + a
// sweep (well under a second by default): its liveness connection closes with it. A process that is alive but
// frozen or cut off from Redis keeps its jobs until their LeaseTTL runs out; a live process extends the leases
// of its running jobs however long they run. Workers of one queue should share their liveness settings, since
// whichever of them sweeps applies its own.
type WorkerConfig struct {
	// Concurrency is how many handlers run at once. A slot frees when its handler returns, while its outcome is
	// still being recorded, so a worker holds up to twice as many leases. Defaults to DefaultConcurrency.
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
	// DrainTimeout is how long a graceful close waits for running handlers, the recording of their outcomes
	// included, before it hands their jobs back. It bounds the close whether or not Redis answers: see Run.
	// Defaults to DefaultDrainTimeout.
	DrainTimeout time.Duration
	// StopGrace is how long a graceful close, once DrainTimeout is up, waits for the handlers it then cancels
	// to return before it hands their jobs back: a job is handed back only once its handler has returned, so
	// that it never starts on another worker beside it, unless the handler ignores its context past StopGrace.
	// Defaults to DefaultStopGrace.
	StopGrace time.Duration
	// IdleBlock bounds one blocking wait for new jobs, and so how long Run takes to notice its context ended
	// while idle. Defaults to DefaultIdleBlock.
	IdleBlock time.Duration
	// RetryBase and RetryMax shape the delay before a failed job's next attempt: a random delay in
	// [0, min(RetryMax, RetryBase*2^(attempt-1))]. Default to 1s and 10m.
	RetryBase, RetryMax time.Duration
	// Logger defaults to the queue's logger.
	Logger *slog.Logger
	// OnJobDone, when set, is called after each handler run with the job, what came of it ("completed",
	// "retry", "dead", "lease_lost": the lease was lost before its outcome was recorded, "stopped": a graceful
	// close cancelled it and handed it back, "error": its outcome could not be recorded before the close) and
	// how long the handler took: a hook for metrics.
	// A leased job whose record cannot be decoded is sent to dead without a run: it is called for it too,
	// with "dead", what could be read of the job, and 0.
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
	// Zero is unset; a negative value is kept for validate to refuse, rather than read as "the default".
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	def(&o.LeaseTTL, DefaultLeaseTTL)
	def(&o.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&o.SweepInterval, DefaultSweepInterval)
	def(&o.ReconnectGrace, DefaultReconnectGrace)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	def(&o.StopGrace, DefaultStopGrace)
	def(&o.IdleBlock, DefaultIdleBlock)
	if (o.RetryBase == 0 || o.RetryMax == 0) && o.RetryBase >= 0 && o.RetryMax >= 0 {
		p := backoff.Policy{Base: o.RetryBase, Max: o.RetryMax}.WithDefaults()
		o.RetryBase, o.RetryMax = p.Base, p.Max
	}
	return o
}

// validate refuses settings under which the worker cannot keep its promises.
func (c WorkerConfig) validate() error {
	if c.Concurrency < 0 {
		return fmt.Errorf("queue: Concurrency %d is negative (0 is the default, %d)", c.Concurrency, DefaultConcurrency)
	}
	if c.DrainTimeout < 0 {
		return fmt.Errorf("queue: DrainTimeout %v is negative (0 is the default, %v)", c.DrainTimeout, DefaultDrainTimeout)
	}
	if c.StopGrace < 0 {
		return fmt.Errorf("queue: StopGrace %v is negative (0 is the default, %v)", c.StopGrace, DefaultStopGrace)
	}
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
	if c.RetryBase < 0 || c.RetryMax < 0 {
		return fmt.Errorf("queue: RetryBase %v and RetryMax %v: neither may be negative (0 is the default)",
			c.RetryBase, c.RetryMax)
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
	// leasedUpTo is the number of the last lease call whose answer came back, its jobs registered as runs: it
	// tells the heartbeat which leases of this worker's it can never have heard of (see heartbeat.lua).
	leasedUpTo int64
	// inDoubt counts the jobs that lease calls whose answer was lost may have leased: Redis may hold them for
	// this worker, which does not know them, until a heartbeat hands them back, which it does once a later
	// lease call's answer has come back (doubtAfter: that call's number; heartbeat.lua). freeSlots counts them
	// as held, so that lost answers cannot take a worker past twice Concurrency leases.
	inDoubt    int
	doubtAfter int64

	completions chan completion
	handlers    sync.WaitGroup
	// calls counts the handlers running (from the lease to the handler's return, its outcome's recording
	// left out): a close hands a job back only once its handler is out. closing is set as the close begins.
	calls   sync.WaitGroup
	closing atomic.Bool
	// records carries the calls that record runs' outcomes (complete, fail). It ends when a graceful close's
	// drain time is up, so that a close never waits on a Redis that does not answer: the outcomes not
	// recorded by then are the jobs handed back, or found again by the sweeper. Set by Run.
	records context.Context
}

// NewWorker returns a worker that runs h for the jobs of q. It refuses settings that cannot work.
func NewWorker(q *Queue, h Handler, cfg *WorkerConfig) (*Worker, error) {
	if q == nil {
		return nil, errors.New("queue: NewWorker needs a queue (queue.New)")
	}
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
// for running handlers and the recording of their outcomes, then cancels the handlers still running, waits up
// to StopGrace for them to return, and hands their jobs back to ready. A job is handed back only once its
// handler has returned, so that it does not start on another worker beside it; a handler that ignores its
// context past StopGrace has its job handed back while it runs (the epoch then tells the two runs apart). A
// worker runs once.
//
// Run returns at most DrainTimeout plus StopGrace plus 5 s (the hand back) after ctx ends, whether Redis answers
// or not, provided handlers return once their context is cancelled. One exception: a lease call or a wait for
// jobs that was out when ctx ended is waited for, which takes up to 10 s, or IdleBlock + 2 s, when Redis does
// not answer; a DrainTimeout at least that long hides it.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("queue: this worker ran already: a Worker runs once; make another with NewWorker")
	}
	top, warnings := w.q.CheckRedis(ctx)
	w.log.Info("redis topology", "role", top.Role, "replicas", top.Replicas, "min_replicas_to_write",
		top.MinReplicasToWrite, "min_replicas_max_lag", top.MinReplicasMaxLag, "aof", top.AOF, "version", top.Version,
		"writes_wait_for_replicas", top.WaitForReplicas)
	for _, warning := range warnings {
		w.log.Warn(warning)
	}
	w.q.register(ctx)
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
	records, stopRecords := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopRecords(nil)
	w.records = records
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
	w.closing.Store(true)
	drainBy := time.Now().Add(w.cfg.DrainTimeout)
	drainOver := time.AfterFunc(w.cfg.DrainTimeout, func() { stopRecords(errDrainTimeout) })
	defer drainOver.Stop()
	wake := w.q.keys.wake(w.id)
	wctx, cancelWake := context.WithDeadline(bgCtx, drainBy)
	if err := w.rdb.ZAdd(wctx, wake, redis.Z{Member: "close"}).Err(); err != nil {
		w.log.Warn("could not wake the fetcher; it stops within IdleBlock", "err", err)
	}
	<-fetched
	_ = w.rdb.Del(wctx, wake).Err()
	cancelWake()

	drained := make(chan struct{})
	go func() { w.handlers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(time.Until(drainBy)):
		// Cancelled first and handed back once out: handed back first, a job started on another worker while
		// its handler here still wound down. A handler stopped by the close records nothing (runJob), and its
		// job stays among the runs to hand back. Heartbeats go on meanwhile, so the leases hold.
		w.log.Warn("drain timeout: cancelling the handlers still running, then handing their jobs back",
			"jobs", len(w.livePairs())/2, "stop_grace", w.cfg.StopGrace)
		cancelHandlers(errWorkerClosed)
		called := make(chan struct{})
		go func() { w.calls.Wait(); close(called) }()
		select {
		case <-called:
		case <-time.After(w.cfg.StopGrace):
			w.log.Error("handlers still running StopGrace after they were cancelled: their jobs are handed back "+
				"while they run, and may start elsewhere beside them", "stop_grace", w.cfg.StopGrace)
		}
	}
	// No more heartbeats, then hand back and leave the registry: the liveness connection that closes next is
	// then not taken for a crash.
	// Closing the connection ends a heartbeat stuck on an unreachable Redis; the registration it leaves is
	// removed by the release below, long before the reconnect grace could make a sweeper act on it.
	stopLiveness()
	live.close()
	liveLoop.Wait()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
	n, err := w.release(rctx)
	cancel()
	if err != nil {
		w.log.Error("hand back unfinished jobs", "err", err)
	} else if n > 0 {
		w.log.Info("handed unfinished jobs back to ready", "jobs", n)
	}
	cancelHandlers(errWorkerClosed)
	stopRecords(errWorkerClosed)
	// A record still waiting on a Redis that does not answer ends here: closing the client breaks the calls
	// out on its connections, which a cancelled context does not.
	_ = w.rdb.Close()
	<-drained
	stopBackground()
	bg.Wait()
	return nil
}

// ownJobClient returns a client of the worker's own for job traffic, shaped like the caller's.
func ownJobClient(rdb redis.UniversalClient, poolSize int, readTimeout time.Duration) (redis.UniversalClient, error) {
	switch c := rdb.(type) {
	case *redis.Client:
		o := copyOptions(c)
		o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = poolSize, 0, poolSize, 0
		o.ReadTimeout = atLeast(o.ReadTimeout, readTimeout)
		o.PoolTimeout = 0
		o.MaxRetries = -1 // a lease or completion repeated after a lost answer would run twice: the loops retry
		// Deadlines of contexts hold on the wire, not only the read timeout, so that a closing worker's
		// deadlines hold against a Redis that does not answer.
		o.ContextTimeoutEnabled = true
		return redis.NewClient(o), nil
	case *redis.ClusterClient:
		o := *c.Options()
		o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = poolSize, 0, poolSize, 0
		o.ReadTimeout = atLeast(o.ReadTimeout, readTimeout)
		o.PoolTimeout = 0
		o.MaxRetries = -1
		o.ContextTimeoutEnabled = true
		return redis.NewClusterClient(&o), nil
	default:
		return nil, fmt.Errorf("queue: a worker needs a *redis.Client or *redis.ClusterClient, not %T", rdb)
	}
}

// atLeast raises a timeout to min, leaving go-redis's special negative values (no deadline) alone.
func atLeast(d, min time.Duration) time.Duration {
	if d < 0 {
		return d
	}
	return max(d, min)
}

// jobReadTimeout bounds a command of the worker's job traffic, the blocking wait for jobs included.
func (w *Worker) jobReadTimeout() time.Duration { return w.cfg.IdleBlock + 5*time.Second }

// errDrainTimeout ends the recording of outcomes when a graceful close's drain time is up.
var errDrainTimeout = errors.New("queue: drain timeout")

// errWorkerClosed cancels the handlers still running when a graceful close's drain time is up.
var errWorkerClosed = errors.New("queue: worker closed")

// jitter returns a random duration in [0, d).
func jitter(d time.Duration) time.Duration { return time.Duration(rand.Int64N(int64(max(d, 1)))) }

// sleep waits for d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
