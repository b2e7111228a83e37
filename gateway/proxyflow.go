package gateway

// The dedup proxy's flow, apart from HTTP: which request performs an effect, which waits for another's
// attempt, and what each is answered. It keeps one promise above the others (docs/proxy.md): a request that
// waited for an attempt is never the one that performs again. Within one gateway the waiters get the ended
// attempt's own answer; across gateways the engine's fenced claim (outbox.Dispatcher.PerformExisting, by
// dedup.Store.ClaimEffect) refuses a waiter the row once the attempt it waited on has ended, so the promise
// does not depend on which process a request reached.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/outbox"
)

// proxyEngine is what the flow needs of the delivery engine: perform a new effect, perform an existing one
// if, and only if, this request is entitled to, and read an effect. outbox.Dispatcher and dedup.Store make
// the gateway's; the flow's tests use a fake that plays any interleaving.
type proxyEngine interface {
	PerformNew(ctx context.Context, ne dedup.NewEffect, fingerprint []byte, started func(dedup.Lease)) (outbox.Attempt, error)
	PerformExisting(ctx context.Context, typ string, id int64, fence *[16]byte, started func(dedup.Lease)) (outbox.Attempt, error)
	Get(ctx context.Context, tenant, key string) (*dedup.Effect, error)
}

// proxyOutcomeKind says what a proxied request came to.
type proxyOutcomeKind int

const (
	// performedHere: this request made the attempt (Performed): a terminal answer, or a transient one.
	performedHere proxyOutcomeKind = iota
	// replayedStored: the effect is terminal; its stored answer (Effect).
	replayedStored
	// sharedTransient: the attempt this request waited for ended transiently in this gateway; its answer
	// (Performed), which was not stored.
	sharedTransient
	// attemptEnded: the attempt this request waited for ended transiently elsewhere; the effect (Effect)
	// says when it is due again.
	attemptEnded
	// stillInFlight: the wait ran out while the attempt was in flight.
	stillInFlight
	// typePausedNow: an operator paused the type; nothing was sent.
	typePausedNow
	// effectGone: the effect was purged by retention while this request waited; the key is free.
	effectGone
	// clientGone: the client went away while waiting; nothing to answer.
	clientGone
	// failed: Err says why (a reused key, an unstorable request, the database).
	failed
)

// proxyOutcome is what a proxied request came to, for the handler to render.
type proxyOutcome struct {
	Kind      proxyOutcomeKind
	Performed *outbox.Performed
	Effect    *dedup.Effect
	Err       error
	// Created is set when this request recorded the effect.
	Created bool
}

// proxyFlow decides, for each unsafe proxied request, whether it performs, waits or replays.
type proxyFlow struct {
	engine proxyEngine
	// answers holds the transient answers of the attempts this gateway made, for their waiters here.
	answers *attempts
	// watch returns a channel closed when effect id may have changed (this gateway finished or shared an
	// attempt, or another gateway announced a terminal effect), and a function that forgets it; wake closes
	// them.
	watch func(id int64) (<-chan struct{}, func())
	wake  func(id int64)
	// recheck is how often a waiter looks again without being woken: the attempt may end pending in
	// another gateway, which announces nothing.
	recheck time.Duration
}

// run performs the request ne, new, or settles it against the effect its key holds: the stored answer, an
// attempt of its own when it is entitled to one, or the answer of the attempt it waited for, up to wait.
func (f *proxyFlow) run(ctx context.Context, ne dedup.NewEffect, fingerprint []byte, wait time.Duration) proxyOutcome {
	a, err := f.attempt(func(started func(dedup.Lease)) (outbox.Attempt, error) {
		return f.engine.PerformNew(ctx, ne, fingerprint, started)
	})
	switch {
	case errors.Is(err, dedup.ErrTypePaused):
		return proxyOutcome{Kind: typePausedNow}
	case err != nil:
		return proxyOutcome{Kind: failed, Err: err}
	case a.Performed != nil:
		return proxyOutcome{Kind: performedHere, Performed: a.Performed, Created: true}
	}
	return f.settle(ctx, a.Existing, wait)
}

// attempt runs one call into the engine that may perform, and brackets the attempt it makes: announced
// to this gateway's waiters under its lease token before the provider is called, and its transient answer,
// once recorded, shared before they are woken (a terminal one they read from the database).
func (f *proxyFlow) attempt(call func(started func(dedup.Lease)) (outbox.Attempt, error)) (outbox.Attempt, error) {
	var lease *dedup.Lease
	defer func() { // a panic in the provider included
		if lease != nil {
			f.answers.end(lease.Token)
			f.wake(lease.EffectID)
		}
	}()
	a, err := call(func(l dedup.Lease) {
		lease = &l
		f.answers.begin(l.Token)
	})
	// Only a recorded outcome is shared: an attempt whose gateway lost its lease meanwhile (paused past it)
	// has an answer that no replay repeats, and its waiters get what the effect comes to instead.
	if err == nil && a.Performed != nil && a.Performed.Recorded && !a.Performed.Status.Terminal() && lease != nil {
		f.answers.share(lease.Token, *a.Performed)
	}
	return a, err
}

