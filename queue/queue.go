package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

const (
	// DefaultMaxAttempts is how many attempts may end in an error before a job is dead.
	DefaultMaxAttempts = 10
	// DefaultMaxStalls is how many times a job may lose its worker (crash, expired lease) and be run again; one
	// more makes it dead, as a job that kills every worker it touches would otherwise walk around the fleet.
	DefaultMaxStalls = 1
	// DefaultRetainCompleted and DefaultRetainCompletedFor bound the completed jobs kept, with their records
	// and payloads.
	DefaultRetainCompleted    = 10_000
	DefaultRetainCompletedFor = 24 * time.Hour
	// DefaultDedupWindow is how long a completed job's ID makes a new enqueue with that ID a no-op, however
	// many newer jobs completed since.
	DefaultDedupWindow = 24 * time.Hour
)

// Options configures a queue. A nil *Options means all defaults.
type Options struct {
	// MaxAttempts is the default for jobs that do not set their own. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// MaxStalls is the default for jobs that do not set their own. Defaults to DefaultMaxStalls; a negative
	// value means zero (the first stall makes the job dead).
	MaxStalls int
	// RetainCompleted is how many completed jobs are kept at most. Defaults to DefaultRetainCompleted; a
	// negative value keeps none.
	RetainCompleted int
	// RetainCompletedFor is how long a completed job is kept at most. Defaults to DefaultRetainCompletedFor.
	RetainCompletedFor time.Duration
	// DedupWindow is how long after a job completed an enqueue with its ID is still a duplicate, whether or not
	// the job's record is still retained. Defaults to DefaultDedupWindow (24h); a negative value turns the
	// window off, leaving deduplication of completed jobs to the records retained. Each ID completed within
	// the window costs Redis about 120 bytes (20-byte IDs) to 136 bytes (36-byte UUIDs): 24 h at 10 jobs/s
	// is about 120 MB, at 100 jobs/s about 1.2 GB, so a busy queue may want a shorter window.
	//
	// Producers and workers should agree on it: a worker remembers the IDs it completes and forgets those
	// older than its window, an enqueue ignores those older than its own, so the shorter of the two holds.
	DedupWindow time.Duration
	// Propagator stores the enqueuer's trace context in the job. Defaults to W3C trace context and baggage.
	Propagator propagation.TextMapPropagator
	// TracerProvider makes the queue's spans. Defaults to otel's global provider.
	TracerProvider trace.TracerProvider
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of o with every unset field at its default.
func (o *Options) WithDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	switch {
	case c.MaxStalls == 0:
		c.MaxStalls = DefaultMaxStalls
	case c.MaxStalls < 0:
		c.MaxStalls = 0
	}
	switch {
	case c.RetainCompleted == 0:
		c.RetainCompleted = DefaultRetainCompleted
	case c.RetainCompleted < 0:
		c.RetainCompleted = 0
	}
	if c.RetainCompletedFor <= 0 {
		c.RetainCompletedFor = DefaultRetainCompletedFor
	}
	// A negative window stays negative rather than becoming zero, so that WithDefaults can run twice.
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	if c.Propagator == nil {
		c.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Queue is a handle on one named queue in Redis. It is safe for concurrent use: concurrent enqueues through
// one Queue are group-committed (see Enqueue), so producers should share one.
type Queue struct {
	rdb    redis.UniversalClient
	name   string
	keys   keys
	opts   Options
	tracer trace.Tracer

	// The group commit of Enqueue: the callers waiting for a batch, and how many senders there are (each
	// sending a batch, or told to send the next). While sending < enqueueInFlight, pending is empty.
	mu      sync.Mutex
	pending []*enqueueCall
	sending int
}

// New returns a handle on the queue called name. Names are 1 to 200 characters without braces, which
// would break the hash tag.
func New(rdb redis.UniversalClient, name string, opts *Options) (*Queue, error) {
	if name == "" || len(name) > 200 || strings.ContainsAny(name, "{}") {
		return nil, fmt.Errorf("queue: invalid queue name %q: want 1-200 characters without braces", name)
	}
	o := opts.WithDefaults()
	return &Queue{
		rdb: rdb, name: name, keys: newKeys(name), opts: o,
		tracer: o.TracerProvider.Tracer("github.com/oncegate/oncegate/queue"),
	}, nil
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.name }

// dedupWindowMs is the window as the scripts take it: 0 is off.
func (q *Queue) dedupWindowMs() int64 { return max(q.opts.DedupWindow.Milliseconds(), 0) }

// NewJob describes a job to enqueue.
type NewJob struct {
	// ID names the job, ideally after the business action it performs ("welcome-email:user_6"). While a job
	// with this ID exists (ready, delayed, active, retained completed or dead), and for Options.DedupWindow
	// after it completed, enqueueing it again is a no-op. Empty means a random ID. At most 512 bytes.
	ID string
	// Kind tells handlers what the job is ("signup"); see Mux.
	Kind string
	// Payload is handed to the handler as is.
	Payload []byte
	// Delay makes the job ready only after this long.
	Delay time.Duration
	// MaxAttempts and MaxStalls override the queue's defaults when positive (MaxStalls: when not zero; a
	// negative value means zero).
	MaxAttempts int
	MaxStalls   int
}

// EnqueueResult is the job as stored. Duplicate is true when a job with the ID existed already and nothing
// was added; Job is then the existing job, with the payload of the first enqueue. When that job completed
// and its record is no longer retained (it is still inside Options.DedupWindow), Job holds only its ID,
// State (StateCompleted) and FinishedAt.
type EnqueueResult struct {
	Job       *Job
	Duplicate bool
}

const (
	// enqueueBatchMax bounds the jobs of one enqueue script call, so that a burst of producers holds Redis
	// for a millisecond or two at a time rather than for the whole burst.
	enqueueBatchMax = 512
	// enqueueInFlight is how many group-committed batches may be in flight at once.
	enqueueInFlight = 1
	// enqueueTimeout bounds a group-committed batch's call, which runs apart from its callers' contexts.
	enqueueTimeout = 10 * time.Second
)

// Enqueue adds a job. The trace context of ctx is stored with the job, so its handler continues the trace.
//
// Concurrent calls on one Queue are group-committed: the call that finds no batch in flight sends its job at
// once, alone; calls arriving meanwhile wait, and when the batch in flight returns the first of them sends
// all of theirs (up to 512) in one script call. Nothing waits on purpose, so a lone producer's latency is one
// round trip, and under load one round trip carries many jobs. A Redis error fails every call of its batch.
//
// When ctx ends while the job waits to be sent, Enqueue returns at once with an error that wraps ctx's, and
// the job is not sent. When ctx ends while the job's batch is in flight, a caller that is waiting returns the
// same way, but the job may have been enqueued, as after any timeout; enqueueing it again with the same ID
// is safe. The caller that sends a batch waits for that call (at most 10 s) even if its own ctx ends, since
// other callers' jobs ride on it.
func (q *Queue) Enqueue(ctx context.Context, nj NewJob) (*EnqueueResult, error) {
	if err := checkNewJob(&nj); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("queue: enqueue %q: %w", nj.ID, err)
	}
	ctx, span := q.tracer.Start(ctx, "queue.enqueue "+q.name, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "oncegate"),
			attribute.String("messaging.destination.name", q.name),
			attribute.String("messaging.message.id", nj.ID), attribute.String("job.kind", nj.Kind)))
	defer span.End()

	c, err := q.newCall(nj, q.traceContext(ctx))
	if err != nil {
		return nil, err
	}
	res, err := q.commit(ctx, c)
	if err != nil {
		span.RecordError(err)
		return nil, err
	}
	span.SetAttributes(attribute.Bool("job.duplicate", res.Duplicate))
	return res, nil
}

