package queue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// Each URL form reaches a working queue of its kind: a single server, a Sentinel-managed primary and a
// Cluster, each a server of the test's own.
func TestOpenRedisURLForms(t *testing.T) {
	t.Parallel()
	p := redistest.Start(t, redistest.WithFastSync())
	redistest.StartReplica(t, p.Addr())
	ss := redistest.StartSentinels(t, 1, 1, p.Addr(), 1)
	c := redistest.StartCluster(t, 2)
	cases := []struct {
		url  string
		want string // the client's type
	}{
		{p.URL(), "*redis.Client"},
		{"redis://" + ss[0].Addr() + "?master_name=" + redistest.MasterName, "failover"},
		{"redis+cluster://" + c.Addrs()[0] + "?addr=" + c.Addrs()[1], "*redis.ClusterClient"},
	}
	for _, tc := range cases {
		rdb, err := OpenRedis(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		defer rdb.Close()
		got := ""
		switch c := rdb.(type) {
		case *redis.ClusterClient:
			got = "*redis.ClusterClient"
		case *redis.Client:
			got = "*redis.Client"
			if c.Options().Addr == "FailoverClient" {
				got = "failover"
			}
		}
		if got != tc.want {
			t.Errorf("%s: a %s, want a %s", tc.url, got, tc.want)
		}
		q, err := New(rdb, testenv.Name(t, "q"), &Options{Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := q.Enqueue(ctx, NewJob{ID: "a"}); err != nil {
			t.Errorf("%s: enqueue: %v", tc.url, err)
		}
		cancel()
	}
	for _, bad := range []string{"redis+cluster://h:1?db=2x", "redis://h:1?master_name=m&bogus=1", "redis://h:1?bogus=1"} {
		if _, err := OpenRedis(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// A Sentinel URL whose master_name no Sentinel knows is refused with the names they do know (an outside
// tester's worker said it ran and logged "all sentinels specified in configuration are unreachable: redis:
// nil" twenty times a second); one that would route writes to replicas is refused before any call.
func TestSentinelURLMistakesAreNamed(t *testing.T) {
	t.Parallel()
	p := redistest.Start(t)
	ss := redistest.StartSentinels(t, 1, 1, p.Addr(), 0)
	base := "redis://" + ss[0].Addr() + "?master_name="
	ctx := context.Background()
	if err := CheckSentinels(ctx, base+redistest.MasterName); err != nil {
		t.Fatalf("the right name: %v", err)
	}
	err := CheckSentinels(ctx, base+"nosuch")
	if err == nil || !strings.Contains(err.Error(), `"nosuch"`) || !strings.Contains(err.Error(), redistest.MasterName) {
		t.Fatalf("a name no Sentinel knows: %v", err)
	}
	if err := CheckSentinels(ctx, "redis://127.0.0.1:1?master_name=x"); err != nil {
		t.Fatalf("Sentinels that do not answer are no error (they may be starting): %v", err)
	}
	if _, err := OpenRedis(base + redistest.MasterName + "&replica_only=true"); err == nil {
		t.Fatal("replica_only=true accepted: every write would fail with READONLY")
	}
}
