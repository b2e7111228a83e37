package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"
	"golang.org/x/net/http/httpguts"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/internal/tenantlimit"
	"github.com/oncegate/oncegate/migrations"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/providers"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/postgres"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/providers/webhook"
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
	// MaxWait) hold theirs, and the timeouts are short, so connections an attacker opens and leaves idle are
	// closed within seconds and cannot hold the slots for long.
	DefaultMaxConnections = 1024

	// The default rate of each tenant, per gateway process.
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
	DefaultRetention       = outbox.DefaultRetention
	DefaultPollInterval    = outbox.DefaultPollInterval
	DefaultLeaseMargin     = outbox.DefaultLeaseMargin
	DefaultDrainTimeout    = outbox.DefaultDrainTimeout

	// DefaultFallbackPollInterval is how often the outbox and the waiting requests are polled while
	// notifications are off: fast enough that a wait ends well within DefaultPollInterval, and one claim per
	// effect type and gateway five times a second.
	DefaultFallbackPollInterval = 200 * time.Millisecond
	// DefaultMigrationLock is how long a start waits for another gateway's migration before giving up.
	DefaultMigrationLock = migrations.DefaultLockWait

	// MaxWait is the longest "wait" a request may ask for.
	MaxWait = 30 * time.Second
)

// Config is the gateway's configuration file. Load reads it; a zero Config (or a nil one given to New) is all
// defaults. Defaults are filled by WithDefaults and checked, once, by Load and New.
type Config struct {
	// Listen is the HTTP API's address. Defaults to DefaultListen.
	Listen string `yaml:"listen"`
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
}

// RateLimit is a tenant's rate in one gateway process: token buckets of requests and of request-body bytes. A
// request that would overdraw either is a 429 with Retry-After. Operator retries are requests like any other.
type RateLimit struct {
	// RequestsPerSecond is the sustained request rate, or Unlimited. Defaults to DefaultTenantRequestsPerSecond.
	RequestsPerSecond PerSecond `yaml:"requests_per_second"`
	// RequestBurst is how many requests may come at once. Defaults to DefaultTenantRequestBurst.
	RequestBurst int `yaml:"request_burst"`
	// BytesPerSecond is the sustained rate of body bytes, or Unlimited. Defaults to
	// DefaultTenantBytesPerSecond.
	BytesPerSecond ByteRate `yaml:"bytes_per_second"`
	// ByteBurst is how many body bytes may come at once; at least limits.max_body, so the largest body
	// accepted can pass. Defaults to DefaultTenantByteBurst.
	ByteBurst ByteSize `yaml:"byte_burst"`
}

// Unlimited, as a PerSecond or a ByteRate ("unlimited" in the file), turns a bucket off.
const Unlimited = -1

// PerSecond is a rate written as a number ("50", "0.5") or "unlimited".
type PerSecond float64

func (p *PerSecond) UnmarshalYAML(n *yaml.Node) error {
	if n.Value == "unlimited" {
		*p = Unlimited
		return nil
	}
	v, err := strconv.ParseFloat(n.Value, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return fmt.Errorf("line %d: %q is not a positive rate like 50 or \"unlimited\"", n.Line, n.Value)
	}
	*p = PerSecond(v)
	return nil
}

// ByteRate is bytes per second written as a size ("8MiB") or "unlimited".
type ByteRate int64

func (b *ByteRate) UnmarshalYAML(n *yaml.Node) error {
	if n.Value == "unlimited" {
		*b = Unlimited
		return nil
	}
	var s ByteSize
	if err := s.UnmarshalYAML(n); err != nil || s == 0 {
		return fmt.Errorf("line %d: %q is not a positive size like 8MiB or \"unlimited\"", n.Line, n.Value)
	}
	*b = ByteRate(s)
	return nil
}

