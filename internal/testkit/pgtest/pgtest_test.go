package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncegate/oncegate/internal/testkit/leaktest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/migrations"
)

func TestMain(m *testing.M) {
	if proctest.Role() == "template" {
		os.Exit(templateProcess())
	}
	leaktest.Main(m)
}

// templateProcess is a test process of another package asking for the template database of the server at
// PGTEST_ADMIN, as packages testing in parallel do. It prints "template <name>".
func templateProcess() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name, err := template(ctx, os.Getenv("PGTEST_ADMIN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("template", name)
	return 0
}

// Each database is at the current schema, and a copy: what a test does in its own is not in another's.
func TestDatabaseIsAMigratedCopyOfItsOwn(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, time.Minute)
	a, b := Pool(t, Database(t)), Pool(t, Database(t))
	for _, p := range []*pgxpool.Pool{a, b} {
		db := stdlib.OpenDBFromPool(p)
		pending, err := migrations.Pending(ctx, db)
		_ = db.Close()
		if err != nil || pending {
			t.Fatalf("pending migrations: %v, %v", pending, err)
		}
	}
	if _, err := a.Exec(ctx, "CREATE TABLE only_in_a (); INSERT INTO oncegate_schema_migrations (version_id, is_applied) VALUES (999, true)"); err != nil {
		t.Fatal(err)
	}
	if n := Count(t, b, "SELECT count(*) FROM pg_class WHERE relname = 'only_in_a'"); n != 0 {
		t.Fatalf("a table made in one test's database is in another's")
	}
	if n := Count(t, b, "SELECT count(*) FROM oncegate_schema_migrations WHERE version_id = 999"); n != 0 {
		t.Fatalf("a row written in one test's database is in another's")
	}
}

// Test processes that start at once on a server without a template make it once between them, and a
// template left half made by a run that crashed is made again rather than copied.
func TestTemplateIsMadeOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	c := StartCluster(t)
	ctx := testenv.Context(t, 2*time.Minute)
	sum, err := migrationsHash()
	if err != nil {
		t.Fatal(err)
	}
	want := "og_template_" + fmt.Sprintf("%x", sum[:6])
	// A crashed run's leftover: the template's name, not migrated, not marked a template, and holding a table
	// a real template has not.
	admin, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+want); err != nil {
		t.Fatal(err)
	}
	half, err := pgx.Connect(ctx, WithDatabase(c.URL(), want))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := half.Exec(ctx, "CREATE TABLE left_by_a_crash ()"); err != nil {
		t.Fatal(err)
	}
	_ = half.Close(ctx)

	var procs []*proctest.Proc
	for range 3 {
		procs = append(procs, proctest.ReExec(t, "template", "PGTEST_ADMIN="+c.URL()))
	}
	for _, p := range procs {
		if got := strings.TrimPrefix(p.WaitLine("template ", time.Minute), "template "); got != want {
			t.Fatalf("a process got template %q, want %q", got, want)
		}
		if err := p.Wait(30 * time.Second); err != nil {
			t.Fatalf("template process: %v", err)
		}
	}
	var templates []string
	rows, _ := admin.Query(ctx, "SELECT datname FROM pg_database WHERE datistemplate AND NOT datallowconn AND datname LIKE 'og_template_%'")
	templates, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(templates) != 1 || templates[0] != want {
		t.Fatalf("template databases: %v (%v), want [%s]", templates, err, want)
	}
	p := Pool(t, DatabaseAt(t, c.URL()))
	if n := Count(t, p, "SELECT count(*) FROM pg_class WHERE relname = 'left_by_a_crash'"); n != 0 {
		t.Fatalf("the half-made template was copied, not made again")
	}
	if n := Count(t, p, "SELECT count(*) FROM pg_class WHERE relname = 'oncegate_effects'"); n != 1 {
		t.Fatalf("a copy of the template lacks the schema")
	}
}

// What a test's database costs: a copy of the template (the template itself is made once, before the timer).
func BenchmarkDatabase(b *testing.B) {
	Database(b)
	for b.Loop() {
		Database(b)
	}
}

// A standby follows its primary, under the sync_state asked for; after the primary is SIGKILLed, it is
// promoted and takes writes, with every commit the synchronous primary acknowledged.
func TestStandbyFollowsAndIsPromoted(t *testing.T) {
	t.Parallel()
	for _, r := range []Replication{Sync, Async} {
		t.Run(string(r), func(t *testing.T) {
			t.Parallel()
			ctx := testenv.Context(t, 2*time.Minute)
			primary := StartCluster(t)
			standby := primary.StartStandby(r)
			p, err := pgx.Connect(ctx, primary.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(ctx)
			var state string
			if err := p.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication").Scan(&state); err != nil || state != string(r) {
				t.Fatalf("sync_state %q (%v), want %s", state, err, r)
			}
			if _, err := p.Exec(ctx, "CREATE TABLE t (id int); INSERT INTO t SELECT generate_series(1, 100)"); err != nil {
				t.Fatal(err)
			}
			primary.Kill()
			if _, err := pgx.Connect(ctx, primary.URL()); err == nil {
				t.Fatal("the killed primary still accepts connections")
			}
			standby.Promote()
			s, err := pgx.Connect(ctx, standby.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			var n int
			err = s.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n)
			if r == Sync && (err != nil || n != 100) {
				t.Fatalf("the promoted synchronous standby has %d of 100 acknowledged rows (%v)", n, err)
			}
			if _, err := s.Exec(ctx, "CREATE TABLE after_promotion (id int)"); err != nil {
				t.Fatalf("the promoted standby refuses a write: %v", err)
			}
		})
	}
}
