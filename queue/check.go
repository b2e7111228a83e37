package queue

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Topology is what CheckRedis read of the Redis node that holds a queue: its replication and persistence.
type Topology struct {
	// Role is "master" or "slave", as INFO replication says; empty when it could not be read.
	Role string
	// Replicas is how many replicas are connected to it (connected_slaves).
	Replicas int
	// MinReplicasToWrite and MinReplicasMaxLag are Redis's min-replicas-* settings (-1: could not be read).
	// They make a primary refuse writes once fewer replicas than that have answered within the lag; they
	// make no write wait for a replica, so they bound, but do not close, what a failover can lose.
	MinReplicasToWrite, MinReplicasMaxLag int
	// AOF is true when the append-only file is on.
	AOF bool
	// Version is redis_version.
	Version string
	// WaitForReplicas is how many replicas the queue's writes wait for now (Options.Replicas, auto resolved).
	WaitForReplicas int
}

// CheckRedis returns warnings about Redis settings that can lose jobs: an eviction policy other than
// noeviction (Redis may delete queue keys under memory pressure), persistence that is off or snapshot-only
// (a restart loses what was acknowledged since), and a topology under which a failover loses acknowledged
// writes (see Queue.CheckRedis). Managed Redis services that forbid CONFIG yield a warning saying the policy
// could not be read.
func CheckRedis(ctx context.Context, rdb redis.UniversalClient) []string {
	_, warnings := check(ctx, rdb, nil)
	return warnings
}

// CheckRedis reports the replication topology of the node that holds q (on Redis Cluster, the master of its
// slot) and returns the warnings of the package's CheckRedis, plus: replicas present while Options.Replicas is
// off (replication is asynchronous: a failover loses the writes of its last moments), a primary without a
// replica (nothing to fail over to, and the AOF is all there is), and a replica where a primary was expected.
// Workers log both at start.
func (q *Queue) CheckRedis(ctx context.Context) (Topology, []string) {
	return check(ctx, q.rdb, q)
}

func check(ctx context.Context, rdb redis.UniversalClient, q *Queue) (Topology, []string) {
	top := Topology{MinReplicasToWrite: -1, MinReplicasMaxLag: -1}
	var warnings []string
	var node redis.UniversalClient = rdb
	if q != nil {
		if n, err := q.primaryFor(ctx, rdb); err == nil {
			node = n
		}
	}
	policy, err := node.ConfigGet(ctx, "maxmemory-policy").Result()
	switch {
	case err != nil:
		warnings = append(warnings, fmt.Sprintf(
			"could not read Redis maxmemory-policy (%v); it must be noeviction, or Redis may evict queued jobs", err))
	case policy["maxmemory-policy"] != "noeviction":
		warnings = append(warnings, fmt.Sprintf(
			"Redis maxmemory-policy is %q: under memory pressure Redis may evict queue keys and lose jobs; "+
				"set maxmemory-policy noeviction", policy["maxmemory-policy"]))
	}

	info, err := node.Info(ctx, "server", "replication", "persistence").Result()
	if err != nil {
		return top, append(warnings, fmt.Sprintf("could not read Redis persistence and replication: %v", err))
	}
	f := infoFields(info)
	top.Role, top.Version, top.AOF = f["role"], f["redis_version"], f["aof_enabled"] == "1"
	top.Replicas, _ = strconv.Atoi(f["connected_slaves"])
	if mr, err := node.ConfigGet(ctx, "min-replicas-*").Result(); err == nil {
		if v, err := strconv.Atoi(mr["min-replicas-to-write"]); err == nil {
			top.MinReplicasToWrite = v
		}
		if v, err := strconv.Atoi(mr["min-replicas-max-lag"]); err == nil {
			top.MinReplicasMaxLag = v
		}
	}

	if !top.AOF {
		save, err := node.ConfigGet(ctx, "save").Result()
		if err == nil && strings.TrimSpace(save["save"]) == "" {
			warnings = append(warnings, "Redis persistence is off (no AOF, no RDB snapshots): a Redis restart "+
				"loses every job; run Redis with --appendonly yes")
		} else {
			warnings = append(warnings, "Redis AOF is off: jobs acknowledged since the last RDB snapshot are lost "+
				"if Redis restarts; run Redis with --appendonly yes")
		}
	}

	switch {
	case top.Role == "slave":
		warnings = append(warnings, "the queue's Redis is a replica: it refuses writes; point REDIS_URL at the "+
			"primary, or at its Sentinels (redis://sentinel:26379?master_name=NAME)")
	case top.Role == "master" && top.Replicas == 0 && (q == nil || q.repl.want <= 0):
		warnings = append(warnings, "the queue's Redis primary has no replica: if it dies there is nothing to "+
			"fail over to, and if its disk is lost so are the jobs; run a replica or two under Sentinel or "+
			"Cluster (the queue then acknowledges writes once a replica has them)")
	}
	if q == nil {
		return top, warnings
	}
	top.WaitForReplicas = q.replicas(ctx)
	switch {
	case top.Replicas > 0 && q.repl.want == ReplicasOff:
		msg := fmt.Sprintf("the queue's Redis primary has %d replica(s) but Options.Replicas is off: replication "+
			"is asynchronous, so a failover or a partition loses the enqueues, leases and completions the primary "+
			"acknowledged last; leave Replicas at auto", top.Replicas)
		if top.MinReplicasToWrite > 0 {
			msg += fmt.Sprintf(" (min-replicas-to-write %d only refuses writes once replicas lag %d s; it makes "+
				"no write wait)", top.MinReplicasToWrite, top.MinReplicasMaxLag)
		}
		warnings = append(warnings, msg)
	case q.repl.want > top.Replicas && top.Role == "master":
		warnings = append(warnings, fmt.Sprintf("Options.Replicas is %d but the primary has %d replica(s) "+
			"connected: every write fails with ErrNotReplicated until enough are", q.repl.want, top.Replicas))
	}
	return top, warnings
}
