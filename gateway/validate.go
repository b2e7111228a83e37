package gateway

// Checking a filled configuration, once, at Load and New: every error names the field at fault.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/net/http/httpguts"

	"github.com/oncegate/oncegate/outbox"
)

// validate checks a configuration that WithDefaults has filled: every error names the field at fault.
func (c *Config) validate() error {
	if err := checkListen("listen", c.Listen); err != nil {
		return err
	}
	if c.MetricsListen != "" {
		if err := checkListen("metrics_listen", c.MetricsListen); err != nil {
			return err
		}
		if c.MetricsListen == c.Listen {
			return fmt.Errorf("metrics_listen: %q is listen's address: give the metrics an address of their own, "+
				"or leave metrics_listen out to serve them on listen", c.MetricsListen)
		}
	}
	if _, err := c.poolConfig(); err != nil {
		return err
	}
	if c.ListenURL != "" {
		if _, err := pgxpool.ParseConfig(c.ListenURL); err != nil {
			return fmt.Errorf("listen_url: %w", err)
		}
	}
	if c.DDLURL != "" {
		if _, err := pgxpool.ParseConfig(c.DDLURL); err != nil {
			return fmt.Errorf("ddl_url: %w", err)
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
	if c.Limits.TenantHeldRequests < 1 {
		return errors.New("limits.tenant_held_requests must be at least 1")
	}
	if err := c.Limits.TenantRate.validate("limits.tenant_rate", c.Limits.MaxBody); err != nil {
		return err
	}
	// Whole seconds: an effect's id counts seconds, and the partitions' bounds are ids.
	if c.Partitions.Interval != 0 && (c.Partitions.Interval < Duration(time.Second) ||
		time.Duration(c.Partitions.Interval)%time.Second != 0) || c.Partitions.Ahead < 0 {
		return errors.New("partitions.interval must be a whole number of seconds, at least 1s, and partitions.ahead " +
			"not negative (0 is the default, 3)")
	}
	// A pass makes every table's partitions ahead in one transaction, a lock on each: 100 ahead is 400
	// tables, and an outside tester's 100,000 started without a word.
	if c.Partitions.Ahead > MaxPartitionsAhead {
		return fmt.Errorf("partitions.ahead (%d) must be at most %d: a pass makes them all in one transaction, "+
			"four tables each", c.Partitions.Ahead, MaxPartitionsAhead)
	}
	if c.Retention.Payloads < 0 || c.Retention.Payloads > c.Retention.Keys {
		return fmt.Errorf("retention.payloads (%v) must be at most retention.keys (%v): a body goes before its "+
			"effect, not after", time.Duration(c.Retention.Payloads), time.Duration(c.Retention.Keys))
	}
	if c.Retention.Payloads > 0 && c.Partitions.Disabled {
		return errors.New("retention.payloads needs the partition manager: bodies are retired by dropping their " +
			"partitions, which partitions.disabled leaves to something else")
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
		if t.HeldRequests < 1 {
			return fmt.Errorf("tenants.%s.held_requests must be at least 1", name)
		}
	}
	return nil
}

// validate checks a filled rate: bursts of at least one request and of the largest body accepted.
func (r RateLimit) validate(path string, maxBody ByteSize) error {
	if r.Scope != ScopeGateway && r.Scope != ScopeFleet {
		return fmt.Errorf("%s.scope is %q: it is gateway (each gateway holds the rate) or fleet (every gateway "+
			"sharing the database holds it together)", path, r.Scope)
	}
	if (r.RequestsPerSecond < 0 && r.RequestsPerSecond != Unlimited) || (r.BytesPerSecond < 0 && r.BytesPerSecond != Unlimited) {
		return fmt.Errorf("%s: a rate is positive or unlimited", path)
	}
	if r.RequestsPerSecond != Unlimited && r.RequestsPerSecond < MinRate {
		return fmt.Errorf("%s.requests_per_second: %v: want at least %v a second, or unlimited", path,
			float64(r.RequestsPerSecond), MinRate)
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

func (r Retry) validate(path string) error {
	if r.MaxAttempts < 0 || r.BaseDelay < 0 || r.MaxDelay < 0 {
		return fmt.Errorf("%s: max_attempts, base_delay and max_delay must be positive", path)
	}
	if r.BaseDelay > r.MaxDelay {
		// The back-off would wait max_delay from the first retry on: not what base_delay says.
		return fmt.Errorf("%[1]s.base_delay (%[2]v) must be at most %[1]s.max_delay (%[3]v)", path,
			time.Duration(r.BaseDelay), time.Duration(r.MaxDelay))
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
	if t.Rate != nil {
		if err := t.Rate.validate("rate"); err != nil {
			return err
		}
	}
	if t.Retry != nil {
		return t.Retry.validate("retry")
	}
	return nil
}

func (r DeliveryRate) validate(path string) error {
	if r.PerSecond == 0 {
		return fmt.Errorf("%s.per_second is required, and not 0: the calls a second to one destination, from %v "+
			"to %d (leave rate out for no limit)", path, MinRate, MaxDeliveryRate)
	}
	// Below MinRate a burst's worth of time passes what Postgres's timestamps hold: every take of tokens
	// failed (an outside test's 1e-300 started, then delivered nothing).
	if !(r.PerSecond >= MinRate) || r.PerSecond > MaxDeliveryRate {
		return fmt.Errorf("%s.per_second: %v: want calls a second to one destination, from %v to %d "+
			"(leave rate out for no limit)", path, r.PerSecond, MinRate, MaxDeliveryRate)
	}
	if r.Burst < 0 || r.Burst > MaxDeliveryBurst {
		return fmt.Errorf("%s.burst: %d: want 1 to %d calls (leave it out for one second's worth)", path, r.Burst,
			MaxDeliveryBurst)
	}
	return nil
}

// checkListen refuses a listen address the gateway could not bind as it is written, while the file is read:
// found at the bind, it stopped a gateway that had already connected to Postgres and migrated it, and the
// error named neither the field nor its line.
func checkListen(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s: %q is not host:port (%v)", field, addr, err)
	}
	if _, ipErr := netip.ParseAddr(host); host != "" && ipErr != nil && !validHostName(host) {
		return fmt.Errorf("%s: %q: %q is neither an IP address nor a host name", field, addr, host)
	}
	n, err := strconv.Atoi(port)
	if err != nil { // a service name, such as http
		_, err = net.LookupPort("tcp", port)
	} else if n < 0 || n > 65535 {
		err = errors.New("out of range")
	}
	if err != nil {
		return fmt.Errorf("%s: %q: the port %q is not 0 to 65535 or a service name", field, addr, port)
	}
	return nil
}

// validHostName is a DNS name's shape: labels of letters, digits and hyphens, 1 to 63 bytes, 253 in all,
// the last not all digits (999.999.999.999 is a mistyped address, not a name).
func validHostName(h string) bool {
	labels := strings.Split(strings.TrimSuffix(h, "."), ".")
	if len(h) > 253 || strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return false
	}
	for _, label := range labels {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}
