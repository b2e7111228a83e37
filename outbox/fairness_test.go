package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers"
)

// hangsFor hangs every delivery of one tenant until its context ends (a destination that accepts and never
// answers) and delivers everyone else's at once.
type hangsFor struct {
	tenant  string
	hanging atomic.Int32
	most    atomic.Int32
	mu      sync.Mutex
}

func (h *hangsFor) Validate(json.RawMessage) error { return nil }

func (h *hangsFor) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	if d.Tenant != h.tenant {
		return providers.Delivered(nil)
	}
	n := h.hanging.Add(1)
	defer h.hanging.Add(-1)
	h.mu.Lock()
	h.most.Store(max(h.most.Load(), n))
	h.mu.Unlock()
	<-ctx.Done()
	return providers.Retry(ctx.Err())
}

// One tenant's destinations hanging take at most its share of a type's delivery slots: another tenant's
// effect of the same type is delivered at once, not after the hung calls time out. (The black-box run: 40
// hung ports of tenant beta held tenant alpha's webhook back 135 s.)
func TestOneTenantsHangingDestinationsLeaveSlotsForOthers(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Isolation",
		"Tenant beta's 40 effects to destinations that never answer, then one of tenant alpha's, same type",
		"alpha's is delivered at once; beta holds at most its share (tenant_concurrency) of the type's slots")
	f := newFixture(t)
	p := &hangsFor{tenant: "beta"}
	for i := range 40 {
		f.createFor("beta", "b"+strconv.Itoa(i), "hook", `{}`)
	}
	f.run(EffectType{Name: "hook", Provider: p, Concurrency: 4, Timeout: time.Hour})
	testenv.Eventually(t, 10*time.Second, "beta's deliveries to hang", func() bool { return p.hanging.Load() == 2 })
	f.createFor("alpha", "a", "hook", `{}`)
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, "alpha's effect delivered", func() bool {
		return f.getFor("alpha", "a").Status == effect.StatusDelivered
	})
	took := time.Since(start)
	if most := p.most.Load(); most > 2 {
		t.Fatalf("beta held %d of the type's 4 slots at once; its share is 2", most)
	}
	pending := 0
	for i := range 40 {
		e := f.getFor("beta", "b"+strconv.Itoa(i))
		if e.Attempts != 0 {
			t.Fatalf("beta's %s was charged %d attempts while it waited for a slot", e.Key, e.Attempts)
		}
		if e.Status == effect.StatusPending {
			pending++
		}
	}
	t.Logf("alpha delivered %v after it was requested; beta: 2 hanging, %d pending, uncharged", took, pending)
	result("alpha delivered in " + took.Round(10*time.Millisecond).String() + "; beta held 2 of 4 slots, 0 attempts charged")
}

// timedDelivery delivers every effect after a fixed delay, as a receiver a few milliseconds away, and notes
// when each key arrived.
type timedDelivery struct {
	delay time.Duration
	mu    sync.Mutex
	at    map[string]time.Time
}

func (p *timedDelivery) Validate(json.RawMessage) error { return nil }

func (p *timedDelivery) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	time.Sleep(p.delay)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at == nil {
		p.at = map[string]time.Time{}
	}
	p.at[d.Key] = time.Now()
	return providers.Delivered(nil)
}

