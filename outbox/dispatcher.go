// Package outbox delivers effects from the transactional outbox to their providers. Any number of gateways can
// run a Dispatcher against one database: rows are leased with SELECT … FOR UPDATE SKIP LOCKED, a lease token
// fences every outcome (only the current holder can record one), and a gateway that dies mid-delivery leaves
// leases that expire, so another gateway rescues its rows within the lease time.
//
// The guarantee is that an accepted effect is delivered, failed for good, dead after its retries, or left
// "unknown" for an operator; never lost. Transient failures are retried with exponential backoff and full
// jitter (honouring a destination's Retry-After), one circuit breaker per effect type keeps rows waiting while
// a destination is down without charging them attempts, and what a crash between a provider's success and the
// commit that records it can do is decided per effect type (OnCrash) and per provider (providers.TxProvider).
package outbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/internal/metrics"
	"github.com/oncegate/oncegate/providers"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func query(name string) string {
	q, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(err)
	}
	return string(q)
}

var (
	claimSQL      = query("claim")
	finishSQL     = query("finish")
	rescheduleSQL = query("reschedule")
	purgeSQL      = query("purge")
	backlogSQL    = query("backlog")
)

// OnCrash says what happens to an effect whose dispatcher died while delivering it.
type OnCrash string

const (
	// AtLeastOnce resends it: the receiver may get it twice, recognisable by the effect's stable ID.
	AtLeastOnce OnCrash = "at_least_once"
	// AtMostOnce marks it unknown for an operator, who can retry it.
	AtMostOnce OnCrash = "at_most_once"
)

const (
	DefaultConcurrency     = 16
	DefaultTimeout         = 10 * time.Second
	DefaultMaxAttempts     = 10
	DefaultBreakerFailures = 5
	DefaultBreakerOpenFor  = 30 * time.Second
	DefaultLeaseMargin     = 5 * time.Second
	DefaultPollInterval    = time.Second
	DefaultBatchSize       = 32
	DefaultDrainTimeout    = 10 * time.Second
	DefaultRetention       = 24 * time.Hour
	DefaultPurgeInterval   = time.Minute
)

// EffectType is how the dispatcher delivers one effect type.
type EffectType struct {
	Name     string
	Provider providers.Provider
	// Concurrency bounds the deliveries of this type in flight in one gateway. Defaults to DefaultConcurrency.
	Concurrency int
	// Timeout bounds one provider call. The lease is Timeout plus Config.LeaseMargin. Defaults to
	// DefaultTimeout.
	Timeout time.Duration
	// MaxAttempts is how many failed attempts make the effect dead. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// Retry shapes the delay between attempts (exponential, full jitter). Defaults to 1s, capped at 10m.
	Retry backoff.Policy
	// OnCrash defaults to AtLeastOnce. A TxProvider ignores it: it has no crash window.
	OnCrash OnCrash
	// BreakerFailures consecutive failures open the breaker for BreakerOpenFor. Default to
	// DefaultBreakerFailures and DefaultBreakerOpenFor.
	BreakerFailures uint32
	BreakerOpenFor  time.Duration
}

