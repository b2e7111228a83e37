package partitions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/partitions"
)

// The effect page reads an effect's attempts by its id (admin/sql/attempts_list.sql), and every listing
// counts each effect's interrupted attempts (effect_columns.sql): neither names a time, so neither can be
// pruned to a partition. With 35 daily partitions (30 days of retention and the days ahead) each reads every
// partition by its (effect_id, id) index, never by a scan of a partition: the generic plan, made on empty
// tables, and the plan run on filled ones (200,000 attempts; but the empty partitions ahead, read by a scan
// of nothing). The test logs what the read costs.
func TestAttemptReadsUseEachPartitionsIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// Without the migration's legacy partition, which covers everything before the day after tomorrow, nor
	// those after it.
	for _, p := range list(t, pool, "oncegate_effect_attempts") {
		if _, err := pool.Exec(ctx, "ALTER TABLE oncegate_effect_attempts DETACH PARTITION "+p.name+"; DROP TABLE "+p.name); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	if _, err := partitions.Ensure(ctx, conn, partitions.Attempts, 24*time.Hour, 33, now.Add(-30*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	parts := pgtest.Count(t, pool, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'oncegate_effect_attempts'::regclass")

	listSQL, err := os.ReadFile("../admin/sql/attempts_list.sql")
	if err != nil {
		t.Fatal(err)
	}
	interrupted := `SELECT count(*) FROM oncegate_effect_attempts a WHERE a.effect_id = $1 AND a.outcome = 'interrupted'`
	reads := map[string]string{"attempts_list": string(listSQL), "interrupted": interrupted}
	for name, q := range reads {
		if seq := pgtest.GenericPlanSeqScans(t, conn, name, q); len(seq) > 0 {
			t.Errorf("%s: the generic plan on empty tables scans %v", name, seq)
		}
	}

	// 40,000 effects' attempts, 5 each, spread over the 30 days.
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome)
		SELECT e, a, now() - (e % 30) * interval '1 day' + a * interval '1 second', 'g',
			CASE WHEN a = 5 THEN 'interrupted' ELSE 'retry' END
		FROM generate_series(1, 40000) e, generate_series(1, 5) a; ANALYZE oncegate_effect_attempts`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "RESET plan_cache_mode"); err != nil {
		t.Fatal(err)
	}
	for name, q := range reads {
		var plan []byte
		for range 2 { // the second run's, with the pages read once
			if err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+strings.ReplaceAll(q, "$1", "1234")).
				Scan(&plan); err != nil {
				t.Fatal(err)
			}
		}
		var doc []struct {
			Plan          map[string]any
			ExecutionTime float64 `json:"Execution Time"`
		}
		if err := json.Unmarshal(plan, &doc); err != nil {
			t.Fatal(err)
		}
		scans := map[string]int{}
		var seq []string
		var walk func(n map[string]any)
		walk = func(n map[string]any) {
			if typ, _ := n["Node Type"].(string); strings.Contains(typ, "Scan") {
				scans[typ]++
				if typ == "Seq Scan" {
					seq = append(seq, n["Relation Name"].(string))
				}
			}
			kids, _ := n["Plans"].([]any)
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
		walk(doc[0].Plan)
		// The partitions ahead are empty, and a scan of an empty table is what its plan costs least.
		for _, rel := range seq {
			if n := pgtest.Count(t, pool, "SELECT count(*) FROM "+rel); n > 0 {
				t.Errorf("%s scans %s, of %d rows: %v", name, rel, n, scans)
			}
		}
		t.Logf("%s over %d partitions: %v, %.3f ms", name, parts, scans, doc[0].ExecutionTime)
	}
}

// An effect is read by its id (a key leads to it, as in dedup/sql/get.sql; an outbox row leads to it), and
// its id tells its partition:
// with 33 daily partitions of effects, each such read, planned once as a gateway's prepared statement is
// (the generic plan), runs a scan of one partition alone, pruned when it starts or, for the join, as each
// row comes.
func TestEffectReadsByIDTouchOnePartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	now := time.Now()
	pgtest.Repartition(t, url, 24*time.Hour, now.Add(-30*24*time.Hour))
	parts := pgtest.Count(t, pool, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'oncegate_effects'::regclass")
	e := &effects{t: t, pool: pool}
	var ids []int64
	for d := range 30 {
		at := now.Add(-time.Duration(d) * 24 * time.Hour)
		ids = append(ids, e.add(fmt.Sprintf("k%d", d), seeded{at: at, expires: at.Add(time.Hour)}))
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ANALYZE; SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	reads := []struct{ name, sql, arg string }{
		{"by id", "SELECT * FROM oncegate_effects WHERE id = $1", fmt.Sprint(ids[12])},
		{"by key", `SELECT * FROM oncegate_effects
			WHERE id = (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = 't' AND k.key = $1) AND tenant = 't'`, "'k12'"},
		{"from the outbox", `SELECT e.* FROM oncegate_outbox o CROSS JOIN LATERAL (SELECT * FROM oncegate_effects e
			WHERE e.id = o.effect_id) e WHERE o.effect_id = $1`, fmt.Sprint(ids[12])},
	}
	for i, r := range reads {
		if _, err := conn.Exec(ctx, fmt.Sprintf("PREPARE read%d AS %s", i, r.sql)); err != nil {
			t.Fatal(err)
		}
		var plan []byte
		if err := conn.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE read%d(%s)", i, r.arg)).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		var doc []struct{ Plan map[string]any }
		if err := json.Unmarshal(plan, &doc); err != nil {
			t.Fatal(err)
		}
		var ran []string
		var walk func(n map[string]any)
		walk = func(n map[string]any) {
			rel, _ := n["Relation Name"].(string)
			if loops, _ := n["Actual Loops"].(float64); strings.HasPrefix(rel, "oncegate_effects_") && loops > 0 {
				ran = append(ran, rel)
			}
			kids, _ := n["Plans"].([]any)
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
		walk(doc[0].Plan)
		if len(ran) != 1 {
			t.Errorf("%s: scans of %v ran, of %d partitions; want one", r.name, ran, parts)
		}
	}
}
