package queue

import (
	"context"
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