// Config configures a dispatcher.
type Config struct {
	Types []EffectType
	// Owner names this dispatcher in leases. Defaults to host name, process ID and a random suffix.
	Owner string
	// LeaseMargin is added to a type's Timeout to make its lease. Defaults to DefaultLeaseMargin.
	LeaseMargin time.Duration
	// PollInterval is how often the outbox is checked without a notification. Defaults to
	// DefaultPollInterval.
	PollInterval time.Duration
	// BatchSize bounds the rows one claim takes. Defaults to DefaultBatchSize.
	BatchSize int
	// DrainTimeout is how long Run waits at shutdown for deliveries in flight before cancelling them and
	// handing their rows back. Defaults to DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Retention is how long terminal effects (and so their keys) are kept. Defaults to DefaultRetention.
	Retention time.Duration
	// PurgeInterval is how often expired effects are purged. Defaults to DefaultPurgeInterval.
	PurgeInterval time.Duration
	// OnFinished is called with the ID of every effect this dispatcher brought to a terminal status, for the
	// gateway's own waiters. Other gateways learn of it from a NOTIFY on oncegate_effect_done, whose payload
	// lists IDs separated by commas.
	OnFinished func(id int64)
	Logger     *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	o := *c
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.LeaseMargin, DefaultLeaseMargin)
	def(&o.PollInterval, DefaultPollInterval)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	def(&o.Retention, DefaultRetention)
	def(&o.PurgeInterval, DefaultPurgeInterval)
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Owner == "" {
		host, _ := os.Hostname()
		o.Owner = fmt.Sprintf("%s/%d/%x", host, os.Getpid(), time.Now().UnixNano()&0xffffff)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Types = make([]EffectType, len(c.Types))
	for i, t := range c.Types {
		if t.Name == "" || t.Provider == nil {
			return o, fmt.Errorf("outbox: effect type %d has no name or provider", i)
		}
		if t.Concurrency <= 0 {
			t.Concurrency = DefaultConcurrency
		}
		def(&t.Timeout, DefaultTimeout)
		if t.MaxAttempts <= 0 {
			t.MaxAttempts = DefaultMaxAttempts
		}
		t.Retry = t.Retry.WithDefaults()
		switch t.OnCrash {
		case "":
			t.OnCrash = AtLeastOnce
		case AtLeastOnce, AtMostOnce:
		default:
			return o, fmt.Errorf("outbox: effect type %s: on_crash %q: want at_least_once or at_most_once", t.Name, t.OnCrash)
		}
		if t.BreakerFailures == 0 {
			t.BreakerFailures = DefaultBreakerFailures
		}
		def(&t.BreakerOpenFor, DefaultBreakerOpenFor)
		o.Types[i] = t
	}
	return o, nil
}

type effectType struct {
	EffectType
	lease    time.Duration
	breaker  *gobreaker.CircuitBreaker[providers.Outcome]
	inflight atomic.Int32
}

// Dispatcher delivers outbox rows. Create it with New and run it with Run.
type Dispatcher struct {
	pool  *pgxpool.Pool
	cfg   Config
	types []*effectType
	log   *slog.Logger
	wake  chan struct{}
	freed chan struct{}

	finishedMu sync.Mutex
	finished   []int64       // terminal since the last notification
	notifyNow  chan struct{} // rung when finished gains its first ID
}

// New returns a dispatcher for the effect types of cfg.
func New(pool *pgxpool.Pool, cfg Config) (*Dispatcher, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{pool: pool, cfg: c, log: c.Logger.With("component", "dispatcher", "owner", c.Owner),
		wake: make(chan struct{}, 1), freed: make(chan struct{}, 1), notifyNow: make(chan struct{}, 1)}
	for _, t := range c.Types {
		et := &effectType{EffectType: t, lease: t.Timeout + c.LeaseMargin}
		name, failures := t.Name, t.BreakerFailures
		et.breaker = gobreaker.NewCircuitBreaker[providers.Outcome](gobreaker.Settings{
			Name:        name,
			MaxRequests: 1,
			Timeout:     t.BreakerOpenFor,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
			OnStateChange: func(_ string, from, to gobreaker.State) {
				d.log.Warn("circuit breaker changed state", "type", name, "from", from.String(), "to", to.String())
				metrics.BreakerState.WithLabelValues(name).Set(float64(to))
				if to != gobreaker.StateOpen {
					d.Wake()
				}
			},
		})
		metrics.BreakerState.WithLabelValues(name).Set(0)
		d.types = append(d.types, et)
	}
	return d, nil
}

// Wake makes the dispatcher look for due rows now; a LISTEN on oncegate_outbox calls it.
func (d *Dispatcher) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run delivers until ctx ends, then shuts down: it stops claiming, waits up to DrainTimeout for deliveries in
// flight, cancels the rest and hands their rows back, unattempted, for any gateway to take.
func (d *Dispatcher) Run(ctx context.Context) error {
	deliveries, cancelDeliveries := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDeliveries()
	var wg sync.WaitGroup
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	purge := time.NewTicker(d.cfg.PurgeInterval)
	defer purge.Stop()
	var claimErrors int
	notifierCtx, stopNotifier := context.WithCancel(context.WithoutCancel(ctx))
	notified := make(chan struct{})
	go func() { defer close(notified); d.notifyFinished(notifierCtx) }()
	defer func() { stopNotifier(); <-notified }()

	for ctx.Err() == nil {
		more, err := d.claimAll(ctx, deliveries, &wg)
		if err != nil && ctx.Err() == nil {
			claimErrors++
			wait := backoff.Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(claimErrors)
			d.log.Warn("claiming outbox rows failed", "err", err, "retry_in", wait.String())
			sleep(ctx, wait)
			continue
		}
		claimErrors = 0
		if more {
			continue
		}
		select {
		case <-ctx.Done():
		case <-d.wake:
		case <-d.freed:
		case <-poll.C:
		case <-purge.C:
			d.purge(ctx)
		}
	}

	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(d.cfg.DrainTimeout):
		d.log.Warn("drain timeout: cancelling deliveries in flight and handing their rows back")
		cancelDeliveries()
		<-drained
	}
	return nil
}

