package queue

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// holders starts procs worker processes on a queue of server's, each running perProc jobs that sleep for
// sleep, and an in-process worker beside them that counts the jobs it was handed: any is a live job stolen.
func holders(t *testing.T, rdb *redis.Client, url string, procs, perProc int, sleep time.Duration,
	env ...string) (*Queue, []string, *atomic.Int32) {
	t.Helper()
	q, err := New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range procs {
		p := proctest.ReExec(t, "worker", append([]string{"WORKER_QUEUE=" + q.name, "REDIS_URL=" + url,
			"WORKER_HANDLER=sleep", "WORKER_SLEEP=" + sleep.String(),
			fmt.Sprintf("WORKER_CONCURRENCY=%d", perProc)}, env...)...)
		p.WaitLine("ready ", 10*time.Second)
		for j := range perProc {
			id := fmt.Sprintf("job-%d-%d", i, j)
			mustEnqueue(t, q, NewJob{ID: id})
			p.WaitLine("start "+id+" 1", 10*time.Second)
			ids = append(ids, id)
		}
	}
	var stolen atomic.Int32
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error { stolen.Add(1); return nil }), nil)
	return q, ids, &stolen
}

// checkNoneStolen waits for every job to complete and fails unless each ran once, in its first worker.
func checkNoneStolen(t *testing.T, q *Queue, ids []string, stolen *atomic.Int32, within time.Duration) {
	t.Helper()
	for _, id := range ids {
		j := waitState(t, q, id, StateCompleted, within)
		if j.Epoch != 1 || j.Stalls != 0 {
			t.Errorf("%s: %+v; want completed by epoch 1, no stall", id, j)
		}
	}
	if n := stolen.Load(); n != 0 {
		t.Fatalf("%d live jobs were taken back and run again", n)
	}
}

// Finding 5 of the queue probe: Redis itself freezing (DEBUG SLEEP 5 on a private server) made every worker
// look dead. Connections survive a stall, and a sweep after one holds lease expiry, so nothing is taken back:
// neither with the default 30 s lease nor with a 3 s lease that runs out during the stall.
func TestRedisStallTakesNoLiveJob(t *testing.T) {
	t.Parallel()
	for _, lease := range []time.Duration{DefaultLeaseTTL, 3 * time.Second} {
		t.Run("lease "+lease.String(), func(t *testing.T) {
			t.Parallel()
			result := reliability.Record(t, "Queue", fmt.Sprintf("Redis frozen 5 s (DEBUG SLEEP) under 18 running jobs in 3 worker processes (lease %v)", lease),
				"No job taken back or run twice")
			srv := redistest.Start(t, redistest.WithDebugCommand())
			q, ids, stolen := holders(t, srv.Client(t), srv.URL(), 3, 6, 9*time.Second,
				"WORKER_LEASE_TTL="+lease.String())
			<-srv.Stall(5 * time.Second)
			checkNoneStolen(t, q, ids, stolen, 60*time.Second)
			result(fmt.Sprintf("%d of %d completed by epoch 1, 0 stalls", len(ids), len(ids)))
		})
	}
}

// A Redis restart (AOF on) under running jobs: the jobs survive it, the connection ids do not. Live workers
// connect again and register within the restart grace; no job runs twice.
func TestRedisRestartTakesNoLiveJob(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Redis (AOF) stopped 5 s and restarted under 8 running jobs in 2 worker processes",
		"Workers reconnect and register again; no job taken back or run twice")
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	q, ids, stolen := holders(t, rdb, srv.URL(), 2, 4, 10*time.Second)
	srv.Stop()
	time.Sleep(5 * time.Second)
	srv.Start()
	checkNoneStolen(t, q, ids, stolen, 60*time.Second)
	result(fmt.Sprintf("%d of %d completed by epoch 1, 0 stalls", len(ids), len(ids)))
}

