// Package outbox delivers effects from the transactional outbox to their providers: it is the policy of
// delivery, while package dedup owns the rows. Any number of gateways can run a Dispatcher against one
// database: rows are leased with SELECT … FOR UPDATE SKIP LOCKED, a lease token fences every outcome (only the
// current holder can record one), and a gateway that dies mid-delivery leaves leases that expire, so another
// gateway rescues its rows within the lease time.
//
// The guarantee is that an accepted effect is delivered, failed for good, dead after its retries, or left
// "unknown" for an operator; never lost. Transient failures are retried with exponential backoff and full
// jitter (honouring a destination's Retry-After), one circuit breaker per destination of each tenant and
// effect type (breakers.go) keeps that destination's rows waiting, uncharged, while it is down, and holds
// back no other, and what a crash between a provider's success and the
// commit that records it can do is decided per effect type (OnCrash) and per provider (providers.TxProvider).
//
// PerformNew and PerformExisting (perform.go) are the dedup proxy's one call into delivery: they lease a row
// for a request (a new effect, or an existing one the request is entitled to: a request that waited for an
// attempt may not take a row whose awaited attempt ended, in any gateway) and run the same delivery in the
// request, so that path has the same breaker, outcomes and fenced record as every other.
//
// What happens to a row after each attempt is decided by one pure function, decide (decide.go). Each
// background duty runs in a loop of its own: claiming (claimer.go), delivering (deliver.go), telling other
// gateways of finished effects (notify.go) and retention (purge.go). docs/effects.md draws the state machine.
package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/internal/notifier"
	"github.com/oncegate/oncegate/internal/workers"
	"github.com/oncegate/oncegate/providers"
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
	DefaultConcurrency = 16
	// DefaultBatchTxConcurrency is a BatchTxProvider's: its slots are rows in batches, a few transactions in
	// all, so it can have many more than a provider whose every slot is a call waiting on a destination.
	DefaultBatchTxConcurrency = 128
	DefaultTimeout            = 10 * time.Second
	DefaultMaxAttempts        = 10
	DefaultBreakerFailures    = 5
	DefaultBreakerOpenFor     = 30 * time.Second
	DefaultLeaseMargin        = 5 * time.Second
	DefaultPollInterval       = time.Second
	DefaultBatchSize          = 32
	DefaultDrainTimeout       = 10 * time.Second
	DefaultRetention          = dedup.DefaultRetention
	DefaultPurgeInterval      = time.Minute
	DefaultPurgeBatchSize     = 1000
	DefaultDBTimeout          = 10 * time.Second
	DefaultClaimTimeout       = 10 * time.Second
	DefaultMaxBreakers        = 1000
	DefaultBreakerIdle        = 10 * time.Minute
)

