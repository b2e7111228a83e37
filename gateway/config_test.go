package gateway

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/outbox"
)

const (
	// testKey is a plain API key long enough to be accepted.
	testKey = "0123456789abcdef0123456789abcdef"
	// testSecret is a webhook secret of 24 bytes, the shortest accepted.
	testSecret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"
	// tenantsYAML is a tenants block, for files whose subject is something else.
	tenantsYAML = "tenants: { acme: { api_keys: [" + testKey + "] } }\n"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// What would fail open stops start-up, naming the field: the four (no tenants, a key under two
// tenants, a short key, a short webhook secret) as the attack found them.
func TestConfigFailsClosed(t *testing.T) {
	result := reliability.Record(t, "Configuration",
		"A file without tenants; one key under two tenants; an 8-character key; a webhook secret of 16 bytes; a burst of 1.5",
		"start-up refused, the error naming the field (both fields for a duplicate key)")
	for _, c := range []struct{ yaml, want string }{
		{"listen: 0.0.0.0:8080\n", "tenants: missing"},
		{"tenants:\n  alpha: { api_keys: [" + testKey + "] }\n  beta: { api_keys: [" + testKey + "] }",
			"tenants.beta.api_keys[0]: the same key as tenants.alpha.api_keys[0]"},
		{"tenants: { alpha: { api_keys: [abcdefgh] } }", "tenants.alpha.api_keys[0]: an API key must be at least 32 characters"},
		{"tenants: { alpha: { api_keys: ['" + strings.Repeat(" ", 40) + "'] } }", "tenants.alpha.api_keys[0]: an API key must be visible ASCII"},
		{tenantsYAML + "effect_types: { w: { provider: webhook, webhook: { url: 'https://h/x', secret: whsec_MDEyMzQ1Njc4OWFiY2RlZg== } } }",
			"effect_types.w: webhook: webhook: secret: want whsec_ and the base64 of at least 24 bytes"},
		// The YAML decoder would cut 1.5 to 1 for a whole-number field, silently.
		{tenantsYAML + "effect_types: { w: { provider: webhook, webhook: { url: 'https://h/x', secret: whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY= }, rate: { per_second: 50, burst: 1.5 } } }",
			`effect_types.w.rate.burst: "1.5" (line 2): want a whole number`},
	} {
		if _, err := Load(writeConfig(t, c.yaml)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.yaml, err, c.want)
		}
	}
	result("5/5 refused, each naming its field")
}

