// Package tests holds end-to-end tests of the whole repository: they load its files and start its binaries
// against real services.
package tests

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"

	"github.com/oncegate/oncegate/gateway"
)

// No Docker engine runs in CI, so compose.yaml is checked with Compose's own loader: it must parse and
// validate against the Compose spec, hold the services the README names, and keep Redis durable.
func TestComposeFileIsValidAndMatchesTheDocs(t *testing.T) {
	opts, err := cli.NewProjectOptions([]string{"../compose.yaml"}, cli.WithName("oncegate"), cli.WithWorkingDirectory(".."))
	if err != nil {
		t.Fatal(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("compose.yaml does not load: %v", err)
	}

	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	named := composeServicesInReadme(t, string(readme))
	for _, name := range named {
		if _, ok := project.Services[name]; !ok {
			t.Errorf("the README names compose service %q, which compose.yaml lacks", name)
		}
	}
	for name := range project.Services {
		if !slices.Contains(named, name) {
			t.Errorf("compose.yaml has service %q, which the README's table does not describe", name)
		}
	}

	// The API key the README gives a newcomer is the one the gateway takes and the worker sends (an outside
	// tester was handed a short key the gateway refuses).
	m := regexp.MustCompile("(?m)^\\| `gateway` \\|.*API key `([^`]+)`").FindStringSubmatch(string(readme))
	if m == nil {
		t.Fatal("the README's compose table names no API key for the gateway")
	}
	for svc, env := range map[string]string{"gateway": "ACME_API_KEY", "worker": "GATEWAY_API_KEY"} {
		got := "(unset)"
		if v := project.Services[svc].Environment[env]; v != nil {
			got = *v
		}
		if got != m[1] {
			t.Errorf("the README gives the API key %q; compose.yaml's %s has %s=%s", m[1], svc, env, got)
		}
	}

	redis := project.Services["redis"]
	cmd := strings.Join(redis.Command, " ")
	for _, want := range []string{"--appendonly yes", "--maxmemory-policy noeviction"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("redis command %q lacks %q", cmd, want)
		}
	}
	if len(redis.Volumes) == 0 {
		t.Error("redis has no volume: its AOF would not outlive the container")
	}
	for name, svc := range project.Services {
		for _, p := range svc.Ports {
			if p.HostIP != "127.0.0.1" {
				t.Errorf("service %s publishes port %d on %q, want loopback only", name, p.Target, p.HostIP)
			}
		}
	}
}

// The configuration compose.yaml mounts into the gateway loads.
func TestComposeGatewayConfigLoads(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres:postgres@postgres:5432/oncegate")
	t.Setenv("ACME_API_KEY", "dev-acme-key-for-compose-on-a-laptop")
	c, err := gateway.Load("../deploy/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.DatabaseURL != "postgres://postgres:postgres@postgres:5432/oncegate" || c.EffectTypes["clicks"].Provider != "postgres" {
		t.Fatalf("loaded %+v", c)
	}
}

// composeServicesInReadme returns the first column of the table in the README section whose heading names
// `docker compose up`.
func composeServicesInReadme(t *testing.T, readme string) []string {
	t.Helper()
	loc := regexp.MustCompile("(?m)^## .*`docker compose up`.*$").FindStringIndex(readme)
	if loc == nil {
		t.Fatal("README has no section headed with `docker compose up`")
	}
	section := readme[loc[1]:]
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var names []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z0-9-]+)` \\|").FindAllStringSubmatch(section, -1) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		t.Fatal("README's compose section has no table of services")
	}
	return names
}
