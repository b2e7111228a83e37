package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/backoff"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers"
)

// scripted is a provider whose outcomes the test chooses, attempt by attempt: the dispatcher's logic is under
// test here, against the real database; real providers have their own suite.
type scripted struct {
	mu       sync.Mutex
	outcomes []providers.Outcome // consumed one per call; the last one repeats
	calls    atomic.Int32
	block    chan struct{} // when set, Deliver waits for it or for ctx
}

func (s *scripted) Validate(json.RawMessage) error { return nil }

func (s *scripted) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	s.calls.Add(1)
	if s.block != nil {
		select {
		case <-s.block:
		case <-ctx.Done():
			return providers.Retry(ctx.Err())
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.outcomes[0]
	if len(s.outcomes) > 1 {
		s.outcomes = s.outcomes[1:]
	}
	return o
}

type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *dedup.Store
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.Database(t))
	return &fixture{t: t, pool: pool, store: dedup.NewStore(pool)}
}

func (f *fixture) create(key, typ string) {
	f.t.Helper()
	if _, _, err := f.store.Create(context.Background(), dedup.NewEffect{Tenant: "t", Key: key, Type: typ,
		Payload: json.RawMessage(`{}`)}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) get(key string) *dedup.Effect {
	f.t.Helper()
	e, err := f.store.Get(context.Background(), "t", key)
	if err != nil {
		f.t.Fatal(err)
	}
	return e
}

func (f *fixture) waitStatus(key string, s effect.Status) *dedup.Effect {
	f.t.Helper()
	var e *dedup.Effect
	testenv.Eventually(f.t, 10*time.Second, "effect "+key+" reaches "+string(s), func() bool {
		e = f.get(key)
		return e.Status == s
	})
	return e
}

// dispatcher returns a dispatcher on the fixture's database with its test signals on, not yet running.
func (f *fixture) dispatcher(cfg Config) *Dispatcher {
	f.t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = time.Second
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := New(f.pool, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	d.signals.init()
	return d
}

// start runs d until the test ends.
func (f *fixture) start(d *Dispatcher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	f.t.Cleanup(func() { cancel(); <-done })
}

// run runs a dispatcher for types until the test ends and returns it.
func (f *fixture) run(types ...EffectType) *Dispatcher {
	f.t.Helper()
	d := f.dispatcher(Config{Types: types})
	f.start(d)
	return d
}

// drainSignal drops the events of s so far.
func drainSignal[T any](s *testSignal[T]) {
	for {
		select {
		case <-s.ch:
		default:
			return
		}
	}
}

// waitSignal waits for n events of s, failing the test after d.
func waitSignal[T any](t *testing.T, s *testSignal[T], n int, d time.Duration, what string) []T {
	t.Helper()
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	var got []T
	for len(got) < n {
		select {
		case v := <-s.ch:
			got = append(got, v)
		case <-timeout.C:
			t.Fatalf("after %v: %d of %d %s", d, len(got), n, what)
		}
	}
	return got
}

func TestOutcomesAreRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.create("ok", "ok")
	f.create("refused", "refused")
	f.create("doubt", "doubt")
	f.run(
		EffectType{Name: "ok", Provider: &scripted{outcomes: []providers.Outcome{providers.Delivered(map[string]string{"id": "m1"})}}},
		EffectType{Name: "refused", Provider: &scripted{outcomes: []providers.Outcome{providers.Failed(errors.New("550 no such user"), true)}}},
		EffectType{Name: "doubt", Provider: &scripted{outcomes: []providers.Outcome{providers.InDoubt(errors.New("connection lost after DATA"))}}},
	)
	if e := f.waitStatus("ok", effect.StatusDelivered); string(e.Result) != `{"id": "m1"}` || e.Attempts != 1 || e.DeliveredAt == nil {
		t.Fatalf("delivered: %+v result %s", e, e.Result)
	}
	if e := f.waitStatus("refused", effect.StatusFailed); *e.LastError != "550 no such user" || e.Attempts != 1 {
		t.Fatalf("failed: %+v", e)
	}
	if e := f.waitStatus("doubt", effect.StatusUnknown); *e.LastError != "connection lost after DATA" {
		t.Fatalf("in doubt: %+v", e)
	}
	if n := pgtest.Count(t, f.pool, "SELECT count(*) FROM oncegate_outbox"); n != 0 {
		t.Fatalf("%d outbox rows left for terminal effects", n)
	}
}

// A destination's Retry-After replaces the backoff delay.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.create("limited", "api")
	p := &scripted{outcomes: []providers.Outcome{
		providers.RetryAfter(1500*time.Millisecond, errors.New("429 slow down")),
		providers.Delivered(nil),
	}}
	f.run(EffectType{Name: "api", Provider: p})
	testenv.Eventually(t, 5*time.Second, "first attempt", func() bool { return f.get("limited").Attempts == 1 })
	e := f.get("limited")
	if e.Status != effect.StatusPending || e.NextAttemptAt == nil || *e.LastError != "429 slow down" {
		t.Fatalf("after a 429: %+v", e)
	}
	if wait := e.NextAttemptAt.Sub(e.UpdatedAt); wait < 1400*time.Millisecond || wait > 1600*time.Millisecond {
		t.Fatalf("next attempt %v after the failure, want the 1.5s the destination asked for", wait)
	}
	e = f.waitStatus("limited", effect.StatusDelivered)
	if d := e.DeliveredAt.Sub(e.CreatedAt); d < 1500*time.Millisecond {
		t.Fatalf("delivered %v after creation, before Retry-After ran out", d)
	}
}