// EffectType is how the dispatcher delivers one effect type.
type EffectType struct {
	Name     string
	Provider providers.Provider
	// ProviderKind names the provider's kind (smtp, webhook, ...) in metrics. Defaults to its Go package.
	ProviderKind string
	// Concurrency bounds the deliveries of this type in flight in one gateway. Defaults to DefaultConcurrency.
	Concurrency int
	// TenantConcurrency bounds the deliveries of this type in flight in one gateway for one tenant, so that one
	// tenant's hanging destinations cannot take every slot and hold back the others' deliveries. Defaults to
	// half of Concurrency (at least 1).
	TenantConcurrency int
	// Timeout bounds one provider call. The lease is Timeout plus Config.LeaseMargin. Defaults to
	// DefaultTimeout.
	Timeout time.Duration
	// MaxAttempts is how many failed attempts make the effect dead. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// Retry shapes the delay between attempts (exponential, full jitter). Defaults to 1s, capped at 10m.
	Retry backoff.Policy
	// OnCrash defaults to AtLeastOnce. A TxProvider ignores it: it has no crash window.
	OnCrash OnCrash
	// BreakerFailures consecutive failures to one destination open its breaker for BreakerOpenFor. Default
	// to DefaultBreakerFailures and DefaultBreakerOpenFor. The provider names a delivery's destination
	// (providers.Router); each tenant's destinations have breakers of their own.
	BreakerFailures uint32
	BreakerOpenFor  time.Duration
	// Rate, when set, limits this type's calls to each destination across every gateway that shares the
	// database (rates.go). Nil is unlimited, and costs the claim nothing.
	Rate *Rate
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
	// ClaimTimeout bounds one claim statement, which is never cancelled midway otherwise. Defaults to
	// DefaultClaimTimeout.
	ClaimTimeout time.Duration
	// DBTimeout bounds each write that records an outcome or sends a notification; these run even while
	// shutting down, so they cannot take the caller's context. Defaults to DefaultDBTimeout.
	DBTimeout time.Duration
	// DrainTimeout is how long Run waits at shutdown for deliveries in flight before cancelling them and
	// handing their rows back. Defaults to DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Retention is how long terminal effects (and so their keys) are kept. Defaults to DefaultRetention.
	Retention time.Duration
	// BodiesApart: the effects the dispatcher creates (the dedup proxy's) keep their payloads and answers in
	// oncegate_effect_bodies (dedup.Store.WithBodiesApart; the gateway's retention.payloads).
	BodiesApart bool
	// Follow, when set, overrides Retention's keys and BodiesApart for the effects the dispatcher creates, as
	// it changes: the fleet's settings, which the gateway follows (dedup.Follow).
	Follow *dedup.Follow
	// PurgeInterval is how often expired effects are purged, row by row. Defaults to DefaultPurgeInterval;
	// negative: never (retention drops partitions instead: package partitions).
	PurgeInterval time.Duration
	// PurgeBatchSize bounds the effects one purge statement deletes, so that no purge holds many locks or
	// runs long. Defaults to DefaultPurgeBatchSize.
	PurgeBatchSize int
	// GroupCommit batches the outcomes that deliveries finish at about the same time into one statement and
	// one commit (dedup.GroupCommit), and a BatchTxProvider's rows claimed together into one transaction
	// (batchtx.go). Defaults to dedup.DefaultGroupCommit; MaxBatch 1 records each outcome alone and delivers
	// each TxProvider row in a transaction of its own.
	GroupCommit dedup.GroupCommit
	// OnFinished is called with the ID of every effect this dispatcher brought to a terminal status, for the
	// gateway's own waiters. Other gateways learn of it from a notification on notifier.TopicEffectDone.
	OnFinished func(id int64)
	// MaxBreakers bounds the circuit breakers kept for one effect type and tenant: beyond it, the least
	// recently used closed one is forgotten, or, when all are open or busy, further destinations share one.
	// Defaults to DefaultMaxBreakers.
	MaxBreakers int
	// BreakerIdle is how long a breaker that no delivery used is kept. At least twice the longest
	// BreakerOpenFor plus Timeout, so that a breaker is never forgotten while rows wait on it. Defaults to
	// DefaultBreakerIdle.
	BreakerIdle time.Duration
	// Attempts, when set, is given every delivery attempt, for the operator (attempts.go). Nil records none.
	Attempts *dedup.AttemptLog
	// Metrics are the collectors the dispatcher records into. Defaults to a set of its own (NewMetrics) that
	// no registry serves.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	o := *c
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n <= 0 {
			*n = v
		}
	}
	def(&o.LeaseMargin, DefaultLeaseMargin)
	def(&o.PollInterval, DefaultPollInterval)
	def(&o.ClaimTimeout, DefaultClaimTimeout)
	def(&o.DBTimeout, DefaultDBTimeout)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	def(&o.Retention, DefaultRetention)
	if o.PurgeInterval == 0 { // negative is off
		o.PurgeInterval = DefaultPurgeInterval
	}
	defInt(&o.BatchSize, DefaultBatchSize)
	defInt(&o.PurgeBatchSize, DefaultPurgeBatchSize)
	defInt(&o.MaxBreakers, DefaultMaxBreakers)
	def(&o.BreakerIdle, DefaultBreakerIdle)
	if o.GroupCommit.MaxBatch == 0 {
		o.GroupCommit = dedup.DefaultGroupCommit
	}
	def(&o.GroupCommit.Timeout, o.DBTimeout)
	if o.Owner == "" {
		host, _ := os.Hostname()
		o.Owner = fmt.Sprintf("%s/%d/%x", host, os.Getpid(), time.Now().UnixNano()&0xffffff)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Types = make([]EffectType, len(c.Types))
	for i, t := range c.Types {
		if t.Name == "" || t.Provider == nil {
			return o, fmt.Errorf("outbox: effect type %d has no name or provider", i)
		}
		if _, ok := t.Provider.(providers.BatchTxProvider); ok {
			defInt(&t.Concurrency, DefaultBatchTxConcurrency)
		}
		defInt(&t.Concurrency, DefaultConcurrency)
		defInt(&t.TenantConcurrency, max(1, t.Concurrency/2))
		t.TenantConcurrency = min(t.TenantConcurrency, t.Concurrency)
		def(&t.Timeout, DefaultTimeout)
		defInt(&t.MaxAttempts, DefaultMaxAttempts)
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
		if t.Rate != nil {
			if !(t.Rate.PerSecond > 0) {
				return o, fmt.Errorf("outbox: effect type %s: rate %v a second: want more than 0", t.Name, t.Rate.PerSecond)
			}
			r := *t.Rate
			defInt(&r.Burst, DefaultBurst(r.PerSecond))
			t.Rate = &r
		}
		o.BreakerIdle = max(o.BreakerIdle, 2*(t.BreakerOpenFor+t.Timeout))
		o.Types[i] = t
	}
	return o, nil
}

