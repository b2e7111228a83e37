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
	// A short lease: a completion that could not reach Redis during the outage (its retries last about 3 s)
	// leaves its job leased, and the job runs again once that lease expires.
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
