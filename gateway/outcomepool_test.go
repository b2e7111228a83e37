package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// An outcome connection is not checked when it is taken. pgxpool pings, by default, a connection idle more
// than a second before handing it out, and with target_session_attrs in database_url the gateway checks it
// against them again (readOnlyConns): each a round trip before the outcome's statement is written, inside the
// crash window. Outcome connections idle between bursts, and a gateway's first burst comes seconds after
// they opened: a chaos run with --gateway-log-level debug saw a restarted gateway's first outcome handed off
// 4.3 ms after the destination accepted it, seven more waiting, and all eight resent when it was killed
// meanwhile. Neither check is needed: a connection that died, or a server now read-only, fails the
// statement, which is then recorded again on another connection (and the read-only one dropped).
func TestAnIdleOutcomeConnectionIsNotCheckedWhenTaken(t *testing.T) {
	t.Parallel()
	var writes *pgtest.Writes
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := &Config{DatabaseURL: pgtest.Database(t) + "&target_session_attrs=read-write"}
	if !strings.Contains(cfg.DatabaseURL, "?") {
		cfg.DatabaseURL = strings.Replace(cfg.DatabaseURL, "&", "?", 1)
	}
	_, outcomes := openOutcomes(t, cfg, log, func(pcfg *pgxpool.Config) {
		writes = pgtest.CountWrites(&pcfg.ConnConfig.Config)
	})
	if n := outcomes.Stat().IdleConns(); n != 1 {
		t.Fatalf("%d outcome connections open, want 1", n)
	}
	time.Sleep(1200 * time.Millisecond) // idle longer than pgxpool's ping threshold and recheckEvery
	writes.Arm()
	c, err := outcomes.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
	if n := writes.Count(); n != 0 {
		t.Errorf("taking an outcome connection idle 1.2 s wrote %d times to Postgres, want 0", n)
	}
}

// An outcome is recorded by a prepared statement that Postgres does not plan again for each outcome. With
// plan_cache_mode left to Postgres, finish.sql was planned for its parameters at every run (a generic plan of
// an UPDATE of partitioned tables is costed as touching every partition), 200 µs of Postgres's CPU an outcome
// beside 100 µs to run it, inside the crash window; over a month of daily partitions, more. Its generic plan
// finds the effect's partition when it starts (the id is a parameter), and is made once per connection.
func TestOutcomesAreNotPlannedOneByOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	main, outcomes := openOutcomes(t, &Config{DatabaseURL: pgtest.Database(t)}, log, nil)
	store := dedup.NewStore(main).WithGroupCommit(dedup.GroupCommit{MaxBatch: 8, Parallel: 1, Timeout: 10 * time.Second,
		Outcomes: outcomes})
	const n = 12
	for i := range n {
		ne := dedup.NewEffect{Tenant: "t", Key: fmt.Sprintf("k%d", i), Type: "hook", Payload: json.RawMessage(`{}`)}
		_, c, _, err := store.CreateLeased(ctx, ne, nil, dedup.Holder{Owner: "test", Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Finish(ctx, c.Lease, dedup.Finish{Status: effect.StatusDelivered, Result: json.RawMessage(`{"ok":true}`),
			Attempted: true, External: true}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := outcomes.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var generic, custom int64
	if err := c.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
		FROM pg_prepared_statements WHERE statement LIKE '%UPDATE oncegate_effects e%'`).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if generic+custom < n || custom > 0 {
		t.Fatalf("%d outcomes were recorded with %d custom plans and %d runs of a generic plan: want every run generic",
			n, custom, generic)
	}
}

// openOutcomes opens a gateway's main pool on cfg's database_url (tune, when set, adjusts it) and one outcome
// connection beside it, both closed when the test ends.
func openOutcomes(t *testing.T, cfg *Config, log *slog.Logger, tune func(*pgxpool.Config)) (main, outcomes *pgxpool.Pool) {
	t.Helper()
	main, _, err := newPool(context.Background(), cfg, log, tune, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(main.Close)
	if outcomes, err = newOutcomePool(main, 1, 1, log); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(outcomes.Close)
	return main, outcomes
}

// A plan_cache_mode chosen by the operator stays: in database_url's options here, and the same holds for the
// role's or the database's setting. The startup parameter the outcome connections first sent beat all of
// them (an outside tester's options=-c plan_cache_mode=force_custom_plan came back force_generic_plan).
func TestOutcomeConnectionsKeepAPlanCacheModeChosenElsewhere(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	url := pgtest.Database(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	// auto too, Postgres's default, when chosen: an adversary's explicit auto became force_generic_plan.
	for _, chosen := range []string{"force_custom_plan", "auto"} {
		main, outcomes := openOutcomes(t, &Config{DatabaseURL: url + sep + "options=-c%20plan_cache_mode%3D" + chosen}, log, nil)
		for name, pool := range map[string]*pgxpool.Pool{"main": main, "outcome": outcomes} {
			var mode string
			if err := pool.QueryRow(context.Background(), "SELECT current_setting('plan_cache_mode')").Scan(&mode); err != nil {
				t.Fatal(err)
			}
			if mode != chosen {
				t.Errorf("a %s connection runs with plan_cache_mode %s, want the %s database_url chose", name, mode, chosen)
			}
		}
	}
}

// Nor are a request's and a claim's statements. Left to Postgres, a statement over the partitioned effects
// was planned for its parameters at every run whenever its generic plan, costed as if every partition were
// read, looked dearer: `scripts/bench retention` saw read_payloads.sql planned at each of 26,826 runs (22.4 s
// planning against 1.5 s running) and insert.sql at one run in six, 2.1 ms a plan. Here over 12 partitions
// of effects, a database a few days into hourly partitions.
func TestRequestsAndClaimsAreNotPlannedOneByOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	pgtest.Repartition(t, url, time.Hour, time.Now().Add(-8*time.Hour))
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	main, _, err := newPool(ctx, &Config{DatabaseURL: url + sep + "pool_max_conns=1"}, slog.New(slog.NewTextHandler(io.Discard, nil)),
		nil, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(main.Close)
	store := dedup.NewStore(main)
	const n = 12
	for i := range n {
		if _, _, err := store.Create(ctx, dedup.NewEffect{Tenant: "t", Key: fmt.Sprintf("k%d", i), Type: "hook",
			Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		rows, err := store.Claim(ctx, dedup.ClaimParams{Type: "hook", Limit: 1, Owner: "test", Lease: time.Minute})
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v rows, %v", len(rows), err)
		}
	}
	rows, err := main.Query(ctx, `SELECT left(regexp_replace(statement, '\s+', ' ', 'g'), 60), generic_plans, custom_plans
		FROM pg_prepared_statements WHERE custom_plans > 0 OR generic_plans >= $1`, n)
	if err != nil {
		t.Fatal(err)
	}
	var generic int
	for rows.Next() {
		var stmt string
		var g, c int64
		if err := rows.Scan(&stmt, &g, &c); err != nil {
			t.Fatal(err)
		}
		if c > 0 {
			t.Errorf("%s: %d custom plans beside %d runs of its generic plan; want none", stmt, c, g)
		} else {
			generic++
		}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if generic < 2 {
		t.Errorf("%d statements ran %d times on their generic plan; want the insert and the payloads' read at least", generic, n)
	}
}