// A 4xx from a destination that answered does not open the breaker; failures of a destination that is down
// do, and while it is open nothing is charged.
func TestBreakerCountsOnlyDestinationFailures(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	refusing := &scripted{outcomes: []providers.Outcome{providers.Failed(errors.New("422 invalid"), true)}}
	down := &scripted{outcomes: []providers.Outcome{providers.Retry(errors.New("connection refused"))}}
	for i := range 6 {
		f.create("r"+string(rune('a'+i)), "refusing")
		f.create("d"+string(rune('a'+i)), "down")
	}
	d := f.run(
		EffectType{Name: "refusing", Provider: refusing, BreakerFailures: 2},
		// One at a time: calls already in flight when the breaker opens are not stopped by it, so with more
		// the count of calls would depend on the scheduler.
		EffectType{Name: "down", Provider: down, BreakerFailures: 2, BreakerOpenFor: time.Hour,
			Retry: backoffPolicy(time.Millisecond), Concurrency: 1},
	)
	for i := range 6 {
		f.waitStatus("r"+string(rune('a'+i)), effect.StatusFailed)
	}
	// The second call opens the breaker; on a loaded machine it may come after the refusing type is done.
	testenv.Eventually(t, 10*time.Second, "the down destination called twice", func() bool {
		return down.calls.Load() >= 2
	})
	// Claim rounds since: had the open breaker not held the down type's rows back (until its next probe, an
	// hour away), these rounds would have claimed and retried them (their backoff is 1 ms).
	drainSignal(&d.signals.claimRound)
	waitSignal(t, &d.signals.claimRound, 5, 10*time.Second, "claim rounds")
	for _, et := range d.types {
		want := map[string]string{"refusing": "closed", "down": "open"}[et.Name]
		if got := d.breakers.state(et.Name, "t", providers.DefaultDestination); got != want {
			t.Errorf("breaker of %s is %s, want %s", et.Name, got, want)
		}
	}
	if calls := down.calls.Load(); calls != 2 {
		t.Fatalf("the down destination was called %d times; the breaker should have stopped it after 2", calls)
	}
	// A row claimed in the last round may still be on its way back to wait for the breaker: its outcome
	// recorded, its lease gone. The status as reported says so (a leased row reads delivering); the stored
	// column does not, since a claim no longer writes it, which made this wait pass at once and the count
	// below race the second call's reschedule under load.
	testenv.Eventually(t, 5*time.Second, "all 6 effects of the down type pending", func() bool {
		for i := range 6 {
			if f.get("d"+string(rune('a'+i))).Status != effect.StatusPending {
				return false
			}
		}
		return true
	})
	if n := pgtest.Count(t, f.pool, "SELECT sum(attempts) FROM oncegate_effects WHERE type = 'down'"); n != 2 {
		t.Fatalf("%d attempts charged to the down type, want the 2 calls", n)
	}
}

// A row whose dispatcher died mid-delivery is marked unknown under at_most_once, and resent under
// at_least_once (with Rescued set).
func TestRescuedRowsFollowOnCrash(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.create("most", "most")
	f.create("least", "least")
	ctx := context.Background()
	// A dispatcher that claimed both rows and died: its leases ran out a moment ago.
	if _, err := f.pool.Exec(ctx, `UPDATE oncegate_outbox SET lease_token = gen_random_uuid(), lease_owner = 'dead',
		lease_expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE oncegate_effects SET status = 'delivering'`); err != nil {
		t.Fatal(err)
	}
	var rescued atomic.Bool
	least := &rescueRecorder{seen: &rescued}
	most := &scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}}
	f.run(EffectType{Name: "most", Provider: most, OnCrash: AtMostOnce},
		EffectType{Name: "least", Provider: least, OnCrash: AtLeastOnce})
	e := f.waitStatus("most", effect.StatusUnknown)
	if most.calls.Load() != 0 || e.LastError == nil {
		t.Fatalf("at_most_once: provider called %d times, effect %+v", most.calls.Load(), e)
	}
	f.waitStatus("least", effect.StatusDelivered)
	if !rescued.Load() {
		t.Fatal("the resent delivery was not marked Rescued")
	}
}

