// Package gateway is oncegate's HTTP service: workers ask it to perform a side effect under an idempotency
// key, and it performs that effect once, however often it is asked. It records each effect and its outbox
// row in one transaction, which claims its key in the table where keys are unique (package dedup), and runs
// the dispatcher that delivers outbox rows to providers (package outbox) in the same process.
//
// It runs on Postgres directly or behind PgBouncer in transaction pooling mode (database.go): there it uses
// no prepared statement and no session state, listens for notifications only on a connection of its own
// (listen_url), proves with a self-check that they arrive, and polls whenever they do not (notify.go).
//
// Its promise to a client: a request that got a 2xx was recorded and will be delivered (or end failed, dead
// or unknown, visible on the effect); a request that got anything else recorded nothing, and retrying it
// with the same key is always safe.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/notifier"
	"github.com/oncegate/oncegate/internal/tenantlimit"
	"github.com/oncegate/oncegate/migrations"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/partitions"
	"github.com/oncegate/oncegate/providers"
)

// Gateway is the HTTP API and the dispatcher over one database.
type Gateway struct {
	cfg      *Config
	log      *slog.Logger
	pool     *pgxpool.Pool
	outcomes *pgxpool.Pool // nil: outcomes share pool (database.go, newOutcomePool)
	probe    *poolerProbe
	budgetMu sync.Mutex
	budget   connBudget // the fleet's connections as last judged (connbudget.go)
	store    *dedup.Store
	// follow holds the fleet's retentions, which the store and the dispatcher's write by (followFleet);
	// followed is the last of them this gateway logged.
	follow     *dedup.Follow
	followed   atomic.Pointer[partitions.Retentions]
	dispatcher *outbox.Dispatcher
	providers  *providers.Registry
	// heard is set while the notification self-check passes (notify.go); until then, the gateway polls fast.
	heard atomic.Bool
	// managing is set once this gateway runs the partition manager: its heartbeat then says which settings
	// it runs with (partitionSettings). A gateway that runs none (behind a pooler without ddl_url) must not
	// hold the fleet's settings alive, or a change of them would wait for it while no one makes partitions.
	managing atomic.Bool
	// replicationSeen is the ReplicationState last logged (replication.go).
	replicationSeen atomic.Value
	// syncReplication is set while the database makes commits wait for a synchronous standby: a replay then
	// runs a durability barrier before it acknowledges (durable.go). barrierSlot spreads barriers over rows.
	syncReplication atomic.Bool
	barrierSlot     atomic.Uint32
	// newEffects tells the other gateways' dispatchers of new effects, outside the requests' transactions.
	newEffects    *notifier.Batcher
	noServerSpans bool // Options.NoServerSpans
	keys          []apiKey
	limiter       *tenantlimit.Limiter
	held          *held                      // each tenant's requests held open (held.go)
	gate          *connGate                  // the connections, set when Serve begins (conngate.go)
	allowed       map[string]map[string]bool // tenant → the effect types it may use; none listed: all
	waiters       *waiters
	proxyAnswers  attempts // the answers of proxied attempts that ended transiently, for their waiters
	router        *mux.Router
	handler       http.Handler // router, behind refuseDotSegments
	metrics       *metrics
	registry      *prometheus.Registry // metrics.registry: what /metrics serves

	// replays and attempts gather, for the operator, the replays absorbed and the delivery attempts made,
	// and write them in batches (dedup.ReplayLog, dedup.AttemptLog).
	replays  *dedup.ReplayLog
	attempts *dedup.AttemptLog
}

// Options are what a gateway takes besides its configuration file.
type Options struct {
	Logger *slog.Logger
	// DispatcherOwner names this gateway's leases; defaults to host, PID and a random suffix.
	DispatcherOwner string
	// DriverTracing makes the spans of Postgres calls (telemetry.Telemetry.Children: only inside a trace).
	// Nil traces no database calls.
	DriverTracing trace.TracerProvider
	// NoServerSpans starts no span per request: the caller's trace context is still read from the request's
	// headers and goes on, with the effect, to its delivery. The gateway binary sets it when no exporter is
	// configured (telemetry.Exporting), where otelhttp's work for each request (attributes, metrics, a span
	// that records nothing) was a tenth of the gateway's CPU.
	NoServerSpans bool
}

