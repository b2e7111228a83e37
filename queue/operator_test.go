package queue

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// A paused queue leases nothing, to any worker, until it is resumed; enqueues go on meanwhile.
func TestPausedQueueLeasesNothingUntilResumed(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	ctx := context.Background()
	if err := q.Pause(ctx, "incident 42"); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, q, NewJob{ID: "a"})
	mustEnqueue(t, q, NewJob{ID: "b"})
	if got := leaseAs(t, q, "w1", 10, time.Minute); len(got) != 0 {
		t.Fatalf("a paused queue leased %v", ids(got))
	}
	paused, reason, err := q.Paused(ctx)
	if err != nil || !paused || reason != "incident 42" {
		t.Fatalf("Paused = %v %q %v", paused, reason, err)
	}
	if s, _ := q.Stats(ctx); s.Counts[StateReady] != 2 {
		t.Fatalf("ready while paused = %d, want 2", s.Counts[StateReady])
	}
	// A second pause leaves the first one's reason (an operator's "paused already", not an overwrite).
	if again, err := q.PauseOnce(ctx, "incident 43"); err != nil || again {
		t.Fatalf("PauseOnce of a paused queue = %v %v", again, err)
	}
	if _, reason, _ := q.Paused(ctx); reason != "incident 42" {
		t.Fatalf("the second pause overwrote the first's reason: %q", reason)
	}
	was, err := q.Resume(ctx)
	if err != nil || !was {
		t.Fatalf("Resume = %v %v", was, err)
	}
	if got := leaseAs(t, q, "w1", 10, time.Minute); !slices.Equal(ids(got), []string{"a", "b"}) {
		t.Fatalf("after resume leased %v", ids(got))
	}
}

// A worker that runs while its queue is paused runs nothing; resumed, it runs what waited, woken at once.
func TestWorkerHonoursPauseAndWakesOnResume(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	ctx := context.Background()
	if err := q.Pause(ctx, ""); err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 4)
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error { ran <- j.ID; return nil }),
		&WorkerConfig{IdleBlock: 30 * time.Second})
	mustEnqueue(t, q, NewJob{ID: "held"})
	// The enqueue rang the marker: the worker leased (nothing) and went back to wait. A lease call by hand
	// shows the pause holding at the script, whatever the worker's timing.
	if got := leaseAs(t, q, "probe", 10, time.Minute); len(got) != 0 {
		t.Fatalf("paused queue leased %v", ids(got))
	}
	if s, _ := q.Stats(ctx); s.Counts[StateReady] != 1 || s.Counts[StateActive] != 0 {
		t.Fatalf("paused: %v", s.Counts)
	}
	if _, err := q.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-ran:
		if id != "held" {
			t.Fatalf("ran %q", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not run the held job after resume (its IdleBlock is 30 s: resume must wake it)")
	}
}

// The registry lists every queue enqueued to or worked on, and Destroy takes the name out.
func TestRegistryListsQueues(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	reg := testenv.Name(t, "registry")
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), reg) })
	a, _ := New(rdb, testenv.Name(t, "qa"), &Options{Registry: reg})
	b, _ := New(rdb, testenv.Name(t, "qb"), &Options{Registry: reg})
	t.Cleanup(func() { _ = a.Destroy(ctx); _ = b.Destroy(ctx) })
	mustEnqueue(t, a, NewJob{})
	if _, err := b.EnqueueMany(ctx, []NewJob{{}, {}}); err != nil {
		t.Fatal(err)
	}
	got, err := Queues(ctx, rdb, reg)
	if want := []string{a.Name(), b.Name()}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("Queues = %v %v, want %v", got, err, want)
	}
	if err := a.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := Queues(ctx, rdb, reg); !slices.Equal(got, []string{b.Name()}) {
		t.Fatalf("after Destroy: %v", got)
	}
}

// Jobs lists each state; Workers shows a live worker and the job it holds.
func TestJobsByStateAndWorkers(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	ctx := context.Background()
	for _, id := range []string{"j1", "j2", "j3"} {
		mustEnqueue(t, q, NewJob{ID: id})
	}
	got, err := q.Jobs(ctx, StateReady, 1, 10)
	if err != nil || !slices.Equal(ids(got), []string{"j2", "j3"}) {
		t.Fatalf("ready from 1 = %v %v", ids(got), err)
	}
	started, release := make(chan string, 3), make(chan struct{})
	w := runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error {
		started <- j.ID
		<-release
		return nil
	}), &WorkerConfig{Concurrency: 1})
	defer close(release)
	held := <-started
	active, err := q.Jobs(ctx, StateActive, 0, 10)
	if err != nil || !slices.Equal(ids(active), []string{held}) {
		t.Fatalf("active = %v %v", ids(active), err)
	}
	if d, err := q.LeaseDeadline(ctx, held); err != nil || d.IsZero() {
		t.Fatalf("lease deadline = %v %v", d, err)
	}
	ws, err := q.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].ID != w.ID() || !ws[0].Alive || !slices.Equal(ws[0].Jobs, []string{held}) {
		t.Fatalf("workers = %+v %v", ws, err)
	}
}
