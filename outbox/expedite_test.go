package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers"
)

// createdFor creates an effect of tenant's and returns it as its gateway tells its dispatcher.
func (f *fixture) createdFor(tenant, key, typ, payload string) NewEffect {
	f.t.Helper()
	e, _, err := f.store.Create(context.Background(), dedup.NewEffect{Tenant: tenant, Key: key, Type: typ,
		Payload: json.RawMessage(payload)})
	if err != nil {
		f.t.Fatal(err)
	}
	return NewEffect{ID: e.ID, Tenant: tenant, Key: key, Type: typ, Stable: e.StableID, CreatedAt: e.CreatedAt,
		Payload: json.RawMessage(payload)}
}

// held delivers once release is closed, and keeps the deliveries started.
type held struct {
	release chan struct{}
	mu      sync.Mutex
	started []string
	got     []providers.Delivery
}

func (p *held) Validate(json.RawMessage) error { return nil }

func (p *held) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	p.mu.Lock()
	p.started = append(p.started, d.Key)
	p.got = append(p.got, d)
	p.mu.Unlock()
	select {
	case <-p.release:
	case <-ctx.Done():
		return providers.Retry(ctx.Err())
	}
	return providers.Delivered(nil)
}

func (p *held) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.started)
}

// Issue 31: the gateway that created an effect claims it by its ID and delivers it, without a round of the
// claim loop, when its tenant has nothing of the type in flight there. The claim loop here never wakes (a poll
// of an hour, no notification): what is delivered was claimed directly. A second effect of a tenant with a
// delivery in flight, and an effect of a limited type, are the claim loop's.
func TestANewEffectOfAQuietTenantIsClaimedByItsID(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := &held{release: make(chan struct{})}
	d := f.dispatcher(Config{PollInterval: time.Hour, Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 4}}})
	f.start(d)
	// A limited type's claim loop wakes for its tokens: a dispatcher of its own.
	limited := f.dispatcher(Config{PollInterval: time.Hour, Types: []EffectType{
		{Name: "limited", Provider: p, Concurrency: 4, Rate: &Rate{PerSecond: 100}}}})
	f.start(limited)
	waitSignal(t, &d.signals.claimRound, 1, 10*time.Second, "the claim loop's first round")
	waitSignal(t, &limited.signals.claimRound, 1, 10*time.Second, "the limited type's first claim round")

	if !d.Created(f.createdFor("a", "a1", "hook", `{"event": "e",  "data": {"n": 1}}`)) {
		t.Fatal("the first effect of tenant a, with nothing in flight, was not claimed directly")
	}
	testenv.Eventually(t, 10*time.Second, "a1's delivery to start", func() bool { return p.count() == 1 })
	if d.Created(f.createdFor("a", "a2", "hook", `{}`)) {
		t.Fatal("a second effect of tenant a, whose first is in flight, was claimed directly")
	}
	if !d.Created(f.createdFor("b", "b1", "hook", `{}`)) {
		t.Fatal("tenant b's first effect, beside tenant a's delivery in flight, was not claimed directly")
	}
	if limited.Created(f.createdFor("c", "c1", "limited", `{}`)) {
		t.Fatal("an effect of a limited type was claimed directly: its tokens are the claim loop's to take")
	}
	testenv.Eventually(t, 10*time.Second, "b1's delivery to start", func() bool { return p.count() == 2 })
	// A direct claim delivers from what the request had: the same as a claim would read back.
	a1 := f.getFor("a", "a1")
	p.mu.Lock()
	got := p.got[0]
	p.mu.Unlock()
	if got.Key != "a1" || got.Tenant != "a" || got.StableID != a1.StableID || got.Attempt != 1 || got.Rescued ||
		!got.CreatedAt.Equal(a1.CreatedAt) ||
		string(got.Payload) != `{"event": "e",  "data": {"n": 1}}` {
		t.Fatalf("a1 delivered as %+v; stored stable id %s", got, a1.StableID)
	}
	close(p.release)
	f.waitStatusFor("a", "a1", effect.StatusDelivered)
	f.waitStatusFor("b", "b1", effect.StatusDelivered)
	// The claim loop was never woken: a2 waits for it, unattempted.
	time.Sleep(200 * time.Millisecond)
	if e := f.getFor("a", "a2"); e.Status != effect.StatusPending || e.Attempts != 0 {
		t.Fatalf("a2 is %s after %d attempts; want pending for the claim loop", e.Status, e.Attempts)
	}
	if n := directClaims(t, d); n != 2 {
		t.Fatalf("oncegate_direct_claims_total{result=claimed} = %v; want 2", n)
	}
}

