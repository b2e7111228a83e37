// Package pgtest gives each test a Postgres database of its own, at the current schema and dropped when the
// test ends, so tests run in parallel against the real server and leave nothing behind. Each is a copy of a
// template database migrated once, not migrated anew. It can also start a private Postgres cluster that a test
// stops and starts itself, for outage tests that must not touch the shared server.
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/migrations"
	"github.com/oncegate/oncegate/partitions"
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

// Database creates a database for the test, at the current schema, and returns its URL. The database is
// dropped when the test ends.
func Database(t testing.TB) string {
	t.Helper()
	return DatabaseAt(t, AdminURL())
}

// DatabaseAt is Database on the server at adminURL. The database is a copy of a template migrated once per
// server and set of migrations (see template), which costs a file copy instead of running every migration.
func DatabaseAt(t testing.TB, adminURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tmpl, err := template(ctx, adminURL)
	if err != nil {
		t.Fatalf("Postgres at %s: template database: %v", adminURL, err)
	}
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("Postgres at %s is unreachable (scripts/test starts one): %v", adminURL, err)
	}
	defer admin.Close(ctx)
	name := testenv.Name(t, "og")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+
		" TEMPLATE "+pgx.Identifier{tmpl}.Sanitize()); err != nil {
		t.Fatalf("create database from %s: %v", tmpl, err)
	}
	t.Cleanup(func() { dropDatabase(t, adminURL, name) })
	// A database's settings are not copied from its template: migration 00024's, as a gateway leaves it.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET jit = off"); err != nil {
		t.Fatalf("database %s: %v", name, err)
	}
	u := WithDatabase(adminURL, name)
	// The template may have been migrated days ago, and the time-partitioned tables' partitions then end
	// before today: the copy gets today's and the next days', as a gateway's partition manager makes them.
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, tbl := range partitions.All {
		if _, err := partitions.Ensure(ctx, conn, tbl, partitions.DefaultInterval, partitions.DefaultAhead,
			time.Now()); err != nil {
			t.Fatalf("partitions of %s: %v", name, err)
		}
	}
	return u
}

func dropDatabase(t testing.TB, adminURL, name string) {
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
}

// templates maps an admin URL to the name of its server's template database, once this process has found
// or made it. Its lock also keeps this process's tests from racing to make it.
var templates = struct {
	sync.Mutex
	names map[string]string
}{names: map[string]string{}}

// template returns the name of a database on the server at adminURL that holds every migration, and that
// tests copy with CREATE DATABASE … TEMPLATE. Its name comes from a hash of the migration files, so a changed
// migration makes a new one and a stale one is never used; it outlives the run, so later runs (and the other
// worktrees on the same server) reuse it. Packages test in parallel processes, so one process makes it under
// a Postgres advisory lock while the others wait; it is marked a template (IS_TEMPLATE, and no connections
// allowed, since a connected template cannot be copied) only once migrated, so a run that crashed half way
// leaves a database the next one drops and makes again.
func template(ctx context.Context, adminURL string) (string, error) {
	templates.Lock()
	defer templates.Unlock()
	if name, ok := templates.names[adminURL]; ok {
		return name, nil
	}
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "og_template_" + hex.EncodeToString(sum[:6])
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", fmt.Errorf("unreachable (scripts/test starts one): %w", err)
	}
	defer admin.Close(ctx)
	ready := func() (bool, error) {
		var ok bool
		err := admin.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&ok)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return ok, err
	}
	ok, err := ready()
	if err == nil && !ok {
		// Advisory locks are per database: every process takes it in the admin database.
		key := int64(binary.BigEndian.Uint64(sum[:8]))
		if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			return "", fmt.Errorf("advisory lock: %w", err)
		}
		defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", key) //nolint:errcheck
		if ok, err = ready(); err == nil && !ok {
			err = makeTemplate(ctx, admin, adminURL, name)
		}
	}
	if err != nil {
		return "", err
	}
	templates.names[adminURL] = name
	return name, nil
}

// makeTemplate (re)creates the template database name and migrates it; the caller holds the advisory lock.
func makeTemplate(ctx context.Context, admin *pgx.Conn, adminURL, name string) error {
	id := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)"); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+id); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, WithDatabase(adminURL, name))
	if err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(pool)
	_, err = migrations.Up(ctx, db, nil)
	_ = db.Close()
	pool.Close()
	if err != nil {
		return err
	}
	_, err = admin.Exec(ctx, "ALTER DATABASE "+id+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
	return err
}

