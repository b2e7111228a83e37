package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

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
	// Registry is the Redis key of the set of queue names that operator tools list (`oncegate queue ls`). A
	// queue adds its name at its first enqueue and when a worker starts on it. Defaults to DefaultRegistry;
	// it is one key outside every queue's hash tag, so on Redis Cluster it lives on one node.
	Registry string
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// Replicas is how many replicas must have a write before the queue acknowledges it: an enqueue (and the
	// dedup window it reads), a lease (which bumps the job's fencing epoch) and a completion (which writes the
	// dedup window) each run their script and then WAIT on the same connection (WAITAOF on Redis 7.2 and
	// later, so the replicas have fsynced it). Redis replicates asynchronously: without this, a write that the
	// primary acknowledged and then lost to a failover (Sentinel or Cluster), or to a partition that had it
	// demoted, is gone.
	//
	// ReplicasAuto (0, the default) waits for one replica once the queue's primary has been seen with a
	// replica connected (INFO replication, read at the first write and every second until then; on Redis
	// Cluster, also the replicas its shard lists, connected or not), and keeps waiting from then on, even when
	// the primary sees none: a primary cut off from its replicas is the one that must not acknowledge alone.
	// A primary never seen with a replica is not waited on, and that memory is per process: where replicas are
	// part of the deployment, 1 is the safer setting. ReplicasOff (-1) never waits. A positive value always
	// waits for that many.
	//
	// A write that fewer replicas acknowledged within ReplicaTimeout returns an error wrapping
	// ErrNotReplicated. It did run on the primary, which may keep it or lose it: an Enqueue may be retried
	// under the same job ID, which the dedup makes safe (the retry may then report Duplicate for the job the
	// failed call added); a lease is handed back and never reaches the handler; a completion is in doubt, and
	// the job may run again after a failover. With one replica wanted, a primary needs two replicas to keep
	// accepting writes after one of them is promoted.
	Replicas int
	// ReplicaTimeout bounds the wait for replicas after a write. Defaults to DefaultReplicaTimeout (1 s). It
	// must be under the client's ReadTimeout, since the WAIT is read within it.
	ReplicaTimeout time.Duration
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
	if c.Registry == "" {
		c.Registry = DefaultRegistry
	}
	if c.ReplicaTimeout <= 0 {
		c.ReplicaTimeout = DefaultReplicaTimeout
	}
	if c.Replicas < 0 {
		c.Replicas = ReplicasOff
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
	// The enqueue span's name and fixed attributes, made once: per call they were a tenth of its garbage.
	enqueueSpan  string
	enqueueAttrs []attribute.KeyValue

	// The group commit of Enqueue: the callers waiting for a batch, and how many senders there are (each
	// sending a batch, or told to send the next). While sending < enqueueInFlight, pending is empty.
	mu      sync.Mutex
	pending []*enqueueCall
	sending int

	registered atomic.Bool // the name is in the registry (registry.go)

	repl replication // durable writes (replication.go)
}

// New returns a handle on the queue called name. Names are 1 to 200 bytes of UTF-8 without braces, which
// would break the hash tag, control characters or spaces at either end.
func New(rdb redis.UniversalClient, name string, opts *Options) (*Queue, error) {
	if rdb == nil || isNilPointer(rdb) {
		return nil, errors.New("queue: New needs a Redis client (redis.NewClient, redis.NewFailoverClient or " +
			"redis.NewClusterClient)")
	}
	// Control characters and invalid UTF-8 would reach logs, metrics' labels and the operator's terminal.
	// Nor spaces at either end, which HTTP drops from a header: the gateway would file a job of " q " under q.
	if name == "" || len(name) > 200 || strings.ContainsAny(name, "{}") || !utf8.ValidString(name) ||
		strings.ContainsFunc(name, unicode.IsControl) || strings.TrimSpace(name) != name {
		return nil, fmt.Errorf("queue: invalid queue name %q: want 1-200 bytes of UTF-8, without braces, "+
			"control characters or spaces at either end", name)
	}
	o := opts.WithDefaults()
	if rt := readTimeout(rdb); o.Replicas != ReplicasOff && rt > 0 && o.ReplicaTimeout >= rt {
		return nil, fmt.Errorf("queue: ReplicaTimeout %v is not under the client's ReadTimeout %v: the WAIT "+
			"after a write would time out as a broken connection", o.ReplicaTimeout, rt)
	}
	q := &Queue{
		rdb: rdb, name: name, keys: newKeys(name), opts: o,
		tracer:      o.TracerProvider.Tracer("github.com/oncegate/oncegate/queue"),
		enqueueSpan: "queue.enqueue " + name,
		enqueueAttrs: []attribute.KeyValue{attribute.String("messaging.system", "oncegate"),
			attribute.String("messaging.destination.name", name)},
	}
	q.repl.want, q.repl.timeout = o.Replicas, o.ReplicaTimeout
	return q, nil
}