// A direct claim races the claim loop (woken for the same rows) and other dispatchers: every effect is
// delivered once, whoever claims it.
func TestDirectClaimsAndClaimLoopsDeliverEachEffectOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := &routed{}
	typ := EffectType{Name: "hook", Provider: p, Concurrency: 8}
	d := f.run(typ)
	other := f.run(typ)
	const tenants, each = 40, 5
	var wg sync.WaitGroup
	for i := range tenants {
		tenant := "t" + strconv.Itoa(i)
		wg.Go(func() {
			for j := range each {
				key := fmt.Sprintf("%s-%d", tenant, j)
				if !d.Created(f.createdFor(tenant, key, "hook", `{"to": "x"}`)) {
					d.WakeType("hook")
				}
				other.WakeType("hook")
			}
		})
	}
	wg.Wait()
	testenv.Eventually(t, 30*time.Second, "every effect delivered", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.keys) == tenants*each
	})
	time.Sleep(300 * time.Millisecond) // a delivery twice would be under way by now
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, n := range p.keys {
		if n != 1 {
			t.Fatalf("%s delivered %d times", k, n)
		}
	}
	direct := directClaims(t, d)
	t.Logf("%d effects, each delivered once; %v claimed directly", tenants*each, direct)
	if direct == 0 {
		t.Fatal("no effect was claimed directly")
	}
}

func (f *fixture) waitStatusFor(tenant, key string, s effect.Status) {
	f.t.Helper()
	testenv.Eventually(f.t, 10*time.Second, "effect "+key+" reaches "+string(s), func() bool {
		return f.getFor(tenant, key).Status == s
	})
}

// directClaims reads oncegate_direct_claims_total{type="hook", result="claimed"}.
func directClaims(t *testing.T, d *Dispatcher) float64 {
	t.Helper()
	return directResults(t, d, "claimed")
}

func directResults(t *testing.T, d *Dispatcher, result string) float64 {
	t.Helper()
	var m dto.Metric
	if err := d.metrics.Direct.WithLabelValues("hook", result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A new effect of a paused type is not claimed directly: it waits, uncharged, and the direct claim counts it
// as paused (not as taken by another claim, which an operator would go looking for). The claim loop, woken,
// delivers it once the type is resumed.
func TestADirectClaimLeavesAPausedTypesEffectWaiting(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := &routed{}
	d := f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 4}}})
	f.start(d)
	waitSignal(t, &d.signals.claimRound, 1, 10*time.Second, "the claim loop's first round")
	ctx := context.Background()
	if _, err := f.store.PauseType(ctx, "hook", "test", "paused for the test"); err != nil {
		t.Fatal(err)
	}
	if !d.Created(f.createdFor("a", "a1", "hook", `{"to": "x"}`)) {
		t.Fatal("tenant a's first effect was not taken on")
	}
	testenv.Eventually(t, 10*time.Second, "the direct claim to count a pause", func() bool {
		return directResults(t, d, "paused") == 1
	})
	if taken, claimed := directResults(t, d, "taken"), directClaims(t, d); taken != 0 || claimed != 0 {
		t.Fatalf("a paused type's effect counted taken %v, claimed %v; want 0, 0", taken, claimed)
	}
	time.Sleep(200 * time.Millisecond)
	if e := f.getFor("a", "a1"); e.Status != effect.StatusPending || e.Attempts != 0 {
		t.Fatalf("a1 is %s after %d attempts while its type is paused; want pending, 0", e.Status, e.Attempts)
	}
	if _, err := f.store.ResumeType(ctx, "hook"); err != nil {
		t.Fatal(err)
	}
	d.WakeType("hook") // as the resume's notification does
	f.waitStatusFor("a", "a1", effect.StatusDelivered)
}
