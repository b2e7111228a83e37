package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/providers"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/postgres"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/providers/webhook"
)

// Defaults for a gateway started with no configuration file: loopback, one dev tenant, one analytics type.
const (
	DefaultListen      = "127.0.0.1:8080"
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/oncegate?sslmode=disable"
	DefaultTenant      = "dev"
	DefaultAPIKey      = "dev-api-key"
	DefaultMaxBody     = 256 << 10
	MaxWait            = 30 * time.Second
)

// Config is the gateway's configuration file. Every field has a default; see Load.
type Config struct {
	Listen      string                `yaml:"listen"`
	DatabaseURL string                `yaml:"database_url"`
	Tenants     map[string]Tenant     `yaml:"tenants"`
	EffectTypes map[string]EffectType `yaml:"effect_types"`
	Retry       Retry                 `yaml:"retry"`
	Retention   Retention             `yaml:"retention"`
	Limits      Limits                `yaml:"limits"`
	Dispatcher  Dispatcher            `yaml:"dispatcher"`
}

// Tenant owns API keys; its idempotency keys are its own.
type Tenant struct {
	// APIKeys are plain keys, hashed when loaded, or "sha256:<hex>" of a key.
	APIKeys []string `yaml:"api_keys"`
}

// EffectType binds an effect type to a provider kind and its settings.
type EffectType struct {
	Provider string           `yaml:"provider"`
	Postgres *postgres.Config `yaml:"postgres"`
	SMTP     *smtp.Config     `yaml:"smtp"`
	Webhook  *webhook.Config  `yaml:"webhook"`
	HTTP     *httpprov.Config `yaml:"http"`
	// OnCrash: at_least_once (default) resends a delivery interrupted by a gateway crash; at_most_once marks
	// it unknown for an operator.
	OnCrash     string   `yaml:"on_crash"`
	Timeout     Duration `yaml:"timeout"`
	Concurrency int      `yaml:"concurrency"`
	Retry       *Retry   `yaml:"retry"`
	Breaker     Breaker  `yaml:"breaker"`
}

// Retry is the retry policy, globally and per effect type.
type Retry struct {
	MaxAttempts int      `yaml:"max_attempts"`
	BaseDelay   Duration `yaml:"base_delay"`
	MaxDelay    Duration `yaml:"max_delay"`
}

// Breaker opens after Failures consecutive failures, for OpenFor.
type Breaker struct {
	Failures uint32   `yaml:"failures"`
	OpenFor  Duration `yaml:"open_for"`
}

// Retention says how long terminal effects, and so their keys, are kept.
type Retention struct {
	Keys Duration `yaml:"keys"`
}

// Limits bounds requests.
type Limits struct {
	MaxBody ByteSize `yaml:"max_body"`
}

