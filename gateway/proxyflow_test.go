package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/providers"
)

// fakeEngine is one effect's row as dedup's statements keep it (status, lease token, whether the lease ran
// out), with the fenced claim's rule, so that the flow's tests can play any interleaving of requests,
// gateways and outcomes in milliseconds. The claim's SQL itself is tested on Postgres in dedup.
type fakeEngine struct {
	mu       sync.Mutex
	e        *dedup.Effect
	token    *[16]byte
	expired  bool
	paused   bool
	next     byte
	performs int
	// outcome is what an attempt comes to; it may block, to hold the attempt in flight.
	outcome func(l dedup.Lease) outbox.Performed
	// recorded, when set, runs after an attempt's outcome is recorded and before the engine returns it.
	recorded func()
	// afterClaim, when set, runs after each PerformExisting that performed nothing (another gateway acts).
	afterClaim func(n int)
	claims     int
	// waiting counts the claims that found an attempt in flight and had no fence yet: one per request that
	// starts to wait for another's attempt.
	waiting int
	// staleGet, when set, is what the next Get returns instead of the row (a read from before an outcome).
	staleGet *dedup.Effect
}

func newFakeEngine(status effect.Status) *fakeEngine {
	return &fakeEngine{e: &dedup.Effect{ID: 7, Tenant: "acme", Key: "k", Type: "payments", Status: status}}
}

func (f *fakeEngine) lease() [16]byte {
	f.next++
	return [16]byte{f.next}
}

// holdBy puts the row in another holder's attempt, as another gateway's claim would.
func (f *fakeEngine) holdBy() [16]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.lease()
	f.token, f.expired, f.e.Status = &t, false, effect.StatusDelivering
	return t
}

// endTransiently ends the attempt in flight elsewhere, pending, as another gateway's Reschedule would.
func (f *fakeEngine) endTransiently() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.token, f.e.Status, f.e.Attempts = nil, effect.StatusPending, f.e.Attempts+1
	next := time.Now().Add(time.Minute)
	f.e.NextAttemptAt = &next
}

func (f *fakeEngine) PerformNew(ctx context.Context, ne dedup.NewEffect, _ []byte, started func(dedup.Lease)) (outbox.Attempt, error) {
	f.mu.Lock()
	if f.e != nil {
		e := *f.e
		f.mu.Unlock()
		return outbox.Attempt{Existing: &e, Replayed: true}, nil
	}
	f.e = &dedup.Effect{ID: 7, Tenant: ne.Tenant, Key: ne.Key, Type: ne.Type, Status: effect.StatusDelivering}
	return f.perform(started), nil
}

func (f *fakeEngine) PerformExisting(ctx context.Context, _ string, _ int64, fence *[16]byte, started func(dedup.Lease)) (outbox.Attempt, error) {
	f.mu.Lock()
	f.claims++
	n := f.claims
	terminal := f.e.Status.Terminal()
	free := !terminal && (f.token == nil || f.expired) && (fence == nil || (f.token != nil && *f.token == *fence))
	if free && f.paused {
		f.mu.Unlock()
		return outbox.Attempt{}, dedup.ErrTypePaused
	}
	if !free {
		var holding *[16]byte
		if !terminal && f.token != nil {
			t := *f.token
			holding = &t
			if fence == nil {
				f.waiting++
			}
		}
		f.mu.Unlock()
		if f.afterClaim != nil {
			f.afterClaim(n)
		}
		return outbox.Attempt{Holding: holding}, nil
	}
	return f.perform(started), nil
}

// perform runs an attempt under a new lease; f.mu is held on entry.
func (f *fakeEngine) perform(started func(dedup.Lease)) outbox.Attempt {
	t := f.lease()
	f.token, f.expired, f.e.Status = &t, false, effect.StatusDelivering
	f.performs++
	l := dedup.Lease{EffectID: f.e.ID, Token: t}
	f.mu.Unlock()
	started(l)
	p := f.outcome(l)
	f.mu.Lock()
	if f.token != nil && *f.token == t {
		f.token, f.e.Status = nil, p.Status
		if p.Status.Terminal() {
			f.e.Result = p.Finish.Result
		}
	}
	f.mu.Unlock()
	if f.recorded != nil {
		f.recorded()
	}
	return outbox.Attempt{Performed: &p, Lease: l}
}

func (f *fakeEngine) Get(context.Context, string, string) (*dedup.Effect, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.staleGet != nil {
		e := f.staleGet
		f.staleGet = nil
		return e, nil
	}
	if f.e == nil {
		return nil, dedup.ErrNotFound
	}
	e := *f.e
	return &e, nil
}

func (f *fakeEngine) performed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.performs
}

func transient503(dedup.Lease) outbox.Performed {
	return outbox.Performed{Attempted: true, Status: effect.StatusPending, Recorded: true,
		Outcome: providers.Outcome{Kind: providers.KindRetry, Result: json.RawMessage(`{"status":503}`)}}
}

