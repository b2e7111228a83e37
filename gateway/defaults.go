package gateway

// The defaults: every default of the configuration is a constant here (or, for the outbox's and the
// group commit's, an alias of its owning package's), and WithDefaults is the one place that fills them in.

import (
	"maps"
	"os"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/migrations"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/partitions"
	"github.com/oncegate/oncegate/providers/postgres"
)

// Defaults of Config. Every field has one except tenants, which a file must name (Config.Dev alone, from
// `serve --dev`, brings a built-in dev tenant): a gateway whose keys nobody chose must not serve.
const (
	DefaultListen      = "127.0.0.1:8080"
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/oncegate?sslmode=disable"
	// DefaultTenant and DefaultAPIKey are the built-in tenant of `serve --dev`, which listens on loopback only.
	DefaultTenant     = "dev"
	DefaultAPIKey     = "oncegate-dev-key-for-loopback-only"
	DefaultEffectType = "analytics"

	// MaxGroupCommitBatch bounds group_commit.max_batch: a batch's arrays are one statement's parameters.
	MaxGroupCommitBatch = 1000
	// MaxPartitionsAhead bounds partitions.ahead: a pass makes every table's partitions ahead in one
	// transaction.
	MaxPartitionsAhead = 100

	// MinAPIKeyLength is the shortest plain API key accepted: `gateway keygen` makes keys of 46 characters.
	MinAPIKeyLength = 32

	// DefaultMaxConns is the pool size when database_url has no pool_max_conns: the gateway's requests and
	// its dispatcher share the pool, and pgx's own default (the number of CPUs, at least 4) starves them.
	DefaultMaxConns = 40
	// DefaultConnectTimeout bounds a new database connection when database_url has no connect_timeout.
	DefaultConnectTimeout = 3 * time.Second

	DefaultMaxBody     = 256 << 10
	DefaultPageSize    = 50
	DefaultMaxPageSize = 500

	// DefaultMaxHeader bounds a request's headers: ours are an API key, an idempotency key (255 bytes at
	// most), a job id (512) and trace context, far below it.
	DefaultMaxHeader = 16 << 10
	// DefaultMaxConnections caps open client connections. It is high, since waiting requests (wait, up to
	// MaxWait) hold theirs; connections that hold no request are closed to make room past a quarter of it.
	DefaultMaxConnections = 1024

	// DefaultTenantHeldRequests is each tenant's held requests (waits, bodies arriving) per gateway process:
	// enough for a worker fleet's waits on one gateway of several, a sixteenth of the default connections.
	DefaultTenantHeldRequests = 64

	// The default rate of each tenant, per gateway process (DefaultTenantRateScope).
	DefaultTenantRateScope         = ScopeGateway
	DefaultTenantRequestsPerSecond = 500
	DefaultTenantRequestBurst      = 1000
	DefaultTenantBytesPerSecond    = 8 << 20
	DefaultTenantByteBurst         = 16 << 20

	DefaultDatabaseTimeout   = 5 * time.Second
	DefaultShutdownTimeout   = 10 * time.Second
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout bounds reading a whole request, body included: 256 KiB in 15 s is 17 KB/s.
	DefaultReadTimeout = 15 * time.Second
	// DefaultWriteTimeout runs from the end of a request's headers to the end of its response, so it holds the
	// body's reading, the longest wait and the database work around it (validate checks that it does).
	DefaultWriteTimeout = 60 * time.Second
	// DefaultIdleTimeout closes a keep-alive connection that sends no new request.
	DefaultIdleTimeout    = 15 * time.Second
	DefaultReadyTimeout   = 3 * time.Second
	DefaultMetricsTimeout = 2 * time.Second

	DefaultOnCrash         = outbox.AtLeastOnce
	DefaultTimeout         = outbox.DefaultTimeout
	DefaultConcurrency     = outbox.DefaultConcurrency
	DefaultMaxAttempts     = outbox.DefaultMaxAttempts
	DefaultBaseDelay       = backoff.DefaultBase
	DefaultMaxDelay        = backoff.DefaultMax
	DefaultBreakerFailures = outbox.DefaultBreakerFailures
	DefaultBreakerOpenFor  = outbox.DefaultBreakerOpenFor
	// MaxDeliveryRate bounds a type's rate.per_second: a limit above it would cost a statement a token for
	// no protection (use none). MaxDeliveryBurst bounds rate.burst.
	MaxDeliveryRate  = 10000
	MaxDeliveryBurst = 100000
	// MinRate is the slowest rate a limit may set, delivery or request: one in about 17 minutes.
	MinRate             = 0.001
	DefaultRetention    = outbox.DefaultRetention
	DefaultPollInterval = outbox.DefaultPollInterval
	DefaultLeaseMargin  = outbox.DefaultLeaseMargin
	DefaultDrainTimeout = outbox.DefaultDrainTimeout

	// DefaultBatchTxConcurrency is the concurrency of a kind whose deliveries are rows in a few shared
	// transactions (postgres: providerKinds), not calls that each wait on a destination.
	DefaultBatchTxConcurrency = outbox.DefaultBatchTxConcurrency

	// DefaultFallbackPollInterval is how often the outbox and the waiting requests are polled while
	// notifications are off: fast enough that a wait ends well within DefaultPollInterval, and one claim per
	// effect type and gateway five times a second.
	DefaultFallbackPollInterval = 200 * time.Millisecond
	// DefaultMigrationLock is how long a start waits for another gateway's migration before giving up.
	DefaultMigrationLock = migrations.DefaultLockWait

	// MaxWait is the longest "wait" a request may ask for.
	MaxWait = 30 * time.Second

	// DefaultProxyAPIKeyHeader carries the tenant's API key on proxied requests, as Bearer or bare.
	DefaultProxyAPIKeyHeader = "Authorization"
)

