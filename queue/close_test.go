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
