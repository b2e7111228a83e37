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
		"tenants: {a: {api_keys: [0123456789abcdef0123456789abcdef], effect_types: [analytics], rate: {requests_per_second: 5}}}",
		"limits: {tenant_rate: {bytes_per_second: unlimited, request_burst: 3}, max_connections: 10}",
		"effect_types: {c: {provider: postgres, postgres: {table: t}}}",
		"effect_types: {w: {provider: webhook, webhook: {url: 'https://h/x', secret: whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3}}}",
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
		// Load refuses a file without tenants, which LoadDev accepts: try both.
		for _, load := range []func(string) (*Config, error){Load, LoadDev} {
			if c, err := load(p); err == nil {
				checkAccepted(t, c, in)
			}
		}
	})
}

// checkAccepted holds a configuration the loader accepted from in to what the gateway needs of it.
func checkAccepted(t *testing.T, c *Config, in string) {
	t.Helper()
	reg, err := c.registry()
	if err != nil {
		t.Fatalf("accepted a configuration whose effect types do not build: %v\n%s", err, in)
	}
	defer reg.Close()
	if _, err := c.poolConfig(); err != nil {
		t.Fatalf("accepted a configuration whose database_url does not parse: %v\n%s", err, in)
	}
	if c.Limits.MaxBody <= 0 || c.Listen == "" || c.DatabaseURL == "" || len(c.Tenants) == 0 {
		t.Fatalf("accepted a configuration without its defaults or tenants: %+v", c)
	}
}