// claimAll claims due rows for every type with free capacity and a breaker that lets calls through. It
// reports whether some claim came back full, so that more rows may be due.
func (d *Dispatcher) claimAll(ctx, deliveries context.Context, wg *sync.WaitGroup) (more bool, err error) {
	for _, t := range d.types {
		free := int(int32(t.Concurrency) - t.inflight.Load())
		switch t.breaker.State() {
		case gobreaker.StateOpen:
			continue // its rows wait, uncharged, until the breaker lets a probe through
		case gobreaker.StateHalfOpen:
			free = min(free, 1)
		}
		if free <= 0 {
			continue
		}
		n := min(free, d.cfg.BatchSize)
		rows, err := d.claim(ctx, t, n)
		if err != nil {
			return false, err
		}
		for _, r := range rows {
			t.inflight.Add(1)
			wg.Go(func() {
				defer func() {
					t.inflight.Add(-1)
					select {
					case d.freed <- struct{}{}:
					default:
					}
				}()
				d.deliver(deliveries, t, r)
			})
		}
		if len(rows) == n {
			more = true
		}
	}
	return more, nil
}

type row struct {
	id       int64
	token    [16]byte
	rescued  bool
	tenant   string
	key      string
	typ      string
	payload  []byte
	attempts int
	created  time.Time
	trace    map[string]string // the creating request's trace context
}

func (d *Dispatcher) claim(ctx context.Context, t *effectType, n int) ([]row, error) {
	// The claim itself is never cancelled midway: rows leased in the database but lost on the way back would
	// sit out their lease for nothing.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	rs, err := d.pool.Query(cctx, claimSQL, t.Name, n, d.cfg.Owner, t.lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("outbox: claim %s: %w", t.Name, err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.token, &x.rescued, &x.tenant, &x.key, &x.typ, &x.payload, &x.attempts, &x.created, &x.trace)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim %s: %w", t.Name, err)
	}
	return out, nil
}

// errBreakerFailure tells the breaker that an attempt failed in a way that says the destination is unwell.
var errBreakerFailure = errors.New("outbox: destination failure")

func (d *Dispatcher) deliver(ctx context.Context, t *effectType, r row) {
	// The delivery continues the trace of the request that created the effect.
	ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(r.trace))
	ctx, span := tracer.Start(ctx, "outbox.dispatch "+t.Name, trace.WithAttributes(
		attribute.String("effect.type", t.Name), attribute.String("idempotency.key", r.key),
		attribute.Int("effect.attempt", r.attempts+1), attribute.Bool("effect.rescued", r.rescued),
		attribute.String("effect.stable_id", providers.StableID(r.tenant, r.key))))
	defer span.End()
	d.deliverSpan(ctx, span, t, r)
}

var tracer = otel.Tracer("github.com/oncegate/oncegate/outbox")

