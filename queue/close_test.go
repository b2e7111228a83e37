package queue

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// A graceful close is bounded by DrainTimeout even when Redis is gone: handlers that finish within the drain
// time and cannot record their outcome stop trying when it is up, and the jobs are not lost. Two ways Redis
// goes: killed (connections refused at once) and frozen (nothing answers, as on a partition or a hung host),
// where each recording attempt waits for a timeout; the frozen server is killed afterwards, so what it was
// sent while frozen is never applied. Before the close was bounded, the frozen case took over half a minute
// (five attempts at a complete or a fail, each waiting out its read timeout).
func TestGracefulCloseIsBoundedWhenRedisIsGone(t *testing.T) {
	t.Parallel()
	for _, gone := range []string{"killed", "frozen"} {
		t.Run(gone, func(t *testing.T) {
			t.Parallel()
			result := reliability.Record(t, "Queue",
				"Redis "+gone+" while a SIGTERMed worker's handlers finish within the drain time",
				"The worker exits within DrainTimeout + the hand back's 5 s; after Redis is back, both jobs run again and complete")
			// appendfsync always: the leases survive the kill, so the restart shows what recovery does with them.
			srv := redistest.Start(t, redistest.WithDebugCommand(), redistest.WithArgs("--appendfsync", "always"))
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			q, err := New(rdb, testenv.Name(t, "q"), nil)
			if err != nil {
				t.Fatal(err)
			}
			const drain = 3 * time.Second
			w := proctest.ReExec(t, "worker", "WORKER_QUEUE="+q.name, "REDIS_URL="+srv.URL(),
				"WORKER_HANDLER=sleep", "WORKER_SLEEP=1500ms", "WORKER_DRAIN="+drain.String())
			w.WaitLine("ready ", 10*time.Second)
			mustEnqueue(t, q, NewJob{ID: "completes"})
			mustEnqueue(t, q, NewJob{ID: "fails", Payload: []byte("fail")})
			waitLines(t, w, "start ", "start completes 1", "start fails 1")

			// The handlers finish 1.5 s after they started, within the drain time, with Redis gone.
			if gone == "killed" {
				srv.Kill()
			} else {
				srv.Stall(10 * time.Minute)
			}
			w.Signal(syscall.SIGTERM)
			signalled := time.Now()
			waitLines(t, w, "done ", "done completes 1", "done fails 1")
			// The bound is DrainTimeout plus the hand back's 5 s; 5 s more of slack for a loaded machine. What
			// this guards against took a minute.
			bound := drain + handBackTimeout + 5*time.Second
			if err := w.Wait(bound); err != nil {
				t.Fatalf("worker exited with %v", err)
			}
			took := time.Since(signalled)
			t.Logf("Redis %s: the worker exited %v after SIGTERM (drain %v)", gone, took.Round(time.Millisecond), drain)
			if took > bound {
				t.Fatalf("close took %v, want at most %v", took, bound)
			}

			if gone == "frozen" {
				srv.Kill()
			}
			srv.Start()
			// The closing worker could record nothing: both jobs are still leased under epoch 1, to a worker
			// that is gone, and come back.
			s := newStarted()
			runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error { s.record(j); return nil }), nil)
			for _, id := range []string{"completes", "fails"} {
				j := waitState(t, q, id, StateCompleted, 60*time.Second)
				if j.Epoch != 2 || j.Failures != 0 || s.count(id) != 1 {
					t.Errorf("%s: %+v, run %d times here; want completed by epoch 2, no failure recorded",
						id, j, s.count(id))
				}
			}
			result(fmt.Sprintf("exited %v after SIGTERM (drain %v); both jobs ran again and completed",
				took.Round(100*time.Millisecond), drain))
		})
	}
}

// waitLines waits for the lines want, all starting with prefix, in any order: handlers run concurrently.
func waitLines(t *testing.T, p *proctest.Proc, prefix string, want ...string) {
	t.Helper()
	got := map[string]bool{}
	for range want {
		got[p.WaitLine(prefix, 10*time.Second)] = true
	}
	for _, l := range want {
		if !got[l] {
			t.Fatalf("got lines %v, want %v", got, want)
		}
	}
}

