package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// The durable-write option (Options.Replicas) against real failovers on servers of the test's own: each
// scenario runs with the option off, which logs what was lost (luck decides how much), and on, where no
// acknowledged enqueue may be lost.

var replicaModes = []struct {
	name     string
	replicas int
}{{"off", ReplicasOff}, {"on", ReplicasAuto}}

// producers enqueues unique IDs from n goroutines until stop is closed, and records what was acknowledged
// and when the first acknowledgement after a moment came.
type producers struct {
	acked      sync.Map // id -> true
	ackedN     atomic.Int64
	errs       atomic.Int64
	notRepl    atomic.Int64
	since      atomic.Int64 // unix ns: count the first ack of a call made after this
	firstAfter atomic.Int64 // unix ns of that ack
	lastErr    atomic.Value
	stop       chan struct{}
	wg         sync.WaitGroup
}

func startProducers(q *Queue, n int, prefix string) *producers {
	p := &producers{stop: make(chan struct{})}
	for g := range n {
		p.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-p.stop:
					return
				default:
				}
				id := fmt.Sprintf("%s-%d-%d", prefix, g, i)
				began := time.Now().UnixNano()
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				_, err := q.Enqueue(ctx, NewJob{ID: id})
				cancel()
				if err != nil {
					p.errs.Add(1)
					if errors.Is(err, ErrNotReplicated) {
						p.notRepl.Add(1)
					}
					p.lastErr.Store(err.Error())
					time.Sleep(20 * time.Millisecond)
					continue
				}
				p.acked.Store(id, true)
				p.ackedN.Add(1)
				// Only a call made after the moment counts: one in flight then may come back after it.
				if s := p.since.Load(); s != 0 && began > s {
					p.firstAfter.CompareAndSwap(0, time.Now().UnixNano())
				}
			}
		})
	}
	return p
}

func (p *producers) halt() {
	close(p.stop)
	p.wg.Wait()
}

func (p *producers) ids() []string {
	var ids []string
	p.acked.Range(func(k, _ any) bool { ids = append(ids, k.(string)); return true })
	return ids
}

// outage is the time from since to the first acknowledgement after it, or -1 if none came.
func (p *producers) outage() time.Duration {
	f := p.firstAfter.Load()
	if f == 0 {
		return -1
	}
	return time.Duration(f - p.since.Load())
}