func delivered201(dedup.Lease) outbox.Performed {
	return outbox.Performed{Attempted: true, Status: effect.StatusDelivered, Recorded: true,
		Finish: dedup.Finish{Status: effect.StatusDelivered, Result: json.RawMessage(`{"status":201}`)}}
}

// flowOn is a gateway's flow over the engine; flows made over one attempts and waiters are one gateway's.
func flowOn(eng proxyEngine, answers *attempts, w *waiters) *proxyFlow {
	return &proxyFlow{engine: eng, answers: answers, watch: w.add, wake: w.wake, recheck: 2 * time.Millisecond}
}

var flowRequest = dedup.NewEffect{Tenant: "acme", Key: "k", Type: "payments", Payload: json.RawMessage(`{}`)}

// The finding: a request waits in gateway B for gateway A's attempt; B reads the effect as delivering; A's
// attempt ends transiently; B's next claim must not take the row, whatever B last read.
func TestProxyFlowWaiterWhoseAttemptEndedElsewhereNeverPerforms(t *testing.T) {
	t.Parallel()
	for _, then := range []string{"handed back", "leased anew by a dispatcher"} {
		t.Run(then, func(t *testing.T) {
			eng := newFakeEngine(effect.StatusDelivering)
			eng.outcome = delivered201
			eng.holdBy()
			stale := *eng.e
			eng.afterClaim = func(n int) {
				switch {
				case n == 1: // B found A's attempt in flight; now A's attempt ends
					eng.endTransiently()
					if then == "leased anew by a dispatcher" {
						eng.holdBy()
					}
					eng.staleGet = &stale // and B's next read is from before that
				case n == 2 && then == "leased anew by a dispatcher":
					// B follows the dispatcher's attempt, which ends transiently too.
					eng.endTransiently()
				}
			}
			out := flowOn(eng, &attempts{}, newWaiters()).run(context.Background(), flowRequest, nil, time.Second)
			if out.Kind != attemptEnded || eng.performed() != 0 {
				t.Fatalf("outcome %d, %d attempts made by the waiter", out.Kind, eng.performed())
			}
		})
	}
}

// A waiter whose awaited attempt never ended (its holder died, the lease ran out) may rescue it: that
// attempt's answer will never come, and nobody else performed since.
func TestProxyFlowWaiterRescuesTheAttemptWhoseHolderDied(t *testing.T) {
	t.Parallel()
	eng := newFakeEngine(effect.StatusDelivering)
	eng.outcome = delivered201
	eng.holdBy()
	eng.afterClaim = func(n int) {
		eng.mu.Lock()
		eng.expired = true
		eng.mu.Unlock()
	}
	out := flowOn(eng, &attempts{}, newWaiters()).run(context.Background(), flowRequest, nil, time.Second)
	if out.Kind != performedHere || eng.performed() != 1 {
		t.Fatalf("outcome %d, %d attempts", out.Kind, eng.performed())
	}
}

// Within one gateway, the waiters get the ended attempt's own answer, also when a waiter sees the attempt
// end (its claim finds the row handed back) before that answer is shared.
func TestProxyFlowWaitersInOneGatewayShareTheAnswer(t *testing.T) {
	t.Parallel()
	eng := newFakeEngine(effect.StatusPending)
	eng.e = nil
	release, claimedAfterEnd := make(chan struct{}), make(chan struct{})
	eng.outcome = func(dedup.Lease) outbox.Performed { <-release; return transient503(dedup.Lease{}) }
	var once sync.Once
	eng.recorded = func() { <-claimedAfterEnd } // recorded, not yet shared: hold until a waiter saw the end
	eng.afterClaim = func(n int) {
		eng.mu.Lock()
		ended := eng.token == nil
		eng.mu.Unlock()
		if ended {
			once.Do(func() { close(claimedAfterEnd) })
		}
	}
	answers, w := &attempts{}, newWaiters()
	first := make(chan proxyOutcome)
	go func() { first <- flowOn(eng, answers, w).run(context.Background(), flowRequest, nil, time.Second) }()
	for eng.performed() == 0 {
		time.Sleep(time.Millisecond)
	}
	outs := make([]proxyOutcome, 5)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() { outs[i] = flowOn(eng, answers, w).run(context.Background(), flowRequest, nil, time.Second) })
	}
	// Every waiter waits for the attempt before it ends (under CI's load, 10 ms was not always enough for the
	// five to start, and the late ones made attempts of their own).
	for {
		eng.mu.Lock()
		n := eng.waiting
		eng.mu.Unlock()
		if n >= len(outs) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if o := <-first; o.Kind != performedHere {
		t.Fatalf("the performing request: %d", o.Kind)
	}
	for i, o := range outs {
		if o.Kind != sharedTransient || o.Performed == nil || string(o.Performed.Outcome.Result) != `{"status":503}` {
			t.Errorf("waiter %d: %+v", i, o)
		}
	}
	if n := eng.performed(); n != 1 {
		t.Fatalf("%d attempts", n)
	}
}