// A close hands a job back only once its handler returned, so that the job never starts on another worker
// while it still runs here. Handed back first and cancelled after, a handler that stopped at once overlapped
// the next run by 41 ms, and one with cleanup to do (a call to finish, a file to close) by all of it.
func TestGracefulCloseHandsAJobBackOnlyAfterItsHandlerReturned(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue",
		"A SIGTERMed worker's handler outlives the drain and takes 400 ms to stop once cancelled; another worker waits",
		"The job is handed back only once the handler returned: the other worker's run starts after it, with no attempt or stall counted")
	q, rdb := newQueue(t, nil)
	const cleanup = 400 * time.Millisecond
	w := proctest.ReExec(t, "worker", "WORKER_QUEUE="+q.name, "REDIS_URL="+testenv.RedisURL(),
		"WORKER_HANDLER=linger", "WORKER_SLEEP="+cleanup.String(), "WORKER_DRAIN=500ms")
	w.WaitLine("ready ", 10*time.Second)
	mustEnqueue(t, q, NewJob{ID: "j"})
	w.WaitLine("start j 1", 10*time.Second)

	// Another worker waits for the job, and notes whether the first run had returned when it got it.
	next := make(chan string, 1)
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error {
		returned, err := rdb.Get(ctx, "returned:"+q.name+":"+j.ID).Result()
		if err == redis.Nil {
			returned = "not yet"
		}
		select {
		case next <- fmt.Sprintf("epoch %d; the first run returned: %s", j.Epoch, returned):
		default:
		}
		return nil
	}), nil)
	t.Cleanup(func() { rdb.Del(context.Background(), "returned:"+q.name+":j") })
	w.Signal(syscall.SIGTERM)
	select {
	case got := <-next:
		if got != "epoch 2; the first run returned: 1" {
			t.Fatalf("the job ran again with %s", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not run again within 30 s of the close")
	}
	if err := w.Wait(20 * time.Second); err != nil {
		t.Fatalf("worker exited with %v", err)
	}
	j := waitState(t, q, "j", StateCompleted, 10*time.Second)
	if j.Failures != 0 || j.Stalls != 0 {
		t.Errorf("a job handed back at close counted %d failures, %d stalls", j.Failures, j.Stalls)
	}
	result("the next run (epoch 2) started after the first had returned; no failure, no stall")
}

// An outside tester's finding: jobs leased to a worker whose lease answers were lost (a dropped connection)
// stayed active after its graceful close, never run, until their lease ran out, and then counted a stall each.
// A worker that leaves has no lease call out: its close hands them back with the rest, uncounted.
func TestGracefulCloseHandsBackLeasesWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	// Its one slot held by a job that runs until the close: no lease call of its own is out or answered
	// between the lost one and the close, so only the close can tell the lease lost. (A ghost made due from
	// the delayed set while the worker idled could wake it to lease the ghost itself, first.)
	w, err := NewWorker(q, HandlerFunc(func(ctx context.Context, j *Job) error {
		<-ctx.Done()
		return ctx.Err()
	}), &WorkerConfig{Concurrency: 1, DrainTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	mustEnqueue(t, q, NewJob{ID: "busy"})
	testenv.Eventually(t, 10*time.Second, "the worker runs the job that holds its slot", func() bool {
		return mustJob(t, q, "busy").State == StateActive
	})
	// Leased to the running worker's ID without its knowing: what a lease whose answer was lost leaves.
	mustEnqueue(t, q, NewJob{ID: "ghost"})
	if got := leaseAs(t, q, w.ID(), 1, time.Hour); len(got) != 1 || got[0].ID != "ghost" {
		t.Fatalf("leased %v", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if j := mustJob(t, q, "ghost"); j.State != StateReady || j.Stalls != 0 {
		t.Fatalf("after the close: %+v; want ready, with no stall", j)
	}
}