type effectType struct {
	EffectType
	policy   policy
	lease    time.Duration
	kind     string // ProviderKind
	batchTx  bool   // a providers.BatchTxProvider with group commit on: rows claimed together deliver together
	inflight atomic.Int32
	woken    atomic.Bool // a notification named this type since the claim loop last looked (wakeWoken)

	tenantsMu sync.Mutex
	tenants   map[string]int // deliveries in flight per tenant, for TenantConcurrency
}

// saturated lists the tenants a claim of t leaves out (claimLimits).
func (t *effectType) saturated() []string {
	out, _ := t.claimLimits()
	return out
}

// claimLimits returns the tenants a claim must skip, in name order, and how many rows the claim may take so
// that no tenant it can bring is taken past its share: TenantConcurrency less the most any other tenant has
// in flight. A claim that took more would hand the excess back, one write per row, on every slot that frees
// up: with one busy tenant that cost more than the deliveries (issue 14).
//
// A tenant is skipped from a quarter of its share short of it, and so is refilled a quarter at a time, as a
// type with a backlog is: refilled at each delivery that ended, a tenant with a backlog cost a claim for
// its one row and a second claim that skipped it and found nothing, two claims a delivery, which held
// Postgres's cores while another tenant's new effects waited for them (the fleet bench, issue 31).
func (t *effectType) claimLimits() (saturated []string, headroom int) {
	t.tenantsMu.Lock()
	defer t.tenantsMu.Unlock()
	busiest := 0
	full := t.TenantConcurrency - max(1, t.TenantConcurrency/4)
	for tenant, n := range t.tenants {
		if n > full {
			saturated = append(saturated, tenant)
		} else {
			busiest = max(busiest, n)
		}
	}
	slices.Sort(saturated)
	return saturated, t.TenantConcurrency - busiest
}

// admit counts a delivery of tenant's in flight, unless tenant has its share already and enforce is set.
func (t *effectType) admit(tenant string, enforce bool) bool {
	t.tenantsMu.Lock()
	defer t.tenantsMu.Unlock()
	if enforce && t.tenants[tenant] >= t.TenantConcurrency {
		return false
	}
	if t.tenants == nil {
		t.tenants = map[string]int{}
	}
	t.tenants[tenant]++
	return true
}

func (t *effectType) done(tenant string) {
	t.tenantsMu.Lock()
	defer t.tenantsMu.Unlock()
	if t.tenants[tenant]--; t.tenants[tenant] <= 0 {
		delete(t.tenants, tenant)
	}
}

// Dispatcher delivers outbox rows. Create it with New and run it with Run.
type Dispatcher struct {
	pool     *pgxpool.Pool
	store    *dedup.Store
	cfg      Config
	types    []*effectType
	breakers *breakerSet
	pauses   pauses // the fleet's paused destinations, as this dispatcher knows them (rates.go)
	probes   probes // the probes of pauses out here (probe.go)
	// probeWake: a pause this dispatcher set ends (probe.go).
	probeWake chan struct{}
	metrics   *Metrics
	log       *slog.Logger
	wake      chan struct{}
	freed     chan struct{}
	// backlogSeen: a claim came back full (statsLoop).
	backlogSeen chan struct{}

	done *notifier.Batcher // the IDs of effects finished here, for the other gateways (notify.go)

	running running // what Created needs of Run (expedite.go)

	signals testSignals
}

var tracer = otel.Tracer("github.com/oncegate/oncegate/outbox")

