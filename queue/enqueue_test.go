package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// completeAll runs a worker that completes every job, enqueues ids one at a time and waits for each to be
// done, so that completion order is enqueue order.
func completeAll(t *testing.T, q *Queue, ids ...string) {
	t.Helper()
	done := make(chan string, len(ids))
	w, err := NewWorker(q, HandlerFunc(func(ctx context.Context, j *Job) error { return nil }),
		&WorkerConfig{Concurrency: 1, OnJobDone: func(j *Job, outcome string, _ time.Duration) {
			done <- j.ID + " " + outcome
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("worker run: %v", err)
		}
	}()
	for _, id := range ids {
		if res := mustEnqueue(t, q, NewJob{ID: id, Payload: []byte("p-" + id)}); res.Duplicate {
			t.Fatalf("enqueue of %s was a duplicate of %+v", id, res.Job)
		}
		select {
		case got := <-done:
			if got != id+" completed" {
				t.Fatalf("job %s: %s", id, got)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("job %s never completed", id)
		}
	}
}

func numbered(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return ids
}

// assertCompletedDuplicate enqueues id again and expects a duplicate of a completed job that is no longer
// retained: state completed, a finish time, and no payload, since none is kept.
func assertCompletedDuplicate(t *testing.T, q *Queue, id string, finishedAfter time.Time) {
	t.Helper()
	res := mustEnqueue(t, q, NewJob{ID: id, Payload: []byte("again")})
	if !res.Duplicate || res.Job.ID != id || res.Job.State != StateCompleted {
		t.Fatalf("re-enqueue of forgotten completed job %s = %+v, job %+v; want a duplicate in state completed",
			id, res, res.Job)
	}
	// Redis's clock and ours may differ by a little; a second of slack still catches a zero or a garbage time.
	if f := res.Job.FinishedAt; f.Before(finishedAfter.Add(-time.Second)) || f.After(time.Now().Add(time.Second)) {
		t.Fatalf("duplicate's FinishedAt %v, want between %v and now", f, finishedAfter)
	}
	if res.Job.Payload != nil {
		t.Fatalf("duplicate of a forgotten job has payload %q", res.Job.Payload)
	}
	if _, err := q.Job(context.Background(), id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the duplicate enqueue created job %s: %v", id, err)
	}
}

// The retention count bounds the records kept, not how long a job ID deduplicates: at full speed 10,000
// completions take under a second.
func TestDedupWindowOutlivesRetentionCount(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, &Options{RetainCompleted: 5})
	start := time.Now()
	completeAll(t, q, "first")
	completeAll(t, q, numbered("later", 8)...)
	if _, err := q.Job(context.Background(), "first"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("job buried under 8 newer completions is still retained (%v); the test proves nothing", err)
	}
	assertCompletedDuplicate(t, q, "first", start)
	if n := rdb.LLen(context.Background(), q.keys.ready).Val(); n != 0 {
		t.Fatalf("ready list holds %d ids after a duplicate enqueue", n)
	}
}

func TestDedupWindowWithoutRetention(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, &Options{RetainCompleted: -1})
	start := time.Now()
	completeAll(t, q, "gone")
	assertCompletedDuplicate(t, q, "gone", start)
}

func TestIDCanBeEnqueuedAgainOnceTheWindowPassed(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, &Options{RetainCompleted: -1, DedupWindow: 300 * time.Millisecond})
	start := time.Now()
	completeAll(t, q, "x", "y")
	assertCompletedDuplicate(t, q, "x", start)
	time.Sleep(400 * time.Millisecond)
	// completeAll fails unless this enqueue adds a new job, which then runs and completes.
	completeAll(t, q, "x")
	// Completions forget IDs past the window, so the set stays as small as the window's traffic.
	ctx := context.Background()
	if ids := rdb.ZRange(ctx, q.keys.seen, 0, -1).Val(); len(ids) != 1 || ids[0] != "x" {
		t.Fatalf("seen set holds %v, want only x, completed again", ids)
	}
}

func TestNegativeDedupWindowTurnsItOff(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, &Options{RetainCompleted: -1, DedupWindow: -1})
	completeAll(t, q, "x")
	completeAll(t, q, "x") // fails if the second enqueue is a duplicate
	if n := rdb.Exists(context.Background(), q.keys.seen).Val(); n != 0 {
		t.Fatal("seen set written with the window off")
	}
}