// An attempt whose outcome was not recorded (its gateway paused past its lease, another took the effect
// over) shares nothing: its waiters here follow the attempt that took over, and get what that comes to.
func TestProxyFlowAnUnrecordedAnswerIsNotShared(t *testing.T) {
	t.Parallel()
	eng := newFakeEngine(effect.StatusPending)
	eng.e = nil
	release := make(chan struct{})
	var rescue [16]byte
	eng.outcome = func(l dedup.Lease) outbox.Performed {
		<-release
		// Meanwhile the lease ran out and another gateway rescued the effect: it holds the row now.
		rescue = eng.holdBy()
		p := transient503(l)
		p.Recorded = false
		return p
	}
	answers, w := &attempts{}, newWaiters()
	first := make(chan proxyOutcome)
	go func() { first <- flowOn(eng, answers, w).run(context.Background(), flowRequest, nil, time.Second) }()
	for eng.performed() == 0 {
		time.Sleep(time.Millisecond)
	}
	eng.afterClaim = func(int) {
		eng.mu.Lock()
		defer eng.mu.Unlock()
		if eng.token != nil && *eng.token == rescue { // the rescue ends: the effect is delivered
			eng.token, eng.e.Status, eng.e.Result = nil, effect.StatusDelivered, json.RawMessage(`{"status":201}`)
		}
	}
	waiter := make(chan proxyOutcome)
	go func() { waiter <- flowOn(eng, answers, w).run(context.Background(), flowRequest, nil, time.Second) }()
	time.Sleep(10 * time.Millisecond)
	close(release)
	<-first
	if o := <-waiter; o.Kind != replayedStored || string(o.Effect.Result) != `{"status":201}` {
		t.Fatalf("the waiter got %+v", o)
	}
	if n := eng.performed(); n != 1 {
		t.Fatalf("%d attempts", n)
	}
}

// A wait that runs out while the attempt is in flight is answered as in flight, and performs nothing; a
// terminal effect is its stored answer; a paused type performs nothing.
func TestProxyFlowInFlightTerminalAndPaused(t *testing.T) {
	t.Parallel()
	eng := newFakeEngine(effect.StatusDelivering)
	eng.holdBy()
	if out := flowOn(eng, &attempts{}, newWaiters()).run(context.Background(), flowRequest, nil, 20*time.Millisecond); out.Kind != stillInFlight || eng.performed() != 0 {
		t.Fatalf("in flight: %d, %d attempts", out.Kind, eng.performed())
	}
	eng = newFakeEngine(effect.StatusDelivered)
	if out := flowOn(eng, &attempts{}, newWaiters()).run(context.Background(), flowRequest, nil, time.Second); out.Kind != replayedStored || eng.performed() != 0 {
		t.Fatalf("terminal: %d", out.Kind)
	}
	eng = newFakeEngine(effect.StatusPending)
	eng.paused = true
	if out := flowOn(eng, &attempts{}, newWaiters()).run(context.Background(), flowRequest, nil, time.Second); out.Kind != typePausedNow || eng.performed() != 0 {
		t.Fatalf("paused: %d", out.Kind)
	}
	// A request that waited for nothing performs an effect that waits for a retry.
	eng = newFakeEngine(effect.StatusPending)
	eng.outcome = delivered201
	if out := flowOn(eng, &attempts{}, newWaiters()).run(context.Background(), flowRequest, nil, time.Second); out.Kind != performedHere || eng.performed() != 1 {
		t.Fatalf("pending: %d", out.Kind)
	}
	// A client that goes away while it waits is answered nothing.
	eng = newFakeEngine(effect.StatusDelivering)
	eng.holdBy()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if out := flowOn(eng, &attempts{}, newWaiters()).run(ctx, flowRequest, nil, time.Second); out.Kind != clientGone {
		t.Fatalf("client gone: %d", out.Kind)
	}
	// An engine error is the request's.
	boom := errors.New("boom")
	if out := flowOn(errEngine{boom}, &attempts{}, newWaiters()).run(context.Background(), flowRequest, nil, time.Second); out.Kind != failed || !errors.Is(out.Err, boom) {
		t.Fatalf("error: %+v", out)
	}
}

type errEngine struct{ err error }

func (e errEngine) PerformNew(context.Context, dedup.NewEffect, []byte, func(dedup.Lease)) (outbox.Attempt, error) {
	return outbox.Attempt{}, e.err
}

func (e errEngine) PerformExisting(context.Context, string, int64, *[16]byte, func(dedup.Lease)) (outbox.Attempt, error) {
	return outbox.Attempt{}, e.err
}

func (e errEngine) Get(context.Context, string, string) (*dedup.Effect, error) { return nil, e.err }
