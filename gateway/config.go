package gateway

// The configuration file's schema: Config and its sections, each field's doc saying what it means and its
// default. Reading the file is load.go, the defaults defaults.go, their checks validate.go.

import (
	"github.com/oncegate/oncegate/outbox"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/postgres"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/providers/webhook"
)

// Config is the gateway's configuration file. Load reads it; a zero Config (or a nil one given to New) is all
// defaults. Defaults are filled by WithDefaults and checked, once, by Load and New.
type Config struct {
	// Listen is the HTTP API's address. Defaults to DefaultListen.
	Listen string `yaml:"listen"`
	// MetricsListen, when set, is the address of /metrics (and of /healthz and /readyz, for probes), which
	// Listen then no longer serves: the metrics name every tenant, destination and breaker, and whoever
	// reaches the API is a tenant. Empty serves /metrics on Listen, to anyone who reaches it.
	MetricsListen string `yaml:"metrics_listen"`
	// DatabaseURL is the Postgres database, as a URL or keyword/value string. Defaults to the environment's
	// DATABASE_URL, then DefaultDatabaseURL. Its pool_max_conns and connect_timeout are used as given; when
	// it leaves them out they default to DefaultMaxConns and DefaultConnectTimeout. Through a pooler such as
	// PgBouncer (found at the first connection), queries run in pgx's exec mode, without prepared
	// statements, unless the URL sets default_query_exec_mode.
	DatabaseURL string `yaml:"database_url"`
	// ListenURL is where the gateway LISTENs for the other gateways' notifications: a direct or session-mode
	// connection, never a transaction-pooling one. Defaults to DatabaseURL when that reaches Postgres
	// directly; when DatabaseURL goes through a pooler and ListenURL is unset, notifications are off and the
	// gateway polls every Dispatcher.FallbackPollInterval.
	ListenURL string `yaml:"listen_url"`
	// DDLURL is where the partition manager (package partitions) holds its lock and runs its DDL: a direct or
	// session-mode connection, never a transaction-pooling one. Defaults to ListenURL, then to DatabaseURL
	// when that reaches Postgres directly.
	DDLURL string `yaml:"ddl_url"`
	// Tenants by name. Required: a configuration without tenants is refused, unless Dev is set, which brings
	// DefaultTenant with DefaultAPIKey.
	Tenants map[string]Tenant `yaml:"tenants"`
	// EffectTypes by name. Defaults to DefaultEffectType, a postgres type writing to the default table.
	EffectTypes map[string]EffectType `yaml:"effect_types"`
	// Retry is the retry policy of every effect type that has none of its own. Each field defaults as
	// Retry's doc says.
	Retry Retry `yaml:"retry"`
	// Retention says how long terminal effects are kept.
	Retention Retention `yaml:"retention"`
	// Partitions tunes the time partitions of the attempt log (docs/storage.md).
	Partitions Partitions `yaml:"partitions"`
	// Limits bounds requests.
	Limits Limits `yaml:"limits"`
	// Timeouts bounds the gateway's own waits.
	Timeouts Timeouts `yaml:"timeouts"`
	// Dispatcher tunes the outbox dispatcher.
	Dispatcher Dispatcher `yaml:"dispatcher"`
	// GroupCommit tunes how concurrent requests are recorded together.
	GroupCommit GroupCommit `yaml:"group_commit"`
	// Proxy tunes the dedup proxy (/v1/proxy/{type}/…).
	Proxy Proxy `yaml:"proxy"`

	// Dev is what `gateway serve --dev` sets, never the file: without a tenants block the gateway then serves
	// DefaultTenant with DefaultAPIKey, and listen must be a loopback address, since that key is public.
	// Defaults to false.
	Dev bool `yaml:"-"`
}

// Proxy tunes the dedup proxy, /v1/proxy/{type}/{path…} (docs/proxy.md).
type Proxy struct {
	// APIKeyHeader is the request header that carries the tenant's API key on proxied requests: for an SDK
	// that owns Authorization (it sends the upstream's credential there, which the gateway drops: the
	// upstream's credentials are the effect type's configured headers). Its value is the key, with or
	// without "Bearer ". Defaults to Authorization, with the Bearer scheme, as on every other route.
	APIKeyHeader string `yaml:"api_key_header"`
	// InFlightWait is how long a request waits for another request (or a dispatcher) that is performing the
	// effect under its key before it answers 409 with Retry-After. Defaults to the effect type's timeout,
	// capped at MaxWait.
	InFlightWait Duration `yaml:"in_flight_wait"`
}

