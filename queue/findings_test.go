package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
)

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
