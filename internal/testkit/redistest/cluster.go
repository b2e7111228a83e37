package redistest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const slotCount = 16384

// Cluster is a Redis Cluster of masters without replicas, each node a Server of the test's own.
type Cluster struct {
	t     testing.TB
	cfg   config
	nodes []*Server
	first []int // first[i] is the first slot of nodes[i]; its slots run up to first[i+1]-1
}

// StartCluster starts an n-node Redis Cluster with the 16384 slots split evenly among the nodes in order, and
// waits until every node reports cluster_state:ok and the same slot map. The nodes run with AOF and with DEBUG
// allowed, so a test can Stall one; opts apply to every node (WithArgs("--cluster-require-full-coverage",
// "no"), say, to keep the other nodes serving while one is down).
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 1 || n > slotCount {
		t.Fatalf("redistest: a cluster of %d nodes", n)
	}
	cfg := config{aof: true, debug: true}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.cluster = true
	c := &Cluster{t: t, cfg: cfg}
	for i := range n {
		c.nodes = append(c.nodes, start(t, cfg))
		c.first = append(c.first, i*slotCount/n)
	}

	// Slots and introductions by hand, as redis-cli --cluster create would, so no redis-cli is needed.
	ctx := context.Background()
	admin := make([]*redis.Client, n)
	for i, s := range c.nodes {
		admin[i] = redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		defer admin[i].Close()
		if err := admin[i].ClusterAddSlotsRange(ctx, c.first[i], c.last(i)).Err(); err != nil {
			t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE on %s: %v", s.Addr(), err)
		}
	}
	for _, s := range c.nodes[1:] {
		err := admin[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", s.port, s.busPort).Err()
		if err != nil {
			t.Fatalf("redistest: CLUSTER MEET %s: %v", s.Addr(), err)
		}
	}
	ids := make([]string, n)
	for i := range c.nodes {
		id, err := admin[i].ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatalf("redistest: CLUSTER MYID on %s: %v", c.nodes[i].Addr(), err)
		}
		ids[i] = id
	}
	want := make([]string, n)
	for i, s := range c.nodes {
		want[i] = fmt.Sprintf("%d-%d %s %s", c.first[i], c.last(i), ids[i], s.Addr())
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		disagree := ""
		for i := range c.nodes {
			if got := c.view(admin[i]); !slices.Equal(got, want) {
				disagree = fmt.Sprintf("%s sees %q", c.nodes[i].Addr(), got)
				break
			}
		}
		if disagree == "" {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: the cluster did not settle within 60s: want %q everywhere; %s", want, disagree)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// last returns the last slot of node i.
func (c *Cluster) last(i int) int {
	if i == len(c.nodes)-1 {
		return slotCount - 1
	}
	return c.first[i+1] - 1
}

// view returns a node's slot map, one "first-last id addr" per range in slot order, or a description of
// why it is not one yet.
func (c *Cluster) view(node *redis.Client) []string {
	ctx := context.Background()
	info, err := node.ClusterInfo(ctx).Result()
	if err != nil {
		return []string{err.Error()}
	}
	if !strings.Contains(info, "cluster_state:ok\r\n") ||
		!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.nodes))+"\r\n") {
		return []string{"not ok: " + strings.ReplaceAll(info, "\r\n", " ")}
	}
	shards, err := node.ClusterShards(ctx).Result()
	if err != nil {
		return []string{err.Error()}
	}
	var v []string
	for _, sh := range shards {
		for _, r := range sh.Slots {
			desc := fmt.Sprintf("%d-%d", r.Start, r.End)
			for _, n := range sh.Nodes {
				desc += fmt.Sprintf(" %s %s:%d", n.ID, n.IP, n.Port)
				if n.Health != "online" {
					desc += " " + n.Health
				}
			}
			v = append(v, desc)
		}
	}
	slices.SortFunc(v, func(a, b string) int { return slotStart(a) - slotStart(b) })
	return v
}

func slotStart(desc string) int {
	n, _ := strconv.Atoi(desc[:strings.IndexByte(desc, '-')])
	return n
}

// Nodes returns the cluster's nodes, in slot order: node i holds the i-th share of the slots.
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }

// Addrs returns the nodes' host:port addresses.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		a[i] = s.Addr()
	}
	return a
}

// Client returns a cluster client that knows every node, closed when t ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// NodeForKey returns the node that holds key's slot in the slot map the cluster started with. It asks no
// node, so it answers while a node is killed or stalled.
func (c *Cluster) NodeForKey(key string) *Server {
	slot := keySlot(key)
	i, found := slices.BinarySearch(c.first, slot)
	if !found {
		i--
	}
	return c.nodes[i]
}

// keySlot is CLUSTER KEYSLOT: CRC16 (XMODEM) of the key's hash tag, or of the whole key when it has none,
// modulo 16384.
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % slotCount
}

// AddReplica starts a node that joins the cluster as a replica of master and returns once it has synced, so
// that a test can fail over to it (CLUSTER FAILOVER on the replica) and watch clients follow the slots.
func (c *Cluster) AddReplica(master *Server) *Server {
	c.t.Helper()
	ctx := context.Background()
	r := start(c.t, c.cfg)
	admin := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer admin.Close()
	m := redis.NewClient(&redis.Options{Addr: master.Addr(), MaxRetries: -1})
	defer m.Close()
	masterID, err := m.ClusterMyID(ctx).Result()
	if err != nil {
		c.t.Fatalf("redistest: CLUSTER MYID on %s: %v", master.Addr(), err)
	}
	if err := admin.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", master.port, master.busPort).Err(); err != nil {
		c.t.Fatalf("redistest: CLUSTER MEET from %s: %v", r.Addr(), err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		// REPLICATE needs the master known to the new node first, which MEET makes true shortly.
		err := admin.Do(ctx, "CLUSTER", "REPLICATE", masterID).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redistest: CLUSTER REPLICATE on %s: %v", r.Addr(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	replicaID, err := admin.ClusterMyID(ctx).Result()
	if err != nil {
		c.t.Fatalf("redistest: CLUSTER MYID on %s: %v", r.Addr(), err)
	}
	for {
		// Synced, and known to its master as its replica: until then the master would forget a replica that
		// died, as a node whose handshake never finished.
		info := admin.Info(ctx, "replication").Val()
		nodes := m.ClusterNodes(ctx).Val()
		if strings.Contains(info, "master_link_status:up") && strings.Contains(nodes, replicaID+" ") &&
			strings.Contains(nodes, "slave "+masterID) {
			return r
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redistest: replica %s did not sync with %s:\n%s", r.Addr(), master.Addr(), info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