// migrationsHash hashes the migration files' names and contents, and how this package migrates.
func migrationsHash() ([]byte, error) {
	h := sha256.New()
	h.Write([]byte("pgtest template v1\n"))
	err := fs.WalkDir(migrations.Files(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.Files(), path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", path, len(b))
		h.Write(b)
		return nil
	})
	return h.Sum(nil), err
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

// TracedPool is Pool with tracer seeing every statement its connections send: for tests that count what
// the code under test asks of Postgres.
func TracedPool(t testing.TB, url string, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
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

// Tx begins a transaction that runs stmt and stays open until the test ends or the caller ends it.
func Tx(t testing.TB, pool *pgxpool.Pool, stmt string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, stmt); err != nil {
		t.Fatal(err)
	}
	return tx
}

// Reader begins a transaction that reads table and stays open, holding it as a report, pg_dump or a psql BEGIN
// left open does, until the test ends or the caller rolls it back.
func Reader(t testing.TB, pool *pgxpool.Pool, table string) pgx.Tx {
	t.Helper()
	return Tx(t, pool, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize())
}

// EmptyDatabase creates an empty database for the test, with no schema at all, and returns its URL: for tests
// of migrating. It is dropped when the test ends.
func EmptyDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("Postgres at %s is unreachable (scripts/test starts one): %v", AdminURL(), err)
	}
	defer admin.Close(ctx)
	name := testenv.Name(t, "og")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropDatabase(t, AdminURL(), name) })
	return WithDatabase(AdminURL(), name)
}

// ThroughPgBouncer returns the URL of the database at dbURL as reached through the PgBouncer at PGBOUNCER_URL,
// which scripts/services runs in transaction pooling mode in front of the test Postgres. A test that needs it
// fails without it: production Postgres is mostly reached this way.
func ThroughPgBouncer(t testing.TB, dbURL string) string {
	t.Helper()
	bouncer := os.Getenv("PGBOUNCER_URL")
	if bouncer == "" {
		t.Fatal(`PGBOUNCER_URL is unset: run eval "$(scripts/services)", which starts a PgBouncer in front of Postgres`)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return WithDatabase(bouncer, u.Path[1:])
}

// KeyEffectsSQL gives every effect that a test inserted straight into oncegate_effects the key a create would
// have claimed with it (oncegate_keys), the newest effect under each (tenant, key) that has none: reads by key
// go through the keys. The key expires after a day, as it would with the default retention.
const KeyEffectsSQL = `INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at)
	SELECT DISTINCT ON (e.tenant, e.key) e.tenant, e.key, e.id, e.fingerprint, e.created_at + interval '1 day'
	FROM oncegate_effects e
	WHERE NOT EXISTS (SELECT FROM oncegate_keys k WHERE k.tenant = e.tenant AND k.key = e.key)
	ORDER BY e.tenant, e.key, e.id DESC`

// KeyEffects runs KeyEffectsSQL on pool.
func KeyEffects(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), KeyEffectsSQL); err != nil {
		t.Fatalf("key the effects inserted in SQL: %v", err)
	}
}

// Repartition gives the test's database (empty: fresh from Database) partitions of effects, their replays,
// bodies and attempts interval long, from the one covering start to DefaultAhead intervals past now, in place of the
// template's daily ones, so that a partition manager run with that interval retires them within the test.
// The legacy partition, empty, ends where the first of them starts.
func Repartition(t testing.TB, url string, interval time.Duration, start time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, tbl := range partitions.All {
		rows, err := conn.Query(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = $1::regclass AND c.relname <> $2`, tbl.Name, tbl.Name+"_legacy")
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if _, err := conn.Exec(ctx, "DROP TABLE "+pgx.Identifier{n}.Sanitize()); err != nil {
				t.Fatalf("repartition %s: %v", tbl.Name, err)
			}
		}
		// The legacy partition ends where the template's migration ran, minutes ago in a fresh run: it ends
		// at start instead, empty as it is. (Bodies have none: migration 00025 made them partitioned.)
		parent, legacy := pgx.Identifier{tbl.Name}.Sanitize(), pgx.Identifier{tbl.Name + "_legacy"}.Sanitize()
		// Its CHECK, which proved the old bound to the migration's ATTACH, goes too.
		if tbl.Name != partitions.Bodies.Name {
			// An effect id, or a time for the attempts.
			bound := fmt.Sprint(partitions.EffectID(start.UTC().Truncate(interval)))
			if !tbl.ByEffectID {
				bound = "'" + start.UTC().Truncate(interval).Format(time.RFC3339) + "'"
			}
			if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s; ALTER TABLE %[2]s DROP "+
				"CONSTRAINT IF EXISTS %[3]s; ALTER TABLE %[1]s ATTACH PARTITION %[2]s FOR VALUES FROM (MINVALUE) TO (%[4]s)",
				parent, legacy, pgx.Identifier{tbl.Name + "_legacy_bound"}.Sanitize(), bound)); err != nil {
				t.Fatalf("repartition %s: %v", tbl.Name, err)
			}
		}
		for at := start; ; at = at.Add(interval) {
			if _, err := partitions.Ensure(ctx, conn, tbl, interval, partitions.DefaultAhead, at); err != nil {
				t.Fatalf("repartition %s: %v", tbl.Name, err)
			}
			if at.After(time.Now()) {
				break
			}
		}
	}
}