// A dead job is not a completed one: it dedups while it is kept, and once purged its ID is free, whatever
// the window.
func TestPurgedDeadJobCanBeEnqueuedAgain(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, &Options{RetainCompleted: -1})
	ctx := context.Background()
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error {
		return Permanent(errors.New("no"))
	}), nil)
	mustEnqueue(t, q, NewJob{ID: "d"})
	waitState(t, q, "d", StateDead, 5*time.Second)
	if res := mustEnqueue(t, q, NewJob{ID: "d"}); !res.Duplicate || res.Job.State != StateDead {
		t.Fatalf("enqueue of a dead job's ID = %+v", res)
	}
	if n, err := q.PurgeDead(ctx, "d"); err != nil || n != 1 {
		t.Fatalf("purge = %d, %v", n, err)
	}
	if res := mustEnqueue(t, q, NewJob{ID: "d"}); res.Duplicate {
		t.Fatalf("enqueue after purge was a duplicate of %+v", res.Job)
	}
}

// An outside tester's finding (issue 14's adversary, on the queue): a job ID used again, after its dead job was
// purged or after the dedup window, started its epochs at 1 again. So (ID, epoch) named two runs: a worker
// paused past its lease, whose job was then purged and enqueued again, held epoch 1 of the new job too, and
// its late completion completed the new job; and the gateway, which keeps the highest epoch it saw per job,
// refused the new job's effects (409) until its epochs passed the old job's. A job's epochs now start above
// every epoch that a job of its queue has finished with.
func TestAnIDUsedAgainNeverReusesAnEpoch(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "A job ID enqueued again after its dead job was purged (its worker paused past the lease), and after a retried job completed and was forgotten",
		"The new job's epochs start above the old job's; the old run's late completion is refused")
	q, _ := newQueue(t, &Options{RetainCompleted: -1, DedupWindow: -1})
	ctx := context.Background()

	// Dead, purged, enqueued again.
	mustEnqueue(t, q, NewJob{ID: "x", MaxStalls: -1})
	primeSweeper(t, q)
	old := leaseAs(t, q, "aaaaaaaaaaaaaaaa", 1, 50*time.Millisecond)
	if len(old) != 1 || old[0].Epoch != 1 {
		t.Fatalf("first lease: %+v", old)
	}
	time.Sleep(100 * time.Millisecond)
	// Primed again first: a sweep that follows the last by more than a second (a CI run's busy machine took
	// that long between the two) is taken for one after an outage, which holds lease expiry off, and no
	// other sweep came to reclaim the job.
	primeSweeper(t, q)
	sweepNow(t, q)
	waitState(t, q, "x", StateDead, 5*time.Second)
	if n, err := q.PurgeDead(ctx, "x"); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	mustEnqueue(t, q, NewJob{ID: "x"})
	again := leaseAs(t, q, "bbbbbbbbbbbbbbbb", 1, time.Minute)
	if len(again) != 1 || again[0].Epoch <= old[0].Epoch {
		t.Fatalf("the job enqueued again under x was leased with epoch %d, after epoch %d of the purged one",
			again[0].Epoch, old[0].Epoch)
	}
	if completeAs(t, q, "x", old[0].Epoch) {
		t.Fatal("the purged job's stale run completed the new job under x")
	}
	if !completeAs(t, q, "x", again[0].Epoch) {
		t.Fatal("the new job's own run could not complete it")
	}

	// Retried, completed and forgotten (nothing retained, no dedup window), enqueued again.
	mustEnqueue(t, q, NewJob{ID: "y"})
	first := leaseAs(t, q, "aaaaaaaaaaaaaaaa", 1, time.Minute)
	k := q.keys
	if out, err := failScript.Run(ctx, q.rdb, []string{k.jobs, k.leases, k.owned, k.ready, k.delayed, k.dead, k.marker},
		"y", first[0].Epoch, "boom", "0", 0).Slice(); err != nil || out[0] != "retry" {
		t.Fatalf("fail = %v, %v", out, err)
	}
	second := leaseAs(t, q, "aaaaaaaaaaaaaaaa", 1, time.Minute)
	// Completed with nothing retained, as a worker of this queue does: the record goes at once.
	if res, err := completeScript.Run(ctx, q.rdb, []string{k.jobs, k.payloads, k.leases, k.owned, k.done, k.seen,
		k.epochFloor}, 0, 0, 0, "y", second[0].Epoch).Int64Slice(); err != nil || res[0] != 1 {
		t.Fatalf("complete y: %v, %v", res, err)
	}
	mustEnqueue(t, q, NewJob{ID: "y"})
	third := leaseAs(t, q, "bbbbbbbbbbbbbbbb", 1, time.Minute)
	if len(third) != 1 || third[0].Epoch <= second[0].Epoch {
		t.Fatalf("y enqueued again was leased with epoch %d, after epoch %d of the completed one", third[0].Epoch,
			second[0].Epoch)
	}
	result(fmt.Sprintf("purged x: epoch %d then %d, stale completion refused; completed y: epoch %d then %d",
		old[0].Epoch, again[0].Epoch, second[0].Epoch, third[0].Epoch))
}

