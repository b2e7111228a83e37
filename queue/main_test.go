package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/testkit/leaktest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

func TestMain(m *testing.M) {
	if proctest.Role() == "worker" {
		os.Exit(workerProcess())
	}
	leaktest.Main(m)
}

// workerProcess is a real worker process for crash tests. It prints "start <id> <epoch>" on stdout when a
// handler starts and "done <id> <epoch>" when one returns, and runs until SIGTERM (a graceful close) or
// SIGKILL. It talks to REDIS_URL, or to the Redis Cluster at WORKER_CLUSTER (comma-separated addresses).
// WORKER_HANDLER says what handlers do: "block" waits for their context, "linger" waits for it and then takes
// WORKER_SLEEP to return (setting returned:<queue>:<id> in Redis as it does), "sleep" sleeps WORKER_SLEEP
// ignoring the context, "hog" spends WORKER_SLEEP in BLPOP calls on the caller's own Redis client (as a handler
// that waits on a list would, holding a pooled connection each), "ok" returns at once. A job whose payload is
// "fail" then fails, so that a test can see both outcomes recorded. WORKER_REPLICAS sets Options.Replicas.
func workerProcess() int {
	env := func(k string, d time.Duration) time.Duration {
		if v, err := time.ParseDuration(os.Getenv(k)); err == nil {
			return v
		}
		return d
	}
	opts, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	opts.MaxRetries = -1 // report errors at once: the worker's own loops retry with backoff
	var rdb redis.UniversalClient = redis.NewClient(opts)
	if addrs := os.Getenv("WORKER_CLUSTER"); addrs != "" {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ","), MaxRetries: -1})
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	replicas, _ := strconv.Atoi(os.Getenv("WORKER_REPLICAS"))
	q, err := New(rdb, os.Getenv("WORKER_QUEUE"), &Options{Logger: log, Replicas: replicas})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	mode := os.Getenv("WORKER_HANDLER")
	h := HandlerFunc(func(ctx context.Context, job *Job) error {
		fmt.Printf("start %s %d\n", job.ID, job.Epoch)
		defer fmt.Printf("done %s %d\n", job.ID, job.Epoch)
		switch mode {
		case "block":
			<-ctx.Done()
			return context.Cause(ctx)
		case "linger":
			// Stops when told, after WORKER_SLEEP of cleanup, and says so in Redis as it returns.
			<-ctx.Done()
			time.Sleep(env("WORKER_SLEEP", time.Second))
			if err := rdb.Set(context.Background(), "returned:"+q.name+":"+job.ID, job.Epoch, time.Hour).Err(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
			return context.Cause(ctx)
		case "sleep":
			time.Sleep(env("WORKER_SLEEP", time.Second))
		case "hog":
			for end := time.Now().Add(env("WORKER_SLEEP", time.Second)); time.Now().Before(end); {
				_ = rdb.BLPop(context.Background(), time.Second, "hog:"+job.ID).Err()
			}
		}
		if string(job.Payload) == "fail" {
			return errors.New("the job asked to fail")
		}
		return nil
	})
	conc, _ := strconv.Atoi(os.Getenv("WORKER_CONCURRENCY"))
	w, err := NewWorker(q, h, &WorkerConfig{
		Concurrency:       conc,
		LeaseTTL:          env("WORKER_LEASE_TTL", 0),
		HeartbeatInterval: env("WORKER_HEARTBEAT", 0),
		SweepInterval:     env("WORKER_SWEEP_INTERVAL", 0),
		ReconnectGrace:    env("WORKER_RECONNECT_GRACE", 0),
		DrainTimeout:      env("WORKER_DRAIN", 0),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fmt.Printf("ready %s\n", w.ID())
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("closed")
	return 0
}

// newQueue returns a queue of the test's own, destroyed when the test ends.
func newQueue(t *testing.T, opts *Options) (*Queue, *redis.Client) {
	t.Helper()
	rdb := testenv.Redis(t)
	q, err := New(rdb, testenv.Name(t, "q"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Destroy(context.Background()); err != nil {
			t.Errorf("destroy queue: %v", err)
		}
	})
	return q, rdb
}

// runWorker runs a worker until the test ends, and checks that it closes cleanly.
func runWorker(t *testing.T, q *Queue, h Handler, cfg *WorkerConfig) *Worker {
	t.Helper()
	w, err := NewWorker(q, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not close within 30s")
		}
	})
	return w
}

func mustEnqueue(t *testing.T, q *Queue, nj NewJob) *EnqueueResult {
	t.Helper()
	res, err := q.Enqueue(context.Background(), nj)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func mustJob(t *testing.T, q *Queue, id string) *Job {
	t.Helper()
	j, err := q.Job(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// waitState waits until the job is in state s and returns it.
func waitState(t *testing.T, q *Queue, id string, s JobState, d time.Duration) *Job {
	t.Helper()
	var j *Job
	testenv.Eventually(t, d, fmt.Sprintf("job %s never reached state %s (last: %+v)", id, s, j), func() bool {
		var err error
		j, err = q.Job(context.Background(), id)
		return err == nil && j.State == s
	})
	return j
}

// completeAs runs the complete script as a worker holding epoch would, bypassing any Worker.
func completeAs(t *testing.T, q *Queue, id string, epoch int64) bool {
	t.Helper()
	k := q.keys
	res, err := completeScript.Run(context.Background(), q.rdb,
		[]string{k.jobs, k.payloads, k.leases, k.owned, k.done, k.seen, k.epochFloor}, 10, 60_000, q.dedupWindowMs(),
		id, epoch).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	return res[0] == 1
}

// leaseAs leases up to n jobs to a made-up worker that will never heartbeat nor register a connection.
func leaseAs(t *testing.T, q *Queue, wid string, n int, leaseTTL time.Duration) []*Job {
	t.Helper()
	w := &Worker{q: q, id: wid, rdb: q.rdb, cfg: WorkerConfig{LeaseTTL: leaseTTL}}
	leases, _, _, _, err := w.lease(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	jobs := make([]*Job, len(leases))
	for i, l := range leases {
		if jobs[i], err = decodeJob(l.record, []byte(l.payload)); err != nil {
			t.Fatal(err)
		}
		if jobs[i].ID != l.id || jobs[i].Epoch != l.epoch {
			t.Fatalf("the lease answered %s at epoch %d beside the record of %s at epoch %d", l.id, l.epoch,
				jobs[i].ID, jobs[i].Epoch)
		}
	}
	return jobs
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

// sweepNow runs one sweep at once, whatever the guard says.
func sweepNow(t *testing.T, q *Queue) {
	t.Helper()
	q.rdb.Del(context.Background(), q.keys.sweepGuard)
	if _, err := testSweep(q, time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

// testSweep runs a sweep as a worker with default settings would, with the guard given, over the test's own
// client: connection checks included.
func testSweep(q *Queue, guard time.Duration) (SweepResult, error) {
	w := &Worker{cfg: (*WorkerConfig)(nil).WithDefaults()}
	s := w.sweepSettings()
	s.guard = guard
	return q.sweep(context.Background(), q.rdb.(*redis.Client), s, nil)
}

// primeSweeper makes the queue's sweeper state that of a queue swept a moment ago, so that a test's first sweep
// is not held back as the first sweep of a new queue is.
func primeSweeper(t *testing.T, q *Queue) {
	t.Helper()
	if _, err := testSweep(q, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := q.rdb.HDel(context.Background(), q.keys.sweeper, "hold_until").Err(); err != nil {
		t.Fatal(err)
	}
}