// A file names its tenants; only `serve --dev` (LoadDev) has a built-in one, and only on loopback.
func TestConfigDefaultsWithoutAFile(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://db.example/x")
	if _, err := Load(""); err == nil || !strings.Contains(err.Error(), "tenants: missing") ||
		!strings.Contains(err.Error(), "gateway serve --dev") {
		t.Fatalf("no file, not --dev: %v, want tenants: missing", err)
	}
	if _, err := Load(writeConfig(t, "listen: 127.0.0.1:9000\n")); err == nil || !strings.Contains(err.Error(), "tenants: missing") {
		t.Fatalf("a file without tenants: %v, want tenants: missing", err)
	}
	if _, err := LoadDev(writeConfig(t, "listen: 0.0.0.0:8080\n")); err == nil ||
		!strings.Contains(err.Error(), `listen: "0.0.0.0:8080": --dev listens on loopback only`) {
		t.Fatalf("--dev on every interface: %v", err)
	}
	// Every listen address Go binds passes the check made as the file is read: a zoned IPv6 address too.
	for _, listen := range []string{"[::1]:0", "[fe80::1%lo]:65535", "localhost:http", ":8080", "ip6-localhost:0",
		"0.0.0.0:80", "gw-1.internal.example:8080"} {
		if err := checkListen("listen", listen); err != nil {
			t.Errorf("listen %s: %v", listen, err)
		}
	}
	c, err := LoadDev("")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:8080" || c.DatabaseURL != "postgres://db.example/x" || c.Limits.MaxBody != 256<<10 ||
		time.Duration(c.Retention.Keys) != 24*time.Hour || len(c.Tenants[DefaultTenant].APIKeys) != 1 ||
		c.EffectTypes["analytics"].Provider != "postgres" {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestConfigFileWithEnvExpansion(t *testing.T) {
	t.Setenv("OG_DB", "postgres://from-env/db")
	t.Setenv("OG_KEY", "secret-from-env-0123456789abcdef0")
	c, err := Load(writeConfig(t, `
listen: 127.0.0.1:9999
database_url: ${OG_DB}
tenants:
  acme:
    api_keys: ["${OG_KEY}", "sha256:`+strings.Repeat("ab", 32)+`"]
effect_types:
  clicks:
    provider: postgres
    postgres: { table: analytics_events }
    on_crash: at_most_once
    retry: { max_attempts: 3, base_delay: 2s, max_delay: 1m }
retry: { max_attempts: 7 }
retention: { keys: 48h }
limits: { max_body: 1MiB }
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.DatabaseURL != "postgres://from-env/db" || c.Tenants["acme"].APIKeys[0] != "secret-from-env-0123456789abcdef0" ||
		c.Limits.MaxBody != 1<<20 || time.Duration(c.Retention.Keys) != 48*time.Hour || c.Retry.MaxAttempts != 7 ||
		c.EffectTypes["clicks"].Retry.MaxAttempts != 3 || time.Duration(c.EffectTypes["clicks"].Retry.BaseDelay) != 2*time.Second {
		t.Fatalf("loaded %+v", c)
	}
	reg, err := c.registry()
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	types := c.outboxTypes(reg)
	if len(types) != 1 || types[0].MaxAttempts != 3 || types[0].OnCrash != "at_most_once" {
		t.Fatalf("outbox types %+v", types)
	}
}

// An unset ${VAR} is refused at start, naming it: read as empty, a missing API_TOKEN became an empty
// credential, silently (an outside tester's finding). ${VAR:-default} is the way to say "empty is fine".
func TestUnsetEnvironmentVariablesAreRefused(t *testing.T) {
	t.Setenv("OG_SET_EMPTY", "")
	_, err := Load(writeConfig(t, `
tenants:
  acme:
    api_keys: ["${OG_NEVER_SET_ANYWHERE}"]
`))
	if err == nil || !strings.Contains(err.Error(), "OG_NEVER_SET_ANYWHERE") || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("an unset variable: %v", err)
	}
	c, err := Load(writeConfig(t, `
listen: "${OG_NEVER_SET_LISTEN:-127.0.0.1:9998}"
database_url: "postgres://x/${OG_SET_EMPTY}db${OG_NEVER_SET_SUFFIX:-}"
tenants:
  acme:
    api_keys: ["k-0123456789abcdef0123456789abcdef"]
`))
	if err != nil || c.Listen != "127.0.0.1:9998" || c.DatabaseURL != "postgres://x/db" {
		t.Fatalf("defaults and a variable set empty: %+v %v", c, err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"listne: x", "listne: unknown field (line 1)"},
		{"effect_types:\n  clicks:\n    provider: postgres\n    postgres: { tabel: x }", "effect_types.clicks.postgres.tabel: unknown field"},
		{"tenants:\n  acme:\n    api_key: [abcdefgh]", "tenants.acme.api_key: unknown field"},
		{"tenants:\n  acme:\n    api_keys: [short]", "tenants.acme.api_keys[0]: an API key must be at least 32 characters (this one has 5); `gateway keygen`"},
		{"tenants:\n  acme:\n    api_keys: [" + testKey + ", sha256:" + strings.Repeat("ab", 31) + "]", `tenants.acme.api_keys[1]: "sha256:" must be followed by 64 hex digits`},
		{"tenants:\n  acme:\n    api_keys: [" + testKey + "]\n  beta:\n    api_keys: [x" + testKey + ", " + HashKey(testKey) + "]",
			"tenants.beta.api_keys[1]: the same key as tenants.acme.api_keys[0]"},
		{"tenants:\n  acme:\n    api_keys: [" + testKey + ", " + testKey + "]", "tenants.acme.api_keys[1]: the same key as tenants.acme.api_keys[0]"},
		{"tenants:\n  acme:\n    api_keys: [" + testKey + "]\n    effect_types: []", "tenants.acme.effect_types: empty"},
		{"tenants:\n  acme:\n    api_keys: [" + testKey + "]\n    effect_types: [analytics, fax]", `tenants.acme.effect_types[1]: no effect type "fax"`},
		{"tenants:\n  acme:\n    api_keys: [" + testKey + "]\n    rate: { requests_per_second: 0 }", `tenants.acme.rate.requests_per_second: line 4: "0" is not a positive rate`},
		// A burst of 0 is no burst to hold: read as left out, it became the default's 1,000 (an outside test).
		{"tenants:\n  acme:\n    api_keys: [" + testKey + "]\n    rate: { request_burst: 0 }", `tenants.acme.rate.request_burst: "0" (line 4): want at least 1 (leave it out for the default)`},
		{"limits: { tenant_rate: { byte_burst: 0KiB } }", `limits.tenant_rate.byte_burst: "0KiB" (line 1): want at least 1 (leave it out for the default)`},
		{"tenants:\n  acme:\n    api_keys: [" + testKey + "]\n    rate: { byte_burst: 1KiB }", "tenants.acme.rate.byte_burst (1024) must be at least limits.max_body (262144)"},
		{"limits: { tenant_rate: { request_burst: -1 } }", `limits.tenant_rate.request_burst: "-1" (line 1): want at least 1 (leave it out for the default)`},
		// Checks made after parsing name the line of the deepest key they name that the file has.
		{"tenants:\n  acme:\n    api_keys: [" + testKey + "]\nlimits:\n  tenant_rate:\n    requests_per_second: 0.0001", "limits.tenant_rate.requests_per_second: 0.0001: want at least 0.001 a second, or unlimited (line 6)"},
		{"tenants:\n  acme:\n    api_keys: [" + testKey + "]\nretry:\n  base_delay: 10s\n  max_delay: 1s", "retry.base_delay (10s) must be at most retry.max_delay (1s) (line 5)"},
		{"effect_types:\n  x:\n    provider: postgres\n    retry:\n      base_delay: 1h", "retry.base_delay (1h0m0s) must be at most retry.max_delay (10m0s) (line 5)"},
		{"limits: { tenant_rate: { requests_per_second: 1e-300 } }", "limits.tenant_rate.requests_per_second: 1e-300: want at least 0.001"},
		{"limits: { tenant_rate: { bytes_per_second: lots } }", `limits.tenant_rate.bytes_per_second: line 1: "lots" is not a positive size like 8MiB or "unlimited"`},
		{"limits: { max_connections: -5 }", "limits.max_connections must be at least 1"},
		{"retention: { keys: 1h, payloads: 2h }", "retention.payloads (2h0m0s) must be at most retention.keys (1h0m0s)"},
		{"retention: { payloads: -1s }", `retention.payloads: line 1: "-1s" is not a duration`},
		{"retention: { payloads: 1h }\npartitions: { disabled: true }", "retention.payloads needs the partition manager"},
		{"partitions: { interval: 1500ms }", "partitions.interval must be a whole number of seconds, at least 1s, and partitions.ahead not negative (0 is the default, 3)"},
		{"partitions: { ahead: 100000 }", "partitions.ahead (100000) must be at most 100"},
		{"timeouts: { read: 21s }", "timeouts.write (1m0s) must be at least timeouts.read + the longest wait (30s) + twice timeouts.database = 1m1s"},
		{"timeouts: { database: 10s }", "timeouts.write (1m0s) must be at least timeouts.read + the longest wait (30s) + twice timeouts.database = 1m5s"},
		{"effect_types:\n  w:\n    provider: webhook\n    webhook: { url: 'https://h/x', secrets: [" + testSecret + ", whsec_MDEyMzQ1Njc4OWFiY2RlZg==] }", "effect_types.w: webhook: webhook: secrets[1]: want whsec_"},
		{"tenants:\n  acme:\n    api_keys: []", "tenants.acme.api_keys: a tenant needs at least one"},
		{"effect_types:\n  fax:\n    provider: fax", `effect_types.fax: provider: unknown kind "fax"`},
		{"effect_types:\n  c:\n    provider: postgres\n    postgres: { table: \"x; drop\" }", "is not an identifier"},
		{"effect_types:\n  c:\n    provider: postgres\n    on_crash: sometimes", "effect_types.c.on_crash"},
		{"retry: { base_delay: soon }", `retry.base_delay: line 1: "soon" is not a duration`},
		{"limits: { max_body: lots }", `limits.max_body: line 1: "lots" is not a size`},
		{"tenants: [1, 2]", "cannot unmarshal"},
		{"limits: { page_size: 600 }", "page_size (600) must be at least 1 and at most max_page_size (500)"},
		{"effect_types:\n  c:\n    provider: postgres\n    concurrency: -1", "effect_types.c: timeout, concurrency"},
		{"database_url: 'postgres://h/d?pool_max_conns=many'", "database_url: cannot parse"},
		{"listen: notanaddr", `listen: "notanaddr" is not host:port (address notanaddr: missing port in address) (line 1)`},
		{"listen: 0.0.0.0:99999", `listen: "0.0.0.0:99999": the port "99999" is not 0 to 65535`},
		{"listen: 'bad host!:80'", `"bad host!" is neither an IP address nor a host name`},
		{"listen: '999.999.999.999:80'", `"999.999.999.999" is neither an IP address nor a host name`},
		{"effect_types:\n  m:\n    provider: smtp\n    smtp: { addr: 'h:25', from: a@b.test, helo: 'a b' }", "effect_types.m: smtp: smtp: helo"},
	} {
		_, err := Load(writeConfig(t, c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.yaml, err, c.want)
		}
	}
}

// Every default is filled in one place, WithDefaults, and reads back as the documented constant; a nil
// configuration is all defaults, and the caller's configuration is left as it was.
func TestWithDefaults(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	if err := (*Config)(nil).WithDefaults().validate(); err == nil || !strings.Contains(err.Error(), "tenants: missing") {
		t.Fatalf("a nil configuration: %v, want tenants: missing", err)
	}
	c := (&Config{Dev: true}).WithDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	et := c.EffectTypes[DefaultEffectType]
	for name, got := range map[string][2]any{
		"listen":                  {c.Listen, DefaultListen},
		"database_url":            {c.DatabaseURL, DefaultDatabaseURL},
		"retry.max_attempts":      {c.Retry.MaxAttempts, DefaultMaxAttempts},
		"retry.base_delay":        {time.Duration(c.Retry.BaseDelay), DefaultBaseDelay},
		"retry.max_delay":         {time.Duration(c.Retry.MaxDelay), DefaultMaxDelay},
		"retention.keys":          {time.Duration(c.Retention.Keys), DefaultRetention},
		"limits.max_body":         {int64(c.Limits.MaxBody), int64(DefaultMaxBody)},
		"limits.page_size":        {c.Limits.PageSize, DefaultPageSize},
		"limits.max_page_size":    {c.Limits.MaxPageSize, DefaultMaxPageSize},
		"timeouts.database":       {time.Duration(c.Timeouts.Database), DefaultDatabaseTimeout},
		"timeouts.shutdown":       {time.Duration(c.Timeouts.Shutdown), DefaultShutdownTimeout},
		"timeouts.read_header":    {time.Duration(c.Timeouts.ReadHeader), DefaultReadHeaderTimeout},
		"timeouts.read":           {time.Duration(c.Timeouts.Read), DefaultReadTimeout},
		"timeouts.write":          {time.Duration(c.Timeouts.Write), DefaultWriteTimeout},
		"timeouts.idle":           {time.Duration(c.Timeouts.Idle), DefaultIdleTimeout},
		"limits.max_header":       {int64(c.Limits.MaxHeader), int64(DefaultMaxHeader)},
		"limits.max_connections":  {c.Limits.MaxConnections, DefaultMaxConnections},
		"limits.tenant_rate":      {c.Limits.TenantRate, RateLimit{DefaultTenantRateScope, DefaultTenantRequestsPerSecond, DefaultTenantRequestBurst, DefaultTenantBytesPerSecond, DefaultTenantByteBurst}},
		"tenant.rate":             {c.Tenants[DefaultTenant].Rate, c.Limits.TenantRate},
		"timeouts.ready":          {time.Duration(c.Timeouts.Ready), DefaultReadyTimeout},
		"timeouts.metrics":        {time.Duration(c.Timeouts.Metrics), DefaultMetricsTimeout},
		"dispatcher.poll":         {time.Duration(c.Dispatcher.PollInterval), DefaultPollInterval},
		"dispatcher.lease_margin": {time.Duration(c.Dispatcher.LeaseMargin), DefaultLeaseMargin},
		"dispatcher.drain":        {time.Duration(c.Dispatcher.DrainTimeout), DefaultDrainTimeout},
		"type.on_crash":           {et.OnCrash, DefaultOnCrash},
		"type.timeout":            {time.Duration(et.Timeout), DefaultTimeout},
		"type.concurrency":        {et.Concurrency, outbox.DefaultBatchTxConcurrency}, // the default type is postgres
		"type.retry":              {*et.Retry, c.Retry},
		"type.breaker.failures":   {et.Breaker.Failures, uint32(DefaultBreakerFailures)},
		"type.breaker.open_for":   {time.Duration(et.Breaker.OpenFor), DefaultBreakerOpenFor},
		"tenant":                  {c.Tenants[DefaultTenant].APIKeys[0], DefaultAPIKey},
	} {
		if got[0] != got[1] {
			t.Errorf("%s: %v, want %v", name, got[0], got[1])
		}
	}

	// A type's own retry keeps what it sets; what it leaves out takes the package defaults.
	mine := &Config{Retry: Retry{BaseDelay: Duration(2 * time.Second)}, EffectTypes: map[string]EffectType{
		"a": {Provider: "postgres", Retry: &Retry{MaxAttempts: 3}}}}
	got := mine.WithDefaults()
	if r := got.EffectTypes["a"].Retry; r.MaxAttempts != 3 || time.Duration(r.BaseDelay) != DefaultBaseDelay {
		t.Fatalf("type retry %+v", r)
	}
	if mine.EffectTypes["a"].Timeout != 0 || mine.Tenants != nil || mine.Listen != "" {
		t.Fatalf("WithDefaults changed its receiver: %+v", mine)
	}

	// A tenant's rate keeps what it sets; what it leaves out takes limits.tenant_rate, set or defaulted.
	rates := (&Config{Limits: Limits{TenantRate: RateLimit{RequestsPerSecond: 7}}, Tenants: map[string]Tenant{
		"a": {APIKeys: []string{testKey}, Rate: RateLimit{RequestBurst: 3, BytesPerSecond: Unlimited}}}}).WithDefaults()
	want := RateLimit{Scope: ScopeGateway, RequestsPerSecond: 7, RequestBurst: 3, BytesPerSecond: Unlimited,
		ByteBurst: DefaultTenantByteBurst}
	if got := rates.Tenants["a"].Rate; got != want {
		t.Fatalf("tenant rate %+v, want %+v", got, want)
	}
	if l := want.limits(); l.RequestsPerSecond != 7 || l.BytesPerSecond != 0 || l.Fleet {
		t.Fatalf("limiter's view of %+v: %+v; want 7 requests/s in this gateway and no byte bucket", want, l)
	}

	// The scope too: limits.tenant_rate's for every tenant that sets none, a tenant's own where it does.
	scoped := (&Config{Limits: Limits{TenantRate: RateLimit{Scope: ScopeFleet}}, Tenants: map[string]Tenant{
		"a": {APIKeys: []string{testKey}},
		"b": {APIKeys: []string{testKey + "b"}, Rate: RateLimit{Scope: ScopeGateway}}}}).WithDefaults()
	if a, b := scoped.Tenants["a"].Rate, scoped.Tenants["b"].Rate; !a.limits().Fleet || b.limits().Fleet {
		t.Fatalf("scopes: a %q, b %q; want a fleet (limits.tenant_rate's), b gateway (its own)", a.Scope, b.Scope)
	}
	if err := (&Config{Limits: Limits{TenantRate: RateLimit{Scope: "cluster"}}, Tenants: map[string]Tenant{
		"a": {APIKeys: []string{testKey}}}}).WithDefaults().validate(); err == nil ||
		!strings.Contains(err.Error(), "limits.tenant_rate.scope") {
		t.Fatalf("scope cluster: %v, want refused as limits.tenant_rate.scope", err)
	}
}

// SPEC §7 spells on_crash and timeout in the provider block too: they are the effect type's one knob, read
// from either place, and a type that sets one twice with different values is refused with both lines.
func TestProviderBlockSpellsTheTypeKnobs(t *testing.T) {
	for _, c := range []struct {
		yaml    string
		onCrash string
		timeout time.Duration
	}{
		{"effect_types:\n  mail:\n    provider: smtp\n    smtp: { addr: 'h:25', from: a@b.test, on_crash: at_most_once, timeout: 5s }",
			"at_most_once", 5 * time.Second},
		{"effect_types:\n  mail:\n    provider: webhook\n    webhook: { url: 'https://h.example/x', secret: " + testSecret + ", timeout: 4s }\n    timeout: 4s",
			"at_least_once", 4 * time.Second},
		{"effect_types:\n  mail:\n    provider: http\n    on_crash: at_most_once\n    http: { base_url: 'https://h', timeout: 3s }",
			"at_most_once", 3 * time.Second},
	} {
		cfg, err := Load(writeConfig(t, tenantsYAML+c.yaml))
		if err != nil {
			t.Fatalf("%q: %v", c.yaml, err)
		}
		et := cfg.EffectTypes["mail"]
		if string(et.OnCrash) != c.onCrash || time.Duration(et.Timeout) != c.timeout {
			t.Errorf("%q: on_crash %q timeout %v, want %q %v", c.yaml, et.OnCrash, time.Duration(et.Timeout), c.onCrash, c.timeout)
		}
	}
	_, err := Load(writeConfig(t, "effect_types:\n  mail:\n    provider: smtp\n    timeout: 2s\n    smtp: { addr: 'h:25', from: a@b.test, timeout: 5s }"))
	want := `effect_types.mail: timeout is set twice, "2s" on the type (line 4) and "5s" in its smtp block (line 5)`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("conflicting timeouts: error %v, want %q", err, want)
	}
}

// The effect type's timeout and on_crash reach the dispatcher, and the smtp provider, which acts on them.
func TestEffectTypeKnobsReachTheDispatcher(t *testing.T) {
	c, err := Load(writeConfig(t, tenantsYAML+`
effect_types:
  mail:
    provider: smtp
    smtp: { addr: "127.0.0.1:25", from: a@b.test }
    on_crash: at_most_once
    timeout: 7s
  hook:
    provider: webhook
    webhook: { url: "https://h.example/x", secret: `+testSecret+` }
    timeout: 2s
`))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := c.registry()
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	got := map[string]string{}
	for _, ty := range c.outboxTypes(reg) {
		got[ty.Name] = fmt.Sprintf("%v %s", ty.Timeout, ty.OnCrash)
		if p, _ := reg.Get(ty.Name); p != ty.Provider {
			t.Errorf("%s: the dispatcher's provider is not the registry's", ty.Name)
		}
	}
	if got["mail"] != "7s at_most_once" || got["hook"] != "2s at_least_once" || len(got) != 2 {
		t.Fatalf("types %v", got)
	}
}

// The pool takes pool_max_conns and connect_timeout from database_url as given, lower or higher than the
// defaults, and the defaults only when the URL leaves them out.
func TestPoolConfigKeepsTheUsersSettings(t *testing.T) {
	t.Setenv("PGCONNECT_TIMEOUT", "")
	for _, c := range []struct {
		url      string
		max      int32
		dialWait time.Duration
	}{
		{"postgres://h/d", DefaultMaxConns, DefaultConnectTimeout},
		{"postgres://h/d?pool_max_conns=5", 5, DefaultConnectTimeout},
		{"postgres://h/d?pool_max_conns=100&connect_timeout=10", 100, 10 * time.Second},
		{"host=h dbname=d pool_max_conns=2 connect_timeout=1", 2, time.Second},
	} {
		pc, err := (&Config{DatabaseURL: c.url}).poolConfig()
		if err != nil {
			t.Fatal(err)
		}
		if pc.MaxConns != c.max || pc.ConnConfig.ConnectTimeout != c.dialWait {
			t.Errorf("%s: pool_max_conns %d, connect_timeout %v; want %d, %v", c.url, pc.MaxConns,
				pc.ConnConfig.ConnectTimeout, c.max, c.dialWait)
		}
	}
}

// docs/configuration.md documents every key of the file: a field added to Config without a row there fails.
func TestEveryKeyIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(rt reflect.Type, path string)
	walk = func(rt reflect.Type, path string) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Map || rt.Kind() == reflect.Slice {
			if rt.Kind() == reflect.Map {
				path = "" // keys under a name (a tenant, an effect type) are documented without it
			}
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct {
			if !strings.Contains(string(doc), path+"`") {
				t.Errorf("docs/configuration.md does not document %s", path)
			}
			return
		}
		if rt.PkgPath() != reflect.TypeOf(Config{}).PkgPath() {
			path = "" // a provider block: its keys are listed by kind
		}
		for i := 0; i < rt.NumField(); i++ {
			if tag := strings.Split(rt.Field(i).Tag.Get("yaml"), ",")[0]; tag != "" && tag != "-" {
				walk(rt.Field(i).Type, join(path, tag))
			}
		}
	}
	walk(reflect.TypeOf(Config{}), "")
}

// Finding 8 of issue 13: Standard Webhooks asks for signing secrets of 24 bytes at least. Every way a secret
// enters the configuration (secret, secrets, both, through ${VAR}) refuses 16 and 23 bytes at start-up,
// naming the field, and takes 24.
func TestWebhookSecretsUnder24BytesStopStartUp(t *testing.T) {
	result := reliability.Record(t, "Configuration", "Webhook secrets of 16 and 23 bytes in secret, secrets, ${VAR}, unpadded and URL-safe base64",
		"start-up refused naming the field; 24 bytes accepted")
	whsec := func(n int) string {
		return "whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", n)))
	}
	t.Setenv("OG_SECRET_23", whsec(23))
	t.Setenv("OG_SECRET_24", whsec(24))
	block := func(secrets string) string {
		return tenantsYAML + "effect_types: { w: { provider: webhook, webhook: { url: 'https://h.example/x', " + secrets + " } } }"
	}
	const want = "want whsec_ and the base64 of at least 24 bytes"
	refused := 0
	for _, c := range []struct{ secrets, field string }{
		{"secret: " + whsec(16), "secret"},
		{"secret: " + whsec(23), "secret"},
		{"secret: '${OG_SECRET_23}'", "secret"},
		{"secret: " + "whsec_" + base64.RawStdEncoding.EncodeToString([]byte(strings.Repeat("k", 23))), "secret"},
		{"secret: " + "whsec_" + base64.URLEncoding.EncodeToString([]byte(strings.Repeat("\xfb", 24))), "secret"},
		{"secrets: [" + whsec(16) + "]", "secrets[0]"},
		{"secrets: [" + whsec(24) + ", " + whsec(23) + "]", "secrets[1]"},
		{"secrets: ['${OG_SECRET_24}', '${OG_SECRET_23}']", "secrets[1]"},
		{"secret: " + whsec(24) + ", secrets: [" + whsec(23) + "]", "secrets[0]"},
		{"secret: " + whsec(23) + ", secrets: [" + whsec(24) + "]", "secret"},
	} {
		_, err := Load(writeConfig(t, block(c.secrets)))
		if err == nil || !strings.Contains(err.Error(), "effect_types.w: webhook: webhook: "+c.field+": "+want) {
			t.Errorf("%s: %v, want refused naming %s", c.secrets, err, c.field)
			continue
		}
		refused++
	}
	for _, secrets := range []string{"secret: " + whsec(24), "secret: '${OG_SECRET_24}'", "secrets: [" + whsec(24) + ", " + whsec(32) + "]",
		"secret: " + "whsec_" + base64.RawStdEncoding.EncodeToString([]byte(strings.Repeat("k", 24)))} {
		c, err := Load(writeConfig(t, block(secrets)))
		if err != nil {
			t.Errorf("%s: %v", secrets, err)
			continue
		}
		reg, err := c.registry()
		if err != nil {
			t.Errorf("%s: the provider refused what the configuration took: %v", secrets, err)
			continue
		}
		reg.Close()
	}
	result(fmt.Sprintf("%d/%d short secrets refused naming the field; 24 bytes accepted", refused, refused))
}

