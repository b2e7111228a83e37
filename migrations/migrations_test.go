package migrations_test

import (
	"context"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3/lock"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/migrations"
)

// Four gateways starting at once on an empty database: the advisory lock lets one migrate, the others find
// the schema current, and all succeed.
func TestConcurrentUpIsSafe(t *testing.T) {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	name := testenv.Name(t, "mig")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	defer admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)") //nolint:errcheck
	url := pgtest.WithDatabase(pgtest.AdminURL(), name)

	var wg sync.WaitGroup
	versions := make([]int64, 4)
	for i := range versions {
		wg.Go(func() {
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Error(err)
				return
			}
			defer pool.Close()
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			v, err := migrations.Up(ctx, db, nil)
			if err != nil {
				t.Errorf("gateway %d: %v", i, err)
			}
			versions[i] = v
		})
	}
	wg.Wait()
	for i, v := range versions {
		if v != versions[0] || v < 1 {
			t.Fatalf("gateway %d reached version %d; all: %v", i, v, versions)
		}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if pending, err := migrations.Pending(ctx, db); err != nil || pending {
		t.Fatalf("pending after Up: %v, %v", pending, err)
	}
	// Counted against the files, not the version: numbers are handed out to branches, and one branch may lack
	// another's (00017 while 00018 is here).
	files, err := fs.Glob(migrations.Files(), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_schema_migrations WHERE version_id > 0"); n != len(files) {
		t.Fatalf("%d migrations recorded for %d files (version %d): one was applied twice", n, len(files), versions[0])
	}
}

// Six gateways starting at once on an empty database through PgBouncer in transaction pooling mode, under
// load, where a session advisory lock would be taken on one server connection and released on another: the
// table lock lets one migrate, the others wait for it, and each migration is applied once.
func TestConcurrentUpThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.ThroughPgBouncer(t, pgtest.EmptyDatabase(t)) + "&default_query_exec_mode=exec"
	// Other clients keep PgBouncer's server connections busy, so that a client's statements move between them.
	load, err := pgxpool.New(ctx, url+"&pool_max_conns=30")
	if err != nil {
		t.Fatal(err)
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loaders sync.WaitGroup
	for range 30 {
		loaders.Go(func() {
			for loadCtx.Err() == nil {
				_, _ = load.Exec(loadCtx, "SELECT pg_sleep(0.002)")
			}
		})
	}
	defer func() { stopLoad(); loaders.Wait(); load.Close() }()
	var wg sync.WaitGroup
	versions := make([]int64, 6)
	for i := range versions {
		wg.Go(func() {
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Error(err)
				return
			}
			defer pool.Close()
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			v, err := migrations.UpWithin(ctx, db, nil, time.Minute)
			if err != nil {
				t.Errorf("gateway %d: %v", i, err)
			}
			versions[i] = v
		})
	}
	wg.Wait()
	pool := pgtest.Pool(t, url)
	for i, v := range versions {
		if v != versions[0] || v < 1 {
			t.Fatalf("gateway %d reached version %d; all: %v", i, v, versions)
		}
	}
	// Counted against the files, not the version: numbers are handed out to branches, and one branch may lack
	// another's (00017 while 00018 is here).
	files, err := fs.Glob(migrations.Files(), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_schema_migrations WHERE version_id > 0"); n != len(files) {
		t.Fatalf("%d migrations recorded for %d files (version %d): one was applied twice", n, len(files), versions[0])
	}
	// Nothing is left locked: no session lock held for good by a pooled server connection.
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); n != 0 {
		t.Fatalf("%d advisory locks left held in the database", n)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM "+migrations.LockTable+" WHERE locked"); n != 0 {
		t.Fatal("the migration lock is still held")
	}
}

// A start that cannot take the lock within its bound gives up, saying which lock, instead of waiting on.
func TestUpGivesUpWhenTheLockIsHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyDatabase(t))
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	holder, err := lock.NewPostgresTableLocker(lock.WithTableName(migrations.LockTable), lock.WithTableLockID(migrations.LockID))
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Lock(ctx, db); err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(ctx, db) //nolint:errcheck
	_, err = migrations.UpWithin(ctx, db, nil, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "could not take the migration lock") {
		t.Fatalf("Up with the lock held elsewhere: %v", err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM pg_tables WHERE tablename = 'oncegate_effects'"); n != 0 {
		t.Fatal("migrated without the lock")
	}
}

// A start with nothing to migrate takes no lock: it does not wait for another start's migration, nor for the
// lease of a holder that was killed (found by an outside test: a current database waited 31 s).
func TestUpWithNothingPendingTakesNoLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.Database(t)) // migrated
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	holder, err := lock.NewPostgresTableLocker(lock.WithTableName(migrations.LockTable), lock.WithTableLockID(migrations.LockID))
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Lock(ctx, db); err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(ctx, db) //nolint:errcheck
	v, err := migrations.UpWithin(ctx, db, nil, 2*time.Second)
	if err != nil || v < 5 {
		t.Fatalf("Up on a current database with the lock held elsewhere: version %d, %v", v, err)
	}
}

// The migrations leave no setting on the sessions that ran them. Through a transaction-pooling PgBouncer those
// are server connections other clients are handed next: an adversary found 00018's
// client_connection_check_interval, set for the session so that its copy stops when its client is gone, on a
// server connection after the gateway had migrated through the pooler.
func TestMigrationsLeaveNoSessionSetting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.EmptyDatabase(t)+"&pool_max_conns=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	// Both connections the migrations may have run on, held together so that each is asked.
	var conns []*pgxpool.Conn
	for range 2 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		conns = append(conns, c)
	}
	for _, c := range conns {
		var set []string
		rows, err := c.Query(ctx, "SELECT name || '=' || setting FROM pg_settings WHERE source = 'session'")
		if err != nil {
			t.Fatal(err)
		}
		if set, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		if len(set) > 0 {
			t.Errorf("a session the migrations ran on keeps %v", set)
		}
	}
}
