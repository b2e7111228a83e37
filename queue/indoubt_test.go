package queue

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// An outside tester's finding: lease answers lost in a Redis restart let a worker hold more than twice
// Concurrency leases, the jobs of the lost calls on top of those it went on to lease. The jobs a lost answer
// may have leased now count as held until a heartbeat hands them back; when they alone leave no room, a lease
// call for no job gets the heartbeat the lease call number it needs to do so.
func TestLeasesOfLostAnswersCountAsHeldUntilHandedBack(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t, redistest.WithDebugCommand())
	rdb := r.Client(t)
	q, err := New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 6 {
		mustEnqueue(t, q, NewJob{ID: fmt.Sprint(i)})
	}
	w, err := NewWorker(q, HandlerFunc(func(context.Context, *Job) error { return nil }), &WorkerConfig{Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	// A client that gives up on an answer after 100 ms: a lease call sent while Redis is frozen times out here,
	// and Redis runs it once it thaws.
	impatient := redis.NewClient(&redis.Options{Addr: r.Addr(), ReadTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer impatient.Close()
	held := func() int64 {
		n, err := rdb.ZLexCount(ctx, q.keys.owned, "["+w.id+":", "["+w.id+";").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Loaded beforehand: otherwise the frozen Redis runs an EVALSHA that fails for want of the script.
	if err := leaseScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	lose := func() {
		t.Helper()
		w.rdb = impatient
		if err := impatient.Ping(ctx).Err(); err != nil { // connected before the freeze, so the call goes out
			t.Fatal(err)
		}
		thawed := r.Stall(500 * time.Millisecond)
		free, _ := w.freeSlots()
		if _, _, _, _, err := w.lease(ctx, free); err == nil {
			t.Fatal("a lease call answered from a frozen Redis")
		}
		<-thawed
	}
	lose()
	if free, probe := w.freeSlots(); free != 2 || probe {
		// Concurrency 2, nothing running, 2 in doubt: 2 more may be leased, which makes twice Concurrency.
		t.Fatalf("after one lost answer: free %d, probe %v; want 2, false", free, probe)
	}
	lose()
	if n := held(); n != 4 {
		t.Fatalf("Redis holds %d leases of the worker after two lost answers of 2 jobs each; want 4", n)
	}
	free, probe := w.freeSlots()
	if free != 0 || !probe {
		t.Fatalf("with 4 leases in doubt: free %d, probe %v; want 0, true", free, probe)
	}
	w.rdb = rdb
	jobs, _, _, call, err := w.lease(ctx, max(free, 0))
	if err != nil || len(jobs) != 0 {
		t.Fatalf("the probe leased %d jobs, err %v; want none", len(jobs), err)
	}
	w.register(ctx, jobs, call)
	if free, probe := w.freeSlots(); free != 0 || probe {
		t.Fatalf("after the probe: free %d, probe %v; want 0, false until a heartbeat", free, probe)
	}
	live := &liveness{rdb: rdb, log: slog.New(slog.DiscardHandler)}
	if err := w.heartbeat(ctx, live); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 0 {
		t.Fatalf("Redis still holds %d leases of the worker after the heartbeat; want them handed back", n)
	}
	if free, probe := w.freeSlots(); free != 2 || probe {
		t.Fatalf("after the heartbeat: free %d, probe %v; want 2, false", free, probe)
	}
	select {
	case <-w.freed:
	default:
		t.Fatal("the heartbeat that handed the leases back did not wake the fetcher")
	}
	if s, err := q.Stats(ctx); err != nil || s.Counts[StateReady] != 6 {
		t.Fatalf("ready jobs after the hand back: %+v, %v; want all 6", s.Counts, err)
	}
}

// After a lease call whose answer was lost, the next asks for half as many jobs, down to one, and answered
// calls let the size grow back until it is no longer limited.
func TestALostLeaseAnswerHalvesTheNextCall(t *testing.T) {
	t.Parallel()
	var s leaseSize
	if n := s.of(8); n != 8 {
		t.Fatalf("unlimited: asked %d of 8 free", n)
	}
	var asked []int
	for range 5 {
		n := s.of(8)
		asked = append(asked, n)
		s.lost(n)
	}
	if fmt.Sprint(asked) != "[8 4 2 1 1]" {
		t.Fatalf("calls after lost answers asked for %v; want [8 4 2 1 1]", asked)
	}
	asked = asked[:0]
	for range 5 {
		s.answered(8)
		asked = append(asked, s.of(8))
	}
	if fmt.Sprint(asked) != "[2 4 8 8 8]" || s.limit != 0 {
		t.Fatalf("calls after answered ones asked for %v (limit %d); want [2 4 8 8 8], unlimited", asked, s.limit)
	}
}
