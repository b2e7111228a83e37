package gateway

// The provider kinds: checking an effect type's settings block and building its provider, and turning the
// effect types into the dispatcher's.

import (
	"errors"
	"fmt"
	"time"

	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/providers"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/postgres"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/providers/webhook"
)

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
