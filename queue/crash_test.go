package queue

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// startWorkerProcess starts a real worker process on q (see workerProcess) and waits until it runs.
func startWorkerProcess(t *testing.T, q *Queue, env ...string) *proctest.Proc {
	t.Helper()
	p := proctest.ReExec(t, "worker", append([]string{"WORKER_QUEUE=" + q.name}, env...)...)
	p.WaitLine("ready ", 10*time.Second)
	return p
}

// started records, for an in-process worker, when each job's handler started and with which epoch.
type started struct {
	mu   sync.Mutex
	runs map[string][]*Job
	at   chan time.Time
}

func newStarted() *started { return &started{runs: map[string][]*Job{}, at: make(chan time.Time, 100)} }

func (s *started) record(j *Job) {
	s.mu.Lock()
	s.runs[j.ID] = append(s.runs[j.ID], j)
	s.mu.Unlock()
	s.at <- time.Now()
}

func (s *started) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs[id])
}

// A SIGKILLed worker's job goes to another worker within a second with the default settings, although its
// lease still has most of a minute to run: its liveness connection closed with it, and detection does not
// wait for the lease. The killed worker's epoch can then neither complete, fail nor extend the job.
func TestKilledWorkersJobIsBackWithinASecond(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Worker process SIGKILLed holding a job (defaults; lease TTL 60 s)", "Another worker runs the job within a second (its connection closed); the dead epoch can neither complete, fail nor extend it")
	q, _ := newQueue(t, nil)
	a := startWorkerProcess(t, q, "WORKER_HANDLER=block", "WORKER_LEASE_TTL=60s")
	mustEnqueue(t, q, NewJob{ID: "signup:user_6"})
	a.WaitLine("start signup:user_6 1", 10*time.Second)
	a.Kill()
	killed := time.Now()

	s := newStarted()
	release := make(chan struct{})
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error {
		s.record(j)
		<-release
		return nil
	}), &WorkerConfig{LeaseTTL: 60 * time.Second})
	bound := 2 * time.Second // the goal is 1 s (see scripts/bench queue); slack for a loaded 2-core machine
	select {
	case at := <-s.at:
		t.Logf("job of the SIGKILLed worker ran again %v after the kill (sweep every %v, reconnect grace %v, lease TTL 60s)",
			at.Sub(killed).Round(time.Millisecond), DefaultSweepInterval, DefaultReconnectGrace)
		result(fmt.Sprintf("re-run %v after the kill", at.Sub(killed).Round(10*time.Millisecond)))
		if at.Sub(killed) > bound {
			t.Errorf("recovery took %v, want under %v", at.Sub(killed), bound)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the killed worker's job was not leased again within 30s")
	}
	j := mustJob(t, q, "signup:user_6")
	if j.Epoch != 2 || j.Stalls != 1 || j.Failures != 0 || !strings.Contains(j.LastStall, "connection closed") {
		t.Fatalf("re-leased job = %+v; want epoch 2, one stall, no failure", j)
	}

	// The dead worker's epoch is fenced off: nothing it could still send changes the job.
	if completeAs(t, q, j.ID, 1) {
		t.Fatal("epoch 1 completed a job leased under epoch 2")
	}
	k := q.keys
	out, err := failScript.Run(context.Background(), q.rdb,
		[]string{k.jobs, k.leases, k.owned, k.ready, k.delayed, k.dead, k.marker},
		j.ID, 1, "stale", "1", 0).Slice()
	if err != nil || out[0] != "lost" {
		t.Fatalf("fail under epoch 1 = %v, %v; want lost", out, err)
	}
	lost, err := heartbeatScript.Run(context.Background(), q.rdb,
		[]string{k.jobs, k.leases, k.workers, k.owned, k.ready, k.marker, k.leaseSeq},
		j.Owner, 3000, 60000, 60000, j.ID, 1).StringSlice()
	if err != nil || len(lost) != 3 || lost[0] != "0" || lost[1] != j.ID || lost[2] != "1" {
		t.Fatalf("heartbeat under epoch 1 = %v, %v; want the lease reported lost", lost, err)
	}
	if got := mustJob(t, q, j.ID); got.State != StateActive || got.Epoch != 2 || got.Failures != 0 {
		t.Fatalf("stale calls changed the job: %+v", got)
	}
	close(release)
	waitState(t, q, j.ID, StateCompleted, 5*time.Second)
}