// Dispatcher tunes the outbox dispatcher.
type Dispatcher struct {
	// Disabled runs the gateway as an API node only: it records effects, and other gateways (with the
	// dispatcher on) deliver them. API and delivery capacity then scale apart.
	Disabled     bool     `yaml:"disabled"`
	PollInterval Duration `yaml:"poll_interval"`
	LeaseMargin  Duration `yaml:"lease_margin"`
	DrainTimeout Duration `yaml:"drain_timeout"`
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
// refusing unknown fields with their path, and filling defaults.
func Load(path string) (*Config, error) {
	var c Config
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if err := parse(raw, &c); err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}
	if err := c.fill(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return &c, nil
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

func (c *Config) fill() error {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = DefaultDatabaseURL
	}
	if c.Tenants == nil {
		c.Tenants = map[string]Tenant{DefaultTenant: {APIKeys: []string{DefaultAPIKey}}}
	}
	if c.EffectTypes == nil {
		c.EffectTypes = map[string]EffectType{"analytics": {Provider: "postgres", Postgres: &postgres.Config{}}}
	}
	if c.Limits.MaxBody == 0 {
		c.Limits.MaxBody = DefaultMaxBody
	}
	if c.Limits.MaxBody < 0 {
		return errors.New("limits.max_body must be positive")
	}
	if c.Retention.Keys == 0 {
		c.Retention.Keys = Duration(outbox.DefaultRetention)
	}
	for name, t := range c.Tenants {
		if name == "" {
			return errors.New("tenants: a tenant has an empty name")
		}
		if len(t.APIKeys) == 0 {
			return fmt.Errorf("tenants.%s.api_keys: a tenant needs at least one API key", name)
		}
		for i, k := range t.APIKeys {
			if _, err := keyHash(k); err != nil {
				return fmt.Errorf("tenants.%s.api_keys[%d]: %w", name, i, err)
			}
		}
	}
	if len(c.EffectTypes) == 0 {
		return errors.New("effect_types: at least one effect type is needed")
	}
	for name, t := range c.EffectTypes {
		if _, err := t.provider(); err != nil {
			return fmt.Errorf("effect_types.%s: %w", name, err)
		}
		switch t.OnCrash {
		case "", string(outbox.AtLeastOnce), string(outbox.AtMostOnce):
		default:
			return fmt.Errorf("effect_types.%s.on_crash: %q: want at_least_once or at_most_once", name, t.OnCrash)
		}
	}
	return nil
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
	if len(k) < 8 {
		return nil, errors.New("an API key must be at least 8 characters")
	}
	sum := sha256.Sum256([]byte(k))
	return sum[:], nil
}

// kinds lists the provider kinds, for messages.
const kinds = "postgres, smtp, webhook, http"

// provider builds the effect type's provider from its settings: the block named after its kind, and no other.
func (t EffectType) provider() (providers.Provider, error) {
	blocks := map[string]bool{"postgres": t.Postgres != nil, "smtp": t.SMTP != nil, "webhook": t.Webhook != nil,
		"http": t.HTTP != nil}
	for kind, set := range blocks {
		if set && kind != t.Provider {
			return nil, fmt.Errorf("%s: a %s block on an effect type whose provider is %q", kind, kind, t.Provider)
		}
	}
	switch t.Provider {
	case "postgres":
		var c postgres.Config
		if t.Postgres != nil {
			c = *t.Postgres
		}
		return postgres.New(c)
	case "smtp", "webhook", "http":
		if !blocks[t.Provider] {
			return nil, fmt.Errorf("%s: the settings of the %s provider are missing", t.Provider, t.Provider)
		}
	}
	var (
		p   providers.Provider
		err error
	)
	switch t.Provider {
	case "smtp":
		p, err = smtp.New(*t.SMTP)
	case "webhook":
		p, err = webhook.New(*t.Webhook)
	case "http":
		p, err = httpprov.New(*t.HTTP)
	case "":
		return nil, errors.New("provider: missing; one of: " + kinds)
	default:
		return nil, fmt.Errorf("provider: unknown kind %q; one of: %s", t.Provider, kinds)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.Provider, err)
	}
	return p, nil
}

// timeout and onCrash read the provider block's settings, which win over the effect type's.
func (t EffectType) timeout() time.Duration {
	switch {
	case t.SMTP != nil && t.SMTP.Timeout > 0:
		return t.SMTP.Timeout
	case t.Webhook != nil && t.Webhook.Timeout > 0:
		return t.Webhook.Timeout
	case t.HTTP != nil && t.HTTP.Timeout > 0:
		return t.HTTP.Timeout
	}
	return time.Duration(t.Timeout)
}

func (t EffectType) onCrash() string {
	if t.SMTP != nil && t.SMTP.OnCrash != "" {
		return t.SMTP.OnCrash
	}
	return t.OnCrash
}

// outboxTypes turns the effect types into the dispatcher's.
func (c *Config) outboxTypes() ([]outbox.EffectType, map[string]providers.Provider, error) {
	var out []outbox.EffectType
	byName := map[string]providers.Provider{}
	names := make([]string, 0, len(c.EffectTypes))
	for n := range c.EffectTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t := c.EffectTypes[name]
		p, err := t.provider()
		if err != nil {
			return nil, nil, fmt.Errorf("effect_types.%s: %w", name, err)
		}
		retry := c.Retry
		if t.Retry != nil {
			retry = *t.Retry
		}
		out = append(out, outbox.EffectType{
			Name: name, Provider: p, Concurrency: t.Concurrency, Timeout: t.timeout(),
			MaxAttempts: retry.MaxAttempts,
			Retry:       backoff.Policy{Base: time.Duration(retry.BaseDelay), Max: time.Duration(retry.MaxDelay)},
			OnCrash:     outbox.OnCrash(t.onCrash()), BreakerFailures: t.Breaker.Failures,
			BreakerOpenFor: time.Duration(t.Breaker.OpenFor),
		})
		byName[name] = p
	}
	return out, byName, nil
}