// Issue 31: a fleet-wide delivery rate out of range stops the start naming the field; a rate without a
// burst gets one second's worth, and reaches the dispatcher's type.
func TestDeliveryRateIsCheckedAndDefaulted(t *testing.T) {
	t.Parallel()
	typ := func(rate string) string {
		return tenantsYAML + "effect_types: { w: { provider: webhook, webhook: { url: 'https://h.example/x', " +
			"secret: 'whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=' }, rate: " + rate + " } }\n"
	}
	for _, c := range []struct{ rate, want string }{
		{"{ per_second: 0 }", "effect_types.w: rate.per_second is required, and not 0: the calls a second to one destination, from 0.001"},
		{"{ per_second: unlimited }", `effect_types.w.rate.per_second: "unlimited" (line 2): want a number`},
		{"{ per_second: '10' }", `effect_types.w.rate.per_second: "10" (line 2): want a number`},
		{"{ per_second: 50, burst: 1e20 }", `effect_types.w.rate.burst: "1e20" (line 2): too large`},
		{"{ per_second: -5 }", "effect_types.w: rate.per_second: -5"},
		{"{ burst: 10 }", "effect_types.w: rate.per_second is required"},
		{"{ per_second: 1e-300 }", "effect_types.w: rate.per_second: 1e-300: want calls a second to one destination, from 0.001"},
		{"{ per_second: 20000 }", "rate.per_second: 20000: want calls a second to one destination, from 0.001 to 10000"},
		{"{ per_second: 50, burst: -1 }", "effect_types.w: rate.burst: -1: want 1 to 100000"},
		{"{ per_second: 50, brust: 3 }", "brust"},
	} {
		if _, err := Load(writeConfig(t, typ(c.rate))); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rate %s: %v, want an error with %q", c.rate, err, c.want)
		}
	}
	cfg, err := Load(writeConfig(t, typ("{ per_second: 2.5 }")))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.EffectTypes["w"].Rate; r == nil || r.PerSecond != 2.5 || r.Burst != 2 {
		t.Fatalf("rate %+v, want 2.5/s with a burst of 2", r)
	}
	if r := outboxRate(cfg.EffectTypes["w"].Rate); r == nil || r.PerSecond != 2.5 || r.Burst != 2 {
		t.Fatalf("the dispatcher's rate %+v", r)
	}
}

// A number from the environment is a number: `per_second: ${RATE}` was refused as a string (the parser had
// read "${RATE}"), and a secret that looks like a number stays the secret.
func TestANumberFromTheEnvironmentIsANumber(t *testing.T) {
	t.Setenv("ONCEGATE_TEST_RATE", "50")
	cfg := tenantsYAML + "effect_types:\n  w:\n    provider: webhook\n    webhook: { url: 'https://h.example/x', " +
		"secret: 'whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=' }\n    rate:\n      per_second: ${ONCEGATE_TEST_RATE}\n"
	c, err := Load(writeConfig(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if r := c.EffectTypes["w"].Rate; r == nil || r.PerSecond != 50 {
		t.Fatalf("rate %+v, want 50 a second", r)
	}
}