func (d *Dispatcher) deliverSpan(ctx context.Context, span trace.Span, t *effectType, r row) {
	log := d.log.With("type", t.Name, "effect", r.id, "tenant", r.tenant, "key", r.key, "attempt", r.attempts+1)
	del := providers.Delivery{Tenant: r.tenant, Key: r.key, Type: r.typ, StableID: providers.StableID(r.tenant, r.key),
		Payload: r.payload, Attempt: r.attempts + 1, Rescued: r.rescued, CreatedAt: r.created}
	txp, isTx := t.Provider.(providers.TxProvider)
	if r.rescued {
		metrics.Rescued.WithLabelValues(t.Name).Inc()
		if t.OnCrash == AtMostOnce && !isTx {
			log.Warn("rescued a delivery interrupted by a crash; on_crash is at_most_once, so it is not resent")
			d.finish(log, t, r, "unknown", nil,
				"a gateway died while delivering this effect, so it may or may not have happened; on_crash is "+
					"at_most_once, so it was not resent: check the destination, then retry it or leave it", 0)
			return
		}
	}

	start := time.Now()
	recorded := false
	out, err := t.breaker.Execute(func() (providers.Outcome, error) {
		actx, cancel := context.WithTimeout(ctx, t.Timeout)
		defer cancel()
		var o providers.Outcome
		if isTx {
			o, recorded = d.deliverTx(actx, log, txp, t, r, del)
		} else {
			o = t.Provider.Deliver(actx, del)
		}
		switch {
		case o.Kind == providers.KindRetry, o.Kind == providers.KindInDoubt,
			o.Kind == providers.KindFailed && !o.DestinationUp:
			return o, errBreakerFailure
		}
		return o, nil
	})
	metrics.DispatchLatency.WithLabelValues(t.Name).Observe(time.Since(start).Seconds())
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		d.reschedule(log, r, 0, "", 0) // the breaker kept the call from the destination: no attempt charged
		return
	}
	metrics.Attempts.WithLabelValues(t.Name, out.Kind.String()).Inc()
	span.SetAttributes(attribute.String("effect.outcome", out.Kind.String()))
	if out.Err != nil {
		span.RecordError(out.Err)
		if out.Kind != providers.KindDelivered {
			span.SetStatus(codes.Error, out.Err.Error())
		}
	}
	if recorded {
		return
	}
	errText := ""
	if out.Err != nil {
		errText = out.Err.Error()
	}
	switch out.Kind {
	case providers.KindDelivered:
		d.finish(log, t, r, "delivered", out.Result, "", 1)
	case providers.KindFailed:
		log.Warn("delivery failed permanently", "err", out.Err)
		d.finish(log, t, r, "failed", out.Result, errText, 1)
	case providers.KindInDoubt:
		log.Warn("delivery in doubt", "err", out.Err)
		d.finish(log, t, r, "unknown", out.Result, errText, 1)
	default:
		if ctx.Err() != nil {
			// Shutdown cancelled the attempt: hand the row back unattempted.
			d.reschedule(log, r, 0, "", 0)
			return
		}
		if r.attempts+1 >= t.MaxAttempts {
			log.Error("delivery failed; retries used up", "err", out.Err)
			d.finish(log, t, r, "dead", out.Result, fmt.Sprintf("failed %d of %d attempts: %s",
				r.attempts+1, t.MaxAttempts, errText), 1)
			return
		}
		delay := t.Retry.Delay(r.attempts + 1)
		if out.RetryAfter > 0 {
			delay = out.RetryAfter
		}
		log.Info("delivery failed; will retry", "err", out.Err, "in", delay.String())
		d.reschedule(log, r, delay, errText, 1)
	}
}

// deliverTx runs a TxProvider and, when it delivered, records that in the same transaction: the effect and
// its record commit together, or neither does. recorded reports whether the outcome is recorded already.
func (d *Dispatcher) deliverTx(ctx context.Context, log *slog.Logger, p providers.TxProvider, t *effectType, r row,
	del providers.Delivery) (out providers.Outcome, recorded bool) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return providers.Retry(fmt.Errorf("begin: %w", err)), false
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	out = p.DeliverTx(ctx, tx, del)
	if out.Kind != providers.KindDelivered {
		return out, false
	}
	var id int64
	err = tx.QueryRow(ctx, finishSQL, r.id, r.token, "delivered", out.Result, nil, 1).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		log.Warn("lease lost before the delivery committed; another dispatcher owns the row, nothing recorded")
		return out, true
	}
	if err != nil {
		return providers.Retry(fmt.Errorf("record delivery: %w", err)), false
	}
	if err := tx.Commit(ctx); err != nil {
		// Whether the commit happened is unknown; if it did not, the lease expires and the row is delivered
		// again, which the unique constraint keeps to one insert.
		log.Warn("commit of a delivery failed; the row will be rescued after its lease", "err", err)
		return out, true
	}
	metrics.Finished.WithLabelValues(t.Name, "delivered").Inc()
	d.finishedEffect(r.id)
	return out, true
}

