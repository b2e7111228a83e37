package notifier

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/pgtest"
	"github.com/oncegate/oncegate/internal/testenv"
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
	payloads := JoinIDs(ids)
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
	if JoinIDs(nil) != nil {
		t.Fatal("no IDs made a payload")
	}
}
