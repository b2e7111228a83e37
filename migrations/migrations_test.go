package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncegate/oncegate/internal/pgtest"
	"github.com/oncegate/oncegate/internal/testenv"
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
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_schema_migrations WHERE version_id > 0"); n != int(versions[0]) {
		t.Fatalf("%d migrations recorded for version %d: one was applied twice", n, versions[0])
	}
}
