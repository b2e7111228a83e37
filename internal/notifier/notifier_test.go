package notifier

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// recorder collects what a subscriber is called with.
type recorder struct{ ch chan Notification }

func (r recorder) fn(n Notification) { r.ch <- n }

func (r recorder) next(t *testing.T) Notification {
	t.Helper()
	select {
	case n := <-r.ch:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10s")
		return Notification{}
	}
}

// Subscribers get their own topic's notifications, and a resync on connecting and again after the
// connection was lost, when the notifications sent meanwhile are gone.
func TestTopicsAndResyncAfterReconnect(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	n := New(Config{DatabaseURL: url, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	outbox, done := recorder{make(chan Notification, 100)}, recorder{make(chan Notification, 100)}
	n.Subscribe(TopicOutbox, outbox.fn)
	n.Subscribe(TopicEffectDone, done.fn)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { n.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })

	if !outbox.next(t).Resync || !done.next(t).Resync {
		t.Fatal("the first call after connecting is not a resync")
	}
	if err := Send(ctx, pool, TopicEffectDone, "1,2"); err != nil {
		t.Fatal(err)
	}
	if got := done.next(t); got.Resync || got.Payload != "1,2" || got.Topic != TopicEffectDone {
		t.Fatalf("got %+v", got)
	}
	if len(outbox.ch) != 0 {
		t.Fatalf("the outbox subscriber got another topic's notification: %+v", <-outbox.ch)
	}

	// The server ends the listener's session: the notifier reconnects and says so to everyone.
	testenv.Eventually(t, 10*time.Second, "the listener's session is terminated", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1) x`, applicationName) == 1
	})
	if !outbox.next(t).Resync || !done.next(t).Resync {
		t.Fatal("no resync after the reconnect")
	}
	if err := Send(ctx, pool, TopicOutbox, "email"); err != nil {
		t.Fatal(err)
	}
	if got := outbox.next(t); got.Payload != "email" {
		t.Fatalf("after the reconnect: %+v", got)
	}
}

func TestIDsRoundTripUnderThePayloadLimit(t *testing.T) {
	t.Parallel()
	ids := make([]int64, 3000)
	for i := range ids {
		ids[i] = int64(1_000_000 + i)
	}
	items := make([]string, len(ids))
	for i, id := range ids {
		items[i] = strconv.FormatInt(id, 10)
	}
	payloads := join(items)
	if len(payloads) < 2 {
		t.Fatalf("3000 IDs of 7 digits fit in %d payload(s) of under 8000 bytes", len(payloads))
	}
	var back []int64
	for _, p := range payloads {
		if len(p) > MaxPayload || strings.HasPrefix(p, ",") || strings.HasSuffix(p, ",") {
			t.Fatalf("payload of %d bytes: %.20q…", len(p), p)
		}
		back = append(back, SplitIDs(p)...)
	}
	if !slices.Equal(back, ids) {
		t.Fatal("the IDs did not come back as they were sent")
	}
	if join(nil) != nil {
		t.Fatal("no IDs made a payload")
	}
}

// runNotifier runs a notifier on url until the test ends.
func runNotifier(t *testing.T, url string, subs map[Topic]func(Notification)) *Notifier {
	t.Helper()
	n := New(Config{DatabaseURL: url, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for topic, fn := range subs {
		n.Subscribe(topic, fn)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { n.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	return n
}

// The self-check passes on a connection of its own, even one whose URL carries a pool's parameters, and fails
// when the LISTEN went through PgBouncer in transaction mode, where the notification is lost without an
// error, and when there is no LISTEN connection at all.
func TestCheckFindsWhetherNotificationsArrive(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	direct := runNotifier(t, url+"&pool_max_conns=3&pool_min_conns=1", nil)
	ctx := testenv.Context(t, 30*time.Second)
	if err := direct.Check(ctx, pool); err != nil {
		t.Fatalf("direct: %v", err)
	}

	pooled := runNotifier(t, pgtest.ThroughPgBouncer(t, url), nil)
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := pooled.Check(cctx, pool); err == nil || !strings.Contains(err.Error(), "did not arrive") {
		t.Fatalf("through PgBouncer in transaction mode: %v", err)
	}

	idle := New(Config{DatabaseURL: url})
	cctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := idle.Check(cctx, pool); err == nil || !strings.Contains(err.Error(), "no LISTEN connection") {
		t.Fatalf("not running: %v", err)
	}
}

// A batcher sends every item added, each at most once per notification, in fewer notifications than items,
// and what is still queued when it stops.
func TestBatcherSendsEveryItemInFewNotifications(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	got := make(chan Notification, 1000)
	n := runNotifier(t, url, map[Topic]func(Notification){TopicOutbox: func(n Notification) {
		if !n.Resync {
			got <- n
		}
	}})
	ctx := testenv.Context(t, 30*time.Second)
	if err := n.Check(ctx, pool); err != nil {
		t.Fatal(err)
	}
	b := NewBatcher(pool, TopicOutbox, 5*time.Millisecond, nil)
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { b.Run(runCtx); close(stopped) }()
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() { b.Add([]string{"email", "hooks"}[i%2]) })
	}
	wg.Wait()
	stop()
	<-stopped
	b.Add("late") // after Run: never sent, and Add does not block
	seen := map[string]bool{}
	notifications := 0
	for !seen["email"] || !seen["hooks"] {
		select {
		case m := <-got:
			notifications++
			items := strings.Split(m.Payload, ",")
			slices.Sort(items)
			if len(slices.Compact(items)) != len(strings.Split(m.Payload, ",")) {
				t.Fatalf("an item twice in one notification: %q", m.Payload)
			}
			for _, it := range items {
				seen[it] = true
			}
		case <-ctx.Done():
			t.Fatalf("not every item arrived: %v", seen)
		}
	}
	t.Logf("400 items in %d notifications", notifications)
	if notifications >= 400 {
		t.Fatalf("%d notifications for 400 items: nothing was batched", notifications)
	}
}

// A listener whose server turns read-only (a primary demoted in a failover, while it lives on) hears nothing
// more: the writers, and their NOTIFYs, went to the new primary. With target_session_attrs=read-write in its
// URL, the listener checks its connection against it whenever idle, as it pings, and reconnects to the
// primary among the URL's hosts.
func TestListenerLeavesAServerTurnedReadOnly(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, time.Minute)
	a, b := pgtest.StartCluster(t), pgtest.StartCluster(t)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		a.Port(), b.Port())
	n := New(Config{DatabaseURL: url, IdleCheck: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	rec := recorder{make(chan Notification, 100)}
	n.Subscribe(TopicOutbox, rec.fn)
	rctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { n.Run(rctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	if !rec.next(t).Resync {
		t.Fatal("the first call after connecting is not a resync")
	}
	poolA, poolB := pgtest.Pool(t, a.URL()), pgtest.Pool(t, b.URL())
	if err := Send(ctx, poolA, TopicOutbox, "on-a"); err != nil {
		t.Fatal(err)
	}
	if got := rec.next(t); got.Payload != "on-a" {
		t.Fatalf("the listener is not on the first host: %+v", got)
	}
	for _, q := range []string{"ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()"} {
		if _, err := poolA.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.next(t); !got.Resync {
		t.Fatalf("no reconnect after the server turned read-only: %+v", got)
	}
	if err := Send(ctx, poolB, TopicOutbox, "on-b"); err != nil {
		t.Fatal(err)
	}
	if got := rec.next(t); got.Payload != "on-b" {
		t.Fatalf("the listener did not move to the read-write host: %+v", got)
	}
}
