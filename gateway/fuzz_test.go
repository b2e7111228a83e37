package gateway

import (
	"os"
	"path/filepath"
	"testing"
)

// The configuration loader never panics on any file, and a file it accepts yields a configuration whose
// every effect type builds its provider.
func FuzzLoadConfig(f *testing.F) {
	for _, s := range []string{
		"", "listen: x", "tenants: {a: {api_keys: [abcdefgh]}}",
		"effect_types: {c: {provider: postgres, postgres: {table: t}}}",
		"effect_types: {w: {provider: webhook, webhook: {url: 'https://h/x', secret: whsec_MDEyMzQ1Njc4OWFiY2RlZg==}}}",
		"limits: {max_body: 1KiB, page_size: 10, max_page_size: 20}", "retry: {base_delay: 1s}", "tenants: [1]",
		"{{{", "a: &a [*a]", "timeouts: {database: 1s, shutdown: 2s}", "database_url: 'postgres://h/d?pool_max_conns=5'",
		"effect_types: {m: {provider: smtp, smtp: {addr: 'h:25', from: a@b.test}, on_crash: at_most_once, timeout: 5s}}",
		"effect_types: {m: {provider: smtp, smtp: {addr: 'h:25', from: a@b.test, on_crash: at_most_once}}}",
		"effect_types: {c: {provider: postgres, postgres: {tabel: t}}}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(in), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p)
		if err != nil {
			return
		}
		reg, err := c.registry()
		if err != nil {
			t.Fatalf("accepted a configuration whose effect types do not build: %v\n%s", err, in)
		}
		defer reg.Close()
		if _, err := c.poolConfig(); err != nil {
			t.Fatalf("accepted a configuration whose database_url does not parse: %v\n%s", err, in)
		}
		if c.Limits.MaxBody <= 0 || c.Listen == "" || c.DatabaseURL == "" {
			t.Fatalf("accepted a configuration without its defaults: %+v", c)
		}
	})
}