// WithDefaults returns a copy of the configuration with every unset field set to its default (see each
// field's doc). A nil configuration gives all defaults. The copy shares no maps with c.
func (c *Config) WithDefaults() *Config {
	if c == nil {
		c = &Config{}
	}
	o := *c
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	if o.Listen == "" {
		o.Listen = DefaultListen
	}
	if o.Proxy.APIKeyHeader == "" {
		o.Proxy.APIKeyHeader = DefaultProxyAPIKeyHeader
	}
	if o.DatabaseURL == "" {
		o.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if o.DatabaseURL == "" {
		o.DatabaseURL = DefaultDatabaseURL
	}
	o.Tenants = maps.Clone(c.Tenants)
	if len(c.Tenants) == 0 && c.Dev {
		o.Tenants = map[string]Tenant{DefaultTenant: {APIKeys: []string{DefaultAPIKey}}}
	}
	o.Retry = o.Retry.withDefaults()
	def(&o.Retention.Keys, DefaultRetention)
	// partitions.interval 0 is the default too, as retention.keys 0 is (docs/configuration.md).
	def(&o.Partitions.Interval, partitions.DefaultInterval)
	defInt(&o.Partitions.Ahead, partitions.DefaultAhead)
	if o.Limits.MaxBody == 0 {
		o.Limits.MaxBody = DefaultMaxBody
	}
	defInt(&o.Limits.PageSize, DefaultPageSize)
	defInt(&o.Limits.MaxPageSize, DefaultMaxPageSize)
	if o.Limits.MaxHeader == 0 {
		o.Limits.MaxHeader = DefaultMaxHeader
	}
	defInt(&o.Limits.MaxConnections, DefaultMaxConnections)
	o.Limits.TenantRate = o.Limits.TenantRate.or(RateLimit{Scope: DefaultTenantRateScope,
		RequestsPerSecond: DefaultTenantRequestsPerSecond, RequestBurst: DefaultTenantRequestBurst,
		BytesPerSecond: DefaultTenantBytesPerSecond, ByteBurst: DefaultTenantByteBurst})
	defInt(&o.Limits.TenantHeldRequests, DefaultTenantHeldRequests)
	for name, t := range o.Tenants {
		t.Rate = t.Rate.or(o.Limits.TenantRate)
		defInt(&t.HeldRequests, o.Limits.TenantHeldRequests)
		o.Tenants[name] = t
	}
	def(&o.Timeouts.Database, DefaultDatabaseTimeout)
	shutdownSet := o.Timeouts.Shutdown != 0
	def(&o.Timeouts.Shutdown, DefaultShutdownTimeout)
	def(&o.Timeouts.ReadHeader, DefaultReadHeaderTimeout)
	def(&o.Timeouts.Read, DefaultReadTimeout)
	def(&o.Timeouts.Write, DefaultWriteTimeout)
	def(&o.Timeouts.Idle, DefaultIdleTimeout)
	def(&o.Timeouts.Ready, DefaultReadyTimeout)
	def(&o.Timeouts.Metrics, DefaultMetricsTimeout)
	defInt(&o.GroupCommit.MaxBatch, dedup.DefaultMaxBatch)
	defInt(&o.GroupCommit.Parallel, dedup.DefaultBatchParallel)
	def(&o.Timeouts.MigrationLock, DefaultMigrationLock)
	def(&o.Dispatcher.PollInterval, DefaultPollInterval)
	def(&o.Dispatcher.FallbackPollInterval, DefaultFallbackPollInterval)
	def(&o.Dispatcher.LeaseMargin, DefaultLeaseMargin)
	drainSet := o.Dispatcher.DrainTimeout != 0

	types := c.EffectTypes
	if types == nil {
		types = map[string]EffectType{DefaultEffectType: {Provider: "postgres", Postgres: &postgres.Config{}}}
	}
	o.EffectTypes = make(map[string]EffectType, len(types))
	for name, t := range types {
		if t.OnCrash == "" {
			t.OnCrash = DefaultOnCrash
		}
		def(&t.Timeout, DefaultTimeout)
		if k, ok := kindNamed(t.Provider); ok && k.concurrency != 0 {
			defInt(&t.Concurrency, k.concurrency)
		}
		defInt(&t.Concurrency, DefaultConcurrency)
		r := o.Retry
		if t.Retry != nil {
			r = t.Retry.withDefaults()
		}
		t.Retry = &r
		if t.Breaker.Failures == 0 {
			t.Breaker.Failures = DefaultBreakerFailures
		}
		def(&t.Breaker.OpenFor, DefaultBreakerOpenFor)
		if t.Rate != nil {
			r := *t.Rate
			if r.Burst == 0 {
				r.Burst = outbox.DefaultBurst(r.PerSecond)
			}
			t.Rate = &r
		}
		o.EffectTypes[name] = t
	}
	if !drainSet {
		// A graceful stop waits for the slowest delivery a type allows: one cut short after its request went
		// out is sent again by whichever gateway takes the row (an outside tester saw 8 of 10 webhooks sent
		// twice at a SIGTERM, their destination answering after 15 s under a 10 s drain).
		o.Dispatcher.DrainTimeout = Duration(DefaultDrainTimeout)
		for _, t := range o.EffectTypes {
			o.Dispatcher.DrainTimeout = max(o.Dispatcher.DrainTimeout, t.Timeout)
		}
	}
	if !shutdownSet {
		// Likewise the requests in flight: a proxied call performs its effect in the request, so a stop that
		// cut it off after timeouts.shutdown left it to be sent again by another gateway, or made it unknown
		// (an outside tester's upstream took 15 s under the 10 s default). It may take its type's timeout,
		// then the database's to record its outcome.
		for _, t := range o.EffectTypes {
			if t.Provider == "http" {
				o.Timeouts.Shutdown = max(o.Timeouts.Shutdown, t.Timeout+o.Timeouts.Database)
			}
		}
	}
	return &o
}

// or fills the fields r leaves out from d.
func (r RateLimit) or(d RateLimit) RateLimit {
	if r.Scope == "" {
		r.Scope = d.Scope
	}
	if r.RequestsPerSecond == 0 {
		r.RequestsPerSecond = d.RequestsPerSecond
	}
	if r.RequestBurst == 0 {
		r.RequestBurst = d.RequestBurst
	}
	if r.BytesPerSecond == 0 {
		r.BytesPerSecond = d.BytesPerSecond
	}
	if r.ByteBurst == 0 {
		r.ByteBurst = d.ByteBurst
	}
	return r
}

func (r Retry) withDefaults() Retry {
	if r.MaxAttempts == 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.BaseDelay == 0 {
		r.BaseDelay = Duration(DefaultBaseDelay)
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = Duration(DefaultMaxDelay)
	}
	return r
}

// inFlightWait is how long a proxied request of type typ waits for another's attempt: proxy.in_flight_wait,
// whose default is per type (the type's timeout, at most MaxWait), so it is read here rather than filled in.
func (c *Config) inFlightWait(typ string) time.Duration {
	if c.Proxy.InFlightWait != 0 {
		return time.Duration(c.Proxy.InFlightWait)
	}
	return min(time.Duration(c.EffectTypes[typ].Timeout), MaxWait)
}