// checkNewJob refuses what the script cannot store and gives an unnamed job a random ID.
func checkNewJob(nj *NewJob) error {
	if nj.ID == "" {
		nj.ID = randomID()
	}
	if len(nj.ID) > 512 {
		return fmt.Errorf("queue: job ID is %d bytes, at most 512", len(nj.ID))
	}
	if nj.Delay < 0 {
		return fmt.Errorf("queue: negative delay %v", nj.Delay)
	}
	return nil
}

// traceContext is the enqueuer's trace context as stored in a job, or nil when there is none.
func (q *Queue) traceContext(ctx context.Context) map[string]string {
	carrier := propagation.MapCarrier{}
	q.opts.Propagator.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	return carrier
}

// enqueueCall is one job on its way into Redis, and then its result.
type enqueueCall struct {
	id      string
	record  []byte
	payload []byte
	delayMs int64

	// signal tells a waiting caller that another caller's batch carried its job (callDone) or that it is to
	// send the next batch (callLead). Each call gets at most one signal from another goroutine, so a buffer
	// of one never blocks the sender.
	signal chan callSignal

	// Set by send before the signal.
	added  bool
	raw    string
	stored []byte // the payload stored, for a duplicate
	err    error
}

type callSignal uint8

const (
	callDone callSignal = iota + 1
	callLead
)