// New returns a dispatcher for the effect types of cfg.
func New(pool *pgxpool.Pool, cfg Config) (*Dispatcher, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	store := dedup.NewStore(pool).WithRetention(c.Retention)
	if c.BodiesApart {
		store = store.WithBodiesApart()
	}
	if c.Follow != nil {
		store = store.Following(c.Follow)
	}
	d := &Dispatcher{pool: pool, store: store.WithGroupCommit(c.GroupCommit), cfg: c, metrics: c.Metrics,
		log:  c.Logger.With("component", "dispatcher", "owner", c.Owner),
		wake: make(chan struct{}, 1), freed: make(chan struct{}, 1),
		backlogSeen: make(chan struct{}, 1), probeWake: make(chan struct{}, 1)}
	d.done = newDoneBatcher(pool, d.log)
	d.breakers = newBreakerSet(c.MaxBreakers, c.BreakerIdle, d.metrics, d.log)
	for _, t := range c.Types {
		_, isTx := t.Provider.(providers.TxProvider)
		_, isBatchTx := t.Provider.(providers.BatchTxProvider)
		et := &effectType{EffectType: t, lease: t.Timeout + c.LeaseMargin, policy: policy{onCrash: t.OnCrash,
			tx: isTx, maxAttempts: t.MaxAttempts, retryDelay: t.Retry.Delay},
			batchTx: isBatchTx && c.GroupCommit.MaxBatch > 1, kind: providerKind(t)}
		d.metrics.BreakersOpen.WithLabelValues(t.Name).Set(0)
		// Known from the start, as Prometheus's guidance has it, so that a rate of it is 0, not missing, until
		// the type's first pause ends.
		d.metrics.Probes.WithLabelValues(t.Name)
		d.types = append(d.types, et)
	}
	return d, nil
}

// providerKind is t's ProviderKind, or the Go package of its provider.
func providerKind(t EffectType) string {
	if t.ProviderKind != "" {
		return t.ProviderKind
	}
	name := strings.TrimPrefix(fmt.Sprintf("%T", t.Provider), "*")
	if i := strings.IndexByte(name, '.'); i > 0 {
		name = name[:i]
	}
	return name
}

// Wake makes the dispatcher look for due rows of every type now: the gateway calls it when notifications
// may have been lost, and when it polls for want of them.
func (d *Dispatcher) Wake() {
	for _, t := range d.types {
		t.woken.Store(true)
		d.pauses.stale(t.Name)
	}
	d.signalWake()
}

// WakeType makes the dispatcher look for due rows of the named type now: a notification on
// notifier.TopicOutbox names the types of the rows it announces. A type this dispatcher does not deliver is
// none of its business.
func (d *Dispatcher) WakeType(name string) {
	for _, t := range d.types {
		if t.Name == name {
			t.woken.Store(true)
			d.pauses.stale(t.Name)
			d.signalWake()
		}
	}
}

func (d *Dispatcher) signalWake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run delivers until ctx ends, then shuts down: it stops claiming, waits up to DrainTimeout for deliveries in
// flight, cancels the rest and hands their rows back, unattempted, for any gateway to take. The purge and the
// notifications of finished effects run beside the claim loop, each in its own goroutine, so neither holds up
// claiming.
// deliveryIdle is how long a goroutine that ran a delivery waits for the next before it ends (package workers).
const deliveryIdle = 10 * time.Second

func (d *Dispatcher) Run(ctx context.Context) error {
	deliveries, cancelDeliveries := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDeliveries()
	// The notifier outlives the deliveries, so that the last of them still reach the other gateways' waiters.
	notifyCtx, stopNotify := context.WithCancel(context.WithoutCancel(ctx))
	var duties sync.WaitGroup
	duties.Go(func() { d.done.Run(notifyCtx) })
	if d.cfg.PurgeInterval > 0 {
		duties.Go(func() { d.purgeLoop(ctx) })
	}
	duties.Go(func() { d.statsLoop(ctx) })
	defer func() { stopNotify(); duties.Wait() }()

	inflight := workers.New(deliveryIdle)
	defer inflight.Close()
	d.running.start(ctx, deliveries, inflight)
	var probing sync.WaitGroup
	probing.Go(func() { d.probeLoop(ctx, deliveries, inflight) })
	d.claimLoop(ctx, deliveries, inflight)
	d.running.stop()
	probing.Wait()

	drained := make(chan struct{})
	go func() { inflight.Wait(); close(drained) }()
	drain := time.NewTimer(d.cfg.DrainTimeout)
	defer drain.Stop()
	select {
	case <-drained:
	case <-drain.C:
		d.log.Warn("drain timeout: cancelling deliveries in flight and handing their rows back")
		cancelDeliveries()
		<-drained
	}
	return nil
}

// dbContext bounds a write that must happen even while shutting down.
func (d *Dispatcher) dbContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d.cfg.DBTimeout)
}