// An outside tester's finding: a payload over what Redis takes (512 MiB) reached Redis, which closed the
// connection, and failed the whole batch that carried it: 898 of 900 other producers' enqueues failed with
// "connection reset by peer". Refused before it joins a batch, it fails alone and says why.
func TestAnOversizedPayloadFailsAloneWithAClearError(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input", "A job payload over 512 MiB enqueued while 200 other producers enqueue",
		"Refused before it reaches Redis, naming the job and the limit; every other enqueue succeeds")
	q, _ := newQueue(t, nil)
	ctx := context.Background()
	huge := make([]byte, MaxPayload+1) // never written: its pages are not touched
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			_, err := q.Enqueue(ctx, NewJob{ID: fmt.Sprintf("small-%d", i), Payload: []byte("{}")})
			errs <- err
		})
	}
	_, err := q.Enqueue(ctx, NewJob{ID: "huge", Payload: huge})
	wg.Wait()
	close(errs)
	if err == nil || !strings.Contains(err.Error(), "over") || !strings.Contains(err.Error(), `"huge"`) {
		t.Fatalf("an oversized payload: %v, want refused, naming the job and the limit", err)
	}
	for err := range errs {
		if err != nil {
			t.Fatalf("another producer's enqueue failed: %v", err)
		}
	}
	if _, err := q.Job(ctx, "huge"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the oversized job was stored: %v", err)
	}
	result("refused alone; 200 of 200 other enqueues succeeded")
}

// scriptHook counts the scripts a client runs and can step in before each.
type scriptHook struct {
	calls  atomic.Int32
	before func(ctx context.Context) error // nil: let the call through
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// EVALSHA only: a NOSCRIPT retry by EVAL is the same batch.
		if cmd.Name() == "evalsha" {
			h.calls.Add(1)
			if h.before != nil {
				if err := h.before(ctx); err != nil {
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}

// holdBatch makes q act as if a batch were in flight, so that Enqueue callers wait in line; release then
// tells the first of them to send, so that every caller waiting goes in one script call.
func holdBatch(t *testing.T, q *Queue) (waiting func() int, release func()) {
	t.Helper()
	q.mu.Lock()
	if q.sending > 0 {
		t.Fatal("a batch is in flight already")
	}
	q.sending = enqueueInFlight
	q.mu.Unlock()
	waiting = func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.pending)
	}
	release = func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		for range enqueueInFlight - 1 {
			q.sending-- // only one sender's place is given, so that every caller waiting goes in one batch
		}
		q.handOffLocked()
	}
	return waiting, release
}