// readTimeout is the client's read timeout, as go-redis has set it up (its default is 5 s), or -1 for none
// (the client's options then hold 0 or a negative value).
func readTimeout(rdb redis.UniversalClient) time.Duration {
	var d time.Duration
	switch c := rdb.(type) {
	case *redis.Client:
		d = c.Options().ReadTimeout
	case *redis.ClusterClient:
		d = c.Options().ReadTimeout
	default:
		return -1
	}
	if d <= 0 {
		return -1
	}
	return d
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
//
// The job that existed may be this very call's: a client that retries a command after a network error
// (go-redis does, up to its MaxRetries, by default) runs the call again when its first try reached Redis and the
// answer was lost, as in a failover, and the second try finds the job the first added, though the caller saw no
// error. Count a Duplicate as "stored", not as "sent twice"; set MaxRetries to -1 to be told of the error instead.
type EnqueueResult struct {
	Job       *Job
	Duplicate bool
}

const (
	// enqueueBatchMax bounds the jobs of one enqueue script call, so that a burst of producers holds Redis
	// for a millisecond or two at a time rather than for the whole burst.
	enqueueBatchMax = 512
	// enqueueInFlight is how many group-committed batches may be in flight at once. Two, so that Redis runs
	// one batch while the client wakes the callers of the previous one and gathers the next: with one, each
	// side waits for the other and both stay half idle. A lone producer never has a second batch to send, so
	// this costs it nothing.
	enqueueInFlight = 2
	// enqueueTimeout bounds a group-committed batch's call, which runs apart from its callers' contexts.
	enqueueTimeout = 10 * time.Second
)

// Enqueue adds a job. The trace context of ctx is stored with the job, so its handler continues the trace.
//
// Concurrent calls on one Queue are group-committed: a call that finds fewer than two batches in flight
// sends its job at once; calls arriving while two are in flight wait, and when one returns the first of them
// sends all of theirs (up to 512) in one script call. Nothing waits on purpose, so a lone producer's latency
// is one round trip, and under load one round trip carries many jobs. A Redis error fails every call of its
// batch.
//
// When ctx ends while the job waits to be sent, Enqueue returns at once with an error that wraps ctx's, and
// the job is not sent. When ctx ends while the job's batch is in flight, a caller that is waiting returns the
// same way, but the job may have been enqueued, as after any timeout; enqueueing it again with the same ID
// is safe. The caller that sends a batch waits for that call (at most 10 s) even if its own ctx ends, since
// other callers' jobs ride on it.
//
// Where the queue waits for replicas (Options.Replicas), a call returns only once a replica has its batch; an
// error wrapping ErrNotReplicated means the job is on the primary but may be lost to a failover: enqueue it
// again under the same ID (the retry may then report Duplicate, for the job this call added).
func (q *Queue) Enqueue(ctx context.Context, nj NewJob) (*EnqueueResult, error) {
	if err := checkNewJob(&nj); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("queue: enqueue %q: %w", nj.ID, err)
	}
	ctx, span := q.tracer.Start(ctx, q.enqueueSpan, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(q.enqueueAttrs...), trace.WithAttributes(
			attribute.String("messaging.message.id", nj.ID), attribute.String("job.kind", nj.Kind)))
	defer span.End()

	q.register(ctx)
	res, err := q.commit(ctx, q.newCall(nj, q.traceContext(ctx)))
	if err != nil {
		span.RecordError(err)
		return nil, err
	}
	span.SetAttributes(attribute.Bool("job.duplicate", res.Duplicate))
	return res, nil
}