// An outside tester's finding (issue 14's adversary): the deliveries that a shutdown cancels after its drain
// time were counted against their destination, and opened its breaker (in the last heartbeat the operator
// sees, `oncegate breaker ls`). The destination did nothing wrong: the gateway gave up on it.
func TestShutdownCancellationsDoNotOpenBreakers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, k := range []string{"s1", "s2", "s3"} {
		f.create(k, "slow")
	}
	p := &scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}, block: make(chan struct{})}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "slow", Provider: p, BreakerFailures: 1}},
		DrainTimeout: 200 * time.Millisecond})
	shutDownMidDelivery(t, d, func() bool { return p.calls.Load() == 3 })
	for _, b := range d.Breakers() {
		if b.State != "closed" {
			t.Errorf("after shutdown the breaker of %s is %s, want closed: cancelling is not the destination failing",
				b.Destination, b.State)
		}
	}
}

// shutDownMidDelivery runs d until started says its deliveries are under way, then shuts it down, and waits
// for Run to return after its drain timeout.
func shutDownMidDelivery(t *testing.T, d *Dispatcher, started func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	testenv.Eventually(t, 5*time.Second, "deliveries start", started)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its drain timeout")
	}
}

type rescueRecorder struct{ seen *atomic.Bool }

func (r *rescueRecorder) Validate(json.RawMessage) error { return nil }
func (r *rescueRecorder) Deliver(_ context.Context, d providers.Delivery) providers.Outcome {
	r.seen.Store(d.Rescued)
	return providers.Delivered(nil)
}

// At shutdown, deliveries that outlast the drain time are cancelled and their rows handed back unattempted,
// for another gateway at once.
func TestShutdownHandsUnfinishedRowsBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.create("slow", "slow")
	p := &scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}, block: make(chan struct{})}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "slow", Provider: p}}, DrainTimeout: 200 * time.Millisecond})
	shutDownMidDelivery(t, d, func() bool { return p.calls.Load() == 1 })
	e := f.get("slow")
	if e.Status != effect.StatusPending || e.Attempts != 0 {
		t.Fatalf("after shutdown: %+v; want pending with no attempt charged", e)
	}
	if n := pgtest.Count(t, f.pool, "SELECT count(*) FROM oncegate_outbox WHERE lease_token IS NULL AND run_at <= now()"); n != 1 {
		t.Fatal("the row is not free for another dispatcher at once")
	}
}

// rescuable creates an effect of type typ whose row a dead gateway leased, its lease run out, and returns an
// attempt log that runs until the test ends.
func (f *fixture) rescuable(typ string) *dedup.AttemptLog {
	f.t.Helper()
	f.create(typ, typ)
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	if _, err := f.pool.Exec(ctx, `UPDATE oncegate_outbox SET lease_token = gen_random_uuid(), lease_owner = 'dead',
		lease_expires_at = now() - interval '1 second'`); err != nil {
		f.t.Fatal(err)
	}
	attempts := dedup.NewAttemptLog(f.pool, 20*time.Millisecond, quietLog())
	go attempts.Run(ctx)
	return attempts
}

// rescueAndDie has a gateway rescue the row of type typ (rescuable) and die with it leased: its lease runs out
// too, the interruption counted on the row by the claim.
func (f *fixture) rescueAndDie(typ string) {
	f.t.Helper()
	ctx := context.Background()
	rows, err := f.store.Claim(ctx, dedup.ClaimParams{Type: typ, Limit: 1, Owner: "rescuer-1", Lease: time.Minute})
	if err != nil || len(rows) != 1 || !rows[0].Rescued {
		f.t.Fatalf("the first rescue: %+v, %v", rows, err)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE oncegate_outbox SET lease_expires_at = now() - interval '1 second'`); err != nil {
		f.t.Fatal(err)
	}
}

// attemptLog is the attempt log, oldest first, each attempt as the SQL expression row makes of it.
func attemptLog(t *testing.T, pool *pgxpool.Pool, row string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT "+row+" FROM oncegate_effect_attempts ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A rescued row's attempt log numbers the interrupted attempt and the rescue's own apart, 1 and 2 (an on-call
// engineer saw two attempts numbered 1 for an email sent twice).
func TestRescueNumbersItsAttemptAfterTheInterruptedOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	attempts := f.rescuable("least")
	d := f.dispatcher(Config{Types: []EffectType{{Name: "least", Provider: &scripted{outcomes: []providers.Outcome{
		providers.Delivered(nil)}}, OnCrash: AtLeastOnce}}, Attempts: attempts, Owner: "rescuer"})
	f.start(d)
	f.waitStatus("least", effect.StatusDelivered)
	testenv.Eventually(t, 10*time.Second, "both attempts logged", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effect_attempts`) == 2
	})
	if got := attemptLog(t, f.pool, "attempt || ' ' || outcome || ' ' || gateway"); fmt.Sprint(got) != "[1 interrupted dead 2 delivered rescuer]" {
		t.Fatalf("attempt log: %q", got)
	}
}

