package dedup

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// What an operator is shown of an effect's life beyond its row: the replays it absorbed and its delivery
// attempts. Both are written off the request and delivery paths, in batches: a replay or an attempt costs a
// map entry or a slice append, and one statement a flush records everything a gateway gathered since the
// last. The price is that a gateway killed between two flushes loses what it gathered in that time (at most
// FlushInterval): the counts and the attempt log are for people, and the effect's own status and outcome,
// which guarantee delivery, are recorded on the paths themselves, unbatched by this.

// DefaultFlushInterval is how often a ReplayLog or AttemptLog writes what it gathered.
const DefaultFlushInterval = 100 * time.Millisecond

// maxGathered bounds what a log holds while its database is away; beyond it, the oldest is dropped (and
// logged), so that an outage costs counts, never the gateway's memory.
const maxGathered = 100_000

var (
	replaysSQL  = query("replays")
	attemptsSQL = query("attempts")
)

// ReplayLog counts the replays a gateway absorbs and adds them to their effects in batches (replays.sql).
type ReplayLog struct {
	db       DBTX
	interval time.Duration
	log      *slog.Logger
	failed   failureLog

	mu      sync.Mutex
	pending map[int64]*replayCount
}

type replayCount struct {
	n     int64
	last  time.Time
	epoch *int64
}

// NewReplayLog returns a log that writes to db every interval (DefaultFlushInterval if not positive).
func NewReplayLog(db DBTX, interval time.Duration, log *slog.Logger) *ReplayLog {
	if interval <= 0 {
		interval = DefaultFlushInterval
	}
	if log == nil {
		log = slog.Default()
	}
	return &ReplayLog{db: db, interval: interval, log: log, pending: map[int64]*replayCount{}}
}

// Add counts one replay of the effect, sent at by the job epoch (0: the request named no job).
func (l *ReplayLog) Add(effectID, epoch int64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.pending[effectID]
	if c == nil {
		if len(l.pending) >= maxGathered {
			return // the database has been away for long; this count is lost, the effect is not
		}
		c = &replayCount{}
		l.pending[effectID] = c
	}
	c.n++
	if !at.Before(c.last) {
		c.last = at
		c.epoch = nil
		if epoch > 0 {
			c.epoch = &epoch
		}
	}
}

// Run flushes every interval until ctx ends, then once more.
func (l *ReplayLog) Run(ctx context.Context) {
	runFlushes(ctx, l.interval, l.Flush)
}

// Flush writes the gathered counts in one statement. On failure they are kept for the next flush.
func (l *ReplayLog) Flush(ctx context.Context) error {
	l.mu.Lock()
	batch := l.pending
	l.pending = map[int64]*replayCount{}
	l.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	ids, ns, ats, epochs := make([]int64, 0, len(batch)), make([]int64, 0, len(batch)),
		make([]time.Time, 0, len(batch)), make([]*int64, 0, len(batch))
	for id, c := range batch {
		ids, ns, ats, epochs = append(ids, id), append(ns, c.n), append(ats, c.last), append(epochs, c.epoch)
	}
	if _, err := l.db.Exec(ctx, replaysSQL, ids, ns, ats, epochs); err != nil {
		l.mu.Lock()
		for id, c := range batch {
			if cur := l.pending[id]; cur != nil {
				cur.n += c.n
				if c.last.After(cur.last) {
					cur.last, cur.epoch = c.last, c.epoch
				}
			} else if len(l.pending) < maxGathered {
				l.pending[id] = c
			}
		}
		l.mu.Unlock()
		l.failed.warn(l.log, "recording replay counts failed; kept for the next try", "effects", len(batch), "err", err)
		return translate("record replays", err)
	}
	return nil
}

// failureLog says a flush's failure at most every failureLogEvery, with how many failed since it last said
// so: a flush is tried every 100 ms, and a table with no partition for its rows for a minute (a lock held on
// it while the partition manager would make one) filled the log with 273 lines in 27 s.
type failureLog struct {
	mu     sync.Mutex
	last   time.Time
	hushed int
}

const failureLogEvery = 10 * time.Second

func (f *failureLog) warn(log *slog.Logger, msg string, args ...any) {
	f.mu.Lock()
	if !f.last.IsZero() && time.Since(f.last) < failureLogEvery {
		f.hushed++
		f.mu.Unlock()
		return
	}
	hushed := f.hushed
	f.last, f.hushed = time.Now(), 0
	f.mu.Unlock()
	log.Warn(msg, append(args, "failures_not_logged", hushed)...)
}

// Attempt is one delivery attempt of an effect, as the gateway that made it saw it.
type Attempt struct {
	EffectID int64
	Attempt  int // 1-based
	Start    time.Time
	Gateway  string    // the dispatcher's owner name
	Token    *[16]byte // the lease it ran under; nil: not known
	Outcome  string    // see oncegate_effect_attempts.outcome
	Error    string    // as the effect's last_error would hold it
	Latency  time.Duration
	Called   bool // the provider was called, so Latency means something
	// Type and Destination are the effect type and where the delivery went (providers.Destination): a host,
	// the SMTP server; "" not known.
	Type, Destination string
}