func (q *Queue) newCall(nj NewJob, tc map[string]string) (*enqueueCall, error) {
	r := record{ID: nj.ID, Kind: nj.Kind, MaxAttempts: q.opts.MaxAttempts, MaxStalls: q.opts.MaxStalls, Trace: tc}
	if nj.MaxAttempts > 0 {
		r.MaxAttempts = nj.MaxAttempts
	}
	if nj.MaxStalls > 0 {
		r.MaxStalls = nj.MaxStalls
	} else if nj.MaxStalls < 0 {
		r.MaxStalls = 0
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("queue: encode job: %w", err)
	}
	return &enqueueCall{id: nj.ID, record: raw, payload: nj.Payload, delayMs: nj.Delay.Milliseconds(),
		signal: make(chan callSignal, 1)}, nil
}

func (c *enqueueCall) result() (*EnqueueResult, error) {
	if c.err != nil {
		return nil, c.err
	}
	payload := c.payload
	if !c.added {
		// The payload stored is the first enqueue's; hand that back rather than the caller's.
		payload = c.stored
	}
	job, err := decodeJob(c.raw, payload)
	if err != nil {
		return nil, err
	}
	return &EnqueueResult{Job: job, Duplicate: !c.added}, nil
}

// commit puts c in the group commit and waits for its result. Leadership passes from caller to caller: the
// one that finds no batch in flight sends, and when its batch returns it hands the next to the first caller
// waiting, instead of staying to send everybody else's jobs while its own caller waits.
func (q *Queue) commit(ctx context.Context, c *enqueueCall) (*EnqueueResult, error) {
	q.mu.Lock()
	lead := q.sending < enqueueInFlight
	if lead {
		q.sending++
	} else {
		q.pending = append(q.pending, c)
	}
	q.mu.Unlock()
	if !lead {
		select {
		case s := <-c.signal:
			if s == callDone {
				return c.result()
			}
			if ctx.Err() != nil {
				// Told to lead, but nobody waits for the result: pass the lead on rather than send.
				return q.abandon(ctx, c, s)
			}
		case <-ctx.Done():
			return q.abandon(ctx, c, 0)
		}
	}
	q.lead(ctx, c)
	return c.result()
}