// EnqueueMany adds jobs in the order given, with one script call per 512 of them, so a producer that has
// many jobs at hand pays one round trip per chunk instead of one per job. Each job is deduplicated as by
// Enqueue, also against the jobs before it in the slice: the first of two with one ID is added, the second
// is its duplicate. The results are in the order of jobs.
//
// An invalid job fails the call before anything is sent. A Redis error stops it: the results of the chunks
// that went through come back with the error, and the failed chunk's jobs may or may not have been added.
// All the jobs carry the trace context of one span, which stands for the whole call.
func (q *Queue) EnqueueMany(ctx context.Context, jobs []NewJob) ([]*EnqueueResult, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	jobs = slices.Clone(jobs) // checkNewJob fills in IDs; the caller's slice stays as it was
	for i := range jobs {
		if err := checkNewJob(&jobs[i]); err != nil {
			return nil, fmt.Errorf("%w (jobs[%d], job %d of %d)", err, i, i+1, len(jobs))
		}
	}
	ctx, span := q.tracer.Start(ctx, q.enqueueSpan, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(q.enqueueAttrs...),
		trace.WithAttributes(attribute.Int("messaging.batch.message_count", len(jobs))))
	defer span.End()

	q.register(ctx)
	tc := q.traceContext(ctx)
	calls := make([]*enqueueCall, len(jobs))
	for i, nj := range jobs {
		calls[i] = q.newCall(nj, maps.Clone(tc)) // one map per job, as each result's Job holds it
	}
	results := make([]*EnqueueResult, 0, len(jobs))
	dups := 0
	for chunk := range slices.Chunk(calls, enqueueBatchMax) {
		q.send(ctx, chunk)
		for _, c := range chunk {
			res, err := c.result()
			if err != nil {
				span.RecordError(err)
				return results, err
			}
			if res.Duplicate {
				dups++
			}
			results = append(results, res)
		}
	}
	span.SetAttributes(attribute.Int("job.duplicates", dups))
	return results, nil
}

// MaxPayload is the largest payload a job may carry: Redis's default proto-max-bulk-len, 512 MiB.
const MaxPayload = 512 << 20

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
	// Redis closes the connection on a larger value (proto-max-bulk-len), which fails every job of the batch
	// that carried this one, other callers' included; refused here, it fails alone and says why.
	if len(nj.Payload) > MaxPayload {
		return fmt.Errorf("queue: job %q: payload is %d bytes, over %d, the largest value Redis takes", nj.ID,
			len(nj.Payload), MaxPayload)
	}
	// The record is JSON, which would store invalid UTF-8 as U+FFFD: a job whose record names another ID than
	// its key could never be completed, extended or buried.
	if !utf8.ValidString(nj.ID) {
		return fmt.Errorf("queue: job ID %q is not valid UTF-8", nj.ID)
	}
	if !utf8.ValidString(nj.Kind) {
		return fmt.Errorf("queue: job kind %q is not valid UTF-8", nj.Kind)
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
	job     *Job   // the job as it will be stored, but for the times only Redis knows
	raw     []byte // its record, encoded
	payload []byte
	delayMs int64

	// signal tells a waiting caller that another caller's batch carried its job (callDone) or that it is to
	// send the next batch (callLead). Each call gets at most one signal from another goroutine, so a buffer
	// of one never blocks the sender.
	signal chan callSignal

	// Set by send before the signal.
	added  bool
	now    int64  // Redis's clock when the job was added
	dupRaw string // the record stored, for a duplicate
	stored []byte // the payload stored, for a duplicate
	err    error
}

type callSignal uint8

const (
	callDone callSignal = iota + 1
	callLead
)

func (q *Queue) newCall(nj NewJob, tc map[string]string) *enqueueCall {
	r := record{ID: nj.ID, Kind: nj.Kind, MaxAttempts: q.opts.MaxAttempts, MaxStalls: q.opts.MaxStalls, Trace: tc}
	if nj.MaxAttempts > 0 {
		r.MaxAttempts = nj.MaxAttempts
	}
	if nj.MaxStalls > 0 {
		r.MaxStalls = nj.MaxStalls
	} else if nj.MaxStalls < 0 {
		r.MaxStalls = 0
	}
	// Left open: enqueue.lua closes the object after appending Redis's fields.
	raw := appendNewRecord(make([]byte, 0, 128+len(nj.ID)+len(nj.Kind)), &r)
	return &enqueueCall{id: nj.ID, job: r.job(nj.Payload), raw: raw, payload: nj.Payload,
		delayMs: nj.Delay.Milliseconds(), signal: make(chan callSignal, 1)}
}

