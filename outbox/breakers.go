package outbox

import (
	"container/list"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/oncegate/oncegate/providers"
)

// A circuit breaker guards one destination of one tenant for one effect type (SPEC §4: "breakers per
// destination"). The tenant is part of the key because two tenants may send to one host (the type's default
// URL, or two paths of one allowed host) and one of them may be the cause of its failures: a receiver that
// answers 500 to beta's payloads says nothing about alpha's, and a breaker both shared would let beta hold
// alpha's deliveries back (SPEC §2: "no shared breaker"). The price is that a host that is down for everyone
// is probed by each tenant, BreakerFailures calls per tenant before its breakers open, which configured
// tenants keep small.
//
// A tenant can name any number of hosts (a payload url on "*.example.com"), so breakers are bounded: those
// of one type and tenant are kept in least-recently-used order, at most MaxBreakers of them; a new
// destination beyond that evicts the least recently used breaker that is closed and idle, and when every one
// is open or busy it shares that type and tenant's overflow breaker (OverflowDestination), which only that
// tenant's rows use. A breaker unused for BreakerIdle is forgotten whatever its state: no row has waited on
// it for that long, so nothing waits on what it knew. The metrics follow: a forgotten breaker's series is
// deleted.

// OverflowDestination names the breaker shared by one type and tenant's destinations beyond MaxBreakers.
const OverflowDestination = "(overflow)"

// minRefusedWait is the least a refused row waits, so that a breaker whose probe overran its time (a
// provider that ignores its context) cannot make rows come back at once.
const minRefusedWait = 250 * time.Millisecond

type breakerKey struct{ typ, tenant, dest string }

type groupKey struct{ typ, tenant string }

// breaker is one destination's circuit breaker and what the dispatcher needs of it beyond gobreaker: when
// its rows may next be tried.
type breaker struct {
	key      breakerKey
	cb       *gobreaker.CircuitBreaker[providers.Outcome]
	inflight atomic.Int32 // calls through cb now; a busy breaker is never evicted

	// Guarded by breakerSet.mu.
	elem     *list.Element
	lastUsed time.Time

	// mu guards the fields below. gobreaker calls OnStateChange with its own lock held, and that takes mu:
	// so mu is never held while calling cb.
	mu         sync.Mutex
	state      gobreaker.State
	openUntil  time.Time // open: when it lets a probe through
	callsUntil time.Time // the latest that a call through it can end: its start plus the type's timeout
	evicted    bool
}

// noteCall records a call starting now, which its context ends by end at the latest.
func (b *breaker) noteCall(end time.Time) {
	b.mu.Lock()
	if end.After(b.callsUntil) {
		b.callsUntil = end
	}
	b.mu.Unlock()
}

// refusedWait is how long a row refused by b waits before it is claimed again: until the open breaker lets a
// probe through, or until the half-open breaker's probe in flight has ended at the latest, plus a jitter of
// up to a quarter of the open period, so that the rows held back do not all come due at one instant ahead of
// other tenants' rows of the type.
func (b *breaker) refusedWait(now time.Time, open bool, openFor time.Duration) time.Duration {
	b.mu.Lock()
	until := b.callsUntil
	if open {
		until = b.openUntil
	}
	b.mu.Unlock()
	return max(until.Sub(now), minRefusedWait) + rand.N(openFor/4+1)
}

// refuses reports whether this gateway's breaker of t's deliveries for tenant to dest would refuse a call
// now, and if so how long a row it refuses waits (refusedWait): open and not yet due its probe, or half-open
// with its one probe in flight or let through already (probing: the destinations of one claim's hold-back
// that were given theirs). A destination without a breaker here refuses nothing. Asked before a limited
// type's rows take their tokens, so that rows the breaker would refuse spend none of the fleet's.
func (s *breakerSet) refuses(t *effectType, tenant, dest string, now time.Time, probing map[breakerKey]bool) (time.Duration, bool) {
	k := breakerKey{t.Name, tenant, dest}
	s.mu.Lock()
	b := s.byKey[k]
	s.mu.Unlock()
	if b == nil {
		return 0, false
	}
	b.mu.Lock()
	state, openUntil := b.state, b.openUntil
	b.mu.Unlock()
	switch {
	case state == gobreaker.StateOpen && now.Before(openUntil):
		return b.refusedWait(now, true, t.BreakerOpenFor), true
	case state == gobreaker.StateOpen, state == gobreaker.StateHalfOpen:
		// Its probe's turn: the first row goes, as the breaker lets one call through; the rest wait for it.
		if b.inflight.Load() > 0 || probing[k] {
			return b.refusedWait(now, false, t.BreakerOpenFor), true
		}
		probing[k] = true
	}
	return 0, false
}

