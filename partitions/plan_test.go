package partitions_test

import (
	"context"
	"encoding/json"
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
