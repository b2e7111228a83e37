package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers"
)

// Issue 12, finding 1: a payload of ~8,200 copies of 1e131071 is 74 KB as text, but jsonb prints each copy as
// 131,072 digits, so the row reads back as over 1 GB, past what Postgres can return, and the claim of every
// batch holding it failed on every try. Such a row can no longer come in through the API (the request limits,
// and payloads are stored as sent), but rows accepted before, or written by hand, still can be there. Its
// claim must fail only that row: the others of its type and of every other type are delivered, and the
// poison row ends dead with Postgres's reason, once, not in a loop.
//
// On a private cluster: each attempt to read the row makes that Postgres allocate about 1 GB.
func TestPoisonRowIsSetAsideAndEveryOtherRowDelivered(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input",
		"A stored row whose payload reads back as over 1 GB (jsonb, 8,200 x 1e131071), due first in the outbox of one of two types",
		"The other rows of its type and of the other type delivered; the poison row dead with Postgres's reason, by ID, claimed once")
	cluster := pgtest.StartCluster(t)
	pool := pgtest.Pool(t, pgtest.DatabaseAt(t, cluster.URL()))
	store := dedup.NewStore(pool)
	ctx := context.Background()

	// The poison row, as a gateway before migration 00004 stored it (the payload in jsonb), due before the rest.
	if _, err := pool.Exec(ctx, `WITH e AS (
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, legacy_payload)
		VALUES ('t', 'poison', 'a', '\x00', ('{"n":[' || repeat('1e131071,', 8200) || '1]}')::jsonb)
		RETURNING id, type)
		INSERT INTO oncegate_outbox (effect_id, type, run_at) SELECT id, type, now() - interval '1 minute' FROM e`); err != nil {
		t.Fatal(err)
	}
	pgtest.KeyEffects(t, pool)
	for i := range 5 {
		for _, typ := range []string{"a", "b"} {
			if _, _, err := store.Create(ctx, dedup.NewEffect{Tenant: "t", Key: fmt.Sprintf("%s%d", typ, i), Type: typ,
				Payload: json.RawMessage(`{"n":1}`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The finding, reproduced: the claim of type a's batch fails, and not for want of a database.
	probe := time.Now()
	_, err := store.Claim(ctx, dedup.ClaimParams{Type: "a", Limit: 32, Owner: "probe", Lease: time.Minute})
	if err == nil || errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("claiming a batch with the poison row: %v; want a failure of the row", err)
	}
	t.Logf("the batch claim fails after %v: %v", time.Since(probe), err)

	logs := &lockedBuffer{}
	deliveredA, deliveredB := &scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}},
		&scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}}
	// Type a first: claimAll used to return at the first type whose claim failed, so b never ran. Reading the
	// poison row takes Postgres far longer than the 3 s claim timeout here, as it may anywhere: the claim and
	// the row's own read are both cut short by the timeout, not failed by Postgres.
	d, err := New(pool, Config{Types: []EffectType{{Name: "a", Provider: deliveredA}, {Name: "b", Provider: deliveredB}},
		PollInterval: 50 * time.Millisecond, DrainTimeout: time.Second, ClaimTimeout: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	d.signals.init()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = d.Run(runCtx); close(done) }()
	t.Cleanup(func() {
		stop()
		<-done
		if t.Failed() {
			t.Logf("dispatcher log:\n%s", logs.String())
		}
	})

	started := time.Now()
	get := func(key string) *dedup.Effect {
		e, err := store.Get(ctx, "t", key)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	for i := range 5 {
		for _, typ := range []string{"a", "b"} {
			key := fmt.Sprintf("%s%d", typ, i)
			testenv.Eventually(t, 60*time.Second, key+" delivered", func() bool { return get(key).Status == effect.StatusDelivered })
		}
	}
	took := time.Since(started)
	var poison *dedup.Effect
	testenv.Eventually(t, 60*time.Second, "the poison row set aside", func() bool {
		poison = get("poison")
		return poison.Status.Terminal()
	})
	if poison.Status != effect.StatusDead || poison.LastError == nil || !strings.HasPrefix(*poison.LastError, unreadablePrefix) ||
		len(*poison.LastError) == len(unreadablePrefix) || poison.Attempts != 0 {
		t.Fatalf("the poison row: %+v, last error %v", poison, deref(poison.LastError))
	}
	setAside := time.Since(started)
	t.Logf("the poison row's last error: %s", *poison.LastError)
	if deliveredA.calls.Load() != 5 || deliveredB.calls.Load() != 5 {
		t.Fatalf("providers called %d (a) and %d (b) times, want 5 each: the poison row must never reach one",
			deliveredA.calls.Load(), deliveredB.calls.Load())
	}

	// Nothing loops: the row is out of the outbox, later rows of its type go by the ordinary batch claim, and
	// the row-by-row fallback ran once.
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); n != 0 {
		t.Fatalf("%d outbox rows left", n)
	}
	if _, _, err := store.Create(ctx, dedup.NewEffect{Tenant: "t", Key: "after", Type: "a", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	d.Wake()
	testenv.Eventually(t, 10*time.Second, "a later row delivered", func() bool { return get("after").Status == effect.StatusDelivered })
	fallbacks := strings.Count(logs.String(), "one at a time for a while")
	drainSignal(&d.signals.claimRound)
	waitSignal(t, &d.signals.claimRound, 5, 10*time.Second, "claim rounds")
	if n := strings.Count(logs.String(), "one at a time for a while"); n != fallbacks || n == 0 {
		t.Fatalf("the batch claim failed %d times before the row was set aside and %d after:\n%s", fallbacks, n-fallbacks, logs.String())
	}
	if n := strings.Count(logs.String(), "claiming outbox rows failed"); n != 0 {
		t.Fatalf("a claim failed %d times:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "set aside as dead"); n != 1 {
		t.Fatalf("%d rows set aside, want the poison row once:\n%s", n, logs.String())
	}
	result(fmt.Sprintf("10 of 10 other rows delivered in %.1fs; the poison row dead after %.1fs, 0 attempts, %q; "+
		"batch claims failed on it %d time(s), none after", took.Seconds(), setAside.Seconds(),
		strings.TrimPrefix(*poison.LastError, unreadablePrefix), fallbacks))
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// lockedBuffer collects a dispatcher's log, written from its goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// panicky panics on a payload that names "boom", and delivers any other.
type panicky struct{ calls atomic.Int32 }

func (p *panicky) Validate(json.RawMessage) error { return nil }
func (p *panicky) Deliver(_ context.Context, d providers.Delivery) providers.Outcome {
	p.calls.Add(1)
	if strings.Contains(string(d.Payload), "boom") {
		panic("provider bug: " + string(d.Payload))
	}
	return providers.Delivered(nil)
}

// A delivery that panics on one row (a provider's bug that one payload sets off) fails that row, dead with
// the panic as its reason; it does not take the gateway down, which would leave the row to be rescued and
// panic again in every gateway that takes it.
func TestPanickingDeliveryFailsOnlyItsRow(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input", "A payload that makes its provider panic, between two that do not",
		"The gateway stays up; the other rows delivered; that row dead, once, with no panic text a tenant could read")
	f := newFixture(t)
	ctx := context.Background()
	for _, k := range []string{"ok1", "boom", "ok2"} {
		if _, _, err := f.store.Create(ctx, dedup.NewEffect{Tenant: "t", Key: k, Type: "p",
			Payload: json.RawMessage(`{"k":"` + k + `"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	p := &panicky{}
	f.run(EffectType{Name: "p", Provider: p})
	f.waitStatus("ok1", effect.StatusDelivered)
	f.waitStatus("ok2", effect.StatusDelivered)
	e := f.waitStatus("boom", effect.StatusDead)
	if e.LastError == nil || *e.LastError != panicked || e.Attempts != 1 {
		t.Fatalf("the panicking row: %+v, last error %s", e, deref(e.LastError))
	}
	if n := p.calls.Load(); n != 3 {
		t.Fatalf("provider called %d times, want 3: the panicking row once", n)
	}
	result("2 of 2 other rows delivered; the panicking row dead after 1 attempt; provider called 3 times")
}
