package pgtest

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

var param = regexp.MustCompile(`\$([0-9]+)`)

// GenericPlanSeqScans prepares sql on conn and returns the tables that its generic plan, made now, reads by a
// sequential scan, and its whole-index scans ("Full Index Scan on table"). Postgres keeps a prepared statement's generic plan, made from the table sizes of the
// moment it was made, for the connection's life: called while the tables are empty, this shows the plan a
// gateway started on a new database keeps however large its tables grow.
func GenericPlanSeqScans(t testing.TB, conn *pgx.Conn, name, sql string) []string {
	t.Helper()
	var out []string
	for _, n := range GenericPlanNodes(t, conn, name, sql) {
		if rel, ok := strings.CutPrefix(n, "Seq Scan on "); ok {
			out = append(out, rel)
		} else if strings.HasPrefix(n, "Full ") {
			out = append(out, n)
		}
	}
	return out
}

// GenericPlanNodes is the generic plan of sql, made now on conn, as its nodes: "Node Type", or "Node Type on
// relation" for a scan; an index scan without an index condition, which reads the whole index for its order,
// is "Full Index Scan on relation".
func GenericPlanNodes(t testing.TB, conn *pgx.Conn, name, sql string) []string {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range param.FindAllStringSubmatch(sql, -1) {
		var i int
		_, _ = fmt.Sscan(m[1], &i)
		n = max(n, i)
	}
	stmt := "plan_" + name
	if _, err := conn.Exec(ctx, "PREPARE "+stmt+" AS "+sql); err != nil {
		t.Fatalf("prepare %s: %v", name, err)
	}
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE "+stmt) }()
	if n > 0 {
		stmt += "(" + strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ") + ")"
	}
	var plan []byte
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE "+stmt).Scan(&plan); err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	var doc []struct{ Plan map[string]any }
	if err := json.Unmarshal(plan, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		n := fmt.Sprint(node["Node Type"])
		if _, cond := node["Index Cond"]; strings.HasPrefix(n, "Index") && !cond {
			n = "Full " + n // an index read whole, for its order
		}
		if rel, ok := node["Relation Name"]; ok {
			n += fmt.Sprint(" on ", rel)
		}
		out = append(out, n)
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	for _, d := range doc {
		walk(d.Plan)
	}
	return out
}
