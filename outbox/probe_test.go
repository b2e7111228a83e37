package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers"
)

// throttling answers 429 with Retry-After to every call until open, then delivers, and notes each call; each
// answer takes 50 ms.
type throttling struct {
	mu    sync.Mutex
	open  time.Time // zero: set to first + throttleFor at the first call
	first time.Time
	calls []time.Time
	keys  map[string]int
	for_  time.Duration
	after time.Duration
	// hangFrom and hangTo, after the first call, bound the calls that get no answer: they wait out their
	// timeout.
	hangFrom, hangTo time.Duration
}

func (p *throttling) Validate(json.RawMessage) error { return nil }

// Destination is "a", as the fixture's backlog names it in the outbox.
func (p *throttling) Destination(json.RawMessage) string { return "a" }

func (p *throttling) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	// A receiver takes a while to answer: the calls made meanwhile do not know what it will say.
	defer time.Sleep(50 * time.Millisecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.first.IsZero() {
		p.first, p.open, p.keys = now, now.Add(p.for_), map[string]int{}
	}
	p.calls = append(p.calls, now)
	if at := now.Sub(p.first); at >= p.hangFrom && at < p.hangTo {
		p.mu.Unlock()
		<-ctx.Done()
		p.mu.Lock()
		return providers.Outcome{Kind: providers.KindRetry, MaybeSent: true, Err: ctx.Err()}
	}
	if now.Before(p.open) {
		o := providers.RetryAfter(p.after, fmt.Errorf("429"))
		o.Throttled = 429
		return o
	}
	p.keys[d.Key]++
	return providers.Delivered(nil)
}

// callsIn returns the calls made from from to to after first, as offsets from first.
func callsIn(first time.Time, calls []time.Time, from, to time.Duration) []time.Duration {
	var in []time.Duration
	for _, c := range calls {
		if at := c.Sub(first); at >= from && at < to {
			in = append(in, at)
		}
	}
	return in
}

func (p *throttling) snapshot() (time.Time, []time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first, append([]time.Time(nil), p.calls...)
}

// A pause's end is one call, not every row that waited for it at once: the first row's call (the probe) asks
// the destination whether it is ready, and the rest go only once it did not ask to wait again. Two
// dispatchers share the pause, and one of them makes each probe. Before, the end of the pause let every
// gateway claim every row in the same instant: an outside test saw 7 calls within 5 ms, and 10 of 31 rows
// charged an attempt by a receiver that still throttled.
// The same holds for a limited type, whose rows that waited then go at the type's rate.
func TestAPausesEndIsOneCallNotAllItsRows(t *testing.T) {
	t.Parallel()
	for name, rate := range map[string]*Rate{"unlimited": nil, "limited": {PerSecond: 100, Burst: 8}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pauseEndsWithOneCall(t, rate)
		})
	}
}

func pauseEndsWithOneCall(t *testing.T, rate *Rate) {
	f := newFixture(t)
	f.backlog("hook", "a", 30)
	// Throttled for 1.5 s, asking for 1 s each time: the pause set by the first calls ends at 1 s, when one
	// call asks again and is told to wait another second; at 2 s the next one is let through, and so are the
	// rest after it.
	p := &throttling{for_: 1500 * time.Millisecond, after: time.Second}
	for range 2 {
		f.start(f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 4,
			Timeout: 5 * time.Second, Rate: rate}}}))
	}
	testenv.Eventually(t, 30*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`) == 30
	})
	first, calls := p.snapshot()
	burst := len(callsIn(first, calls, 0, 500*time.Millisecond)) // the first claims', in flight as the first 429 came
	probes := callsIn(first, calls, 500*time.Millisecond, 1900*time.Millisecond)
	t.Logf("%d calls: %d in the first half second, then %v before the second pause's end", len(calls), burst, probes)
	if len(probes) != 1 {
		t.Fatalf("%d calls between the first pause's end and the second's (at %v), want its one probe", len(probes), probes)
	}
	if probes[0] < time.Second || probes[0] > 1300*time.Millisecond {
		t.Fatalf("the probe went %v after the first 429, which asked for 1 s", probes[0])
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, n := range p.keys {
		if n != 1 {
			t.Fatalf("%s delivered %d times", k, n)
		}
	}
	// The rows that waited were not charged for the end of the pause: only the calls that got a 429 count.
	if n := pgtest.Count(t, f.pool, `SELECT coalesce(sum(attempts), 0) FROM oncegate_effects`); n != len(calls) {
		t.Fatalf("%d attempts charged for %d calls", n, len(calls))
	}
	if n := pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_destination_pauses`); n != 0 {
		t.Fatalf("%d pauses left after the probe's delivery lifted it", n)
	}
}

