package admin_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
)

// `effect ls --since` lists exactly the effects created since, and reads only those: created_at has no index,
// and the listing walked every older effect that matched its other filters to test each one's creation time
// (555 ms for `--since 1h --status unknown` beside ten million effects, in BenchmarkOperatorListings). The
// table here has what the search for the first id must survive: ids purged away at the boundary, and
// effects whose created_at runs behind their id by up to 30 s (a transaction that began before its
// neighbour's and wrote after it).
func TestSinceListsTheEffectsCreatedSinceAndReadsNoOlderOnes(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	const n = 20_000
	// One a second back from now; every tenth unknown, the rest delivered.
	if _, err := pool.Exec(ctx, `
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, status, finished_at, created_at)
		SELECT 'acme', 'k' || i, 'hook', '\x00', '{}'::json,
		       CASE WHEN i % 10 = 0 THEN 'unknown' ELSE 'delivered' END, now(),
		       now() - make_interval(secs => $1 - i)
		FROM generate_series(1, $1) AS i`, n); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-1000 * time.Second)
	// Around the boundary: a run of ids purged, and every seventh effect created 30 s before its id says.
	if _, err := pool.Exec(ctx, `DELETE FROM oncegate_effects WHERE id BETWEEN $1 - 1005 AND $1 - 995`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET created_at = created_at - interval '30 seconds'
		WHERE id BETWEEN $1 - 1100 AND $1 - 900 AND id % 7 = 0`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE oncegate_effects"); err != nil {
		t.Fatal(err)
	}
	var want []int64
	rows, _ := pool.Query(ctx, `SELECT id FROM oncegate_effects WHERE created_at >= $1 AND status = 'unknown'
		ORDER BY id DESC`, since)
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	if rows.Err() != nil || len(want) < 90 {
		t.Fatalf("the window holds %d unknown effects (%v); the seed went wrong", len(want), rows.Err())
	}

	viewer := admin.Actor{Name: "test", Role: admin.RoleViewer}
	f := admin.EffectFilter{Since: since, Status: effect.StatusUnknown}
	var got []int64
	for p := (admin.Page{Limit: 40}); ; {
		page, err := svc.Effects(ctx, viewer, f, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Effects {
			got = append(got, e.ID)
		}
		if page.NextCursor == "" {
			break
		}
		p.Cursor = page.NextCursor
	}
	if !slices.Equal(got, want) {
		t.Fatalf("--since --status unknown listed %d effects, want the %d created since: got %v, want %v",
			len(got), len(want), got, want)
	}
	if c, err := svc.CountEffects(ctx, viewer, f); err != nil || c != int64(len(want)) {
		t.Fatalf("the count: %d, %v; want %d", c, err, len(want))
	}

	// A page larger than what the window holds (the last page of any listing is one) reads no effect
	// created more than a minute and a half before since: the table holds 2,000 unknown effects, the window
	// 1,000 effects of which 100 unknown.
	from, err := svc.SinceID(ctx, since)
	if err != nil {
		t.Fatal(err)
	}
	var plan []byte
	if err := pool.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+admin.EffectsListSQL, nil, nil, "unknown", nil,
		since, nil, nil, 1001, nil, nil, from).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	read := effectsRead(t, plan)
	if read > 1_100 {
		t.Fatalf("a page of 1,000 of --since --status unknown read %d effects, want those of the window alone (from id %d): %s",
			read, *from, plan)
	}
	t.Logf("first id %d; a page of 1,000 read %d effects; %d listed", *from, read, len(got))
}

// A tenant's listing of its failed, dead or unknown effects finds them, or that there are none, without
// walking the other tenants' (or its own delivered ones): beside ten million effects, a console page for a
// tenant with no failed effect took 260.8 ms (BenchmarkPages), walking every failed effect of the table to
// test each one's tenant.
func TestATenantsFailuresAreListedWithoutWalkingOthers(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	// Tenant globex has every failure; acme, as many effects, has none.
	if _, err := pool.Exec(ctx, `
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, status, finished_at)
		SELECT CASE WHEN i % 2 = 0 THEN 'acme' ELSE 'globex' END, 'k' || i, 'hook', '\x00', '{}'::json,
		       CASE WHEN i % 2 = 1 AND i % 7 = 1 THEN (ARRAY['failed', 'dead', 'unknown'])[1 + i % 3] ELSE 'delivered' END, now()
		FROM generate_series(1, 40000) AS i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE oncegate_effects"); err != nil {
		t.Fatal(err)
	}
	viewer := admin.Actor{Name: "test", Role: admin.RoleViewer}
	for _, s := range []effect.Status{effect.StatusFailed, effect.StatusDead, effect.StatusUnknown} {
		for _, tenant := range []string{"acme", "globex"} {
			page, err := svc.Effects(ctx, viewer, admin.EffectFilter{Tenant: tenant, Status: s}, admin.Page{Limit: 50})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(page.Effects); (tenant == "acme") != (n == 0) {
				t.Fatalf("%s's %s effects: %d listed", tenant, s, n)
			}
			var plan []byte
			if err := pool.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+admin.EffectsListSQL, tenant, nil, string(s),
				nil, nil, nil, nil, 51, nil, nil, nil).Scan(&plan); err != nil {
				t.Fatal(err)
			}
			if read := effectsRead(t, plan); read > 60 {
				t.Fatalf("%s's %s effects: the page read %d effects, want at most the page's", tenant, s, read)
			}
		}
	}
}

// effectsRead is how many rows of oncegate_effects a plan from EXPLAIN (ANALYZE, FORMAT JSON) read.
func effectsRead(t *testing.T, plan []byte) int {
	t.Helper()
	var doc []struct{ Plan map[string]any }
	if err := json.Unmarshal(plan, &doc); err != nil {
		t.Fatal(err)
	}
	read := 0
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, _ := n["Relation Name"].(string); rel == "oncegate_effects" {
			rows, _ := n["Actual Rows"].(float64)
			loops, _ := n["Actual Loops"].(float64)
			removed, _ := n["Rows Removed by Filter"].(float64)
			read += int(rows*loops + removed)
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			walk(k.(map[string]any))
		}
	}
	walk(doc[0].Plan)
	return read
}