// EffectType binds an effect type to a provider kind and its settings. The block named after the kind
// (postgres, smtp, webhook or http) holds the provider's own settings; everything about delivery (timeout,
// on_crash, concurrency, retries, breaker) is the effect type's, for every kind alike.
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
	// Concurrency bounds the deliveries of this type in flight in one gateway. Defaults to DefaultConcurrency.
	Concurrency int `yaml:"concurrency"`
	// TenantConcurrency bounds one tenant's deliveries of this type in flight in one gateway, so one tenant's
	// hanging destinations leave slots for the others. Defaults to half of Concurrency (at least 1).
	TenantConcurrency int `yaml:"tenant_concurrency"`
	// Retry is this type's retry policy. Defaults to the configuration's retry; a field it leaves out defaults
	// as Retry's doc says (not to the configuration's retry).
	Retry *Retry `yaml:"retry"`
	// Breaker opens this type's circuit breaker after consecutive failures.
	Breaker Breaker `yaml:"breaker"`
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
	// MaxConnections caps the open client connections; more wait, unaccepted, in the kernel's backlog until one
	// closes. It is lowered to fit the process's open-file limit. Defaults to DefaultMaxConnections.
	MaxConnections int `yaml:"max_connections"`
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

// Duration is a time.Duration written as "1s", "10m", "24h".
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: %q is not a duration like 10s or 24h", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// ByteSize is a size written as "256KiB", "1MiB", "1000" (bytes).
type ByteSize int64

var sizeRe = regexp.MustCompile(`^(\d+)\s*(B|KB|KiB|MB|MiB)?$`)

func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	m := sizeRe.FindStringSubmatch(strings.TrimSpace(n.Value))
	if m == nil {
		return fmt.Errorf("line %d: %q is not a size like 256KiB", n.Line, n.Value)
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	mult := map[string]int64{"": 1, "B": 1, "KB": 1000, "KiB": 1024, "MB": 1000_000, "MiB": 1 << 20}[m[2]]
	*b = ByteSize(v * mult)
	return nil
}

// Load reads the configuration file at path ("" for none), expanding ${VAR} in values from the environment,
// refusing unknown fields with their path, filling defaults (WithDefaults) and checking the result. A file
// must name its tenants.
func Load(path string) (*Config, error) { return load(path, false) }

// LoadDev is Load for `gateway serve --dev`: Config.Dev is set, so a file without tenants (or no file) serves
// the built-in dev tenant, on a loopback address only.
func LoadDev(path string) (*Config, error) { return load(path, true) }

func load(path string, dev bool) (*Config, error) {
	c := Config{Dev: dev}
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if err := parse(raw, &c); err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}
	out := c.WithDefaults()
	if err := out.validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return out, nil
}

func parse(raw []byte, c *Config) error {
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return err
	}
	if len(root.Content) == 0 {
		return nil // an empty file: all defaults
	}
	expand(&root)
	if err := hoistTypeKnobs(root.Content[0]); err != nil {
		return err
	}
	if err := checkKnown(root.Content[0], reflect.TypeOf(Config{}), ""); err != nil {
		return err
	}
	return root.Content[0].Decode(c)
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expand replaces ${VAR} in scalar values with the environment's VAR (empty when unset).
func expand(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		n.Value = envRef.ReplaceAllStringFunc(n.Value, func(ref string) string {
			return os.Getenv(ref[2 : len(ref)-1])
		})
	}
	for _, c := range n.Content {
		expand(c)
	}
}

// typeKnobs are settings of the effect type that SPEC §7 also lets a provider block spell (`smtp: {on_crash:
// …}`, `webhook: {timeout: …}`): one knob written in either place. hoistTypeKnobs moves them up to the type
// before decoding, so the rest of the gateway reads one field; a type that sets one in both places with
// different values is refused, rather than one silently winning.
var typeKnobs = []string{"on_crash", "timeout"}

func hoistTypeKnobs(root *yaml.Node) error {
	types := mapValue(root, "effect_types")
	if types == nil || types.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(types.Content); i += 2 {
		name, typ := types.Content[i].Value, types.Content[i+1]
		if typ.Kind != yaml.MappingNode {
			continue
		}
		for j := 0; j+1 < len(typ.Content); j += 2 {
			kind, block := typ.Content[j].Value, typ.Content[j+1]
			if block.Kind != yaml.MappingNode || kind == "retry" || kind == "breaker" {
				continue
			}
			for _, knob := range typeKnobs {
				k, v := cutKey(block, knob)
				if v == nil {
					continue
				}
				if prev := mapValue(typ, knob); prev != nil {
					if prev.Value != v.Value {
						return fmt.Errorf("effect_types.%s: %s is set twice, %q on the type (line %d) and %q in its %s "+
							"block (line %d): it is one setting, set it once", name, knob, prev.Value, prev.Line,
							v.Value, kind, v.Line)
					}
					continue
				}
				typ.Content = append(typ.Content, k, v)
			}
		}
	}
	return nil
}