// Tenant owns API keys; its idempotency keys are its own.
type Tenant struct {
	// APIKeys are plain keys (at least MinAPIKeyLength characters), hashed when loaded, or "sha256:<hex>" of a
	// key. At least one is required, and a key belongs to one tenant only.
	APIKeys []string `yaml:"api_keys"`
	// EffectTypes are the effect types this tenant may use; a request for another is a 403. Defaults to every
	// type (the field left out; an empty list is refused).
	EffectTypes []string `yaml:"effect_types"`
	// Rate is this tenant's rate; a field it leaves out takes limits.tenant_rate's.
	Rate RateLimit `yaml:"rate"`
	// HeldRequests bounds this tenant's requests held open in one gateway: waiting (wait, or a proxied request
	// waiting for another's attempt) or sending their body. Past it a wait is answered at once with the
	// effect as it is, and a body must arrive within a second. It is lowered to a quarter of the connections
	// the gateway holds. Defaults to limits.tenant_held_requests.
	HeldRequests int `yaml:"held_requests"`
}

// RateLimit is a tenant's rate: token buckets of requests and of request-body bytes, each held by one gateway
// process, or for requests by the whole fleet (Scope). A request that would overdraw either is a 429 with
// Retry-After. Operator retries are requests like any other.
type RateLimit struct {
	// Scope says who holds RequestsPerSecond and RequestBurst: ScopeGateway, each gateway process on its own
	// (N gateways allow N times the rate; no request waits on the database for it), or ScopeFleet, every
	// gateway sharing the database together (a round trip per batch of a tenth of a second's requests; off
	// by at most a batch per gateway; each gateway on its own while the database cannot be asked):
	// docs/configuration.md, "Tenant rates". The byte bucket is per gateway in either scope. Defaults to
	// DefaultTenantRateScope, ScopeGateway.
	Scope RateScope `yaml:"scope"`
	// RequestsPerSecond is the sustained request rate, or Unlimited. Defaults to DefaultTenantRequestsPerSecond.
	RequestsPerSecond PerSecond `yaml:"requests_per_second"`
	// RequestBurst is how many requests may come at once. Defaults to DefaultTenantRequestBurst.
	RequestBurst int `yaml:"request_burst" oncegate:"positive"`
	// BytesPerSecond is the sustained rate of body bytes, or Unlimited. Defaults to
	// DefaultTenantBytesPerSecond.
	BytesPerSecond ByteRate `yaml:"bytes_per_second"`
	// ByteBurst is how many body bytes may come at once; at least limits.max_body, so the largest body
	// accepted can pass. Defaults to DefaultTenantByteBurst.
	ByteBurst ByteSize `yaml:"byte_burst" oncegate:"positive"`
}

// RateScope says who holds a tenant's request rate: "gateway" or "fleet".
type RateScope string

const (
	// ScopeGateway: each gateway process holds the rate on its own.
	ScopeGateway RateScope = "gateway"
	// ScopeFleet: every gateway that shares the database holds the rate together.
	ScopeFleet RateScope = "fleet"
)

// EffectType binds an effect type to a provider kind and its settings. The block named after the kind
// (postgres, smtp, webhook or http) holds the provider's own settings; everything about delivery (timeout,
// on_crash, concurrency, retries, breaker) is the effect type's, for every kind alike. A kind's block field
// here is all it adds to the schema: what the gateway does with it is its entry in providerKinds.
type EffectType struct {
	// Provider is the kind: postgres, smtp, webhook or http. Required.
	Provider string           `yaml:"provider"`
	Postgres *postgres.Config `yaml:"postgres"`
	SMTP     *smtp.Config     `yaml:"smtp"`
	Webhook  *webhook.Config  `yaml:"webhook"`
	HTTP     *httpprov.Config `yaml:"http"`
	// OnCrash is what happens to a delivery interrupted by a gateway crash (or, for smtp, by an answer lost
	// after the message was sent): at_least_once resends it, at_most_once marks it unknown for an operator.
	// Defaults to DefaultOnCrash.
	OnCrash outbox.OnCrash `yaml:"on_crash"`
	// Timeout bounds one attempt; the lease is this plus dispatcher.lease_margin. Defaults to DefaultTimeout.
	Timeout Duration `yaml:"timeout"`
	// Concurrency bounds the deliveries of this type in flight in one gateway. Defaults to DefaultConcurrency,
	// or for postgres, whose deliveries are rows in a few shared transactions, DefaultBatchTxConcurrency.
	Concurrency int `yaml:"concurrency"`
	// TenantConcurrency bounds one tenant's deliveries of this type in flight in one gateway, so one tenant's
	// hanging destinations leave slots for the others. Defaults to half of Concurrency (at least 1).
	TenantConcurrency int `yaml:"tenant_concurrency"`
	// Retry is this type's retry policy. Defaults to the configuration's retry; a field it leaves out defaults
	// as Retry's doc says (not to the configuration's retry).
	Retry *Retry `yaml:"retry"`
	// Breaker opens this type's circuit breaker after consecutive failures.
	Breaker Breaker `yaml:"breaker"`
	// Rate limits this type's calls to each destination (scheme, host and port: a webhook's payload URL
	// varies, each host it names has a limit of its own) across every gateway sharing the database. Rows
	// over it wait, uncharged, for their token. Defaults to none: unlimited.
	Rate *DeliveryRate `yaml:"rate"`
}