// settle answers a request whose key holds the effect e already.
func (f *proxyFlow) settle(ctx context.Context, e *dedup.Effect, wait time.Duration) proxyOutcome {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	var fence *[16]byte // the lease of the attempt this request waits for, once it found one in flight
	for {
		if e.Status.Terminal() {
			return proxyOutcome{Kind: replayedStored, Effect: e}
		}
		a, err := f.attempt(func(started func(dedup.Lease)) (outbox.Attempt, error) {
			return f.engine.PerformExisting(ctx, e.Type, e.ID, fence, started)
		})
		switch {
		case errors.Is(err, dedup.ErrTypePaused):
			return proxyOutcome{Kind: typePausedNow}
		case err != nil:
			return proxyOutcome{Kind: failed, Err: err}
		case a.Performed != nil:
			return proxyOutcome{Kind: performedHere, Performed: a.Performed}
		}
		switch {
		case fence == nil && a.Holding != nil:
			fence = a.Holding // from now on this request waits for that attempt, and never makes one
		case fence != nil && (a.Holding == nil || *a.Holding != *fence):
			// The attempt it waited for ended: its own answer, when this gateway made it.
			if out, ok := f.shared(ctx, e, *fence, deadline.C); ok {
				return out
			}
			if a.Holding == nil {
				return f.ended(ctx, e) // handed back, or finished: what the effect came to
			}
			// Another attempt holds the row now: a dispatcher's retry, a fresh request's, or the rescue of
			// an attempt whose gateway died. The effect's answer is that attempt's to give: wait for it,
			// still never making one.
			fence = a.Holding
		}
		if !f.pause(ctx, e.ID, deadline.C) {
			if ctx.Err() != nil {
				return proxyOutcome{Kind: clientGone}
			}
			return proxyOutcome{Kind: stillInFlight, Effect: e}
		}
		next, out, ok := f.reread(ctx, e)
		if !ok {
			return out
		}
		e = next
	}
}

// shared returns the answer of the attempt under fence when this gateway made it and it ended transiently,
// waiting while that attempt is recorded but its answer not yet shared; ok is false when this gateway has no
// answer of it (another gateway's attempt, or one that ended terminal, whose answer is stored). A wait that
// ran out, or a client gone, is an outcome too.
func (f *proxyFlow) shared(ctx context.Context, e *dedup.Effect, fence [16]byte, deadline <-chan time.Time) (proxyOutcome, bool) {
	for {
		p, ok, performing := f.answers.answerOf(fence)
		if ok {
			return proxyOutcome{Kind: sharedTransient, Performed: &p, Effect: e}, true
		}
		if !performing {
			return proxyOutcome{}, false
		}
		if !f.pause(ctx, e.ID, deadline) {
			if ctx.Err() != nil {
				return proxyOutcome{Kind: clientGone}, true
			}
			return proxyOutcome{Kind: stillInFlight, Effect: e}, true
		}
	}
}

// ended answers a request whose awaited attempt ended with no attempt after it: the stored answer when the
// effect is terminal, else when it is due again.
func (f *proxyFlow) ended(ctx context.Context, e *dedup.Effect) proxyOutcome {
	next, out, ok := f.reread(ctx, e)
	if !ok {
		return out
	}
	if next.Status.Terminal() {
		return proxyOutcome{Kind: replayedStored, Effect: next}
	}
	return proxyOutcome{Kind: attemptEnded, Effect: next}
}

// pause waits until effect id may have changed or a recheck passes; false when the deadline or the
// request's context ended first.
func (f *proxyFlow) pause(ctx context.Context, id int64, deadline <-chan time.Time) bool {
	ch, forget := f.watch(id)
	defer forget()
	recheck := time.NewTimer(f.recheck)
	defer recheck.Stop()
	select {
	case <-ch:
	case <-recheck.C:
	case <-deadline:
		return false
	case <-ctx.Done():
		return false
	}
	return true
}

// reread reads e again; ok is false when the request is answered by out instead.
func (f *proxyFlow) reread(ctx context.Context, e *dedup.Effect) (*dedup.Effect, proxyOutcome, bool) {
	next, err := f.engine.Get(ctx, e.Tenant, e.Key)
	switch {
	case errors.Is(err, dedup.ErrNotFound):
		return nil, proxyOutcome{Kind: effectGone}, false
	case err != nil:
		return nil, proxyOutcome{Kind: failed, Err: err}, false
	}
	return next, proxyOutcome{}, true
}

// attempts keeps, for a minute, the answer of each attempt this gateway made that left its effect pending,
// by lease token, for the requests here that waited for that attempt; and which attempts are in flight, so
// that a waiter that sees one end before its answer is shared waits for the share.
type attempts struct {
	mu         sync.Mutex
	shared     map[[16]byte]sharedAttempt
	performing map[[16]byte]bool
}

type sharedAttempt struct {
	ended time.Time
	p     outbox.Performed
}

func (a *attempts) share(token [16]byte, p outbox.Performed) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.shared == nil {
		a.shared = map[[16]byte]sharedAttempt{}
	}
	now := time.Now()
	for k, v := range a.shared { // its waiters read an answer at once: older ones are nobody's
		if now.Sub(v.ended) > time.Minute {
			delete(a.shared, k)
		}
	}
	a.shared[token] = sharedAttempt{ended: now, p: p}
}

// answerOf returns the shared answer of the attempt under token, if this gateway made it; and whether that
// attempt is still between its start and the share of its answer here.
func (a *attempts) answerOf(token [16]byte) (p outbox.Performed, ok, performing bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.shared[token]
	return s.p, ok, a.performing[token]
}

func (a *attempts) begin(token [16]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.performing == nil {
		a.performing = map[[16]byte]bool{}
	}
	a.performing[token] = true
}

func (a *attempts) end(token [16]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.performing, token)
}