// A gateway that took a pause's probe and died leaves it to the next once the probe's lease has run out: the
// rows stay held until then, and one call goes first as for any probe.
func TestAProbeWhoseGatewayDiedIsTakenAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.backlog("hook", "a", 5)
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO oncegate_destination_pauses (type, destination,
		tenant, until, held_until, status, paused_by, paused_at, probe_token, probe_lease, prober)
		VALUES ('hook', 'a', 't', now() - interval '1 second', now() + interval '1 hour', 429, 'dead', now(),
			gen_random_uuid(), now() + interval '1500 milliseconds', 'dead')`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := &routed{}
	f.start(f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 4}}}))
	testenv.Eventually(t, 30*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`) == 5
	})
	calls := p.snapshot("a")
	t.Logf("first call %v after the start, last %v", calls[0].Sub(start), calls[len(calls)-1].Sub(start))
	if calls[0].Sub(start) < 1400*time.Millisecond {
		t.Fatalf("the destination was called %v after the start, while the dead gateway's probe held its rows",
			calls[0].Sub(start))
	}
	if n := pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_destination_pauses`); n != 0 {
		t.Fatalf("%d pauses left after the second probe's delivery", n)
	}
}

// A probe that gets no answer (its call times out) leaves the destination paused, as long as the last pause,
// as a breaker's failed probe does: lifted, it let every waiting row go at once into a destination that still
// throttled (an outside test: 15 calls within 7 ms, each charged a 429).
func TestAProbeWithNoAnswerPausesAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.backlog("hook", "a", 20)
	// The first calls get 429 Retry-After: 1 s; the probe at 1 s hangs until its 300 ms timeout; the destination
	// is paused again for 1 s, and the probe after that is delivered.
	p := &throttling{for_: 900 * time.Millisecond, after: time.Second, hangFrom: 900 * time.Millisecond,
		hangTo: 1600 * time.Millisecond}
	for range 2 {
		f.start(f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 4,
			Timeout: 300 * time.Millisecond}}}))
	}
	testenv.Eventually(t, 30*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`) == 20
	})
	first, calls := p.snapshot()
	mid := callsIn(first, calls, 500*time.Millisecond, 2200*time.Millisecond)
	t.Logf("%d calls; between the first pause's end and the second's: %v", len(calls), mid)
	if len(mid) != 1 {
		t.Fatalf("%d calls between the first pause's end and the end of the pause its unanswered probe set (at %v), "+
			"want the probe alone", len(mid), mid)
	}
}

// A pause whose end passed long ago with no probe taken (an operator paused the type meanwhile, or the fleet
// was down) still ends with one call: its rows stay held until a probe's answer. With a hold of ten seconds
// past the pause's end, an outside test's held rows all went at once into a failing receiver when the
// operator resumed the type 13 s on, and when a fleet stopped for 16 s came back.
func TestAPauseLongEndedStillEndsWithOneCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.backlog("hook", "a", 20)
	// 429 with Retry-After: 1 s to the first calls; delivered once the type is resumed 12 s on.
	p := &throttling{for_: 500 * time.Millisecond, after: time.Second}
	for range 2 {
		f.start(f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 4,
			Timeout: 5 * time.Second}}}))
	}
	testenv.Eventually(t, 10*time.Second, "the pause", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_destination_pauses`) == 1
	})
	if _, err := f.store.PauseType(context.Background(), "hook", "operator alice", "test"); err != nil {
		t.Fatal(err)
	}
	first, _ := p.snapshot()
	time.Sleep(time.Until(first.Add(12 * time.Second)))
	resumed := time.Now()
	if _, err := f.store.ResumeType(context.Background(), "hook"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`) == 20
	})
	_, calls := p.snapshot()
	var after []time.Time
	for _, c := range calls {
		if c.After(resumed) {
			after = append(after, c)
		}
	}
	var together []time.Duration
	for _, c := range after {
		if c.Sub(after[0]) < 40*time.Millisecond {
			together = append(together, c.Sub(resumed))
		}
	}
	t.Logf("first call %v after the type's resume; within 40 ms of it: %v", after[0].Sub(resumed), together)
	if len(together) != 1 {
		t.Fatalf("%d calls within 40 ms of the first after the resume (at %v), want the probe alone", len(together), together)
	}
}

// A probe's call is neither refused nor counted by its gateway's breaker: a destination that fails its probes
// is paused again at each (TestAProbeWithNoAnswerPausesAgain), and once it recovers the rows go at once.
// Counted, the failed probes opened every gateway's breaker (here at the first failure), and the probes then
// stopped for the breakers' open period: an outside test's rows went 30 s after the receiver had recovered.
func TestFailedProbesDoNotOpenTheBreaker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.backlog("hook", "a", 20)
	// 429 for 1 s at first; the probes of the next 1.5 s get no answer (their 300 ms timeout); then delivered.
	p := &throttling{for_: 500 * time.Millisecond, after: time.Second, hangFrom: 500 * time.Millisecond,
		hangTo: 2 * time.Second}
	start := time.Now()
	f.start(f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: p, Concurrency: 4,
		Timeout: 300 * time.Millisecond, BreakerFailures: 1, BreakerOpenFor: time.Minute}}}))
	testenv.Eventually(t, 20*time.Second, "every effect delivered, well within the breaker's minute", func() bool {
		return pgtest.Count(t, f.pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`) == 20
	})
	t.Logf("every effect delivered %v after the start", time.Since(start).Round(10*time.Millisecond))
}