// mapValue returns the value under key in mapping node n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// cutKey removes key from mapping node n and returns its key and value nodes, or nils.
func cutKey(n *yaml.Node, key string) (k, v *yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			k, v = n.Content[i], n.Content[i+1]
			n.Content = append(n.Content[:i:i], n.Content[i+2:]...)
			return k, v
		}
	}
	return nil, nil
}

// checkKnown walks a mapping node against the struct type it decodes into and returns the first key the
// struct does not have, with its dotted path, so a typo fails start-up instead of being ignored.
func checkKnown(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			if tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]; tag != "" && tag != "-" {
				fields[tag] = t.Field(i).Type
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			ft, ok := fields[k]
			if !ok {
				known := make([]string, 0, len(fields))
				for f := range fields {
					known = append(known, f)
				}
				sort.Strings(known)
				return fmt.Errorf("%s: unknown field (line %d); known fields: %s", join(path, k),
					n.Content[i].Line, strings.Join(known, ", "))
			}
			if err := checkKnown(n.Content[i+1], ft, join(path, k)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkKnown(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for i, c := range n.Content {
			if err := checkKnown(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

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
	if o.Limits.MaxBody == 0 {
		o.Limits.MaxBody = DefaultMaxBody
	}
	defInt(&o.Limits.PageSize, DefaultPageSize)
	defInt(&o.Limits.MaxPageSize, DefaultMaxPageSize)
	if o.Limits.MaxHeader == 0 {
		o.Limits.MaxHeader = DefaultMaxHeader
	}
	defInt(&o.Limits.MaxConnections, DefaultMaxConnections)
	o.Limits.TenantRate = o.Limits.TenantRate.or(RateLimit{RequestsPerSecond: DefaultTenantRequestsPerSecond,
		RequestBurst: DefaultTenantRequestBurst, BytesPerSecond: DefaultTenantBytesPerSecond,
		ByteBurst: DefaultTenantByteBurst})
	for name, t := range o.Tenants {
		t.Rate = t.Rate.or(o.Limits.TenantRate)
		o.Tenants[name] = t
	}
	def(&o.Timeouts.Database, DefaultDatabaseTimeout)
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
	def(&o.Dispatcher.DrainTimeout, DefaultDrainTimeout)

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
		if t.Provider == "postgres" {
			defInt(&t.Concurrency, outbox.DefaultBatchTxConcurrency)
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
		o.EffectTypes[name] = t
	}
	return &o
}

// or fills the fields r leaves out from d.
func (r RateLimit) or(d RateLimit) RateLimit {
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

// validate checks a configuration that WithDefaults has filled: every error names the field at fault.
func (c *Config) validate() error {
	if _, err := c.poolConfig(); err != nil {
		return err
	}
	if c.ListenURL != "" {
		if _, err := pgxpool.ParseConfig(c.ListenURL); err != nil {
			return fmt.Errorf("listen_url: %w", err)
		}
	}
	if c.Limits.MaxBody <= 0 {
		return errors.New("limits.max_body must be positive")
	}
	if h := c.Proxy.APIKeyHeader; h != "" && !httpguts.ValidHeaderFieldName(h) {
		return fmt.Errorf("proxy.api_key_header: %q is not a header name", h)
	}
	if c.Proxy.InFlightWait < 0 || time.Duration(c.Proxy.InFlightWait) > MaxWait {
		return fmt.Errorf("proxy.in_flight_wait: from 0 to %v", MaxWait)
	}
	if c.Limits.PageSize < 1 || c.Limits.MaxPageSize < c.Limits.PageSize {
		return fmt.Errorf("limits: page_size (%d) must be at least 1 and at most max_page_size (%d)",
			c.Limits.PageSize, c.Limits.MaxPageSize)
	}
	if c.Limits.MaxHeader <= 0 {
		return errors.New("limits.max_header must be positive")
	}
	if c.Limits.MaxConnections < 1 {
		return errors.New("limits.max_connections must be at least 1")
	}
	if err := c.Limits.TenantRate.validate("limits.tenant_rate", c.Limits.MaxBody); err != nil {
		return err
	}
	for field, d := range map[string]Duration{"retention.keys": c.Retention.Keys,
		"timeouts.database": c.Timeouts.Database, "timeouts.shutdown": c.Timeouts.Shutdown,
		"timeouts.read_header": c.Timeouts.ReadHeader, "timeouts.read": c.Timeouts.Read,
		"timeouts.write": c.Timeouts.Write, "timeouts.idle": c.Timeouts.Idle, "timeouts.ready": c.Timeouts.Ready,
		"timeouts.metrics": c.Timeouts.Metrics, "timeouts.migration_lock": c.Timeouts.MigrationLock,
		"dispatcher.poll_interval": c.Dispatcher.PollInterval, "dispatcher.lease_margin": c.Dispatcher.LeaseMargin,
		"dispatcher.drain_timeout": c.Dispatcher.DrainTimeout, "dispatcher.fallback_poll_interval": c.Dispatcher.FallbackPollInterval} {
		if d < 0 {
			return fmt.Errorf("%s must be positive", field)
		}
	}
	// A request that waits must still be answered: the body may take until timeouts.read, then the effect is
	// recorded, the wait runs and the effect is read again, each database step bounded by timeouts.database.
	if need := c.Timeouts.Read + Duration(MaxWait) + 2*c.Timeouts.Database; c.Timeouts.Write < need {
		return fmt.Errorf("timeouts.write (%v) must be at least timeouts.read + the longest wait (%v) + twice "+
			"timeouts.database = %v, or a request that waits is cut off before its answer",
			time.Duration(c.Timeouts.Write), MaxWait, time.Duration(need))
	}
	if c.GroupCommit.MaxBatch < 1 || c.GroupCommit.MaxBatch > MaxGroupCommitBatch {
		return fmt.Errorf("group_commit.max_batch: %d: want 1 (no batching) to %d", c.GroupCommit.MaxBatch,
			MaxGroupCommitBatch)
	}
	if c.GroupCommit.Parallel < 1 {
		return fmt.Errorf("group_commit.parallel: %d: want at least 1", c.GroupCommit.Parallel)
	}
	if err := c.Retry.validate("retry"); err != nil {
		return err
	}
	if len(c.EffectTypes) == 0 {
		return errors.New("effect_types: at least one effect type is needed")
	}
	for name, t := range c.EffectTypes {
		if err := t.validate(); err != nil {
			return fmt.Errorf("effect_types.%s: %w", name, err)
		}
		switch t.OnCrash {
		case outbox.AtLeastOnce, outbox.AtMostOnce:
		default:
			return fmt.Errorf("effect_types.%s.on_crash: %q: want at_least_once or at_most_once", name, t.OnCrash)
		}
	}
	return c.validateTenants()
}

// validateTenants checks that there are tenants (or the dev tenant on loopback), that every key is long
// enough and belongs to one tenant, and that allow-lists name configured types.
func (c *Config) validateTenants() error {
	if len(c.Tenants) == 0 {
		return errors.New("tenants: missing; name each tenant and its API keys (make a key with `gateway keygen`), " +
			"or run `gateway serve --dev` for a built-in dev tenant on loopback")
	}
	if c.Dev {
		host, _, err := net.SplitHostPort(c.Listen)
		ip := net.ParseIP(host)
		if err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
			return fmt.Errorf("listen: %q: --dev listens on loopback only (127.0.0.1, ::1 or localhost)", c.Listen)
		}
	}
	names := make([]string, 0, len(c.Tenants))
	for name := range c.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	owner := map[string]string{} // key hash → the field that lists it first
	for _, name := range names {
		t := c.Tenants[name]
		if name == "" {
			return errors.New("tenants: a tenant has an empty name")
		}
		if len(t.APIKeys) == 0 {
			return fmt.Errorf("tenants.%s.api_keys: a tenant needs at least one API key", name)
		}
		for i, k := range t.APIKeys {
			field := fmt.Sprintf("tenants.%s.api_keys[%d]", name, i)
			h, err := keyHash(k)
			if err != nil {
				return fmt.Errorf("%s: %w", field, err)
			}
			if first, ok := owner[string(h)]; ok {
				return fmt.Errorf("%s: the same key as %s; a key belongs to one tenant, listed once", field, first)
			}
			owner[string(h)] = field
		}
		if t.EffectTypes != nil && len(t.EffectTypes) == 0 {
			return fmt.Errorf("tenants.%s.effect_types: empty; leave it out to allow every type", name)
		}
		for i, typ := range t.EffectTypes {
			if _, ok := c.EffectTypes[typ]; !ok {
				return fmt.Errorf("tenants.%s.effect_types[%d]: no effect type %q is configured", name, i, typ)
			}
		}
		if err := t.Rate.validate("tenants."+name+".rate", c.Limits.MaxBody); err != nil {
			return err
		}
	}
	return nil
}

// validate checks a filled rate: bursts of at least one request and of the largest body accepted.
func (r RateLimit) validate(path string, maxBody ByteSize) error {
	if (r.RequestsPerSecond < 0 && r.RequestsPerSecond != Unlimited) || (r.BytesPerSecond < 0 && r.BytesPerSecond != Unlimited) {
		return fmt.Errorf("%s: a rate is positive or unlimited", path)
	}
	if r.RequestBurst < 1 {
		return fmt.Errorf("%s.request_burst must be at least 1", path)
	}
	if r.BytesPerSecond != Unlimited && r.ByteBurst < maxBody {
		return fmt.Errorf("%s.byte_burst (%d) must be at least limits.max_body (%d), or the largest body accepted "+
			"could never pass", path, r.ByteBurst, maxBody)
	}
	return nil
}

// limits is the tenant's rate for the limiter.
func (r RateLimit) limits() tenantlimit.Limits {
	l := tenantlimit.Limits{RequestsPerSecond: float64(r.RequestsPerSecond), RequestBurst: r.RequestBurst,
		BytesPerSecond: float64(r.BytesPerSecond), ByteBurst: int(r.ByteBurst)}
	if r.RequestsPerSecond == Unlimited {
		l.RequestsPerSecond = 0
	}
	if r.BytesPerSecond == Unlimited {
		l.BytesPerSecond = 0
	}
	return l
}

func (r Retry) validate(path string) error {
	if r.MaxAttempts < 0 || r.BaseDelay < 0 || r.MaxDelay < 0 {
		return fmt.Errorf("%s: max_attempts, base_delay and max_delay must be positive", path)
	}
	return nil
}

func (t EffectType) validate() error {
	if err := t.checkBlocks(); err != nil {
		return err
	}
	if t.Timeout < 0 || t.Concurrency < 0 || t.TenantConcurrency < 0 || t.Breaker.OpenFor < 0 {
		return errors.New("timeout, concurrency and breaker.open_for must be positive")
	}
	if t.Retry != nil {
		return t.Retry.validate("retry")
	}
	return nil
}

// kinds lists the provider kinds, for messages.
const kinds = "postgres, smtp, webhook, http"

// checkBlocks checks that the effect type has the settings block of its kind, and no other, and that the
// block is one its provider accepts.
func (t EffectType) checkBlocks() error {
	blocks := map[string]bool{"postgres": t.Postgres != nil, "smtp": t.SMTP != nil, "webhook": t.Webhook != nil,
		"http": t.HTTP != nil}
	for kind, set := range blocks {
		if set && kind != t.Provider {
			return fmt.Errorf("%s: a %s block on an effect type whose provider is %q", kind, kind, t.Provider)
		}
	}
	var err error
	switch t.Provider {
	case "postgres":
		if t.Postgres != nil {
			err = t.Postgres.Validate()
		}
	case "smtp", "webhook", "http":
		if !blocks[t.Provider] {
			return fmt.Errorf("%s: the settings of the %s provider are missing", t.Provider, t.Provider)
		}
		switch t.Provider {
		case "smtp":
			err = t.SMTP.Validate()
		case "webhook":
			err = t.Webhook.Validate()
		case "http":
			err = t.HTTP.Validate()
		}
	case "":
		return errors.New("provider: missing; one of: " + kinds)
	default:
		return fmt.Errorf("provider: unknown kind %q; one of: %s", t.Provider, kinds)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", t.Provider, err)
	}
	return nil
}

// HashKey returns the form of an API key that a configuration may hold instead of the key: "sha256:<hex>".
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// keyHash returns the SHA-256 of an API key given plain or as "sha256:<hex>".
func keyHash(k string) ([]byte, error) {
	if h, ok := strings.CutPrefix(k, "sha256:"); ok {
		b, err := hex.DecodeString(h)
		if err != nil || len(b) != sha256.Size {
			return nil, errors.New(`"sha256:" must be followed by 64 hex digits`)
		}
		return b, nil
	}
	for _, c := range k {
		// Authorization carries the key as a bearer token, trimmed: a space or control character would make a
		// key no request can present.
		if c <= ' ' || c > '~' {
			return nil, errors.New("an API key must be visible ASCII, without spaces; `gateway keygen` makes one")
		}
	}
	if len(k) < MinAPIKeyLength {
		return nil, fmt.Errorf("an API key must be at least %d characters (this one has %d); `gateway keygen` "+
			"makes one", MinAPIKeyLength, len(k))
	}
	sum := sha256.Sum256([]byte(k))
	return sum[:], nil
}

// newProvider builds the effect type's provider from its block. It is the one place providers are built;
// validate has checked the block.
func (t EffectType) newProvider(name string) (providers.Provider, error) {
	typ := providers.Type{Name: name, Timeout: time.Duration(t.Timeout), AtMostOnce: t.OnCrash == outbox.AtMostOnce}
	var (
		p   providers.Provider
		err error
	)
	switch t.Provider {
	case "postgres":
		var c postgres.Config
		if t.Postgres != nil {
			c = *t.Postgres
		}
		p, err = postgres.New(c)
	case "smtp":
		p, err = smtp.New(*t.SMTP, typ)
	case "webhook":
		p, err = webhook.New(*t.Webhook)
	case "http":
		p, err = httpprov.New(*t.HTTP)
	default:
		return nil, fmt.Errorf("provider: unknown kind %q; one of: %s", t.Provider, kinds)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.Provider, err)
	}
	return p, nil
}

// registry builds the providers of every effect type, once, into the registry that the HTTP API and the
// dispatcher share.
func (c *Config) registry() (*providers.Registry, error) {
	byName := make(map[string]providers.Provider, len(c.EffectTypes))
	for name, t := range c.EffectTypes {
		p, err := t.newProvider(name)
		if err != nil {
			closeAll(byName)
			return nil, fmt.Errorf("effect_types.%s: %w", name, err)
		}
		byName[name] = p
	}
	return providers.NewRegistry(byName)
}

func closeAll(byName map[string]providers.Provider) {
	if r, err := providers.NewRegistry(byName); err == nil {
		_ = r.Close()
	}
}

// outboxTypes turns the effect types into the dispatcher's, with the providers of reg.
func (c *Config) outboxTypes(reg *providers.Registry) []outbox.EffectType {
	var out []outbox.EffectType
	for _, name := range reg.Names() {
		t := c.EffectTypes[name]
		p, _ := reg.Get(name)
		out = append(out, outbox.EffectType{
			Name: name, Provider: p, Concurrency: t.Concurrency, TenantConcurrency: t.TenantConcurrency,
			Timeout:     time.Duration(t.Timeout),
			MaxAttempts: t.Retry.MaxAttempts,
			Retry:       backoff.Policy{Base: time.Duration(t.Retry.BaseDelay), Max: time.Duration(t.Retry.MaxDelay)},
			OnCrash:     t.OnCrash, BreakerFailures: t.Breaker.Failures, BreakerOpenFor: time.Duration(t.Breaker.OpenFor),
		})
	}
	return out
}

// poolConfig is the database pool's configuration: database_url as given, with defaults only for what it
// leaves out. pgxpool fills in a pool_max_conns of its own when the URL has none, so whether the user set
// it is read from the URL itself.
func (c *Config) poolConfig() (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database_url: %w", err)
	}
	cc, err := pgconn.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database_url: %w", err)
	}
	if _, set := cc.RuntimeParams["pool_max_conns"]; !set {
		pcfg.MaxConns = DefaultMaxConns
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 { // connect_timeout (or PGCONNECT_TIMEOUT) was not set
		pcfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	return pcfg, nil
}