// missing counts the ids that the queue's jobs hash does not hold, asked through rdb.
func missing(t *testing.T, rdb redis.UniversalClient, q *Queue, ids []string) int {
	t.Helper()
	n := 0
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), 1000)]
		ids = ids[len(chunk):]
		var vals []any
		var err error
		for range 50 { // the cluster client may still be learning the new slot map
			if vals, err = rdb.HMGet(context.Background(), q.keys.jobs, chunk...).Result(); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("count jobs: %v", err)
		}
		for _, v := range vals {
			if v == nil {
				n++
			}
		}
	}
	return n
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// d) A replica that does not answer makes Enqueue fail with ErrNotReplicated within about the timeout; the
// job retried under its ID once the replica is back is enqueued once.
func TestEnqueueNotReplicatedWhenReplicaStops(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name     string
		replicas int
	}{{"auto", ReplicasAuto}, {"one", 1}} {
		t.Run(mode.name, func(t *testing.T) {
			p := redistest.Start(t, redistest.WithFastSync())
			r := redistest.StartReplica(t, p.Addr())
			rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
			defer rdb.Close()
			q, err := New(rdb, testenv.Name(t, "q"), &Options{Replicas: mode.replicas,
				ReplicaTimeout: 500 * time.Millisecond, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			mustEnqueue(t, q, NewJob{ID: "before"})
			r.Freeze()
			start := time.Now()
			_, err = q.Enqueue(context.Background(), NewJob{ID: "during", Payload: []byte("one")})
			took := time.Since(start)
			r.Thaw()
			if !errors.Is(err, ErrNotReplicated) {
				t.Fatalf("enqueue while the replica was stopped: err = %v, want ErrNotReplicated", err)
			}
			if took < 400*time.Millisecond || took > 5*time.Second {
				t.Errorf("ErrNotReplicated came after %v, want about the 500ms timeout", took)
			}
			res, err := q.Enqueue(context.Background(), NewJob{ID: "during", Payload: []byte("two")})
			if err != nil {
				t.Fatalf("retry after the replica came back: %v", err)
			}
			if !res.Duplicate || string(res.Job.Payload) != "one" {
				t.Errorf("retry: duplicate=%v payload=%q, want the first enqueue's job", res.Duplicate, res.Job.Payload)
			}
			if n, err := r.Client(t).HLen(context.Background(), q.keys.jobs).Result(); err != nil || n != 2 {
				t.Errorf("the replica holds %d jobs (%v), want 2", n, err)
			}
		})
	}
}

// a) The primary SIGKILLed under Sentinel while producers enqueue through a failover client.
func TestSentinelFailoverLosesNoAcknowledgedEnqueue(t *testing.T) {
	t.Parallel()
	for _, mode := range replicaModes {
		t.Run(mode.name, func(t *testing.T) {
			result := reliability.Record(t, "Queue", "Redis primary SIGKILLed under Sentinel (3, quorum 2), 2 replicas, "+
				"30 producers through a failover client; durable-write option "+mode.name,
				checkedFor(mode.replicas))
			p := redistest.Start(t, redistest.WithFastSync())
			redistest.StartReplica(t, p.Addr())
			redistest.StartReplica(t, p.Addr())
			ss := redistest.StartSentinels(t, 3, 2, p.Addr(), 2)
			rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.MasterName,
				SentinelAddrs: redistest.SentinelAddrs(ss), MaxRetries: -1, DialTimeout: 500 * time.Millisecond})
			defer rdb.Close()
			q, err := New(rdb, testenv.Name(t, "q"), &Options{Replicas: mode.replicas, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			prod := startProducers(q, 30, "job")
			time.Sleep(1500 * time.Millisecond)
			prod.since.Store(time.Now().UnixNano())
			p.Kill()
			redistest.WaitFailover(t, ss, p.Addr(), 20*time.Second)
			testenv.Eventually(t, 20*time.Second, "an enqueue succeeded after the failover", func() bool {
				return prod.firstAfter.Load() != 0
			})
			time.Sleep(500 * time.Millisecond)
			prod.halt()
			ids := prod.ids()
			lost := missing(t, rdb, q, ids)
			t.Logf("failover: redis sentinel outage=%.1fs lost_acked=%d acked=%d errors=%d not_replicated=%d option=%s",
				prod.outage().Seconds(), lost, len(ids), prod.errs.Load(), prod.notRepl.Load(), mode.name)
			result(fmt.Sprintf("%d of %d acknowledged enqueues lost; outage %.1f s", lost, len(ids), prod.outage().Seconds()))
			if mode.replicas == ReplicasAuto && !q.repl.on.Load() {
				t.Error("auto mode never saw the replicas")
			}
			if mode.replicas != ReplicasOff && lost != 0 {
				t.Errorf("%d of %d acknowledged enqueues lost with the option on", lost, len(ids))
			}
		})
	}
}

// b) The primary cut off from its replicas and Sentinels while producers still reach it: Sentinel promotes
// a replica, and after the heal the old primary is demoted and resyncs, dropping what it took meanwhile.
func TestPartitionedPrimaryLosesNoAcknowledgedEnqueue(t *testing.T) {
	t.Parallel()
	for _, mode := range replicaModes {
		t.Run(mode.name, func(t *testing.T) {
			// Side by side: most of each run is spent waiting for Sentinel, which demotes the old primary only
			// some 10 s after the heal.
			t.Parallel()
			result := reliability.Record(t, "Queue", "Redis primary cut off from its replicas and Sentinels until "+
				"failed over, producers and a worker process still reaching it, then healed; durable-write option "+
				mode.name, checkedFor(mode.replicas)+"; no job reaches a handler on the cut-off primary")
			p := redistest.Start(t, redistest.WithFastSync())
			px := redistest.StartProxy(t, p.Addr())
			redistest.StartReplica(t, px.Addr())
			redistest.StartReplica(t, px.Addr())
			ss := redistest.StartSentinels(t, 3, 2, px.Addr(), 2)
			direct := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
			defer direct.Close()
			q, err := New(direct, testenv.Name(t, "q"), &Options{Replicas: mode.replicas, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			w := proctest.ReExec(t, "worker", "WORKER_QUEUE="+q.name, "WORKER_HANDLER=ok",
				"WORKER_REPLICAS="+fmt.Sprint(mode.replicas), "REDIS_URL="+p.URL())
			w.WaitLine("ready ", 10*time.Second)
			// The producer and the worker have both seen the replicas; retried, as a replica under load may
			// miss the first WAIT's timeout.
			testenv.Eventually(t, 20*time.Second, "the warm-up enqueue", func() bool {
				_, err := q.Enqueue(context.Background(), NewJob{ID: "warm-up"})
				return err == nil
			})
			w.WaitLine("done warm-up ", 10*time.Second)
			startsBefore := countPrefix(w.Lines(), "start ")

			t0 := time.Now()
			px.Cut()
			prod := startProducers(q, 20, "cut")
			newPrimary := redistest.WaitFailover(t, ss, px.Addr(), 20*time.Second)
			failedOver := time.Since(t0)
			time.Sleep(time.Second)
			handled := countPrefix(w.Lines(), "start ") - startsBefore
			prod.halt()
			px.Heal()
			healed := time.Now()
			testenv.Eventually(t, 30*time.Second, "the old primary is demoted", func() bool {
				return p.Role() == "slave"
			})
			demoted := time.Since(healed)
			p.WaitLinkUp(20 * time.Second)

			np := redis.NewClient(&redis.Options{Addr: newPrimary, MaxRetries: -1})
			defer np.Close()
			ids := prod.ids()
			lost := missing(t, np, q, ids)
			t.Logf("partition: redis sentinel failover=%.1fs demoted=%.1fs_after_heal lost_acked=%d acked=%d "+
				"errors=%d not_replicated=%d handled_on_old_primary=%d option=%s", failedOver.Seconds(),
				demoted.Seconds(), lost, len(ids), prod.errs.Load(), prod.notRepl.Load(), handled, mode.name)
			w.Signal(syscall.SIGKILL)
			result(fmt.Sprintf("%d of %d acknowledged enqueues lost; %d jobs handled on the cut-off primary", lost,
				len(ids), handled))
			if mode.replicas == ReplicasOff {
				return
			}
			if !q.repl.on.Load() {
				t.Error("auto mode never saw the replicas")
			}
			if lost != 0 {
				t.Errorf("%d of %d acknowledged enqueues lost with the option on", lost, len(ids))
			}
			if handled != 0 {
				t.Errorf("the worker on the cut-off primary handed %d jobs to its handler", handled)
			}
		})
	}
}

// c) A Redis Cluster master SIGKILLed; its replica takes over its slots.
func TestClusterFailoverLosesNoAcknowledgedEnqueue(t *testing.T) {
	t.Parallel()
	for _, mode := range replicaModes {
		t.Run(mode.name, func(t *testing.T) {
			result := reliability.Record(t, "Queue", "Redis Cluster master SIGKILLed, 2 replicas, 30 producers; "+
				"durable-write option "+mode.name, checkedFor(mode.replicas))
			// Without replica migration, both replicas stay with the master that is killed, rather than one
			// moving to a master that has none: the new master then has a replica and takes writes again.
			c := redistest.StartCluster(t, 3, redistest.WithFastSync(),
				redistest.WithArgs("--cluster-allow-replica-migration", "no"))
			name := testenv.Name(t, "q")
			master := c.NodeForKey(newKeys(name).jobs)
			replicas := []*redistest.Server{c.AddReplica(master), c.AddReplica(master)}
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRetries: -1,
				DialTimeout: 500 * time.Millisecond})
			defer rdb.Close()
			q, err := New(rdb, name, &Options{Replicas: mode.replicas, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			prod := startProducers(q, 30, "job")
			time.Sleep(1500 * time.Millisecond)
			prod.since.Store(time.Now().UnixNano())
			master.Kill()
			defer func() {
				if t.Failed() {
					t.Logf("last enqueue error: %v", prod.lastErr.Load())
					for _, n := range append(c.Nodes(), replicas...) {
						info, _ := n.Client(t).Info(context.Background(), "replication").Result()
						t.Logf("%s: %s", n.Addr(), info)
					}
				}
			}()
			testenv.Eventually(t, 30*time.Second, "an enqueue succeeded after the failover", func() bool {
				return prod.firstAfter.Load() != 0
			})
			time.Sleep(500 * time.Millisecond)
			prod.halt()
			ids := prod.ids()
			lost := missing(t, rdb, q, ids)
			t.Logf("failover: redis cluster outage=%.1fs lost_acked=%d acked=%d errors=%d not_replicated=%d option=%s",
				prod.outage().Seconds(), lost, len(ids), prod.errs.Load(), prod.notRepl.Load(), mode.name)
			result(fmt.Sprintf("%d of %d acknowledged enqueues lost; outage %.1f s", lost, len(ids), prod.outage().Seconds()))
			if mode.replicas == ReplicasAuto && !q.repl.on.Load() {
				t.Error("auto mode never saw the replicas")
			}
			if mode.replicas != ReplicasOff && lost != 0 {
				t.Errorf("%d of %d acknowledged enqueues lost with the option on", lost, len(ids))
			}
		})
	}
}

// checkedFor is what a scenario's reliability row checks under an option: with it off, the loss is measured,
// not asserted.
func checkedFor(replicas int) string {
	if replicas == ReplicasOff {
		return "Loss measured (asynchronous replication; not asserted)"
	}
	return "No acknowledged enqueue lost"
}

func countPrefix(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// CheckRedis reports the topology and warns where acknowledged writes can be lost to a failover.
func TestCheckRedisReportsReplication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lone := redistest.Start(t)
	p := redistest.Start(t, redistest.WithFastSync())
	r := redistest.StartReplica(t, p.Addr())
	check := func(addr string, replicas int) (Topology, string) {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = rdb.Close() })
		q, err := New(rdb, testenv.Name(t, "q"), &Options{Replicas: replicas, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		top, w := q.CheckRedis(ctx)
		return top, strings.Join(w, "\n")
	}

	top, w := check(p.Addr(), ReplicasOff)
	if top.Role != "master" || top.Replicas != 1 || !top.AOF || top.MinReplicasToWrite != 0 || top.WaitForReplicas != 0 {
		t.Errorf("primary with a replica, option off: %+v", top)
	}
	if !strings.Contains(w, "Options.Replicas is off") {
		t.Errorf("option off beside a replica: no warning in %q", w)
	}
	top, w = check(p.Addr(), ReplicasAuto)
	if top.WaitForReplicas != 1 || w != "" {
		t.Errorf("primary with a replica, auto: %+v, warnings %q", top, w)
	}
	top, w = check(lone.Addr(), ReplicasAuto)
	if top.Replicas != 0 || top.WaitForReplicas != 0 || !strings.Contains(w, "has no replica") {
		t.Errorf("lone primary: %+v, warnings %q", top, w)
	}
	if _, w = check(r.Addr(), ReplicasAuto); !strings.Contains(w, "is a replica") {
		t.Errorf("a replica: warnings %q", w)
	}
	if err := lone.Client(t).ConfigSet(ctx, "appendonly", "no").Err(); err != nil {
		t.Fatal(err)
	}
	if top, w = check(lone.Addr(), ReplicasAuto); top.AOF || !strings.Contains(w, "persistence is off") {
		t.Errorf("AOF off: %+v, warnings %q", top, w)
	}
}

// A worker whose replica does not answer hands a lease back rather than run the job, and reports a
// completion it could not get replicated as in doubt rather than as done or as a lost lease.
func TestWorkerWaitsForReplicas(t *testing.T) {
	t.Parallel()
	p := redistest.Start(t, redistest.WithFastSync())
	r := redistest.StartReplica(t, p.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer rdb.Close()
	name := testenv.Name(t, "q")
	q, err := New(rdb, name, &Options{ReplicaTimeout: 300 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	// Enqueued before the freeze through a handle that waits longer for the replica: on a loaded machine a
	// replica just synced can take more than 300 ms to acknowledge its first write (a CI run saw 0 of 1), and
	// this job's point is what happens to it once the replica is frozen.
	seed, err := New(rdb, name, &Options{ReplicaTimeout: 3 * time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, seed, NewJob{ID: "leased-while-frozen"})
	r.Freeze()
	frozen := true
	defer func() {
		if frozen {
			r.Thaw()
		}
	}()

	started := make(chan string, 10)
	release := make(chan struct{})
	outcomes := make(chan string, 10)
	runWorker(t, q, HandlerFunc(func(ctx context.Context, job *Job) error {
		started <- job.ID
		if job.ID == "completed-while-frozen" {
			<-release
		}
		return nil
	}), &WorkerConfig{Concurrency: 2, OnJobDone: func(job *Job, outcome string, _ time.Duration) {
		outcomes <- job.ID + " " + outcome
	}})
	select {
	case id := <-started:
		t.Fatalf("job %s reached its handler while its lease could not be replicated", id)
	case <-time.After(2 * time.Second):
	}
	// Each lease call leases it, finds the lease unreplicated and hands it back: only a job back in ready can
	// be leased again, under a new epoch.
	if j := mustJob(t, q, "leased-while-frozen"); j.Epoch < 2 {
		t.Errorf("the job's epoch is %d after 2 s of leases: it was not handed back", j.Epoch)
	}
	r.Thaw()
	frozen = false
	if id := <-started; id != "leased-while-frozen" {
		t.Fatalf("started %s", id)
	}
	if o := <-outcomes; o != "leased-while-frozen completed" {
		t.Fatalf("outcome %q", o)
	}

	mustEnqueue(t, q, NewJob{ID: "completed-while-frozen"})
	if id := <-started; id != "completed-while-frozen" {
		t.Fatalf("started %s", id)
	}
	r.Freeze()
	frozen = true
	close(release)
	select {
	case o := <-outcomes:
		if o != "completed-while-frozen error" {
			t.Errorf("outcome %q, want the completion reported as not done (error)", o)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome for the completion")
	}
	r.Thaw()
	frozen = false
}

// On Redis Cluster, auto mode counts the replicas the master's shard lists, connected or not: a process that
// starts while its master has lost its replica still waits, and fails rather than acknowledging alone.
func TestAutoCountsAClusterMastersDisconnectedReplica(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 1, redistest.WithFastSync())
	replica := c.AddReplica(c.Nodes()[0])
	replica.Kill()
	master := c.Nodes()[0].Client(t)
	testenv.Eventually(t, 10*time.Second, "the master never saw its replica go", func() bool {
		return strings.Contains(master.Info(context.Background(), "replication").Val(), "connected_slaves:0")
	})
	rdb := c.Client(t)
	q, err := New(rdb, testenv.Name(t, "q"), &Options{ReplicaTimeout: 200 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(context.Background(), NewJob{ID: "a"}); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("enqueue on a master whose replica is gone: err = %v, want ErrNotReplicated", err)
	}
}

// What waiting for a replica costs an enqueue: 50 producers on a private primary with one replica, the option
// off and on. It prints jobs/s; nothing is asserted.
func BenchmarkEnqueueWaitingForReplica(b *testing.B) {
	p := redistest.Start(b, redistest.WithFastSync())
	redistest.StartReplica(b, p.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), PoolSize: 64})
	defer rdb.Close()
	for _, mode := range replicaModes {
		b.Run(mode.name, func(b *testing.B) {
			q, err := New(rdb, testenv.Name(b, "q"), &Options{Replicas: mode.replicas, Logger: quietLogger()})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = q.Destroy(context.Background()) }()
			var n atomic.Int64
			b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := q.Enqueue(context.Background(), NewJob{ID: fmt.Sprint("j", n.Add(1))}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
		})
	}
}

// A duplicate is acknowledged only once what it found is replicated: a retry under the same ID, on another
// connection, while the first enqueue is still only on the primary, fails too. On Redis 7.0 WAIT waits for
// the offset after the connection's last command of any kind, so this holds here even without the sync key
// enqueue.lua writes for a batch of duplicates; the key is for servers whose WAIT counts only writes.
func TestDuplicateWaitsForTheReplicationOfWhatItFound(t *testing.T) {
	t.Parallel()
	p := redistest.Start(t, redistest.WithFastSync())
	r := redistest.StartReplica(t, p.Addr())
	opts := &Options{Replicas: 1, ReplicaTimeout: 300 * time.Millisecond, Logger: quietLogger()}
	name := testenv.Name(t, "q")
	first := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer first.Close()
	second := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer second.Close()
	q1, err := New(first, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	q2, err := New(second, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	// q2's connection has written, and been replicated, before. Retried: under load the new replica may take
	// longer than the 300 ms timeout to apply its first writes; that is not what this test is about.
	testenv.Eventually(t, 20*time.Second, "the warm-up enqueue is replicated", func() bool {
		_, err := q2.Enqueue(context.Background(), NewJob{ID: "warm-up"})
		return err == nil
	})
	r.Freeze()
	defer r.Thaw()
	if _, err := q1.Enqueue(context.Background(), NewJob{ID: "a"}); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("first enqueue: err = %v, want ErrNotReplicated", err)
	}
	res, err := q2.Enqueue(context.Background(), NewJob{ID: "a"})
	if !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("retry on another connection while the first is unreplicated: %+v, err = %v; want ErrNotReplicated",
			res, err)
	}
}

// A ReplicaTimeout the client's read timeout would cut short is refused.
func TestNewRefusesAReplicaTimeoutOverTheReadTimeout(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	if _, err := New(rdb, "q", &Options{ReplicaTimeout: 5 * time.Second}); err == nil ||
		!strings.Contains(err.Error(), "ReadTimeout") {
		t.Errorf("ReplicaTimeout 5s on go-redis's default 5s read timeout: err = %v, want refused", err)
	}
	if _, err := New(rdb, "q", &Options{ReplicaTimeout: 4 * time.Second}); err != nil {
		t.Errorf("ReplicaTimeout 4s on a 5s read timeout: %v", err)
	}
	none := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: -1})
	defer none.Close()
	if _, err := New(none, "q", &Options{ReplicaTimeout: time.Minute}); err != nil {
		t.Errorf("no read timeout: %v", err)
	}
	if _, err := New(rdb, "q", &Options{Replicas: ReplicasOff, ReplicaTimeout: 5 * time.Second}); err != nil {
		t.Errorf("with the option off the timeout is unused: %v", err)
	}
}

// A new producer in auto mode whose primary has replicas waits for them from its very first enqueue, however
// many enqueues start at once (an outside tester's finding: while the first topology check was in flight,
// the other enqueues went out without WAIT and were acknowledged by the primary alone).
func TestAutoModeWaitsFromTheFirstConcurrentEnqueues(t *testing.T) {
	t.Parallel()
	p := redistest.Start(t, redistest.WithFastSync())
	r := redistest.StartReplica(t, p.Addr())
	r.Freeze() // still connected as far as the primary knows: it answers no WAIT
	defer r.Thaw()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer rdb.Close()
	q, err := New(rdb, testenv.Name(t, "q"), &Options{ReplicaTimeout: 300 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var acked atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			if _, err := q.Enqueue(context.Background(), NewJob{ID: fmt.Sprint("first-", i)}); err == nil {
				acked.Add(1)
			} else if !errors.Is(err, ErrNotReplicated) {
				t.Errorf("enqueue %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if n := acked.Load(); n != 0 {
		t.Fatalf("%d of 20 first enqueues were acknowledged with the only replica frozen", n)
	}
}