// dbContext bounds a write that must happen even while shutting down.
func dbContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (d *Dispatcher) finish(log *slog.Logger, t *effectType, r row, status string, result []byte, lastErr string, add int) {
	ctx, cancel := dbContext()
	defer cancel()
	var errArg any
	if lastErr != "" {
		errArg = lastErr
	}
	var id int64
	err := d.pool.QueryRow(ctx, finishSQL, r.id, r.token, status, nullJSON(result), errArg, add).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		log.Warn("lease lost before the outcome was recorded; another dispatcher owns the row", "status", status)
	case err != nil:
		log.Error("recording the outcome failed; the row will be rescued after its lease", "status", status, "err", err)
	default:
		metrics.Finished.WithLabelValues(t.Name, status).Inc()
		d.finishedEffect(r.id)
	}
}

// finishedEffect wakes this gateway's waiters at once and queues the ID for the other gateways.
func (d *Dispatcher) finishedEffect(id int64) {
	if d.cfg.OnFinished != nil {
		d.cfg.OnFinished(id)
	}
	d.finishedMu.Lock()
	d.finished = append(d.finished, id)
	first := len(d.finished) == 1
	d.finishedMu.Unlock()
	if first {
		select {
		case d.notifyNow <- struct{}{}:
		default:
		}
	}
}

// notifyFinished sends the IDs of finished effects to other gateways: one NOTIFY for all that finished while
// the previous one was sent, at most every 5 ms, each payload under Postgres's 8000-byte limit.
func (d *Dispatcher) notifyFinished(ctx context.Context) {
	for {
		select {
		case <-d.notifyNow:
		case <-ctx.Done():
		}
		d.finishedMu.Lock()
		ids := d.finished
		d.finished = nil
		d.finishedMu.Unlock()
		for len(ids) > 0 {
			var b strings.Builder
			for len(ids) > 0 && b.Len() < 7900 {
				if b.Len() > 0 {
					b.WriteByte(',')
				}
				b.WriteString(strconv.FormatInt(ids[0], 10))
				ids = ids[1:]
			}
			nctx, cancel := dbContext()
			if _, err := d.pool.Exec(nctx, "SELECT pg_notify('oncegate_effect_done', $1)", b.String()); err != nil {
				d.log.Warn("notifying other gateways of finished effects failed; their waiters poll on", "err", err)
			}
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		sleep(ctx, 5*time.Millisecond)
	}
}

func (d *Dispatcher) reschedule(log *slog.Logger, r row, delay time.Duration, lastErr string, add int) {
	ctx, cancel := dbContext()
	defer cancel()
	var errArg any
	if lastErr != "" {
		errArg = lastErr
	}
	var id int64
	err := d.pool.QueryRow(ctx, rescheduleSQL, r.id, r.token, delay.Milliseconds(), errArg, add).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		log.Warn("lease lost before the row was rescheduled; another dispatcher owns it")
	case err != nil:
		log.Error("rescheduling failed; the row will be rescued after its lease", "err", err)
	}
}

// purge deletes effects past retention, in batches, until none is left or ctx ends.
func (d *Dispatcher) purge(ctx context.Context) {
	const batch = 1000
	total := int64(0)
	for ctx.Err() == nil {
		tag, err := d.pool.Exec(ctx, purgeSQL, d.cfg.Retention.Milliseconds(), batch)
		if err != nil {
			d.log.Warn("purging expired effects failed", "err", err)
			return
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < batch {
			break
		}
	}
	if total > 0 {
		d.log.Info("purged effects past retention", "effects", total, "retention", d.cfg.Retention.String())
	}
}

// Purge runs one retention purge now.
func (d *Dispatcher) Purge(ctx context.Context) { d.purge(ctx) }

// Backlog is the outbox of one effect type: rows waiting, and the age of the oldest one that is due.
type Backlog struct {
	Type      string
	Rows      int64
	OldestDue time.Duration
}

// Backlogs reads the outbox backlog per effect type.
func Backlogs(ctx context.Context, pool *pgxpool.Pool) ([]Backlog, error) {
	rs, err := pool.Query(ctx, backlogSQL)
	if err != nil {
		return nil, fmt.Errorf("outbox: backlog: %w", err)
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Backlog, error) {
		var b Backlog
		var secs float64
		err := r.Scan(&b.Type, &b.Rows, &secs)
		b.OldestDue = time.Duration(secs * float64(time.Second))
		return b, err
	})
}

func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
