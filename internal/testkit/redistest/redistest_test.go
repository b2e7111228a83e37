package redistest_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/testkit/redistest"
)

func TestRedisServerStarts(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if s.URL() != fmt.Sprintf("redis://127.0.0.1:%d/0", s.Port()) || s.Addr() != fmt.Sprintf("127.0.0.1:%d", s.Port()) {
		t.Fatalf("URL %s, Addr %s, Port %d disagree", s.URL(), s.Addr(), s.Port())
	}
	// Defaults that the outage tests rely on: AOF with everysec, and DEBUG refused unless asked for.
	cfg, err := c.ConfigGet(ctx, "append*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if cfg["appendonly"] != "yes" || cfg["appendfsync"] != "everysec" {
		t.Fatalf("AOF config: %v", cfg)
	}
	if err := c.Do(ctx, "DEBUG", "SLEEP", "0").Err(); err == nil {
		t.Fatal("DEBUG allowed without WithDebugCommand")
	}
	if !strings.Contains(s.Log(), "Ready to accept connections") {
		t.Fatalf("log has no start-up line:\n%s", s.Log())
	}
}

// A key written before a clean stop is there after a restart on the same port and folder: the AOF is what
// the queue's outage test counts on.
func TestRedisRestartKeepsAOFData(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "kept", "across a restart", 0).Err(); err != nil {
		t.Fatal(err)
	}
	port := s.Port()
	s.Stop()
	if conn, err := net.Dial("tcp", s.Addr()); err == nil {
		conn.Close()
		t.Fatal("still listening after Stop")
	}
	s.Start()
	if s.Port() != port {
		t.Fatalf("port %d after restart, was %d", s.Port(), port)
	}
	if v, err := c.Get(ctx, "kept").Result(); err != nil || v != "across a restart" {
		t.Fatalf("after Stop and Start: %q, %v", v, err)
	}
	s.Kill()
	s.Start()
	if v, err := c.Get(ctx, "kept").Result(); err != nil || v != "across a restart" {
		t.Fatalf("after Kill and Start: %q, %v", v, err)
	}
}

func TestRedisWithoutAOFRestartsEmpty(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.WithoutAOF(), redistest.WithArgs("--maxmemory", "10mb"))
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "lost", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if mm, err := c.ConfigGet(ctx, "maxmemory").Result(); err != nil || mm["maxmemory"] != "10485760" {
		t.Fatalf("WithArgs not applied: %v %v", mm, err)
	}
	s.Stop()
	s.Start()
	if n, err := c.Exists(ctx, "lost").Result(); err != nil || n != 0 {
		t.Fatalf("without AOF, a restart kept the key (%d, %v)", n, err)
	}
}

// Stall freezes the server: a PING sent once Stall returns waits for most of the stall.
func TestRedisStallBlocksCommands(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.WithDebugCommand())
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const stall = 2 * time.Second
	done := s.Stall(stall)
	began := time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after the stall: %v", err)
	}
	if took := time.Since(began); took < stall/2 {
		t.Fatalf("PING answered after %v of a %v stall", took, stall)
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the stall's channel was not closed after the server answered again")
	}
}

// Every node takes writes through the cluster client, and NodeForKey names the node that holds each key.
func TestRedisClusterWritesOnEveryNode(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	cc := cl.Client(t)
	ctx := context.Background()
	nodes := cl.Nodes()
	if len(nodes) != 3 || len(cl.Addrs()) != 3 {
		t.Fatalf("%d nodes, %d addresses", len(nodes), len(cl.Addrs()))
	}
	direct := map[*redistest.Server]*redis.Client{}
	for _, n := range nodes {
		direct[n] = n.Client(t)
	}
	perNode := map[*redistest.Server]int{}
	for i := range 300 {
		key := fmt.Sprintf("key-%d", i)
		if i%3 == 0 { // hash tags too: the slot is the tag's
			key = fmt.Sprintf("{tag-%d}:key", i)
		}
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		node := cl.NodeForKey(key)
		perNode[node]++
		// The node named holds the key itself: a plain client sees it there, with no redirection.
		if v, err := direct[node].Get(ctx, key).Int(); err != nil || v != i {
			t.Fatalf("%s on %s, which NodeForKey named: %d, %v", key, node.Addr(), v, err)
		}
		slot, err := direct[node].ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if owner := ownerOf(t, direct[node], int(slot)); owner != node.Addr() {
			t.Fatalf("%s: slot %d belongs to %s, NodeForKey said %s", key, slot, owner, node.Addr())
		}
	}
	for _, n := range nodes {
		if perNode[n] == 0 {
			t.Fatalf("no key landed on %s", n.Addr())
		}
	}
}

// ownerOf reads the owner of slot from a node's own CLUSTER SHARDS.
func ownerOf(t *testing.T, c *redis.Client, slot int) string {
	t.Helper()
	shards, err := c.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= int64(slot) && int64(slot) <= r.End {
				return fmt.Sprintf("%s:%d", sh.Nodes[0].IP, sh.Nodes[0].Port)
			}
		}
	}
	t.Fatalf("slot %d unassigned", slot)
	return ""
}