// 200 callers, 50 IDs: each ID is added once, by exactly one caller, and the other three get a duplicate
// carrying the winner's payload; nobody gets another caller's result.
func TestConcurrentEnqueuesOfFiftyIDsMakeFiftyJobs(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	hook := &scriptHook{}
	rdb.AddHook(hook)
	// Every caller waits before the first batch goes, so that they meet in batches whatever the machine's
	// load: left to the scheduler, a CI run's busy machine once ran the 200 one after the other.
	waiting, release := holdBatch(t, q)
	const callers, distinct = 200, 50
	results := make([]*EnqueueResult, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			res, err := q.Enqueue(context.Background(), NewJob{ID: fmt.Sprintf("id-%d", i%distinct),
				Payload: []byte(fmt.Sprintf("caller-%d", i))})
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = res
		})
	}
	close(start)
	testenv.Eventually(t, 10*time.Second, "callers waiting", func() bool { return waiting() == callers })
	release()
	wg.Wait()
	if t.Failed() {
		return
	}
	winner := map[string]string{} // id -> payload of the caller that added it
	for i, res := range results {
		id := fmt.Sprintf("id-%d", i%distinct)
		if res.Job.ID != id {
			t.Fatalf("caller %d enqueued %s and got job %s", i, id, res.Job.ID)
		}
		if !res.Duplicate {
			if string(res.Job.Payload) != fmt.Sprintf("caller-%d", i) {
				t.Fatalf("caller %d added %s but got payload %q", i, id, res.Job.Payload)
			}
			if w, ok := winner[id]; ok {
				t.Fatalf("%s added twice, by %s and caller-%d", id, w, i)
			}
			winner[id] = string(res.Job.Payload)
		}
	}
	if len(winner) != distinct {
		t.Fatalf("%d IDs were added, want %d", len(winner), distinct)
	}
	for i, res := range results {
		if w := winner[res.Job.ID]; res.Duplicate && string(res.Job.Payload) != w {
			t.Fatalf("caller %d's duplicate of %s has payload %q, want the winner's %q", i, res.Job.ID,
				res.Job.Payload, w)
		}
	}
	ctx := context.Background()
	if n := rdb.HLen(ctx, q.keys.jobs).Val(); n != distinct {
		t.Fatalf("%d job records, want %d", n, distinct)
	}
	if n := rdb.LLen(ctx, q.keys.ready).Val(); n != distinct {
		t.Fatalf("ready list holds %d ids, want %d", n, distinct)
	}
	for id, p := range winner {
		if got := rdb.HGet(ctx, q.keys.payloads, id).Val(); got != p {
			t.Fatalf("stored payload of %s is %q, want the winner's %q", id, got, p)
		}
	}
	t.Logf("%d enqueues in %d script calls", callers, hook.calls.Load())
	if hook.calls.Load() >= callers {
		t.Fatalf("%d enqueues took %d script calls: nothing was batched", callers, hook.calls.Load())
	}
	assertIdle(t, q)
}

func TestGroupCommitHandsEachCallerItsOwnResult(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	const callers = 200
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			nj := NewJob{ID: fmt.Sprintf("job-%d", i), Kind: fmt.Sprintf("kind-%d", i),
				Payload: []byte(fmt.Sprintf("payload-%d", i)), MaxAttempts: i + 1}
			if i%3 == 0 {
				nj.Delay = time.Hour
			}
			res, err := q.Enqueue(context.Background(), nj)
			if err != nil {
				t.Error(err)
				return
			}
			j := res.Job
			want := StateReady
			if nj.Delay > 0 {
				want = StateDelayed
			}
			if res.Duplicate || j.ID != nj.ID || j.Kind != nj.Kind || string(j.Payload) != string(nj.Payload) ||
				j.MaxAttempts != nj.MaxAttempts || j.State != want || j.CreatedAt.IsZero() {
				t.Errorf("caller %d got %+v duplicate=%v", i, j, res.Duplicate)
			}
		})
	}
	wg.Wait()
	ctx := context.Background()
	if r, d := rdb.LLen(ctx, q.keys.ready).Val(), rdb.ZCard(ctx, q.keys.delayed).Val(); r+d != callers || d != 67 {
		t.Fatalf("%d ready and %d delayed, want %d and 67", r, d, callers-67)
	}
}

// Every caller waiting when a batch is sent goes in that one call, and a Redis error reaches all of them.
func TestRedisErrorFailsEveryCallerOfTheBatch(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	injected := errors.New("injected: redis refused the script")
	hook := &scriptHook{before: func(context.Context) error { return injected }}
	rdb.AddHook(hook)
	waiting, release := holdBatch(t, q)
	const callers = 20
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			_, err := q.Enqueue(context.Background(), NewJob{ID: fmt.Sprintf("job-%d", i)})
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", fmt.Sprintf("job-%d", i))) {
				err = fmt.Errorf("caller %d: error %v does not name its job", i, err)
			}
			errs <- err
		}()
	}
	testenv.Eventually(t, 5*time.Second, "callers waiting", func() bool { return waiting() == callers })
	release()
	for range callers {
		if err := <-errs; !errors.Is(err, injected) {
			t.Fatalf("caller got %v, want the injected error", err)
		}
	}
	if n := hook.calls.Load(); n != 1 {
		t.Fatalf("%d callers took %d script calls, want 1 batch", callers, n)
	}
	if n := rdb.HLen(context.Background(), q.keys.jobs).Val(); n != 0 {
		t.Fatalf("%d jobs stored", n)
	}
	// The failed batch handed on: a later enqueue goes through.
	hook.before = nil
	mustEnqueue(t, q, NewJob{ID: "after"})
}