// A worker that is paused (SIGSTOP: a long GC pause, a frozen VM) past its lease loses its job to another
// worker; when it resumes, it learns of the loss and records nothing.
func TestPausedWorkerResumesWithoutTouchingItsLostJob(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Worker process SIGSTOPped past its lease, then SIGCONT", "Its job completes elsewhere under epoch 2; the resumed worker records nothing")
	result("lost its lease, recorded nothing")
	q, _ := newQueue(t, nil)
	a := startWorkerProcess(t, q, "WORKER_HANDLER=sleep", "WORKER_SLEEP=1500ms", "WORKER_LEASE_TTL=600ms",
		"WORKER_HEARTBEAT=100ms")
	mustEnqueue(t, q, NewJob{ID: "job"})
	a.WaitLine("start job 1", 10*time.Second)
	a.Signal(syscall.SIGSTOP)

	s := newStarted()
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error { s.record(j); return nil }),
		nil)
	j := waitState(t, q, "job", StateCompleted, 15*time.Second)
	a.Signal(syscall.SIGCONT)
	a.WaitLine("done job 1", 10*time.Second)
	testenv.Eventually(t, 5*time.Second, "the resumed worker logs that its lease was lost", func() bool {
		l := a.Log()
		return strings.Contains(l, "lease lost") || strings.Contains(l, "handler stopped") ||
			strings.Contains(l, "after its lease was lost")
	})
	if got := mustJob(t, q, "job"); got.Epoch != 2 || got.State != StateCompleted || got.Failures != 0 ||
		!got.FinishedAt.Equal(j.FinishedAt) {
		t.Fatalf("after the paused worker resumed: %+v, want the epoch-2 completion untouched", got)
	}
	if s.count("job") != 1 {
		t.Fatalf("second worker ran the job %d times", s.count("job"))
	}
}

// A live worker's slow job keeps its lease however long it runs, while other workers sweep all along.
func TestSlowJobOfLiveWorkerIsNeverReclaimed(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "A job running 10x its lease TTL while sweeps run every 20 ms", "Never reclaimed: one run, epoch 1, no stall")
	result("one run, epoch 1, 0 stalls")
	q, _ := newQueue(t, nil)
	cfg := &WorkerConfig{LeaseTTL: 300 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond,
		SweepInterval: 50 * time.Millisecond}
	var runs atomic.Int32
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error {
		runs.Add(1)
		select {
		case <-time.After(10 * cfg.LeaseTTL):
			return nil
		case <-ctx.Done():
			return fmt.Errorf("cancelled: %w", context.Cause(ctx))
		}
	}), cfg)
	// Sweeps beside the worker's own, as other worker processes would run them, every 20ms.
	stop := make(chan struct{})
	var sweeps atomic.Int32
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if res, err := testSweep(q, 10*time.Millisecond); err == nil && res.Ran {
				sweeps.Add(1)
			}
		}
	})
	mustEnqueue(t, q, NewJob{ID: "slow"})
	j := waitState(t, q, "slow", StateCompleted, 15*time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d sweeps ran while the job held its lease for %v", sweeps.Load(), j.FinishedAt.Sub(j.LeasedAt))
	if runs.Load() != 1 || j.Epoch != 1 || j.Stalls != 0 {
		t.Fatalf("slow job ran %d times, ended %+v; want one run, epoch 1, no stall", runs.Load(), j)
	}
	if d := j.FinishedAt.Sub(j.LeasedAt); d < 10*cfg.LeaseTTL {
		t.Fatalf("job finished %v after its lease, want at least %v", d, 10*cfg.LeaseTTL)
	}
}

