package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// What a failover would lose is judged from the standbys and synchronous_commit together: a synchronous
// standby that commits do not wait for (synchronous_commit = local or off) protects nothing.
func TestJudgeReplication(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		commit   string
		standbys map[string]int
		want     ReplicationState
		names    string
	}{
		// Commits wait for a synchronous standby that is not connected: writes are stopped (an outside
		// tester's /readyz read "none" and told them to set the setting already set).
		{"on", map[string]int{}, ReplicationBlocked, "ANY 1 (s2, s3)"},
		{"on", map[string]int{"async": 1}, ReplicationBlocked, "ANY 1 (s2, s3)"},
		{"on", map[string]int{"quorum": 1}, ReplicationSync, "ANY 1 (s2, s3)"},
		{"local", map[string]int{}, ReplicationNone, "*"},
		{"on", map[string]int{"sync": 1, "potential": 1}, ReplicationSync, ""},
		{"remote_apply", map[string]int{"quorum": 2}, ReplicationSync, ""},
		{"remote_write", map[string]int{"sync": 1}, ReplicationSync, ""},
		{"local", map[string]int{"sync": 1}, ReplicationAsync, ""},
		{"off", map[string]int{"sync": 1}, ReplicationAsync, ""},
		{"on", map[string]int{"async": 2}, ReplicationAsync, ""},
		{"on", map[string]int{"potential": 1}, ReplicationAsync, ""},
		{"on", map[string]int{"unknown": 1}, ReplicationUnknown, ""},
		{"on", map[string]int{}, ReplicationNone, ""},
	} {
		got, detail := judgeReplication(Replication{SynchronousCommit: c.commit, Standbys: c.standbys,
			SynchronousStandbyNames: c.names})
		if got != c.want || detail == "" {
			t.Errorf("synchronous_commit %s, standbys %v: %s (%q), want %s", c.commit, c.standbys, got, detail, c.want)
		}
		if got == ReplicationAsync && !strings.Contains(detail, "synchronous_") {
			t.Errorf("%v: the detail does not say what closes the loss: %s", c.standbys, detail)
		}
	}
}

// A database user that may not read its standbys' state (no pg_monitor) is told so: the check reports
// unknown, never "no standbys", which would read as nothing to fix. With pg_monitor it sees the standby.
func TestReplicationUnreadableIsUnknownNotNone(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, time.Minute)
	primary := pgtest.StartCluster(t)
	primary.StartStandby(pgtest.Async)
	admin, err := pgx.Connect(ctx, primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE ROLE plain LOGIN"); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(primary.URL(), "postgres://postgres@", "postgres://plain@", 1)
	g := &Gateway{pool: pgtest.Pool(t, url)}
	for _, step := range []struct {
		grant string
		want  ReplicationState
	}{{"", ReplicationUnknown}, {"GRANT pg_monitor TO plain", ReplicationAsync}} {
		if step.grant != "" {
			if _, err := admin.Exec(ctx, step.grant); err != nil {
				t.Fatal(err)
			}
		}
		r, err := g.replication(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != step.want || fmt.Sprint(r.Standbys) != fmt.Sprintf("map[%s:1]", step.want) {
			t.Errorf("after %q: %+v, want %s with that one standby", step.grant, r, step.want)
		}
	}
}
