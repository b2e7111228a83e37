package gateway

// The provider kinds, in one table (providerKinds): each kind's settings block, how it is checked and how its
// provider is built; and the effect types turned into the registry's providers and the dispatcher's types.

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/providers"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/postgres"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/providers/webhook"
)

// providerKind is one provider kind, everything the gateway knows of it: a new kind is an entry of
// providerKinds and its block's field in EffectType, named after it.
type providerKind struct {
	// name is the kind as the file writes it: provider's value, and the key of its settings block.
	name string
	// optional kinds may leave their block out: their provider is built from the block's zero value.
	optional bool
	// concurrency is the kind's default concurrency, if not DefaultConcurrency.
	concurrency int
	// pooled kinds deliver through the gateway's database pool: a delivery in flight holds no descriptor of
	// its own (connectionCap).
	pooled bool
	block  settingsBlock
}

// settingsBlock is a kind's settings block: its field in EffectType, how the block is checked, and how the
// provider is built from it.
type settingsBlock struct {
	set      func(*EffectType) bool
	validate func(*EffectType) error
	build    func(*EffectType, providers.Type) (providers.Provider, error)
}

// blockOf makes the settingsBlock of the EffectType field that field points to, whose provider build makes.
func blockOf[C interface{ Validate() error }](field func(*EffectType) **C,
	build func(C, providers.Type) (providers.Provider, error)) settingsBlock {
	return settingsBlock{
		set:      func(t *EffectType) bool { return *field(t) != nil },
		validate: func(t *EffectType) error { return (**field(t)).Validate() },
		build: func(t *EffectType, typ providers.Type) (providers.Provider, error) {
			var c C
			if b := *field(t); b != nil {
				c = *b
			}
			return build(c, typ)
		},
	}
}

// providerKinds are the provider kinds, in the order messages list them.
var providerKinds = []providerKind{
	{name: "postgres", optional: true, concurrency: DefaultBatchTxConcurrency, pooled: true,
		block: blockOf(func(t *EffectType) **postgres.Config { return &t.Postgres },
			func(c postgres.Config, _ providers.Type) (providers.Provider, error) { return postgres.New(c) })},
	{name: "smtp", block: blockOf(func(t *EffectType) **smtp.Config { return &t.SMTP },
		func(c smtp.Config, typ providers.Type) (providers.Provider, error) { return smtp.New(c, typ) })},
	{name: "webhook", block: blockOf(func(t *EffectType) **webhook.Config { return &t.Webhook },
		func(c webhook.Config, _ providers.Type) (providers.Provider, error) { return webhook.New(c) })},
	{name: "http", block: blockOf(func(t *EffectType) **httpprov.Config { return &t.HTTP },
		func(c httpprov.Config, _ providers.Type) (providers.Provider, error) { return httpprov.New(c) })},
}

// kindNamed returns the provider kind called name.
func kindNamed(name string) (providerKind, bool) {
	for _, k := range providerKinds {
		if k.name == name {
			return k, true
		}
	}
	return providerKind{}, false
}

// kinds lists the provider kinds, for messages.
var kinds = func() string {
	names := make([]string, len(providerKinds))
	for i, k := range providerKinds {
		names[i] = k.name
	}
	return strings.Join(names, ", ")
}()

// checkBlocks checks that the effect type has the settings block of its kind, and no other, and that the
// block is one its provider accepts.
func (t EffectType) checkBlocks() error {
	for _, k := range providerKinds {
		if k.block.set(&t) && k.name != t.Provider {
			return fmt.Errorf("%s: a %s block on an effect type whose provider is %q", k.name, k.name, t.Provider)
		}
	}
	if t.Provider == "" {
		return errors.New("provider: missing; one of: " + kinds)
	}
	k, ok := kindNamed(t.Provider)
	if !ok {
		return fmt.Errorf("provider: unknown kind %q; one of: %s", t.Provider, kinds)
	}
	if !k.block.set(&t) {
		if k.optional {
			return nil
		}
		return fmt.Errorf("%s: the settings of the %s provider are missing", t.Provider, t.Provider)
	}
	if err := k.block.validate(&t); err != nil {
		return fmt.Errorf("%s: %w", t.Provider, err)
	}
	return nil
}

// newProvider builds the effect type's provider from its block. It is the one place providers are built;
// validate has checked the block.
func (t EffectType) newProvider(name string) (providers.Provider, error) {
	typ := providers.Type{Name: name, Timeout: time.Duration(t.Timeout), AtMostOnce: t.OnCrash == outbox.AtMostOnce}
	k, ok := kindNamed(t.Provider)
	if !ok {
		return nil, fmt.Errorf("provider: unknown kind %q; one of: %s", t.Provider, kinds)
	}
	p, err := k.block.build(&t, typ)
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
			Name: name, Provider: p, ProviderKind: t.Provider, Concurrency: t.Concurrency, TenantConcurrency: t.TenantConcurrency,
			Timeout:     time.Duration(t.Timeout),
			MaxAttempts: t.Retry.MaxAttempts,
			Retry:       backoff.Policy{Base: time.Duration(t.Retry.BaseDelay), Max: time.Duration(t.Retry.MaxDelay)},
			OnCrash:     t.OnCrash, BreakerFailures: t.Breaker.Failures, BreakerOpenFor: time.Duration(t.Breaker.OpenFor),
			Rate: outboxRate(t.Rate),
		})
	}
	return out
}

func outboxRate(r *DeliveryRate) *outbox.Rate {
	if r == nil {
		return nil
	}
	return &outbox.Rate{PerSecond: r.PerSecond, Burst: r.Burst}
}