// appendNewRecord encodes a new job's record as json.Marshal would, byte for byte, without the closing
// brace. A new record sets only these fields; the rest are zero and omitted. Written out because
// json.Marshal's reflection was an eighth of a producer's CPU under load.
func appendNewRecord(b []byte, r *record) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, r.ID)
	if r.Kind != "" {
		b = append(b, `,"kind":`...)
		b = appendJSONString(b, r.Kind)
	}
	b = append(b, `,"epoch":`...)
	b = strconv.AppendInt(b, r.Epoch, 10)
	b = append(b, `,"failures":`...)
	b = strconv.AppendInt(b, int64(r.Failures), 10)
	b = append(b, `,"stalls":`...)
	b = strconv.AppendInt(b, int64(r.Stalls), 10)
	b = append(b, `,"max_attempts":`...)
	b = strconv.AppendInt(b, int64(r.MaxAttempts), 10)
	b = append(b, `,"max_stalls":`...)
	b = strconv.AppendInt(b, int64(r.MaxStalls), 10)
	if len(r.Trace) > 0 {
		b = append(b, `,"trace":{`...)
		for i, k := range slices.Sorted(maps.Keys(r.Trace)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, r.Trace[k])
		}
		b = append(b, '}')
	}
	return b
}

// appendJSONString copies a string that needs no escaping and leaves any other to encoding/json, which
// escapes control characters, quotes, HTML characters and invalid UTF-8 its own way.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func (c *enqueueCall) result() (*EnqueueResult, error) {
	if c.err != nil {
		return nil, c.err
	}
	if !c.added {
		// The payload stored is the first enqueue's; hand that back rather than the caller's.
		job := readJob(c.dupRaw, c.stored)
		job.ID = c.id
		return &EnqueueResult{Job: job, Duplicate: true}, nil
	}
	// The record stored is the one sent plus what enqueue.lua appends, so there is nothing to decode.
	j := c.job
	j.CreatedAt = msTime(c.now)
	if c.delayMs > 0 {
		j.State, j.RunAt = StateDelayed, msTime(c.now+c.delayMs)
	} else {
		j.State, j.ReadyAt = StateReady, j.CreatedAt
	}
	return &EnqueueResult{Job: j}, nil
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
		args = append(args, c.id, c.raw, c.payload, c.delayMs)
	}
	k := q.keys
	keys := []string{k.jobs, k.payloads, k.ready, k.delayed, k.marker, k.seen}
	n := q.replicas(ctx)
	if n > 0 {
		// A batch of duplicates writes nothing. Redis 7.0 and earlier have WAIT wait for the offset after the
		// connection's last command, whatever it was; a server that counts only commands that replicated
		// something would have it wait for nothing, and acknowledge a duplicate whose first enqueue is not
		// replicated yet. The sync key is written then, so WAIT covers that first enqueue (enqueue.lua).
		keys = append(keys, k.sync)
	}
	// A batch that ran but was not replicated fails every job of it, as any other error would: each may be
	// enqueued, and may be lost.
	var res []any
	cmd, err := q.runDurable(ctx, q.rdb, n, enqueueScript, keys, args...)
	if err == nil {
		res, err = cmd.Slice()
	}
	var now int64
	if err == nil {
		var ok bool
		if now, ok = res[0].(int64); !ok || len(res) != 1+3*len(calls) {
			err = fmt.Errorf("script returned %d values for %d jobs", len(res), len(calls))
		}
	}
	for i, c := range calls {
		if err != nil {
			c.err = fmt.Errorf("queue: enqueue %q: %w", c.id, err)
			continue
		}
		r := res[1+3*i : 4+3*i]
		flag, _ := r[0].(int64)
		c.added, c.now = flag == 1, now
		if c.added {
			continue
		}
		var ok bool
		if c.dupRaw, ok = r[1].(string); !ok {
			c.err = fmt.Errorf("queue: enqueue %q: unexpected reply %v", c.id, r)
			continue
		}
		if p, ok := r[2].(string); ok {
			c.stored = []byte(p)
		}
	}
}

// Destroy deletes every key of the queue: its jobs in every state, dead ones included. It is for tests and for
// decommissioning a queue; nothing in normal operation calls it.
func (q *Queue) Destroy(ctx context.Context) error {
	if err := q.rdb.Del(ctx, q.keys.all()...).Err(); err != nil {
		return err
	}
	q.registered.Store(false)
	return q.rdb.SRem(ctx, q.opts.Registry, q.name).Err()
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// isNilPointer reports whether v is a nil pointer in an interface, which is not itself nil: a
// (*redis.Client)(nil) passed as a client.
func isNilPointer(v any) bool {
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}
