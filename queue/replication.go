package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Durable writes. Redis replication is asynchronous: a script's writes reach the replicas after its reply
// reached the client, so a primary that dies or is cut off right after a write has acknowledged something its
// successor never saw. A queue that wants replicas runs each write that must survive a failover (enqueue,
// lease, complete) and then WAIT on the same connection, so that WAIT waits for that write's replication
// offset, and acknowledges only when enough replicas have it.

const (
	// ReplicasAuto (the zero value of Options.Replicas) waits for one replica once the queue's primary has been
	// seen with one, and from then on: see Options.Replicas.
	ReplicasAuto = 0
	// ReplicasOff acknowledges a write once the primary ran it, as Redis does by itself.
	ReplicasOff = -1
	// DefaultReplicaTimeout bounds the WAIT after a write.
	DefaultReplicaTimeout = time.Second
)

// ErrNotReplicated is returned when a write ran on the primary but fewer replicas than Options.Replicas
// acknowledged it within Options.ReplicaTimeout: the write may be lost if the primary fails over now.
var ErrNotReplicated = errors.New("queue: write not acknowledged by enough replicas")

// autoCheckEvery is how often a queue in auto mode that has not seen a replica yet looks again.
const autoCheckEvery = time.Second

// replication is a queue's state of the durable-write option.
type replication struct {
	want    int           // Options.Replicas
	timeout time.Duration // Options.ReplicaTimeout
	// on is set, never cleared, once auto mode has seen a replica: a primary cut off from its replicas sees
	// none, and that is exactly when acknowledging without them would lose writes.
	on atomic.Bool
	// checkedAt is when the last topology check finished (unix ns). Checks run one at a time, under checkMu:
	// a write that finds one in flight waits for its answer, since going on without it would acknowledge
	// writes unreplicated on a primary about to be seen with replicas (an outside tester's finding: a new
	// producer's first enqueues skipped WAIT while the first check's INFO was in flight).
	checkedAt atomic.Int64
	checkMu   sync.Mutex
	// waitAOF is set when the primary is Redis 7.2 or later (WAITAOF exists), with aofLocal when its own AOF
	// is on; read with the topology.
	waitAOF, aofLocal atomic.Bool
}

// replicas returns how many replicas a write must reach before it is acknowledged: 0 means do not wait.
func (q *Queue) replicas(ctx context.Context) int {
	r := &q.repl
	switch {
	case r.want > 0:
		if r.checkedAt.Load() == 0 {
			q.checkTopology(ctx)
		}
		return r.want
	case r.want < 0:
		return 0
	case r.on.Load():
		return 1
	}
	last := r.checkedAt.Load()
	if last != 0 && time.Since(time.Unix(0, last)) < autoCheckEvery {
		return 0
	}
	if q.checkTopology(ctx) {
		return 1
	}
	return 0
}

// checkTopology reads the queue's primary's replication and version, records them, and reports whether it
// has a replica connected. A failed read changes nothing: the write that follows fails the same way.
func (q *Queue) checkTopology(ctx context.Context) bool {
	r := &q.repl
	r.checkMu.Lock()
	defer r.checkMu.Unlock()
	if last := r.checkedAt.Load(); last != 0 && time.Since(time.Unix(0, last)) < autoCheckEvery {
		return r.on.Load() // another write's check just finished: its answer holds
	}
	defer func() { r.checkedAt.Store(time.Now().UnixNano()) }()
	node, err := q.primaryFor(ctx, q.rdb)
	if err != nil {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := node.Info(cctx, "server", "replication", "persistence").Result()
	if err != nil {
		return false
	}
	f := infoFields(info)
	r.waitAOF.Store(versionAtLeast(f["redis_version"], 7, 2))
	r.aofLocal.Store(f["aof_enabled"] == "1")
	n, _ := strconv.Atoi(f["connected_slaves"])
	if _, ok := q.rdb.(*redis.ClusterClient); ok && n == 0 {
		// On Redis Cluster the master's shard lists its replicas whether or not they are connected: a master
		// cut off from its replicas still counts them, so a process that starts during the cut waits too.
		n = shardReplicas(cctx, node)
	}
	if n > 0 && r.want == ReplicasAuto && r.on.CompareAndSwap(false, true) {
		q.opts.Logger.Info("queue: the primary has replicas: writes are acknowledged once a replica has them",
			"queue", q.name, "replicas", n, "timeout", r.timeout)
	}
	return n > 0
}

// shardReplicas counts the replicas of node's shard, connected or not, as CLUSTER SHARDS lists them.
func shardReplicas(ctx context.Context, node *redis.Client) int {
	id, err := node.ClusterMyID(ctx).Result()
	if err != nil {
		return 0
	}
	shards, err := node.ClusterShards(ctx).Result()
	if err != nil {
		return 0
	}
	for _, sh := range shards {
		mine, replicas := false, 0
		for _, n := range sh.Nodes {
			switch {
			case n.ID == id:
				mine = true
			case n.Role == "replica":
				replicas++
			}
		}
		if mine {
			return replicas
		}
	}
	return 0
}

// primaryFor returns a client of the node that holds the queue: rdb itself, or on Redis Cluster the master of
// the queue's slot.
func (q *Queue) primaryFor(ctx context.Context, rdb redis.UniversalClient) (*redis.Client, error) {
	switch c := rdb.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, q.keys.jobs)
	default:
		return nil, fmt.Errorf("queue: durable writes need a *redis.Client or *redis.ClusterClient, not %T", rdb)
	}
}