// Four workers sweeping at the same moment reclaim each expired job once: the guard lets one sweep run, and a
// sweep that runs anyway (the guard expired) finds nothing left to reclaim.
func TestConcurrentSweepsReclaimEachJobOnce(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Four sweepers at once over 200 expired leases", "Each job reclaimed once; one of four simultaneous sweeps passes the guard")
	result("200 reclaims for 200 jobs")
	q, rdb := newQueue(t, nil)
	const n = 200
	for i := range n {
		mustEnqueue(t, q, NewJob{ID: fmt.Sprint(i)})
	}
	primeSweeper(t, q)
	if got := len(leaseAs(t, q, "deadbeefdeadbeef", n, time.Millisecond)); got != n {
		t.Fatalf("leased %d", got)
	}
	time.Sleep(20 * time.Millisecond) // the made-up worker's leases run out

	var ran, reclaimed atomic.Int32
	var wg sync.WaitGroup
	startLine := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			<-startLine
			for range 5 { // several rounds: later ones pass the expired guard and must find nothing
				res, err := testSweep(q, 5*time.Millisecond)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Ran {
					ran.Add(1)
				}
				reclaimed.Add(int32(res.Reclaimed))
				time.Sleep(6 * time.Millisecond)
			}
		})
	}
	close(startLine)
	wg.Wait()
	if reclaimed.Load() != n {
		t.Fatalf("%d sweeps reclaimed %d jobs in all, want %d", ran.Load(), reclaimed.Load(), n)
	}
	t.Logf("%d of 20 sweep calls passed the guard; %d jobs reclaimed once each", ran.Load(), reclaimed.Load())
	ids := rdb.LRange(context.Background(), q.keys.ready, 0, -1).Val()
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("job %s is in the ready list twice", id)
		}
		seen[id] = true
	}
	if len(ids) != n {
		t.Fatalf("ready list holds %d jobs, want %d", len(ids), n)
	}
	for _, id := range []string{"0", fmt.Sprint(n - 1)} {
		if j := mustJob(t, q, id); j.Stalls != 1 || j.State != StateReady {
			t.Fatalf("job %s after the sweeps: %+v", id, j)
		}
	}

	// Four calls at one instant within one interval: exactly one passes the guard.
	ran.Store(0)
	rdb.Del(context.Background(), q.keys.sweepGuard)
	start := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			<-start
			if res, err := testSweep(q, time.Minute); err == nil && res.Ran {
				ran.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if ran.Load() != 1 {
		t.Fatalf("%d of 4 simultaneous sweeps ran, want 1", ran.Load())
	}
}

// A job that kills every worker it touches is dead after MaxStalls+1 crashes, with the reason recorded, and is
// not run a third time.
func TestJobThatKeepsKillingWorkersGoesDead(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Two worker processes SIGKILLed by the same job", "The job is dead after max stalls with the reason, and never runs again")
	q, _ := newQueue(t, nil)
	mustEnqueue(t, q, NewJob{ID: "poison"})
	env := []string{"WORKER_HANDLER=block"}
	for epoch := 1; epoch <= 2; epoch++ {
		p := startWorkerProcess(t, q, env...)
		p.WaitLine(fmt.Sprintf("start poison %d", epoch), 15*time.Second)
		p.Kill()
	}
	var runs atomic.Int32
	runWorker(t, q, HandlerFunc(func(context.Context, *Job) error { runs.Add(1); return nil }),
		&WorkerConfig{SweepInterval: 100 * time.Millisecond})
	j := waitState(t, q, "poison", StateDead, 15*time.Second)
	if j.Stalls != 2 || j.Failures != 0 ||
		!strings.HasPrefix(j.DeadReason, "stalled 2 times (max 1), last: worker ") ||
		!strings.HasSuffix(j.DeadReason, "lost: connection closed") {
		t.Fatalf("dead job = %+v", j)
	}
	time.Sleep(300 * time.Millisecond)
	if runs.Load() != 0 {
		t.Fatal("a dead job ran again")
	}
	if dead, _ := q.DeadJobs(context.Background(), 0, 10); len(dead) != 1 || dead[0].ID != "poison" {
		t.Fatalf("dead letters = %v", ids(dead))
	}
	reason, _, _ := strings.Cut(j.DeadReason, ", last:")
	result(fmt.Sprintf("dead: %s; %d runs after", reason, runs.Load()))
}