// breakerSet holds a dispatcher's breakers.
type breakerSet struct {
	max     int
	idle    time.Duration
	metrics *Metrics
	log     *slog.Logger

	mu        sync.Mutex
	byKey     map[breakerKey]*breaker
	groups    map[groupKey]*list.List // of *breaker, most recently used first
	lastSweep time.Time
}

func newBreakerSet(maxPerGroup int, idle time.Duration, m *Metrics, log *slog.Logger) *breakerSet {
	return &breakerSet{max: maxPerGroup, idle: idle, metrics: m, log: log, byKey: map[breakerKey]*breaker{},
		groups: map[groupKey]*list.List{}, lastSweep: time.Now()}
}

// get returns the breaker of t's deliveries for tenant to dest, making it when there is none.
func (s *breakerSet) get(t *effectType, tenant, dest string) *breaker {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.lastSweep) > s.idle/4 {
		s.sweep(now)
	}
	k := breakerKey{t.Name, tenant, dest}
	g := s.groups[groupKey{t.Name, tenant}]
	if g == nil {
		g = list.New()
		s.groups[groupKey{t.Name, tenant}] = g
	}
	b := s.byKey[k]
	if b == nil && dest != OverflowDestination && g.Len() >= s.max && !s.evictOne(g) {
		k.dest = OverflowDestination
		b = s.byKey[k]
	}
	if b == nil {
		b = s.newBreaker(t, k)
		s.byKey[k] = b
		if k.dest == OverflowDestination {
			b.elem = nil // not in the group's order: it is never evicted for room, only when idle
		} else {
			b.elem = g.PushFront(b)
		}
	} else if b.elem != nil {
		g.MoveToFront(b.elem)
	}
	b.lastUsed = now
	return b
}

// evictOne drops the least recently used breaker of g that is closed and has no call in flight. It reports
// whether it found one.
func (s *breakerSet) evictOne(g *list.List) bool {
	for e := g.Back(); e != nil; e = e.Prev() {
		b := e.Value.(*breaker)
		if b.inflight.Load() == 0 && b.cb.State() == gobreaker.StateClosed {
			s.drop(b)
			return true
		}
	}
	return false
}

// sweep forgets every breaker unused for idle.
func (s *breakerSet) sweep(now time.Time) {
	s.lastSweep = now
	for _, b := range s.byKey {
		if now.Sub(b.lastUsed) > s.idle && b.inflight.Load() == 0 {
			s.drop(b)
		}
	}
}

// drop forgets b and its metric series. s.mu is held.
func (s *breakerSet) drop(b *breaker) {
	delete(s.byKey, b.key)
	gk := groupKey{b.key.typ, b.key.tenant}
	if g := s.groups[gk]; g != nil {
		if b.elem != nil {
			g.Remove(b.elem)
		}
		if g.Len() == 0 && s.byKey[breakerKey{b.key.typ, b.key.tenant, OverflowDestination}] == nil {
			delete(s.groups, gk)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.evicted = true
	s.metrics.BreakerState.DeleteLabelValues(b.key.typ, b.key.tenant, b.key.dest)
	if b.state != gobreaker.StateClosed {
		s.metrics.BreakersOpen.WithLabelValues(b.key.typ).Dec()
	}
}

func (s *breakerSet) newBreaker(t *effectType, k breakerKey) *breaker {
	b := &breaker{key: k}
	failures, openFor := t.BreakerFailures, t.BreakerOpenFor
	b.cb = gobreaker.NewCircuitBreaker[providers.Outcome](gobreaker.Settings{
		Name:        k.typ + "/" + k.tenant + "/" + k.dest,
		MaxRequests: 1,
		Timeout:     openFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.state = to
			if to == gobreaker.StateOpen {
				b.openUntil = time.Now().Add(openFor)
			}
			if b.evicted {
				return // a call that was in flight when its breaker was forgotten: no series to set
			}
			s.metrics.BreakerState.WithLabelValues(k.typ, k.tenant, k.dest).Set(float64(to))
			switch {
			case from == gobreaker.StateClosed:
				s.metrics.BreakersOpen.WithLabelValues(k.typ).Inc()
			case to == gobreaker.StateClosed:
				s.metrics.BreakersOpen.WithLabelValues(k.typ).Dec()
			}
			s.log.Warn("circuit breaker changed state", "type", k.typ, "tenant", k.tenant, "destination", k.dest,
				"from", from.String(), "to", to.String())
		},
	})
	s.metrics.BreakerState.WithLabelValues(k.typ, k.tenant, k.dest).Set(0)
	return b
}

// state returns the state of a breaker as gobreaker names it, or "" when there is none. For tests.
func (s *breakerSet) state(typ, tenant, dest string) string {
	s.mu.Lock()
	b := s.byKey[breakerKey{typ, tenant, dest}]
	s.mu.Unlock()
	if b == nil {
		return ""
	}
	return b.cb.State().String()
}

// len returns how many breakers are kept. For tests.
func (s *breakerSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}
