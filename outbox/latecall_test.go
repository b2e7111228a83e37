package outbox

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/providers"
)

// slowCalls answers every call after a while, and counts the calls by key.
type slowCalls struct {
	took  time.Duration
	mu    sync.Mutex
	calls map[string]int
}

func (p *slowCalls) Validate(json.RawMessage) error { return nil }

func (p *slowCalls) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	p.mu.Lock()
	p.calls[d.Key]++
	p.mu.Unlock()
	select {
	case <-time.After(p.took):
		return providers.Delivered(nil)
	case <-ctx.Done():
		return providers.Retry(ctx.Err())
	}
}

func (p *slowCalls) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key]
}

// stallPayloads holds the first read of a claim's payloads for a while, as a stall of the database between
// a claim's two statements would (a PgBouncer PAUSE, a failover), and says when it has begun.
type stallPayloads struct {
	hold    time.Duration
	once    sync.Once
	holding chan struct{}
}

func (s *stallPayloads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, q pgx.TraceQueryStartData) context.Context {
	if strings.Contains(q.SQL, "The payloads of rows leased to the caller") {
		s.once.Do(func() { close(s.holding); time.Sleep(s.hold) })
	}
	return ctx
}

func (s *stallPayloads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A call is never started on a lease too short for it: a claim's payloads read late (the database stalled
// between the claim and the read) leave less of the lease than the call and its record need, and a call made
// then outlived its lease, was rescued by another dispatcher and made again (an 8 s PgBouncer PAUSE resent 4
// webhooks of 128 in a CI run). The dispatcher extends the lease first.
func TestACallIsNotStartedOnALeaseTooShortForIt(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	store := dedup.NewStore(pool)
	// The lease is 3 s (a 2 s timeout and 1 s of margin); the read of the payloads is held 2.2 s, so the
	// call, 1.5 s long, starts with 0.8 s of lease left.
	stall := &stallPayloads{hold: 2200 * time.Millisecond, holding: make(chan struct{})}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = stall
	stalled, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stalled.Close)
	p := &slowCalls{took: 1500 * time.Millisecond, calls: map[string]int{}}
	typ := EffectType{Name: "hook", Provider: p, Timeout: 2 * time.Second, Concurrency: 4}
	f := &fixture{t: t, pool: pool, store: store}
	if _, _, err := store.Create(context.Background(), dedup.NewEffect{Tenant: "t", Key: "late", Type: "hook",
		Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	first := &fixture{t: t, pool: stalled, store: dedup.NewStore(stalled)}
	first.start(first.dispatcher(Config{Types: []EffectType{typ}, LeaseMargin: time.Second, Owner: "first"}))
	select {
	case <-stall.holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the first dispatcher never read the payloads of a claim")
	}
	// A second dispatcher rescues whatever lease runs out.
	f.start(f.dispatcher(Config{Types: []EffectType{typ}, LeaseMargin: time.Second, Owner: "second"}))
	f.waitStatus("late", effect.StatusDelivered)
	time.Sleep(2 * time.Second) // a rescue's call, had there been one, has begun
	if n := p.count("late"); n != 1 {
		t.Fatalf("the effect was called %d times: a call started on a lease too short for it was rescued and made again", n)
	}
}
