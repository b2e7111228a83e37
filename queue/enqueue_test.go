package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
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
