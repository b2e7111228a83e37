package deptest

import (
	"encoding/json"
	"os/exec"
	"slices"
	"testing"
)

const module = "github.com/oncegate/oncegate"

// rules are the project's layering. A Package ending in "/..." is every package below it, each checked on its
// own so that a violation names the one that links it. A violation names the import path; `go list -deps`
// and `go mod why` show how it gets in.
var rules = []Rule{
	{
		Package:   module + "/cmd/...",
		Forbidden: []string{"testing"},
		Why: "a binary links no test code: package testing registers its -test.* flags in the binary, and a " +
			"test helper it drags in (internal/testkit/...) fails or skips where a binary must return an error",
	},
	{
		Package:   module + "/bench/...",
		Forbidden: []string{"testing"},
		Dir:       "bench",
		Why:       "the benchmarks are binaries too: what they measure must not carry test code the product does not",
	},
	{
		Package:   module + "/cmd/gateway",
		Forbidden: []string{"github.com/redis/go-redis/v9", module + "/queue"},
		Why:       "the gateway speaks HTTP and Postgres; the Redis queue belongs to workers",
	},
	{
		Package:   module + "/client",
		Forbidden: []string{module + "/queue", "github.com/redis/go-redis/v9", "github.com/jackc/pgx/v5"},
		Why:       "the client is an HTTP client that any worker can embed, whatever queue it runs on",
	},
	{
		Package:   module + "/queue",
		Forbidden: []string{"github.com/jackc/pgx/v5", module + "/gateway", module + "/outbox", module + "/dedup"},
		Why:       "the queue is Redis alone: an application using it must not link the gateway's Postgres stack",
	},
	{
		Package:   module + "/providers/...",
		Forbidden: []string{module + "/dedup", module + "/outbox", module + "/gateway"},
		Why: "a provider turns a payload into one delivery and its outcome; whether it runs, again or once, is " +
			"the outbox's and the effect store's decision, which a provider must not reach around",
	},
	{
		Package:   module + "/dedup",
		Forbidden: []string{module + "/outbox"},
		Why:       "the effect store is below the dispatcher: the outbox calls dedup, never the other way round",
	},
	{
		Package:   module + "/admin/...",
		Forbidden: []string{module + "/gateway"},
		Why: "the operator's tools act on the stores (Postgres, Redis) as the gateway does, not through its " +
			"HTTP layer: the CLI and console must not link the gateway's server, configuration and providers' wiring",
	},
}

// testOnly are modules only the end-to-end tests use: they belong to the tests module's go.mod, so that an
// application importing queue or client never inherits them in its module graph.
var testOnly = []string{"github.com/compose-spec/compose-go/v2", "github.com/Shopify/toxiproxy/v2", "github.com/rs/zerolog",
	"github.com/standard-webhooks/standard-webhooks/libraries"}

func TestLibraryModuleRequiresNoTestOnlyModule(t *testing.T) {
	out, err := exec.Command("go", "mod", "edit", "-json").Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct{ Require []struct{ Path string } }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	if len(mod.Require) == 0 {
		t.Fatal("go.mod lists no requirement: the check reads the wrong file")
	}
	for _, r := range mod.Require {
		if slices.Contains(testOnly, r.Path) {
			t.Errorf("the library's go.mod requires %s, which only tests/ uses: move it to tests/go.mod", r.Path)
		}
	}
}

func TestLayering(t *testing.T) {
	for _, r := range rules {
		t.Run(r.Package, func(t *testing.T) {
			t.Parallel()
			pkgs := PackagesOf(t, r)
			if len(pkgs) == 0 {
				t.Fatalf("%s matches no package: the rule checks nothing", r.Package)
			}
			for _, p := range pkgs {
				Check(t, Rule{Package: p, Forbidden: r.Forbidden, Why: r.Why, Dir: r.Dir})
			}
		})
	}
}

// TestCheckCatchesAViolation keeps the check honest: the worker does link go-redis, so forbidding it must
// fail, or the rules above would pass whatever the code imports.
func TestCheckCatchesAViolation(t *testing.T) {
	found := false
	for _, dep := range Deps(t, module+"/cmd/worker") {
		if dep == "github.com/redis/go-redis/v9" {
			found = true
		}
	}
	if !found {
		t.Fatal("cmd/worker does not list go-redis among its deps: Deps is broken")
	}
}