func TestUnreachableRedisFailsEveryCaller(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	q, err := New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting, release := holdBatch(t, q)
	const callers = 20
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			_, err := q.Enqueue(context.Background(), NewJob{ID: fmt.Sprintf("job-%d", i)})
			errs <- err
		}()
	}
	testenv.Eventually(t, 5*time.Second, "callers waiting", func() bool { return waiting() == callers })
	release()
	for range callers {
		var op *net.OpError
		if err := <-errs; !errors.As(err, &op) || !strings.HasPrefix(err.Error(), "queue: enqueue ") {
			t.Fatalf("caller got %v, want a wrapped dial error", err)
		}
	}
}

// A caller whose context ends while it waits returns at once and its job is not sent; the batch's other
// callers are not affected. Repeated, so that the cancellation lands both before and after the caller is
// told to send.
func TestCancelledWaiterIsWithdrawn(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	ctx := context.Background()
	for round := range 20 {
		waiting, release := holdBatch(t, q)
		cctx, cancel := context.WithCancel(ctx)
		cancelled := make(chan error, 1)
		go func() {
			_, err := q.Enqueue(cctx, NewJob{ID: fmt.Sprintf("cancelled-%d", round)})
			cancelled <- err
		}()
		// The cancelled caller is first in line, so it is the one told to send.
		testenv.Eventually(t, 5*time.Second, "first caller waiting", func() bool { return waiting() == 1 })
		others := make(chan error, 3)
		for i := range 3 {
			go func() {
				_, err := q.Enqueue(ctx, NewJob{ID: fmt.Sprintf("kept-%d-%d", round, i)})
				others <- err
			}()
		}
		testenv.Eventually(t, 5*time.Second, "all callers waiting", func() bool { return waiting() == 4 })
		cancel()
		if round%2 == 0 {
			if err := <-cancelled; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled caller got %v", err)
			}
		}
		release()
		if round%2 == 1 {
			if err := <-cancelled; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled caller got %v", err)
			}
		}
		for range 3 {
			if err := <-others; err != nil {
				t.Fatalf("round %d: a caller sharing the batch failed: %v", round, err)
			}
		}
	}
	if n := rdb.HLen(ctx, q.keys.jobs).Val(); n != 60 {
		t.Fatalf("%d jobs stored, want the 60 kept ones", n)
	}
	assertIdle(t, q)
}

// The caller that sends a batch has its context cancelled mid-call: the others' jobs are stored all the same.
func TestSendersCancelDoesNotFailTheBatch(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	ctx := context.Background()
	lctx, cancelLeader := context.WithCancel(ctx)
	hook := &scriptHook{before: func(context.Context) error { cancelLeader(); return nil }}
	rdb.AddHook(hook)
	waiting, release := holdBatch(t, q)
	leader := make(chan error, 1)
	go func() {
		_, err := q.Enqueue(lctx, NewJob{ID: "leader"})
		leader <- err
	}()
	testenv.Eventually(t, 5*time.Second, "leader waiting", func() bool { return waiting() == 1 })
	others := make(chan error, 5)
	for i := range 5 {
		go func() {
			_, err := q.Enqueue(ctx, NewJob{ID: fmt.Sprintf("other-%d", i)})
			others <- err
		}()
	}
	testenv.Eventually(t, 5*time.Second, "callers waiting", func() bool { return waiting() == 6 })
	release()
	for range 5 {
		if err := <-others; err != nil {
			t.Fatalf("caller failed with the sender's cancellation: %v", err)
		}
	}
	// The sender's job went in its own batch, so it has a result to give.
	if err := <-leader; err != nil {
		t.Fatalf("sender: %v", err)
	}
	if n := rdb.HLen(ctx, q.keys.jobs).Val(); n != 6 || hook.calls.Load() != 1 {
		t.Fatalf("%d jobs in %d calls, want 6 in 1", n, hook.calls.Load())
	}
}

