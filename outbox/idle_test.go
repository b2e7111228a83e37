package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers"
)

// claimCounter counts the claim statements run for each effect type.
type claimCounter struct {
	mu     sync.Mutex
	byType map[string]int
}

func (c *claimCounter) count(sql string, args []any) {
	if !strings.Contains(sql, "Leases up to $2 due outbox rows") {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range args {
		if s, ok := a.(string); ok && (s == "busy" || s == "idle") {
			c.byType[s]++
			break
		}
	}
}

func (c *claimCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.count(data.SQL, data.Args)
	return ctx
}

func (*claimCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The claim runs in a batch, behind its planner settings (dedup's pinned).
func (c *claimCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *claimCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.count(data.SQL, data.Args)
}

func (*claimCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A gateway delivering a backlog of one type claimed every other type at each delivery that ended, finding
// nothing each time (issue 14's benchmark: 570 empty claims of 798 while 6,000 webhooks went out). A type
// whose claim found nothing is claimed again on a notification, a retry or the poll, not when another
// type's delivery ends.
func TestAnIdleTypeIsNotClaimedAtEveryDelivery(t *testing.T) {
	t.Parallel()
	counter := &claimCounter{byType: map[string]int{}}
	pool := pgtest.TracedPool(t, pgtest.Database(t), counter)
	f := &fixture{t: t, pool: pool, store: dedup.NewStore(pool)}
	const backlog = 300
	for i := range backlog {
		f.create(fmt.Sprintf("b%d", i), "busy")
	}
	busy := &scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}}
	idle := &scripted{outcomes: []providers.Outcome{providers.Delivered(nil)}}
	d := f.dispatcher(Config{PollInterval: time.Hour, BatchSize: 4, Types: []EffectType{
		{Name: "busy", Provider: busy, Concurrency: 4}, {Name: "idle", Provider: idle, Concurrency: 4}}})
	f.start(d)
	f.waitStatus(fmt.Sprintf("b%d", backlog-1), effect.StatusDelivered)
	for i := range backlog {
		f.waitStatus(fmt.Sprintf("b%d", i), effect.StatusDelivered)
	}
	counter.mu.Lock()
	busyClaims, idleClaims := counter.byType["busy"], counter.byType["idle"]
	counter.mu.Unlock()
	if busyClaims < backlog/4 {
		t.Fatalf("%d claims of the busy type for %d rows in claims of 4: the counter counts nothing", busyClaims, backlog)
	}
	if idleClaims > 2 {
		t.Errorf("the idle type was claimed %d times while %d rows of another type were delivered", idleClaims, backlog)
	}
	// A notification still brings its new rows at once.
	f.create("i1", "idle")
	d.Wake()
	f.waitStatus("i1", effect.StatusDelivered)
}

// A notification names the types of its new rows, and only those are claimed: woken whole at every
// notification, each idle type's claim ran for nothing each time (the retention bench with one busy type and
// five idle ones: 26,000 of 32,000 claims in a minute found nothing).
func TestANotificationClaimsOnlyTheTypesItNames(t *testing.T) {
	t.Parallel()
	counter := &claimCounter{byType: map[string]int{}}
	pool := pgtest.TracedPool(t, pgtest.Database(t), counter)
	f := &fixture{t: t, pool: pool, store: dedup.NewStore(pool)}
	ok := []providers.Outcome{providers.Delivered(nil)}
	d := f.dispatcher(Config{PollInterval: time.Hour, Types: []EffectType{
		{Name: "busy", Provider: &scripted{outcomes: ok}}, {Name: "idle", Provider: &scripted{outcomes: ok}}}})
	f.start(d)
	waitRounds := func() { // the first rounds, which claim every type, are over
		drainSignal(&d.signals.claimRound)
		waitSignal(t, &d.signals.claimRound, 1, 10*time.Second, "claim round")
	}
	waitRounds()
	counter.mu.Lock()
	before := counter.byType["idle"]
	counter.mu.Unlock()
	const n = 20
	for i := range n {
		f.create(fmt.Sprintf("b%d", i), "busy")
		d.WakeType("busy")
		f.waitStatus(fmt.Sprintf("b%d", i), effect.StatusDelivered)
	}
	counter.mu.Lock()
	busyClaims, idleClaims := counter.byType["busy"], counter.byType["idle"]-before
	counter.mu.Unlock()
	if busyClaims < n {
		t.Fatalf("%d claims of the busy type for %d notified rows: the counter counts nothing", busyClaims, n)
	}
	if idleClaims != 0 {
		t.Errorf("the idle type was claimed %d times at %d notifications of another type", idleClaims, n)
	}
	// Its own notification brings its new row at once; Wake, for every type, too.
	f.create("i1", "idle")
	d.WakeType("idle")
	f.waitStatus("i1", effect.StatusDelivered)
	f.create("i2", "idle")
	d.Wake()
	f.waitStatus("i2", effect.StatusDelivered)
}

// While one type's claims keep coming back full, the loop claims again at once, round after round: a
// notification for an idle type must still be read between those rounds, or the idle type's new effect waits
// for the busy type's backlog to drain (an outside tester's reading of the claim loop).
func TestAnIdleTypeIsClaimedWhileAnotherDrainsABacklog(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.create("b0", "busy")
	// The rest of the backlog in one statement, as Create writes it: effect and outbox row.
	if _, err := f.pool.Exec(context.Background(), `WITH e AS (
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
		SELECT 't', 'b' || g, 'busy', '\x00', '{}', 'eff_b' || g FROM generate_series(1, 2999) g
		RETURNING id, type)
		INSERT INTO oncegate_outbox (effect_id, type) SELECT id, type FROM e`); err != nil {
		t.Fatal(err)
	}
	ok := []providers.Outcome{providers.Delivered(nil)}
	d := f.dispatcher(Config{PollInterval: time.Hour, BatchSize: 2, Types: []EffectType{
		{Name: "busy", Provider: &scripted{outcomes: ok}, Concurrency: 1000, TenantConcurrency: 1000},
		{Name: "idle", Provider: &scripted{outcomes: ok}, Concurrency: 4}}})
	f.start(d)
	f.waitStatus("b0", effect.StatusDelivered)
	f.create("i1", "idle")
	d.Wake()
	f.waitStatus("i1", effect.StatusDelivered)
	if left := pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_outbox WHERE type = 'busy'`); left == 0 {
		t.Fatal("the idle type's effect was delivered only after the busy type's backlog had drained")
	}
}

// A tenant with a backlog and its share of a type's slots in flight is refilled a quarter of its share at a
// time: refilled at each delivery that ended, it cost a claim for its one row and a second that skipped it
// and found nothing, two claims a delivery (the fleet bench: Postgres's cores held by claims while another
// tenant's new effects waited for them).
func TestATenantAtItsShareIsNotClaimedAtEveryDelivery(t *testing.T) {
	t.Parallel()
	counter := &claimCounter{byType: map[string]int{}}
	pool := pgtest.TracedPool(t, pgtest.Database(t), counter)
	f := &fixture{t: t, pool: pool, store: dedup.NewStore(pool)}
	const backlog = 400
	for i := range backlog {
		f.create(fmt.Sprintf("b%d", i), "busy")
	}
	// Concurrency 32: the tenant's share is 16 of it, refilled 4 at a time. Each call takes a while, so that
	// deliveries end one by one, as a destination's answers come.
	f.start(f.dispatcher(Config{PollInterval: time.Hour, Types: []EffectType{
		{Name: "busy", Provider: takes(100 * time.Millisecond), Concurrency: 32}}}))
	for i := range backlog {
		f.waitStatus(fmt.Sprintf("b%d", i), effect.StatusDelivered)
	}
	counter.mu.Lock()
	claims := counter.byType["busy"]
	counter.mu.Unlock()
	t.Logf("%d claims for %d deliveries", claims, backlog)
	if claims > backlog*3/4 {
		t.Fatalf("%d claims for %d deliveries of one tenant at its share", claims, backlog)
	}
}

// takes is a provider whose every call takes from nothing to twice d, drawn, then delivers.
type takes time.Duration

func (takes) Validate(json.RawMessage) error { return nil }

func (d takes) Deliver(ctx context.Context, _ providers.Delivery) providers.Outcome {
	select {
	case <-time.After(rand.N(2 * time.Duration(d))):
		return providers.Delivered(nil)
	case <-ctx.Done():
		return providers.Retry(ctx.Err())
	}
}

// An outbox that drained and was vacuumed keeps its pages with no row noted in them, and the planner believes
// it empty until the next ANALYZE (autovacuum's, a minute or more away; off here). A dispatcher whose claims
// come back full asks for that ANALYZE: a burst into such an outbox was recorded at 1.85 s a batch of
// outcomes in the fleet bench (deliveries fell from 1,800 a second to 100).
func TestADispatcherDrainingABurstHasAVacuumedEmptyOutboxAnalyzed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `ALTER TABLE oncegate_outbox SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	burst := func(prefix string, n int) {
		if _, err := f.pool.Exec(ctx, `WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 't', $1 || g, 'hook', '\x00', '{}', 'eff_' || $1 || g FROM generate_series(1, $2) g
			RETURNING id, type, tenant)
			INSERT INTO oncegate_outbox (effect_id, type, tenant) SELECT id, type, tenant FROM e`, prefix, n); err != nil {
			t.Fatal(err)
		}
	}
	burst("old", 5000)
	if _, err := f.pool.Exec(ctx, `DELETE FROM oncegate_outbox`); err != nil {
		t.Fatal(err)
	}
	// Claims coming and going keep autovacuum from truncating the table: TRUNCATE false.
	if _, err := f.pool.Exec(ctx, `VACUUM (TRUNCATE false, ANALYZE) oncegate_outbox`); err != nil {
		t.Fatal(err)
	}
	burst("new", 5000)
	noted := func() int {
		return pgtest.Count(t, f.pool, `SELECT reltuples::int FROM pg_class WHERE relname = 'oncegate_outbox'`)
	}
	if n := noted(); n != 0 {
		t.Fatalf("the outbox's statistics note %d rows before the burst is claimed; the test wants them empty", n)
	}
	// Slow calls, so that the backlog outlasts the first checks: Postgres shows a backend's counts of rows
	// changed only when it flushes them, up to seconds later.
	f.start(f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: takes(50 * time.Millisecond), Concurrency: 16}}}))
	testenv.Eventually(t, 30*time.Second, "the outbox analyzed", func() bool { return noted() > 1000 })
}
