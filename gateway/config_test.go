package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigDefaultsWithoutAFile(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://db.example/x")
	c, err := Load("")
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
	t.Setenv("OG_KEY", "secret-from-env")
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
	if c.DatabaseURL != "postgres://from-env/db" || c.Tenants["acme"].APIKeys[0] != "secret-from-env" ||
		c.Limits.MaxBody != 1<<20 || time.Duration(c.Retention.Keys) != 48*time.Hour || c.Retry.MaxAttempts != 7 ||
		c.EffectTypes["clicks"].Retry.MaxAttempts != 3 || time.Duration(c.EffectTypes["clicks"].Retry.BaseDelay) != 2*time.Second {
		t.Fatalf("loaded %+v", c)
	}
	types, _, err := c.outboxTypes()
	if err != nil || len(types) != 1 || types[0].MaxAttempts != 3 || types[0].OnCrash != "at_most_once" {
		t.Fatalf("outbox types %+v, %v", types, err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"listne: x", "listne: unknown field (line 1)"},
		{"effect_types:\n  clicks:\n    provider: postgres\n    postgres: { tabel: x }", "effect_types.clicks.postgres.tabel: unknown field"},
		{"tenants:\n  acme:\n    api_key: [abcdefgh]", "tenants.acme.api_key: unknown field"},
		{"tenants:\n  acme:\n    api_keys: [short]", "tenants.acme.api_keys[0]: an API key must be at least 8"},
		{"tenants:\n  acme:\n    api_keys: []", "tenants.acme.api_keys: a tenant needs at least one"},
		{"effect_types:\n  fax:\n    provider: fax", `effect_types.fax: provider: unknown kind "fax"`},
		{"effect_types:\n  c:\n    provider: postgres\n    postgres: { table: \"x; drop\" }", "is not an identifier"},
		{"effect_types:\n  c:\n    provider: postgres\n    on_crash: sometimes", "effect_types.c.on_crash"},
		{"retry: { base_delay: soon }", `"soon" is not a duration`},
		{"limits: { max_body: lots }", `"lots" is not a size`},
		{"tenants: [1, 2]", "cannot unmarshal"},
	} {
		_, err := Load(writeConfig(t, c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.yaml, err, c.want)
		}
	}
}