// A crowd larger than one batch is sent in batches of at most enqueueBatchMax.
func TestGroupCommitCapsTheBatch(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	hook := &scriptHook{}
	rdb.AddHook(hook)
	waiting, release := holdBatch(t, q)
	const callers = enqueueBatchMax + 100
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			if _, err := q.Enqueue(context.Background(), NewJob{ID: fmt.Sprint(i)}); err != nil {
				t.Error(err)
			}
		})
	}
	testenv.Eventually(t, 5*time.Second, "callers waiting", func() bool { return waiting() == callers })
	release()
	wg.Wait()
	if n, calls := rdb.HLen(context.Background(), q.keys.jobs).Val(), hook.calls.Load(); n != callers || calls != 2 {
		t.Fatalf("%d jobs in %d calls, want %d in 2", n, calls, callers)
	}
}

// Two batches return before the caller told to send the next one has run: each hands its place to a
// different caller. (Handing both to the same one blocked forever with the lock held.)
func TestTwoHandOffsPromoteTwoCallers(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	hook := &scriptHook{}
	rdb.AddHook(hook)
	q.mu.Lock()
	q.sending = enqueueInFlight
	q.mu.Unlock()
	waiting := func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.pending)
	}
	const callers = 3
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			_, err := q.Enqueue(context.Background(), NewJob{ID: fmt.Sprint(i)})
			errs <- err
		}()
	}
	testenv.Eventually(t, 5*time.Second, "callers waiting", func() bool { return waiting() == callers })
	handedOff := make(chan struct{})
	go func() {
		q.mu.Lock()
		for range enqueueInFlight {
			q.handOffLocked()
		}
		q.mu.Unlock()
		close(handedOff)
	}()
	select {
	case <-handedOff:
	case <-time.After(5 * time.Second):
		t.Fatal("hand-off blocked")
	}
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.HLen(context.Background(), q.keys.jobs).Val(); n != callers {
		t.Fatalf("%d jobs stored, want %d", n, callers)
	}
	t.Logf("%d callers in %d script calls", callers, hook.calls.Load())
	// Each place handed off came back when its batch returned: none was lost to a caller told twice.
	assertIdle(t, q)
}

// assertIdle checks that no batch is in flight and no caller waits.
func assertIdle(t *testing.T, q *Queue) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, "group commit idle", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.sending == 0 && len(q.pending) == 0
	})
}

// Many producers, some of them giving up after a few microseconds: every acknowledged job is stored, the
// ones given up on may or may not be, nobody hangs, and every sender's place comes back.
func TestGroupCommitUnderLoadWithCancellations(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	const producers, each = 50, 200
	var acked, gaveUp atomic.Int32
	var ackedIDs sync.Map
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("%d-%d", p, i)
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if i%5 == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%7)*20*time.Microsecond)
				}
				res, err := q.Enqueue(ctx, NewJob{ID: id})
				cancel()
				switch {
				case err == nil && res.Job.ID == id && !res.Duplicate:
					acked.Add(1)
					ackedIDs.Store(id, true)
				case errors.Is(err, context.DeadlineExceeded):
					gaveUp.Add(1)
				default:
					t.Errorf("enqueue %s: %+v, %v", id, res, err)
				}
			}
		})
	}
	wg.Wait()
	stored := rdb.HKeys(context.Background(), q.keys.jobs).Val()
	storedSet := map[string]bool{}
	for _, id := range stored {
		storedSet[id] = true
	}
	ackedIDs.Range(func(k, _ any) bool {
		if !storedSet[k.(string)] {
			t.Errorf("acknowledged job %s not stored", k)
		}
		return true
	})
	if int(acked.Load()+gaveUp.Load()) != producers*each || len(stored) < int(acked.Load()) ||
		len(stored) > producers*each {
		t.Fatalf("%d acknowledged, %d given up, %d stored", acked.Load(), gaveUp.Load(), len(stored))
	}
	t.Logf("%d acknowledged, %d given up (%d of those stored all the same)", acked.Load(), gaveUp.Load(),
		len(stored)-int(acked.Load()))
	assertIdle(t, q)
}