// New connects to the database (lazily: a database that is down makes requests fail with 503, not New) and
// builds the gateway. A nil cfg is all defaults; unset fields take theirs (Config.WithDefaults).
func New(cfg *Config, opts Options) (*Gateway, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("gateway: config: %w", err)
	}
	reg, err := cfg.registry()
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	outcomeConns := int32(0)
	pool, probe, err := newPool(context.Background(), cfg, log, func(pcfg *pgxpool.Config) {
		if opts.DriverTracing != nil {
			pcfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(opts.DriverTracing))
		}
		// Only a dispatcher that batches records outcomes apart (an API-only gateway records none).
		if !cfg.Dispatcher.Disabled && cfg.GroupCommit.MaxBatch > 1 {
			outcomeConns = outcomeShare(pcfg.MaxConns, cfg.GroupCommit.Parallel)
			pcfg.MaxConns -= outcomeConns
		}
		// The partition manager holds a connection of its own to database_url while it holds its lock
		// (partitions.go): carved out of the pool too, so that pool_max_conns and the listener still bound
		// what a gateway opens (TestPoolMaxConnsIsRespected saw one more). A pool of 2 or fewer keeps both.
		if !cfg.Partitions.Disabled && cfg.ListenURL == "" && pcfg.MaxConns > 2 {
			pcfg.MaxConns--
		}
	}, true)
	if err != nil {
		_ = reg.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	groupCommit := dedup.GroupCommit{MaxBatch: cfg.GroupCommit.MaxBatch, Parallel: cfg.GroupCommit.Parallel,
		Timeout: time.Duration(cfg.Timeouts.Database)}
	var outcomes *pgxpool.Pool
	if outcomeConns > 0 {
		if outcomes, err = newOutcomePool(pool, outcomeConns, int32(2*max(cfg.GroupCommit.Parallel, 1)), log); err != nil {
			pool.Close()
			_ = reg.Close()
			return nil, fmt.Errorf("gateway: %w", err)
		}
		groupCommit.Outcomes = outcomes
	}
	types := cfg.outboxTypes(reg)
	// The fleet's retentions, once known, win over this gateway's own (followFleet).
	follow := &dedup.Follow{}
	store := dedup.NewStore(pool).WithRetention(time.Duration(cfg.Retention.Keys))
	if cfg.Retention.Payloads > 0 {
		store = store.WithBodiesApart()
	}
	store = store.Following(follow).WithGroupCommit(groupCommit)
	m := newMetrics(store, time.Duration(cfg.Timeouts.Metrics), map[string]*pgxpool.Pool{"main": pool, "outcomes": outcomes},
		slices.Sorted(maps.Keys(cfg.EffectTypes)))
	// Each tenant's refusals are counted from 0, so that a rate of them reads 0, not a missing series.
	for tenant := range cfg.Tenants {
		for _, bucket := range []string{"requests", "bytes", "connections"} {
			m.rateLimited.WithLabelValues(tenant, bucket)
		}
	}
	w := newWaiters()
	attempts := dedup.NewAttemptLog(pool, 0, log)
	d, err := outbox.New(pool, outbox.Config{
		Attempts:    attempts,
		Types:       types,
		Owner:       opts.DispatcherOwner,
		Retention:   time.Duration(cfg.Retention.Keys),
		BodiesApart: cfg.Retention.Payloads > 0,
		Follow:      follow,
		// The partition manager retires effects by dropping their partitions; the row-by-row purge is for a
		// gateway whose partitions something else keeps (partitions.disabled).
		PurgeInterval: cfg.purgeInterval(),
		PollInterval:  time.Duration(cfg.Dispatcher.PollInterval),
		LeaseMargin:   time.Duration(cfg.Dispatcher.LeaseMargin),
		DrainTimeout:  time.Duration(cfg.Dispatcher.DrainTimeout),
		GroupCommit:   groupCommit,
		OnFinished:    w.wake,
		Metrics:       m.dispatcher,
		Logger:        log,
	})
	if err != nil {
		pool.Close()
		if outcomes != nil {
			outcomes.Close()
		}
		_ = reg.Close()
		return nil, err
	}
	g := &Gateway{cfg: cfg, log: log, pool: pool, outcomes: outcomes, probe: probe, store: store, follow: follow, dispatcher: d, providers: reg,
		waiters: w, metrics: m, registry: m.registry, replays: dedup.NewReplayLog(pool, 0, log), attempts: attempts,
		newEffects: notifier.NewBatcher(pool, notifier.TopicOutbox, notifyInterval, log), noServerSpans: opts.NoServerSpans}
	m.registry.MustRegister(replicationCollector{g: g, timeout: time.Duration(cfg.Timeouts.Metrics)})
	tenants := make([]string, 0, len(cfg.Tenants))
	for t := range cfg.Tenants {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	g.allowed = map[string]map[string]bool{}
	for _, t := range tenants {
		for _, k := range cfg.Tenants[t].APIKeys {
			h, _ := keyHash(k) // checked by validate
			g.keys = append(g.keys, apiKey{hash: h, tenant: t})
		}
		if types := cfg.Tenants[t].EffectTypes; types != nil {
			g.allowed[t] = map[string]bool{}
			for _, typ := range types {
				g.allowed[t][typ] = true
			}
		}
	}
	g.limiter = tenantlimit.NewShared(func(tenant string) tenantlimit.Limits { return cfg.Tenants[tenant].Rate.limits() },
		pool, log)
	g.held = newHeld(func(tenant string) int { return cfg.Tenants[tenant].HeldRequests }, m.held)
	// Every tenant's series from the start, at 0, so that a rate over them is defined before the first cut.
	for _, t := range tenants {
		m.held.WithLabelValues(t).Set(0)
		for _, what := range []string{"wait", "shed", "body"} {
			m.heldCut.WithLabelValues(t, what)
		}
	}
	g.router = g.routes()
	g.handler = refuseDotSegments(g.router)
	return g, nil
}

// Close releases the database pool and the providers.
func (g *Gateway) Close() {
	g.limiter.Close() // its takes of tokens in flight use the pool
	g.pool.Close()
	if g.outcomes != nil {
		g.outcomes.Close()
	}
	_ = g.providers.Close()
}

// Handler returns the HTTP API.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Migrate applies pending migrations, waiting up to timeouts.migration_lock for a gateway that migrates
// meanwhile.
func (g *Gateway) Migrate(ctx context.Context) error {
	return migrate(ctx, g.pool, g.probe, g.log, time.Duration(g.cfg.Timeouts.MigrationLock))
}

// Migrate applies pending migrations to the database at databaseURL, without a gateway: `gateway migrate`
// with no configuration file, which needs neither tenants nor effect types.
func Migrate(ctx context.Context, databaseURL string, log *slog.Logger) error {
	pool, _, err := newPool(ctx, &Config{DatabaseURL: databaseURL}, log, nil, false)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrate(ctx, pool, nil, log, DefaultMigrationLock)
}

// migrate applies pending migrations on connections of its own, made as pool's are. probe, when not nil, is
// the pool's: its connections straight to Postgres keep generic plans (newPool), which the migrations' put back.
func migrate(ctx context.Context, pool *pgxpool.Pool, probe *poolerProbe, log *slog.Logger, lockWait time.Duration) error {
	// Connections of their own, two: the migration lock is held on one while the migrations run on the
	// other, so on a pool of one (pool_max_conns=1) the migrations waited for the lock's connection forever,
	// past timeouts.migration_lock (an outside tester's gateway never started on an empty database).
	cfg := pool.Config()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 2, 0, 0
	// A long migration says how far it is (00018's copy of the keys) with a notice; the operator reads it here.
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		log.Info("migration: "+n.Message, "severity", n.Severity)
	}
	// Migrations plan as Postgres chooses, not with the gateway's generic plans (newPool): RESET goes back to
	// what database_url, the role or the database chose, or to auto. Only where newPool set them: through a
	// pooler it set nothing, and a RESET there would change a server connection other clients are handed.
	if probe != nil {
		onDirectConnect(cfg, probe, "RESET plan_cache_mode", "migration connections: plan_cache_mode")
	}
	own, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("database_url: migration connections: %w", err)
	}
	defer own.Close()
	db := stdlib.OpenDBFromPool(own)
	defer db.Close()
	v, err := migrations.UpWithin(ctx, db, log, lockWait)
	if err != nil {
		return err
	}
	log.Info("database schema is current", "version", v)
	return nil
}

// Check asks every provider that can check its destination (providers.Checker) whether it can deliver:
// a start that could only send every effect of a type to dead letters stops, saying what to fix. A check
// that cannot run (the database is down) is logged, and does not stop the start. It also logs what a
// failover of the database would lose (replication.go): a warning unless it is nothing.
func (g *Gateway) Check(ctx context.Context) error {
	g.logReplication(ctx, true)
	var errs []error
	for _, name := range g.providers.Names() {
		p, _ := g.providers.Get(name)
		c, ok := p.(providers.Checker)
		if !ok {
			continue
		}
		err := c.Check(ctx, g.pool)
		switch {
		case errors.Is(err, providers.ErrCannotCheck):
			// A gateway starts without its database, and answers 503 until it is back.
			g.log.Warn("could not check the destination of an effect type at start-up", "type", name, "err", err)
		case err != nil:
			errs = append(errs, fmt.Errorf("effect type %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