// An outside tester's finding: a job buried by a stall kept the stall before as its last one (`oncegate job
// show` named the first worker lost, the dead reason the second).
func TestTheLastStallIsTheOneThatBuriedTheJob(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	mustEnqueue(t, q, NewJob{ID: "z", MaxStalls: -1})
	primeSweeper(t, q)
	leaseAs(t, q, "cccccccccccccccc", 1, 20*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	sweepNow(t, q)
	j := waitState(t, q, "z", StateDead, 5*time.Second)
	if j.LastStall == "" || !strings.HasSuffix(j.DeadReason, "last: "+j.LastStall) {
		t.Fatalf("dead reason %q, last stall %q: want the stall that buried it in both", j.DeadReason, j.LastStall)
	}
}

// SIGTERM closes a worker gracefully: finished handlers complete, and a job still running when the drain time
// is up is back in ready the moment the process exits, with no attempt or stall counted.
func TestGracefulCloseHandsUnfinishedJobsBackAtOnce(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "SIGTERM while a job runs past the drain timeout", "The job is ready the moment the process exits; no attempt or stall counted")
	result("ready at exit, 0 failures, 0 stalls")
	q, _ := newQueue(t, nil)
	a := startWorkerProcess(t, q, "WORKER_HANDLER=block", "WORKER_DRAIN=300ms", "WORKER_LEASE_TTL=60s")
	mustEnqueue(t, q, NewJob{ID: "long"})
	a.WaitLine("start long 1", 10*time.Second)
	a.Signal(syscall.SIGTERM)
	a.WaitLine("closed", 10*time.Second)
	if err := a.Wait(5 * time.Second); err != nil {
		t.Fatalf("worker exited with %v", err)
	}
	j := mustJob(t, q, "long")
	if j.State != StateReady || j.Stalls != 0 || j.Failures != 0 || j.Owner != "" {
		t.Fatalf("after a graceful close the job is %+v; want ready with nothing counted", j)
	}
	if s, _ := q.Stats(context.Background()); s.Workers != 0 {
		t.Fatalf("closed worker still counted alive: %+v", s)
	}
	s := newStarted()
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error { s.record(j); return nil }), nil)
	waitState(t, q, "long", StateCompleted, 5*time.Second)
}

// A graceful close lets handlers that finish within the drain time complete normally.
func TestGracefulCloseLetsRunningHandlersFinish(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	a := startWorkerProcess(t, q, "WORKER_HANDLER=sleep", "WORKER_SLEEP=500ms", "WORKER_DRAIN=10s")
	mustEnqueue(t, q, NewJob{ID: "short"})
	a.WaitLine("start short 1", 10*time.Second)
	a.Signal(syscall.SIGTERM)
	a.WaitLine("closed", 10*time.Second)
	if j := mustJob(t, q, "short"); j.State != StateCompleted || j.Epoch != 1 {
		t.Fatalf("job after close = %+v; want completed by the closing worker", j)
	}
}

// A job taken back from a dead worker goes to the head of the ready list: it had waited longest and was
// already running, so a crash does not send it behind the backlog that arrived meanwhile.
func TestReclaimedJobRunsBeforeTheBacklog(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	a := startWorkerProcess(t, q, "WORKER_HANDLER=block", "WORKER_CONCURRENCY=1")
	mustEnqueue(t, q, NewJob{ID: "crashed"})
	a.WaitLine("start crashed 1", 10*time.Second)
	for i := range 5 {
		mustEnqueue(t, q, NewJob{ID: fmt.Sprint("backlog-", i)})
	}
	a.Kill()
	testenv.Eventually(t, 10*time.Second, "the crashed job was not taken back", func() bool {
		sweepNow(t, q) // no other worker runs yet: it would take the backlog
		return mustJob(t, q, "crashed").State == StateReady
	})
	order := make(chan string, 6)
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error { order <- j.ID; return nil }),
		&WorkerConfig{Concurrency: 1})
	if first := <-order; first != "crashed" {
		t.Fatalf("first job run after the crash: %s, want the reclaimed one", first)
	}
}