// AttemptLog records delivery attempts in batches (attempts.sql).
type AttemptLog struct {
	db       DBTX
	interval time.Duration
	log      *slog.Logger
	failed   failureLog

	mu      sync.Mutex
	pending []Attempt
}

// NewAttemptLog returns a log that writes to db every interval (DefaultFlushInterval if not positive).
func NewAttemptLog(db DBTX, interval time.Duration, log *slog.Logger) *AttemptLog {
	if interval <= 0 {
		interval = DefaultFlushInterval
	}
	if log == nil {
		log = slog.Default()
	}
	return &AttemptLog{db: db, interval: interval, log: log}
}

// Record gathers an attempt for the next flush.
func (l *AttemptLog) Record(a Attempt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) >= maxGathered {
		l.pending = l.pending[1:]
	}
	l.pending = append(l.pending, a)
}

// Run flushes every interval until ctx ends, then once more.
func (l *AttemptLog) Run(ctx context.Context) {
	runFlushes(ctx, l.interval, l.Flush)
}

// Flush writes the gathered attempts in one statement. On failure they are kept for the next flush.
func (l *AttemptLog) Flush(ctx context.Context) error {
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	l.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	n := len(batch)
	ids, nums, starts, gws := make([]int64, n), make([]int32, n), make([]time.Time, n), make([]string, n)
	tokens, outcomes, errs, lat := make([]pgtype.UUID, n), make([]string, n), make([]*string, n), make([]*float64, n)
	dests, types := make([]*string, n), make([]*string, n)
	for i, a := range batch {
		ids[i], nums[i], starts[i], gws[i], outcomes[i] = a.EffectID, int32(a.Attempt), a.Start, a.Gateway, a.Outcome
		if a.Token != nil {
			tokens[i] = uuidArg(*a.Token)
		}
		if e := storableText(a.Error); e != "" {
			errs[i] = &e
		}
		if a.Called {
			ms := float64(a.Latency) / float64(time.Millisecond)
			lat[i] = &ms
		}
		if a.Destination != "" {
			dests[i] = &batch[i].Destination
		}
		if a.Type != "" {
			types[i] = &batch[i].Type
		}
	}
	r := rollUp(batch)
	if _, err := l.db.Exec(ctx, attemptsSQL, ids, nums, starts, gws, tokens, outcomes, errs, lat, dests, types,
		r.minutes, r.types, r.dests, r.attempts, r.delivered, r.failed, r.retried, r.inDoubt, r.buckets,
		len(LatencyBuckets)+1); err != nil {
		l.mu.Lock()
		l.pending = append(batch, l.pending...)
		if over := len(l.pending) - maxGathered; over > 0 {
			l.pending = l.pending[over:]
		}
		l.mu.Unlock()
		l.failed.warn(l.log, "recording delivery attempts failed; kept for the next try", "attempts", n, "err", err)
		return translate("record attempts", err)
	}
	return nil
}

// runFlushes calls flush every interval until ctx ends, then once more, bounded, for what the last moments
// gathered.
func runFlushes(ctx context.Context, interval time.Duration, flush func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = flush(fctx)
			cancel()
			return
		case <-t.C:
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_ = flush(fctx)
			cancel()
		}
	}
}

// LatencyBuckets are the upper bounds, in milliseconds, of the buckets in which the per-minute rollup of each
// destination counts its calls (oncegate_destination_minutes.latency_buckets); one more bucket holds the
// calls above the last bound. A percentile read from them is a bucket's bound: coarse, and exact to read.
var LatencyBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000}

// rollup is a flush's attempts summed per minute, type and destination, as attempts.sql's rollup takes them.
type rollup struct {
	minutes                                       []time.Time
	types, dests                                  []string
	attempts, delivered, failed, retried, inDoubt []int64
	buckets                                       []int64 // len(LatencyBuckets)+1 per index
}

func rollUp(batch []Attempt) rollup {
	type key struct {
		minute    time.Time
		typ, dest string
	}
	var r rollup
	index := map[key]int{}
	nb := len(LatencyBuckets) + 1
	for _, a := range batch {
		if a.Type == "" || a.Destination == "" {
			continue
		}
		k := key{a.Start.UTC().Truncate(time.Minute), a.Type, a.Destination}
		i, ok := index[k]
		if !ok {
			i = len(r.minutes)
			index[k] = i
			r.minutes, r.types, r.dests = append(r.minutes, k.minute), append(r.types, k.typ), append(r.dests, k.dest)
			r.attempts, r.delivered, r.failed = append(r.attempts, 0), append(r.delivered, 0), append(r.failed, 0)
			r.retried, r.inDoubt = append(r.retried, 0), append(r.inDoubt, 0)
			r.buckets = append(r.buckets, make([]int64, nb)...)
		}
		r.attempts[i]++
		switch a.Outcome {
		case "delivered":
			r.delivered[i]++
		case "failed":
			r.failed[i]++
		case "retry":
			r.retried[i]++
		case "in_doubt", "interrupted":
			r.inDoubt[i]++
		}
		if a.Called {
			ms := float64(a.Latency) / float64(time.Millisecond)
			b := len(LatencyBuckets)
			for j, bound := range LatencyBuckets {
				if ms <= bound {
					b = j
					break
				}
			}
			r.buckets[i*nb+b]++
		}
	}
	return r
}
