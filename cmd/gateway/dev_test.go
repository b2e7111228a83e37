package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// keygen prints a key that a configuration accepts, then its sha256: form; no two runs print the same.
func TestKeygen(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 3 {
		var out bytes.Buffer
		if err := keygen(&out); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 || len(lines[0]) < gateway.MinAPIKeyLength || lines[1] != gateway.HashKey(lines[0]) || seen[lines[0]] {
			t.Fatalf("keygen printed %q", out.String())
		}
		seen[lines[0]] = true
		for _, form := range lines {
			p := filepath.Join(t.TempDir(), "gateway.yaml")
			if err := os.WriteFile(p, []byte("tenants: {acme: {api_keys: ['"+form+"']}}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := gateway.Load(p); err != nil {
				t.Fatalf("a configuration with the key's form %q: %v", form, err)
			}
		}
	}
}

// keygen --webhook prints a whsec_ secret that a webhook type accepts (nothing made one, so a first
// configuration was refused until one was written by hand); no two runs print the same.
func TestKeygenWebhookSecret(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 3 {
		var out bytes.Buffer
		if err := keygenCmd([]string{"--webhook"}, &out); err != nil {
			t.Fatal(err)
		}
		secret := strings.TrimSpace(out.String())
		if !strings.HasPrefix(secret, "whsec_") || strings.Contains(secret, "\n") || seen[secret] {
			t.Fatalf("keygen --webhook printed %q", out.String())
		}
		seen[secret] = true
		p := filepath.Join(t.TempDir(), "gateway.yaml")
		cfg := "tenants: {acme: {api_keys: ['og_0123456789abcdef0123456789abcdef']}}\n" +
			"effect_types: {hook: {provider: webhook, webhook: {url: 'https://hooks.example.com/in', secret: '" + secret + "'}}}\n"
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := gateway.Load(p); err != nil {
			t.Fatalf("a webhook type with the secret %q: %v", secret, err)
		}
	}
	if err := keygenCmd([]string{"--bogus"}, io.Discard); !errors.Is(err, errUsage) {
		t.Fatalf("keygen --bogus: %v", err)
	}
}

// serve --dev creates a database the server does not have, once; a second start finds it.
func TestDevCreatesTheDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := testenv.Name(t, "og_dev")
	url := pgtest.WithDatabase(pgtest.AdminURL(), name)
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	// The drop runs after the test function has returned, so the connection is closed there and not by a
	// defer, which would close it first (and leave the database behind, as it did).
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
		_ = admin.Close(context.Background())
	})
	if _, err := pgx.Connect(ctx, url); !missingDatabase(err) {
		t.Fatalf("before: %v, want database does not exist", err)
	}
	if err := explainMissingDatabase(func() error { _, err := pgx.Connect(ctx, url); return err }(), url); err == nil ||
		!strings.Contains(err.Error(), "`createdb -h ") || !strings.Contains(err.Error(), " "+name+"`") {
		t.Fatalf("the hint without --dev: %v", err)
	}
	log := slog.New(slog.DiscardHandler)
	for range 2 {
		if err := createDatabase(ctx, url, log); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("after: %v", err)
	}
	_ = conn.Close(ctx)
}

// `gateway migrate` without a file needs only DATABASE_URL: no tenants, no effect types. Not parallel: it sets
// the environment.
func TestMigrateNeedsOnlyTheDatabase(t *testing.T) {
	t.Setenv("OTEL_SDK_DISABLED", "true")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := testenv.Name(t, "og_migrate")
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
		_ = admin.Close(context.Background())
	})
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	url := pgtest.WithDatabase(pgtest.AdminURL(), name)
	t.Setenv("DATABASE_URL", url)
	var runErr error
	stderrOf(t, func() { runErr = run([]string{"migrate"}) })
	if runErr != nil {
		t.Fatalf("migrate with DATABASE_URL alone: %v", runErr)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM oncegate_effects").Scan(&n); err != nil {
		t.Fatalf("after migrate: %v", err)
	}
}