// DeliveryRate is a fleet-wide limit on one effect type's calls to one destination: a token bucket shared by
// every gateway through the database (docs/configuration.md, "Fleet-wide delivery limits").
type DeliveryRate struct {
	// PerSecond is the sustained rate of calls, for the whole fleet: 50 means 50 a second whether one
	// gateway delivers or ten. Required, above 0 and at most MaxDeliveryRate.
	PerSecond float64 `yaml:"per_second"`
	// Burst is how many calls may go at once after a quiet spell. Defaults to one second's worth of
	// PerSecond (at least 1); at most MaxDeliveryBurst.
	Burst int `yaml:"burst"`
}

// Retry is the retry policy: exponential backoff with full jitter.
type Retry struct {
	// MaxAttempts failed attempts make an effect dead. Defaults to DefaultMaxAttempts.
	MaxAttempts int `yaml:"max_attempts"`
	// BaseDelay is the ceiling of the first retry's delay. Defaults to DefaultBaseDelay.
	BaseDelay Duration `yaml:"base_delay"`
	// MaxDelay caps every delay. Defaults to DefaultMaxDelay.
	MaxDelay Duration `yaml:"max_delay"`
}

// Breaker opens after Failures consecutive failures, for OpenFor.
type Breaker struct {
	// Failures defaults to DefaultBreakerFailures.
	Failures uint32 `yaml:"failures"`
	// OpenFor defaults to DefaultBreakerOpenFor.
	OpenFor Duration `yaml:"open_for"`
}

// Retention says how long terminal effects, and so their keys, are kept.
type Retention struct {
	// Keys defaults to DefaultRetention.
	Keys Duration `yaml:"keys"`
	// Payloads, when set (at most Keys), keeps payloads and stored answers apart from their effects, in
	// oncegate_effect_bodies, whose partitions go this long after their effects finished: the effect stays
	// (who, what, when, its status and attempts) until Keys, its body does not. A replay after it answers
	// with the effect's status and no stored answer (docs/storage.md). Needs the partition manager (not
	// partitions.disabled), and every gateway of the fleet at a version that reads bodies. Off by default.
	Payloads Duration `yaml:"payloads"`
}

// Partitions tunes the partition manager (package partitions): one gateway at a time creates the attempt
// log's time partitions ahead and drops those past retention.keys, on listen_url's connection (or
// database_url's when it reaches Postgres directly; through a transaction pooler without listen_url the
// manager does not run, and says so).
type Partitions struct {
	// Interval is the range of one partition. Defaults to partitions.DefaultInterval (a day).
	Interval Duration `yaml:"interval"`
	// Ahead is how many intervals past the present are kept created. Defaults to partitions.DefaultAhead.
	Ahead int `yaml:"ahead"`
	// Disabled leaves the partitions to something else (pg_partman, a cron job). Defaults to false.
	Disabled bool `yaml:"disabled"`
}

