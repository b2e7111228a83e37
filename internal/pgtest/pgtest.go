// Package pgtest gives each test a Postgres database of its own, migrated to the current schema and dropped
// when the test ends, so tests run in parallel against the real server and leave nothing behind. It can also
// start a private Postgres cluster that a test stops and starts itself, for outage tests that must not touch
// the shared server.
package pgtest

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncegate/oncegate/internal/testenv"
	"github.com/oncegate/oncegate/migrations"
)

// DefaultDatabaseURL is used when DATABASE_URL is unset.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// AdminURL returns DATABASE_URL or the loopback default: a database the tests may create others from.
func AdminURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultDatabaseURL
}

// WithDatabase returns u with its database name replaced.
func WithDatabase(u, name string) string {
	p, err := url.Parse(u)
	if err != nil {
		panic(err)
	}
	p.Path = "/" + name
	return p.String()
}

// Database creates a database for the test, applies the migrations, and returns its URL. The database is
// dropped when the test ends.
func Database(t testing.TB) string {
	t.Helper()
	return DatabaseAt(t, AdminURL())
}

// DatabaseAt is Database on the server at adminURL.
func DatabaseAt(t testing.TB, adminURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("Postgres at %s is unreachable (scripts/test starts one): %v", adminURL, err)
	}
	defer admin.Close(ctx)
	name := testenv.Name(t, "og")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	dbURL := WithDatabase(adminURL, name)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	return dbURL
}

// Pool returns a pool on the database at url, closed when the test ends.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Count runs a count query and returns its result.
func Count(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}