// A caller whose context ends while its batch is in flight returns at once; its job is stored all the same,
// which is why Enqueue's doc says a job may have been enqueued after an error.
func TestCallerCancelledInFlightReturnsAtOnce(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	ctx := context.Background()
	inCall, unblock := make(chan struct{}), make(chan struct{})
	rdb.AddHook(&scriptHook{before: func(context.Context) error {
		close(inCall)
		<-unblock
		return nil
	}})
	waiting, release := holdBatch(t, q)
	sender := make(chan error, 1)
	go func() {
		_, err := q.Enqueue(ctx, NewJob{ID: "sender"})
		sender <- err
	}()
	testenv.Eventually(t, 5*time.Second, "sender waiting", func() bool { return waiting() == 1 })
	cctx, cancel := context.WithCancel(ctx)
	rider := make(chan error, 1)
	go func() {
		_, err := q.Enqueue(cctx, NewJob{ID: "rider"})
		rider <- err
	}()
	testenv.Eventually(t, 5*time.Second, "rider waiting", func() bool { return waiting() == 2 })
	release()
	<-inCall
	cancel()
	select {
	case err := <-rider:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("rider got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled rider still waits for the batch")
	}
	close(unblock)
	if err := <-sender; err != nil {
		t.Fatal(err)
	}
	if _, err := q.Job(ctx, "rider"); err != nil {
		t.Fatalf("rider's job, sent before it gave up: %v", err)
	}
}