// Limits bounds requests.
type Limits struct {
	// MaxBody bounds a request's body. Defaults to DefaultMaxBody.
	MaxBody ByteSize `yaml:"max_body"`
	// PageSize is how many effects a list returns when the request names no limit. Defaults to
	// DefaultPageSize.
	PageSize int `yaml:"page_size"`
	// MaxPageSize is the largest limit a list request may name. Defaults to DefaultMaxPageSize.
	MaxPageSize int `yaml:"max_page_size"`
	// MaxHeader bounds a request's headers (a 431 beyond). Defaults to DefaultMaxHeader.
	MaxHeader ByteSize `yaml:"max_header"`
	// MaxConnections caps the open client connections. A quarter of them may hold no request (new, idle,
	// sending headers); past that, or at the cap, the oldest of those are closed to make room. Only when every
	// connection serves a request do more wait, unaccepted, in the kernel's backlog. It is lowered to fit the
	// process's open-file limit. Defaults to DefaultMaxConnections.
	MaxConnections int `yaml:"max_connections"`
	// TenantHeldRequests is every tenant's held_requests, unless the tenant sets its own. Defaults to
	// DefaultTenantHeldRequests.
	TenantHeldRequests int `yaml:"tenant_held_requests"`
	// TenantRate is every tenant's rate, unless the tenant sets its own. Each field defaults as RateLimit's
	// doc says.
	TenantRate RateLimit `yaml:"tenant_rate"`
}

// Timeouts bounds the gateway's own waits.
type Timeouts struct {
	// Database bounds the database work of one API request, so a database that hangs gives a 503, not a
	// hang. Defaults to DefaultDatabaseTimeout.
	Database Duration `yaml:"database"`
	// Shutdown is how long requests in flight may take to finish once the gateway is told to stop. Defaults
	// to DefaultShutdownTimeout.
	Shutdown Duration `yaml:"shutdown"`
	// ReadHeader bounds reading a request's headers. Defaults to DefaultReadHeaderTimeout.
	ReadHeader Duration `yaml:"read_header"`
	// Read bounds reading a whole request, body included, from its first byte. Defaults to
	// DefaultReadTimeout.
	Read Duration `yaml:"read"`
	// Write bounds a request from the end of its headers to the end of its response: reading the body,
	// waiting (up to MaxWait) and answering. It must be at least read + MaxWait + twice database. Defaults to
	// DefaultWriteTimeout.
	Write Duration `yaml:"write"`
	// Idle closes a keep-alive connection that sends no next request. Defaults to DefaultIdleTimeout.
	Idle Duration `yaml:"idle"`
	// Ready bounds /readyz's database checks. Defaults to DefaultReadyTimeout.
	Ready Duration `yaml:"ready"`
	// Metrics bounds the backlog query that a /metrics scrape runs. Defaults to DefaultMetricsTimeout.
	Metrics Duration `yaml:"metrics"`
	// MigrationLock is how long a start waits for the migration lock, which another gateway holds while it
	// migrates, before it exits with an error. Defaults to DefaultMigrationLock.
	MigrationLock Duration `yaml:"migration_lock"`
}

// Dispatcher tunes the outbox dispatcher.
type Dispatcher struct {
	// Disabled runs the gateway as an API node only: it records effects, and other gateways (with the
	// dispatcher on) deliver them. API and delivery capacity then scale apart. Defaults to false.
	Disabled bool `yaml:"disabled"`
	// PollInterval is how often the outbox, and the effects that requests wait for, are checked without a
	// notification. Defaults to DefaultPollInterval.
	PollInterval Duration `yaml:"poll_interval"`
	// FallbackPollInterval replaces PollInterval while notifications are off: database_url goes through a
	// pooler without a listen_url, or the notification self-check fails. Defaults to
	// DefaultFallbackPollInterval.
	FallbackPollInterval Duration `yaml:"fallback_poll_interval"`
	// LeaseMargin is added to a type's timeout to make its lease. Defaults to DefaultLeaseMargin.
	LeaseMargin Duration `yaml:"lease_margin"`
	// DrainTimeout is how long deliveries in flight may take to finish at shutdown before they are
	// cancelled and their rows handed back. Defaults to DefaultDrainTimeout.
	DrainTimeout Duration `yaml:"drain_timeout"`
}

// GroupCommit records the effects of requests that arrive together in one statement and one commit
// (dedup.GroupCommit): a request that finds fewer than Parallel batches in flight starts one at once, the
// others wait for the next batch, so batches grow with the load and a lone request never waits.
type GroupCommit struct {
	// MaxBatch is the largest number of requests in one statement; 1 records each request alone. Defaults
	// to dedup.DefaultMaxBatch.
	MaxBatch int `yaml:"max_batch"`
	// Parallel is how many batches may be in flight at once, each on a database connection of its own.
	// Defaults to dedup.DefaultBatchParallel.
	Parallel int `yaml:"parallel"`
}
