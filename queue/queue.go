package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// Queue is a handle on one named queue in Redis. It is safe for concurrent use.
type Queue struct {
	rdb    redis.UniversalClient
	name   string
	keys   keys
	opts   Options
	tracer trace.Tracer
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

// Enqueue adds a job. The trace context of ctx is stored with the job, so its handler continues the trace.
func (q *Queue) Enqueue(ctx context.Context, nj NewJob) (*EnqueueResult, error) {
	if nj.ID == "" {
		nj.ID = randomID()
	}
	if len(nj.ID) > 512 {
		return nil, fmt.Errorf("queue: job ID is %d bytes, at most 512", len(nj.ID))
	}
	if nj.Delay < 0 {
		return nil, fmt.Errorf("queue: negative delay %v", nj.Delay)
	}
	ctx, span := q.tracer.Start(ctx, "queue.enqueue "+q.name, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "oncegate"),
			attribute.String("messaging.destination.name", q.name),
			attribute.String("messaging.message.id", nj.ID), attribute.String("job.kind", nj.Kind)))
	defer span.End()

	r := record{ID: nj.ID, Kind: nj.Kind, MaxAttempts: q.opts.MaxAttempts, MaxStalls: q.opts.MaxStalls}
	if nj.MaxAttempts > 0 {
		r.MaxAttempts = nj.MaxAttempts
	}
	if nj.MaxStalls > 0 {
		r.MaxStalls = nj.MaxStalls
	} else if nj.MaxStalls < 0 {
		r.MaxStalls = 0
	}
	carrier := propagation.MapCarrier{}
	q.opts.Propagator.Inject(ctx, carrier)
	if len(carrier) > 0 {
		r.Trace = carrier
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("queue: encode job: %w", err)
	}
	res, err := enqueueScript.Run(ctx, q.rdb,
		[]string{q.keys.jobs, q.keys.payloads, q.keys.ready, q.keys.delayed, q.keys.marker, q.keys.seen},
		nj.ID, raw, nj.Payload, nj.Delay.Milliseconds(), q.dedupWindowMs()).Slice()
	if err != nil {
		span.RecordError(err)
		return nil, fmt.Errorf("queue: enqueue %q: %w", nj.ID, err)
	}
	job, err := decodeJob(res[1].(string), nj.Payload)
	if err != nil {
		return nil, err
	}
	dup := res[0].(int64) == 0
	if dup {
		// The payload stored is the first enqueue's; hand that back rather than the caller's.
		p, err := q.rdb.HGet(ctx, q.keys.payloads, nj.ID).Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("queue: read payload of %q: %w", nj.ID, err)
		}
		job.Payload = p
	}
	span.SetAttributes(attribute.Bool("job.duplicate", dup))
	return &EnqueueResult{Job: job, Duplicate: dup}, nil
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
