package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/providers"
)

// expire makes n delivered effects whose retention ran out an hour ago, keyed prefix0 … prefix(n-1).
func (f *fixture) expire(prefix string, n int) {
	f.t.Helper()
	for i := range n {
		f.create(fmt.Sprintf("%s%d", prefix, i), "old")
	}
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `DELETE FROM oncegate_outbox WHERE type = 'old'`); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE oncegate_effects SET status = $1, finished_at = now() - interval '2 hours'
		WHERE type = 'old'`, effect.StatusDelivered); err != nil {
		f.t.Fatal(err)
	}
}

// A purge skips the rows that another gateway's purge holds instead of queueing behind it, and deletes in
// batches no larger than PurgeBatchSize.
func TestPurgesDoNotQueueOnEachOther(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.expire("old", 35)
	d := f.dispatcher(Config{Types: []EffectType{{Name: "old", Provider: &scripted{}}}, Retention: time.Hour,
		PurgeBatchSize: 10})

	// Another gateway's purge, mid-batch: it holds five of the expired rows.
	ctx := context.Background()
	other, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, `SELECT id FROM oncegate_effects WHERE key IN ('old0', 'old1', 'old2', 'old3', 'old4')
		FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	// Had the purge waited for those locks, it would still be waiting when its context ran out.
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	n, err := d.Purge(pctx)
	if err != nil || n != 30 {
		t.Fatalf("purge beside another: %d deleted, err %v; want the 30 rows nobody held", n, err)
	}
	for _, b := range waitSignal(t, &d.signals.purgeBatch, 4, time.Second, "purge batches") {
		if b > 10 {
			t.Fatalf("a batch deleted %d effects, over the batch size of 10", b)
		}
	}
	if left := pgtest.Count(t, f.pool, "SELECT count(*) FROM oncegate_effects"); left != 5 {
		t.Fatalf("%d effects left, want the 5 held by the other purge", left)
	}
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Purge(pctx); err != nil || n != 5 {
		t.Fatalf("purge after the other let go: %d deleted, err %v", n, err)
	}
}

// The purge has a loop of its own: while a purge is running (held in its first batch), the dispatcher still
// claims and delivers.
func TestLongPurgeDoesNotHoldUpClaiming(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.expire("old", 3)
	p := &scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "fresh", Provider: p}}, Retention: time.Hour,
		PurgeInterval: 10 * time.Millisecond})
	d.signals.purgeHold = make(chan struct{})
	f.start(d)

	// The purge loop is inside Purge, held before its first batch, when the effect arrives.
	waitSignal(t, &d.signals.purgeHeld, 1, 10*time.Second, "purges held")
	f.create("new", "fresh")
	f.waitStatus("new", effect.StatusDelivered)
	if n := pgtest.Count(t, f.pool, "SELECT count(*) FROM oncegate_effects WHERE type = 'old'"); n != 3 {
		t.Fatalf("%d expired effects left; the purge should still be held before its first batch", n)
	}
	close(d.signals.purgeHold)
	got := waitSignal(t, &d.signals.purgeBatch, 1, 10*time.Second, "purge batches")
	if got[0] != 3 {
		t.Fatalf("the released purge deleted %d effects, want 3", got[0])
	}
}