// quietP99 creates n of tenant quiet's effects one at a time and returns the p99 of the time each took from
// its creation's commit to its delivery.
func (f *fixture) quietP99(p *timedDelivery, d *Dispatcher, phase string, n int) time.Duration {
	f.t.Helper()
	var lat []time.Duration
	for i := range n {
		key := phase + strconv.Itoa(i)
		f.createFor("quiet", key, "hook", `{}`)
		// From the commit: the claim's order is measured, not the time Postgres takes to insert beside the
		// noisy tenant's deliveries.
		t0 := time.Now()
		d.Wake()
		testenv.Eventually(f.t, 30*time.Second, "quiet's "+key+" delivered", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			_, ok := p.at[key]
			return ok
		})
		p.mu.Lock()
		lat = append(lat, p.at[key].Sub(t0))
		p.mu.Unlock()
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// Issue 31: one tenant's backlog of 100,000 effects of a type does not hold back another tenant's new
// effects of that type beyond twice what they take alone: claims go round the tenants with work. The
// per-tenant share of slots (tenant_concurrency) is off here, so that only the claim's order is measured.
func TestAQuietTenantIsNotQueuedBehindAnothersBacklog(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Isolation",
		"Tenant noisy's 100,000 effects waiting, then tenant quiet's new effects of the same type, one at a time",
		"quiet's effects not queued behind the backlog (p99 under 3 s, against a minute behind it); the ratio to alone logged")
	f := newFixture(t)
	p := &timedDelivery{delay: 10 * time.Millisecond}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 16, TenantConcurrency: 16}}})
	f.start(d)
	f.quietP99(p, d, "warm", 5) // the first claims plan their statements
	alone := f.quietP99(p, d, "alone", 50)
	if _, err := f.pool.Exec(context.Background(), `WITH e AS (
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
		SELECT 'noisy', 'n' || g, 'hook', '\x00', '{}', 'eff_n' || g FROM generate_series(1, 100000) g
		RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, tenant) SELECT id, type, tenant FROM e`); err != nil {
		t.Fatal(err)
	}
	d.Wake()
	busy := f.quietP99(p, d, "busy", 50)
	left := pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_outbox WHERE tenant = 'noisy'`)
	t.Logf("quiet p99 %v alone, %v beside noisy's backlog (%d of 100,000 still waiting)", alone, busy, left)
	if left < 50000 {
		t.Fatalf("noisy's backlog was mostly delivered (%d left) before quiet's were measured", left)
	}
	// Behind noisy's backlog, quiet's effects would wait for 100,000 deliveries of 10 ms at 16 at once: about
	// a minute. The bound is far from that and far above what a loaded machine adds (CI under -race saw 132 ms
	// against 58 ms alone); the ratio itself is a benchmark's (scripts/bench fleet), logged here.
	if busy > 3*time.Second {
		t.Fatalf("quiet's p99 %v beside noisy's backlog, %v alone: queued behind it", busy, alone)
	}
	result(fmt.Sprintf("quiet p99 %v alone, %v beside the backlog (%.2f×)", alone.Round(time.Millisecond),
		busy.Round(time.Millisecond), float64(busy)/float64(alone)))
}

// Issue 31, within a limited type: tenant noisy's backlog to one destination limited at 50 calls a second,
// then tenant quiet's new effects to the same destination. The destination's tokens go round the tenants
// with rows for it, so quiet's effects take about every other token; ordered by due time alone, they waited
// for the whole backlog at the limit's pace (2,000 rows: 40 s).
func TestAQuietTenantGetsItsShareOfALimitedDestination(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Isolation",
		"Tenant noisy's 2,000 effects to one destination limited at 50/s, then 20 of tenant quiet's to it",
		"quiet's 20 delivered within about 40 calls to the destination (every other token), not after noisy's 2,000")
	f := newFixture(t)
	backlog := func(tenant string, n int) {
		t.Helper()
		if _, err := f.pool.Exec(context.Background(), `WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT $1, $1 || g, 'hook', '\x00', '{"to": "a"}', 'eff_' || $1 || g FROM generate_series(1, $2) g
			RETURNING id, type, tenant)
			INSERT INTO oncegate_outbox (effect_id, type, tenant, destination) SELECT id, type, tenant, 'a' FROM e`,
			tenant, n); err != nil {
			t.Fatal(err)
		}
	}
	backlog("noisy", 2000)
	p := &routed{}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 16, TenantConcurrency: 16,
		Rate: &Rate{PerSecond: 50, Burst: 5}}}})
	f.start(d)
	testenv.Eventually(t, 30*time.Second, "noisy's first 50 calls", func() bool { return len(p.snapshot("a")) >= 50 })
	before := len(p.snapshot("a"))
	backlog("quiet", 20)
	d.Wake()
	delivered := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		n := 0
		for k := range p.keys {
			if strings.HasPrefix(k, "quiet") {
				n++
			}
		}
		return n
	}
	testenv.Eventually(t, 60*time.Second, "quiet's 20 delivered", func() bool { return delivered() == 20 })
	calls := len(p.snapshot("a")) - before
	left := pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_outbox WHERE tenant = 'noisy'`)
	t.Logf("quiet's 20 delivered within %d calls to a after they were written (%d of noisy's 2,000 waiting)", calls, left)
	// Round the tenants, quiet's 20 take about 40 calls (one of every two tokens, plus the rows claimed before
	// they came). Behind the backlog they would take 1,950. The bound is the correctness one: not queued.
	if calls > 80 {
		t.Fatalf("quiet's 20 effects took %d calls to the destination: queued behind noisy's backlog", calls)
	}
	result(fmt.Sprintf("quiet's 20 delivered within %d calls to the destination (20 alone, 40 at an even share)", calls))
}
