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
		"limits: {max_body: 1KiB}", "retry: {base_delay: 1s}", "tenants: [1]", "{{{", "a: &a [*a]",
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
		if _, _, err := c.outboxTypes(); err != nil {
			t.Fatalf("accepted a configuration whose effect types do not build: %v\n%s", err, in)
		}
		if c.Limits.MaxBody <= 0 || c.Listen == "" || c.DatabaseURL == "" {
			t.Fatalf("accepted a configuration without its defaults: %+v", c)
		}
	})
}