// lead sends self's job and those pending as one batch, hands its place on, then wakes the callers whose
// jobs rode along. The script runs without the leader's cancellation: the batch carries other callers'
// jobs, and their contexts are theirs to watch.
func (q *Queue) lead(ctx context.Context, self *enqueueCall) {
	q.mu.Lock()
	n := min(len(q.pending), enqueueBatchMax-1)
	batch := make([]*enqueueCall, 0, n+1)
	batch = append(append(batch, self), q.pending[:n]...)
	q.pending = slices.Delete(q.pending, 0, n)
	q.mu.Unlock()

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), enqueueTimeout)
	q.send(sctx, batch)
	cancel()
	// The next batch goes out before this one's callers are woken, so Redis is never idle for want of a
	// sender while jobs wait.
	q.mu.Lock()
	q.handOffLocked()
	q.mu.Unlock()
	for _, c := range batch {
		if c != self {
			c.signal <- callDone
		}
	}
}

// handOffLocked gives up a sender's place: to the first waiting caller, told to send the next batch, or
// to nobody. The caller told leaves pending at once, so that the next place handed off goes to another
// and no caller is ever told twice.
func (q *Queue) handOffLocked() {
	if len(q.pending) == 0 {
		q.sending--
		return
	}
	next := q.pending[0]
	q.pending = slices.Delete(q.pending, 0, 1)
	next.signal <- callLead
}

// withdrawLocked takes c out of the next batch, if it is still waiting for one.
func (q *Queue) withdrawLocked(c *enqueueCall) {
	if i := slices.Index(q.pending, c); i >= 0 {
		q.pending = slices.Delete(q.pending, i, i+1)
	}
}

// abandon returns for a caller whose ctx ended while it waited, given the signal it received, if any.
// Leadership is handed over under the same lock, so either c was told to lead (and passes that on) or it was
// not and never will be.
func (q *Queue) abandon(ctx context.Context, c *enqueueCall, s callSignal) (*EnqueueResult, error) {
	q.mu.Lock()
	if s == 0 {
		select {
		case s = <-c.signal:
		default:
		}
	}
	switch s {
	case callDone:
		q.mu.Unlock()
		return c.result()
	case callLead:
		// c left pending when it was told; its place goes to the next caller.
		q.handOffLocked()
	default:
		// When c is not pending, its batch is in flight: the job may be enqueued, and the leader still
		// records a result nobody will read.
		q.withdrawLocked(c)
	}
	q.mu.Unlock()
	return nil, fmt.Errorf("queue: enqueue %q: %w", c.id, ctx.Err())
}

// send runs the enqueue script once for calls and records each one's result in it.
func (q *Queue) send(ctx context.Context, calls []*enqueueCall) {
	args := make([]any, 1, 1+4*len(calls))
	args[0] = q.dedupWindowMs()
	for _, c := range calls {
		args = append(args, c.id, c.record, c.payload, c.delayMs)
	}
	k := q.keys
	res, err := enqueueScript.Run(ctx, q.rdb, []string{k.jobs, k.payloads, k.ready, k.delayed, k.marker, k.seen},
		args...).Slice()
	if err == nil && len(res) != 3*len(calls) {
		err = fmt.Errorf("script returned %d values for %d jobs", len(res), len(calls))
	}
	for i, c := range calls {
		if err != nil {
			c.err = fmt.Errorf("queue: enqueue %q: %w", c.id, err)
			continue
		}
		flag, ok1 := res[3*i].(int64)
		raw, ok2 := res[3*i+1].(string)
		if !ok1 || !ok2 {
			c.err = fmt.Errorf("queue: enqueue %q: unexpected reply %v", c.id, res[3*i:3*i+3])
			continue
		}
		c.added, c.raw = flag == 1, raw
		if p, ok := res[3*i+2].(string); ok {
			c.stored = []byte(p)
		}
	}
}

// Destroy deletes every key of the queue: its jobs in every state, dead ones included. It is for tests and for
// decommissioning a queue; nothing in normal operation calls it.
func (q *Queue) Destroy(ctx context.Context) error {
	return q.rdb.Del(ctx, q.keys.all()...).Err()
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