// runDurable runs s and, when replicas are wanted, WAIT (or WAITAOF) on the same connection, in one round
// trip; a short WAIT is ErrNotReplicated. One WAIT covers every job of a group-committed batch. On Redis
// Cluster both go to the master of the queue's slot; a slot that moved meanwhile fails the call, which the
// caller retries as any other error, after the client has reloaded its slot map.
// n is q.replicas, read by the caller.
func (q *Queue) runDurable(ctx context.Context, rdb redis.UniversalClient, n int, s *redis.Script, keys []string,
	args ...any) (*redis.Cmd, error) {
	var cmd *redis.Cmd
	var err error
	if n == 0 {
		cmd = s.Run(ctx, rdb, keys, args...)
		err = cmd.Err()
	} else {
		var node *redis.Client
		if node, err = q.primaryFor(ctx, rdb); err != nil {
			return nil, err
		}
		cmd, err = q.pipeWait(ctx, node, n, func(p redis.Pipeliner) *redis.Cmd { return s.EvalSha(ctx, p, keys, args...) })
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			cmd, err = q.pipeWait(ctx, node, n, func(p redis.Pipeliner) *redis.Cmd { return s.Eval(ctx, p, keys, args...) })
		}
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok && err != nil && !errors.Is(err, ErrNotReplicated) &&
		!errors.Is(err, redis.Nil) {
		// A dead node or a moved slot: go-redis reloads its slot map on MOVED but not on a refused dial, nor
		// for a call made on a node's own client, so without this the next call would go to the same node.
		cc.ReloadState(ctx)
	}
	return cmd, err
}

// pipeWait sends the script and the WAIT in one pipeline, which go-redis writes on one connection: WAIT
// waits for the replication offset of the last write made on its own connection.
func (q *Queue) pipeWait(ctx context.Context, node *redis.Client, n int, eval func(redis.Pipeliner) *redis.Cmd) (*redis.Cmd, error) {
	r := &q.repl
	pipe := node.Pipeline()
	cmd := eval(pipe)
	local := 0
	ms := r.timeout.Milliseconds()
	var wait *redis.Cmd
	if r.waitAOF.Load() {
		// Redis 7.2+: the replicas have fsynced it to their AOF (and so has the primary, when its AOF is on),
		// so it survives them restarting as well as the primary failing over. Not exercised by the tests on
		// Redis 7.0.
		if r.aofLocal.Load() {
			local = 1
		}
		wait = pipe.Do(ctx, "WAITAOF", local, n, ms)
	} else {
		wait = pipe.Do(ctx, "WAIT", n, ms)
	}
	_, _ = pipe.Exec(ctx)
	if err := cmd.Err(); err != nil {
		return cmd, err
	}
	if !r.waitAOF.Load() {
		got, err := wait.Int64()
		if err != nil {
			return cmd, fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
		}
		if int(got) < n {
			return cmd, fmt.Errorf("%w: %d of %d replicas had it after %v", ErrNotReplicated, got, n, r.timeout)
		}
		return cmd, nil
	}
	got, err := wait.Int64Slice()
	if err != nil {
		return cmd, fmt.Errorf("%w: WAITAOF: %w", ErrNotReplicated, err)
	}
	if len(got) != 2 || int(got[0]) < local || int(got[1]) < n {
		return cmd, fmt.Errorf("%w: WAITAOF %d %d answered %v after %v (replicas need appendonly yes)",
			ErrNotReplicated, local, n, got, r.timeout)
	}
	return cmd, nil
}

// infoFields parses INFO's "key:value" lines.
func infoFields(info string) map[string]string {
	f := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			f[k] = v
		}
	}
	return f
}

// versionAtLeast reports whether a Redis version "7.2.4" is at least major.minor.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}