func TestEnqueueManyDeduplicatesWithinAndAgainstStoredJobs(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	ctx := context.Background()
	mustEnqueue(t, q, NewJob{ID: "old", Payload: []byte("old payload")})
	in := []NewJob{
		{ID: "a", Kind: "k", Payload: []byte("a1")},
		{ID: "b", Payload: []byte("b1"), Delay: time.Hour},
		{ID: "a", Payload: []byte("a2")},
		{ID: "old", Payload: []byte("new payload")},
		{Payload: []byte("anonymous")},
	}
	res, err := q.EnqueueMany(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if in[4].ID != "" {
		t.Fatal("EnqueueMany wrote into the caller's slice")
	}
	type want struct {
		id      string
		dup     bool
		state   JobState
		payload string
	}
	for i, w := range []want{{"a", false, StateReady, "a1"}, {"b", false, StateDelayed, "b1"},
		{"a", true, StateReady, "a1"}, {"old", true, StateReady, "old payload"}, {"", false, StateReady, "anonymous"}} {
		j := res[i].Job
		if (w.id != "" && j.ID != w.id) || (w.id == "" && len(j.ID) != 32) || res[i].Duplicate != w.dup ||
			j.State != w.state || string(j.Payload) != w.payload {
			t.Errorf("result %d = %+v duplicate=%v, want %+v", i, j, res[i].Duplicate, w)
		}
	}
	if ids := rdb.LRange(ctx, q.keys.ready, 0, -1).Val(); len(ids) != 3 || ids[0] != "old" || ids[1] != "a" ||
		ids[2] != res[4].Job.ID {
		t.Fatalf("ready list %v", ids)
	}
}

func TestEnqueueManySendsOneCallPerChunk(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	hook := &scriptHook{}
	rdb.AddHook(hook)
	in := make([]NewJob, 1200)
	for i := range in {
		in[i] = NewJob{ID: fmt.Sprint(i)}
	}
	res, err := q.EnqueueMany(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(in) || hook.calls.Load() != 3 {
		t.Fatalf("%d results in %d calls, want %d in 3", len(res), hook.calls.Load(), len(in))
	}
	ids := rdb.LRange(context.Background(), q.keys.ready, 0, -1).Val()
	for i, id := range ids {
		if id != fmt.Sprint(i) || res[i].Job.ID != id || res[i].Duplicate {
			t.Fatalf("ready[%d] = %s, result %+v", i, id, res[i])
		}
	}
	if len(ids) != len(in) {
		t.Fatalf("%d ready, want %d", len(ids), len(in))
	}
	if res, err := q.EnqueueMany(context.Background(), nil); res != nil || err != nil {
		t.Fatalf("empty EnqueueMany = %v, %v", res, err)
	}
}

func TestEnqueueManyRefusesAnInvalidJobBeforeSending(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	for _, bad := range []NewJob{{ID: strings.Repeat("x", 513)}, {ID: "late", Delay: -time.Second}} {
		res, err := q.EnqueueMany(context.Background(), []NewJob{{ID: "fine"}, bad})
		if err == nil || res != nil || !strings.Contains(err.Error(), "jobs[1], job 2 of 2") {
			t.Fatalf("EnqueueMany with %+v = %v, %v", bad, res, err)
		}
	}
	if n := rdb.Exists(context.Background(), q.keys.jobs).Val(); n != 0 {
		t.Fatal("a job was stored")
	}
}

func TestEnqueueManyReportsRedisErrors(t *testing.T) {
	t.Parallel()
	q, rdb := newQueue(t, nil)
	injected := errors.New("injected")
	var calls atomic.Int32
	rdb.AddHook(&scriptHook{before: func(context.Context) error {
		if calls.Add(1) == 2 {
			return injected
		}
		return nil
	}})
	in := make([]NewJob, 600)
	for i := range in {
		in[i] = NewJob{ID: fmt.Sprint(i)}
	}
	res, err := q.EnqueueMany(context.Background(), in)
	if !errors.Is(err, injected) || len(res) != enqueueBatchMax {
		t.Fatalf("EnqueueMany = %d results, %v; want the first chunk's %d and the error", len(res), err,
			enqueueBatchMax)
	}
}

func TestEnqueueManyStoresTheCallersTrace(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5},
		TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), parent)
	res, err := q.EnqueueMany(ctx, []NewJob{{ID: "a"}, {ID: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if j := mustJob(t, q, id); !strings.Contains(j.TraceContext["traceparent"], parent.TraceID().String()) {
			t.Fatalf("job %s stored trace %v", id, j.TraceContext)
		}
	}
	res[0].Job.TraceContext["x"] = "y"
	if _, shared := res[1].Job.TraceContext["x"]; shared {
		t.Fatal("results share one trace context map")
	}
}

func TestNewRecordEncodesAsJSONMarshal(t *testing.T) {
	t.Parallel()
	odd := []string{"", "plain:id_6", `quo"te`, `back\slash`, "<html>&", "tab\there", "nul\x00", "bad utf-8 \xff",
		"é", "line\u2028sep", strings.Repeat("x", 512)}
	for _, s := range odd {
		for _, r := range []record{
			{ID: s, Kind: s, MaxAttempts: 10, MaxStalls: 1},
			{ID: "id", MaxAttempts: 1, Trace: map[string]string{"traceparent": s, "baggage": "k=v", s: "x"}},
		} {
			want, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(appendNewRecord(nil, &r)) + "}"; got != string(want) {
				t.Errorf("record %+v:\n got %s\nwant %s", r, got, want)
			}
		}
	}
}

// An added job's result is built from what was sent, not read back: it must equal the job as stored.
func TestEnqueueResultIsTheStoredJob(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	ctx := context.Background()
	for _, nj := range []NewJob{
		{ID: "ready", Kind: "k", Payload: []byte("p"), MaxAttempts: 3, MaxStalls: -1},
		{ID: "later", Payload: []byte("p"), Delay: time.Minute},
	} {
		res := mustEnqueue(t, q, nj)
		stored, err := q.Job(ctx, nj.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprintf("%+v", *res.Job), fmt.Sprintf("%+v", *stored); got != want {
			t.Fatalf("enqueue returned\n%s\nstored\n%s", got, want)
		}
	}
}

// Runs count a job's leases from 1, whatever its epoch starts from: a job's first lease starts above the
// epochs of its queue's completed jobs, so an operator reading the epoch saw "@14" for a job that ran once.
func TestRunsCountLeasesFromOne(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	mustEnqueue(t, q, NewJob{ID: "a"})
	a := leaseAs(t, q, "cccccccccccccccc", 1, time.Minute)
	if len(a) != 1 || a[0].Runs != 1 || !completeAs(t, q, "a", a[0].Epoch) {
		t.Fatalf("a: %+v", a)
	}
	mustEnqueue(t, q, NewJob{ID: "b"})
	primeSweeper(t, q)
	b := leaseAs(t, q, "aaaaaaaaaaaaaaaa", 1, 50*time.Millisecond)
	if len(b) != 1 || b[0].Epoch <= a[0].Epoch || b[0].Runs != 1 {
		t.Fatalf("b's first lease: epoch %d (a's %d), runs %d", b[0].Epoch, a[0].Epoch, b[0].Runs)
	}
	time.Sleep(100 * time.Millisecond)
	sweepNow(t, q) // b's lease ran out: a stall, and b is ready again
	waitState(t, q, "b", StateReady, 5*time.Second)
	again := leaseAs(t, q, "bbbbbbbbbbbbbbbb", 1, time.Minute)
	if len(again) != 1 || again[0].Runs != 2 || mustJob(t, q, "b").Runs != 2 {
		t.Fatalf("b's second lease: %+v", again)
	}
}