// The interrupted attempt of a rescued row counts towards max_attempts, as it is numbered in the attempt log:
// it may have reached the destination. Counted in the log and not in the effect's attempts, the rescue's own
// call was numbered 2 and the next 2 again, and an effect of max_attempts 3 was sent 4 times (an outside test:
// `1:interrupted 2:retry 2:retry 3:failed`).
func TestARescuedRowsInterruptedAttemptCountsTowardsItsMaximum(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	attempts := f.rescuable("least")
	boom := errors.New("503 busy")
	p := &scripted{outcomes: []providers.Outcome{providers.Retry(boom), providers.Retry(boom), providers.Retry(boom)}}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "least", Provider: p, OnCrash: AtLeastOnce, MaxAttempts: 3,
		Retry: backoff.Policy{Base: time.Millisecond, Max: time.Millisecond}}}, Attempts: attempts, Owner: "rescuer"})
	f.start(d)
	f.waitStatus("least", effect.StatusDead)
	testenv.Eventually(t, 10*time.Second, "the attempts logged", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effect_attempts`) >= 3
	})
	time.Sleep(100 * time.Millisecond) // a fourth, were there one, is flushed too
	if got := attemptLog(t, f.pool, "attempt || ' ' || outcome"); fmt.Sprint(got) != "[1 interrupted 2 retry 3 failed]" {
		t.Errorf("attempt log: %q", got)
	}
	if e := f.get("least"); e.Attempts != 3 || p.calls.Load() != 2 {
		t.Errorf("the effect has %d attempts and its provider was called %d times; want 3 and 2", e.Attempts, p.calls.Load())
	}
}

// Each rescue's interrupted attempt counts, also when the gateway that rescued a row dies before it records
// anything: the claim that rescues a row counts the interruption on the row itself. Counted by the outcome
// alone, two kills in a row left one interruption uncounted: an effect of max_attempts 3 was called 4 times,
// its log reading `1 interrupted, 1 interrupted, 2 retry, 3 failed` (an outside test).
func TestEveryRescueOfARowCountsItsInterruptedAttempt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	attempts := f.rescuable("least")
	f.rescueAndDie("least")
	boom := errors.New("503 busy")
	p := &scripted{outcomes: []providers.Outcome{providers.Retry(boom), providers.Retry(boom)}}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "least", Provider: p, OnCrash: AtLeastOnce, MaxAttempts: 3,
		Retry: backoff.Policy{Base: time.Millisecond, Max: time.Millisecond}}}, Attempts: attempts, Owner: "rescuer-2"})
	f.start(d)
	f.waitStatus("least", effect.StatusDead)
	if e := f.get("least"); e.Attempts != 3 || p.calls.Load() != 1 {
		t.Errorf("the effect has %d attempts and its provider was called %d times; want 3 and 1", e.Attempts, p.calls.Load())
	}
	testenv.Eventually(t, 10*time.Second, "the attempts logged", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effect_attempts`) >= 2
	})
	time.Sleep(100 * time.Millisecond)
	if got := attemptLog(t, f.pool, "attempt || ' ' || outcome"); fmt.Sprint(got) != "[2 interrupted 3 failed]" {
		t.Errorf("attempt log: %q", got)
	}
}

// A row whose interrupted attempts reach max_attempts is not called again: it is unknown, since the last may
// have reached the destination (an outside test: three kills of max_attempts 3 made a fourth call).
func TestARowWhoseInterruptionsUseUpItsAttemptsIsNotCalledAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	attempts := f.rescuable("least")
	f.rescueAndDie("least")
	p := &scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "least", Provider: p, OnCrash: AtLeastOnce, MaxAttempts: 2}},
		Attempts: attempts, Owner: "rescuer-2"})
	f.start(d)
	f.waitStatus("least", effect.StatusUnknown)
	if e := f.get("least"); e.Attempts != 2 || p.calls.Load() != 0 {
		t.Errorf("the effect has %d attempts and its provider was called %d times; want 2 and 0", e.Attempts, p.calls.Load())
	}
}