// On a 3-node Redis Cluster, the liveness connection goes to the node that holds the queue's slot, and a
// SIGKILLed worker's job is back within a second or two there too.
func TestKilledWorkerOnRedisCluster(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Worker process SIGKILLed holding a job, on a 3-node Redis Cluster",
		"Another worker runs the job within a second or two; the dead epoch is fenced")
	c := redistest.StartCluster(t, 3)
	rdb := c.Client(t)
	q, err := New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	a := proctest.ReExec(t, "worker", "WORKER_QUEUE="+q.name, "WORKER_CLUSTER="+strings.Join(c.Addrs(), ","),
		"WORKER_HANDLER=block", "WORKER_LEASE_TTL=60s")
	a.WaitLine("ready ", 10*time.Second)
	mustEnqueue(t, q, NewJob{ID: "job"})
	a.WaitLine("start job 1", 10*time.Second)
	node := c.NodeForKey(q.keys.jobs)
	regs := node.Client(t).HGetAll(context.Background(), q.keys.conns).Val()
	if len(regs) != 1 {
		t.Fatalf("registrations on the queue's node %s: %v, want the worker's", node.Addr(), regs)
	}
	a.Kill()
	killed := time.Now()
	s := newStarted()
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error { s.record(j); return nil }), nil)
	select {
	case at := <-s.at:
		took := at.Sub(killed)
		t.Logf("on the cluster, the killed worker's job ran again %v after the kill", took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Fatalf("recovery took %v, want under 2s", took)
		}
		result(fmt.Sprintf("re-run %v after the kill", took.Round(10*time.Millisecond)))
	case <-time.After(30 * time.Second):
		t.Fatal("the killed worker's job was not run again within 30s")
	}
	if completeAs(t, q, "job", 1) {
		t.Fatal("epoch 1 completed the job after it was taken back")
	}
}

// A Redis Cluster failover moves the queue's slot to the replica: each worker's liveness connection follows it
// and registers there, so a live worker keeps its job, and a worker killed after the failover is still found
// by its connection (adversary finding: liveness stayed pinned to the old master, failing for good).
func TestWorkersFollowAClusterFailover(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Redis Cluster failover (CLUSTER FAILOVER to the replica of the queue's master) under running jobs",
		"Live workers follow the slot and keep their jobs; a worker killed after it is found by its connection")
	c := redistest.StartCluster(t, 3)
	rdb := c.Client(t)
	q, err := New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	master := c.NodeForKey(q.keys.jobs)
	replica := c.AddReplica(master)
	env := []string{"WORKER_QUEUE=" + q.name, "WORKER_CLUSTER=" + strings.Join(c.Addrs(), ","),
		"WORKER_CONCURRENCY=1", "WORKER_LEASE_TTL=60s"}
	live := proctest.ReExec(t, "worker", append(env, "WORKER_HANDLER=sleep", "WORKER_SLEEP=8s")...)
	live.WaitLine("ready ", 10*time.Second)
	mustEnqueue(t, q, NewJob{ID: "live"})
	live.WaitLine("start live 1", 10*time.Second)
	doomed := proctest.ReExec(t, "worker", append(env, "WORKER_HANDLER=block")...)
	doomed.WaitLine("ready ", 10*time.Second)
	mustEnqueue(t, q, NewJob{ID: "doomed"})
	doomed.WaitLine("start doomed 1", 10*time.Second)

	if err := replica.Client(t).Do(context.Background(), "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the replica never became master", func() bool {
		return strings.Contains(replica.Client(t).Info(context.Background(), "replication").Val(), "role:master")
	})
	// Both workers register on the new master.
	testenv.Eventually(t, 15*time.Second, "the workers did not register on the new master", func() bool {
		regs := replica.Client(t).HGetAll(context.Background(), q.keys.conns).Val()
		run := runIDOf(t, replica.Client(t))
		n := 0
		for _, reg := range regs {
			if strings.HasPrefix(reg, run+":") {
				n++
			}
		}
		return n == 2
	})
	var stolen atomic.Int32
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error {
		if j.ID == "live" {
			stolen.Add(1)
		}
		return nil
	}), nil)
	doomed.Kill()
	j := waitState(t, q, "doomed", StateCompleted, 15*time.Second)
	if j.Epoch != 2 || !strings.Contains(j.LastStall, "connection closed") {
		t.Fatalf("doomed = %+v; want run again after its worker's connection closed", j)
	}
	j = waitState(t, q, "live", StateCompleted, 30*time.Second)
	if j.Epoch != 1 || j.Stalls != 0 || stolen.Load() != 0 {
		t.Fatalf("live = %+v, run elsewhere %d times; want completed by its own worker", j, stolen.Load())
	}
	result("live job kept (epoch 1); killed worker's job run again after its connection closed")
}

func runIDOf(t *testing.T, c *redis.Client) string {
	t.Helper()
	for _, line := range strings.Split(c.Info(context.Background(), "server").Val(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v
		}
	}
	t.Fatal("no run_id in INFO server")
	return ""
}
