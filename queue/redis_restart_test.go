package queue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// Redis stopped and restarted under a running queue: every acknowledged enqueue survives, the jobs leased
// at the time are recovered, and the worker process reconnects by itself.
func TestRedisRestartLosesNoAcknowledgedJob(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Redis (AOF everysec) stopped and restarted under a producer and a worker process",
		"No acknowledged enqueue lost; leased jobs recovered; the worker reconnects by itself")
	r := redistest.Start(t) // AOF everysec, as production runs
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer rdb.Close()
	q, err := New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// A short lease: every lease of the outage looks expired after it, so the sweeper and the heartbeats decide
	// together; completions that could not reach Redis are retried until it answers.
	w := proctest.ReExec(t, "worker", "WORKER_QUEUE="+q.name, "WORKER_HANDLER=sleep", "WORKER_SLEEP=50ms",
		"WORKER_CONCURRENCY=4", "WORKER_LEASE_TTL=3s", "REDIS_URL="+r.URL())
	w.WaitLine("ready ", 10*time.Second)

	var acked sync.Map
	var ackedN, refused atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("job-%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := q.Enqueue(ctx, NewJob{ID: id})
			cancel()
			if err == nil {
				acked.Store(id, true)
				ackedN.Add(1)
			} else {
				refused.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(1500 * time.Millisecond)
	// SIGTERM, as an operator or an orchestrator would: Redis finishes its AOF and exits.
	r.Stop()
	time.Sleep(2 * time.Second) // an outage long enough for every lease and liveness to look expired after it
	r.Start()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	n := int(ackedN.Load())
	var last Stats
	defer func() {
		if t.Failed() {
			t.Logf("queue at the end: %+v (%d acknowledged)", last, n)
		}
	}()
	testenv.Eventually(t, 90*time.Second, "every acknowledged job completed after the restart", func() bool {
		s, err := q.Stats(context.Background())
		last = s
		// An enqueue whose answer was lost to the outage may have been applied: it completes too, unacknowledged.
		return err == nil && s.Counts[StateCompleted] >= int64(n) && s.Counts[StateReady]+s.Counts[StateActive]+
			s.Counts[StateDelayed] == 0
	})
	missing := 0
	acked.Range(func(k, _ any) bool {
		if j, err := q.Job(context.Background(), k.(string)); err != nil || j.State != StateCompleted {
			missing++
		}
		return true
	})
	if missing != 0 {
		t.Fatalf("%d of %d acknowledged jobs missing or unfinished", missing, n)
	}
	s, _ := q.Stats(context.Background())
	if s.Counts[StateDead] != 0 {
		t.Fatalf("%d jobs dead after one restart", s.Counts[StateDead])
	}
	t.Logf("%d enqueues acknowledged (%d refused during the outage), all completed", n, refused.Load())
	result(fmt.Sprintf("%d acknowledged, %d completed, 0 lost; %d refused while down", n, n, refused.Load()))
}

// An outside tester's finding: a handler that succeeded while Redis was restarting had its completion given up
// after about a second of retries; the heartbeat then handed the job back as a lease the worker never heard
// of, and the same live worker ran it again. A completion is now retried until it is recorded, its lease is
// found lost, or the worker's drain is over, and the run keeps its lease meanwhile: the job runs once.
func TestACompletionWaitsOutARedisRestart(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Redis (AOF) stopped for 3 s just as a handler succeeds, then started again",
		"The completion is recorded once Redis is back; the job runs once, on the same worker")
	r := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer rdb.Close()
	q, err := New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}, 1), make(chan struct{})
	var runs atomic.Int32
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error {
		if runs.Add(1) == 1 {
			started <- struct{}{}
			<-release
		}
		return nil
	}), &WorkerConfig{Concurrency: 4})
	mustEnqueue(t, q, NewJob{ID: "once"})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the job never started")
	}
	r.Stop() // SIGTERM: Redis writes its AOF out and exits
	close(release)
	time.Sleep(3 * time.Second) // longer than the retries that gave up before
	r.Start()
	waitState(t, q, "once", StateCompleted, 30*time.Second)
	// The heartbeat (every second) would have handed the job back within a beat or two, and the worker run it.
	time.Sleep(3 * time.Second)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the job ran %d times; its worker never lost its lease", n)
	}
	j := mustJob(t, q, "once")
	if j.Runs != 1 || j.Stalls != 0 {
		t.Fatalf("completed after %d runs, %d stalls", j.Runs, j.Stalls)
	}
	result("completed once Redis was back; 1 run, 0 stalls")
}
