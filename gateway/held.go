package gateway

// Held requests: the requests of a tenant that keep their connection open for longer than the gateway takes to
// answer them, because they wait (a create or a read with "wait", a proxied request waiting for another's
// attempt) or because their body is still arriving. Each tenant may hold tenants.<name>.held_requests of them
// at once in one gateway; past that a wait is answered at once with the effect as it is, and a body must
// arrive within heldBodyGrace. So one tenant's waits hold at most its share of the connections, and never the
// slots another tenant's requests need (SPEC §2: one tenant cannot slow, stop or read another).

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// heldBodyGrace is how long a tenant over its held requests may take to send a body: a client that sends its
// body with its headers is read in full; one that dribbles it is cut off.
const heldBodyGrace = time.Second

// held counts each tenant's held requests against its limit.
type held struct {
	limit func(tenant string) int
	gauge *prometheus.GaugeVec

	mu sync.Mutex
	// ceiling bounds every tenant's limit: a share of the connections the gateway may hold (heldCeiling),
	// set when it starts serving; 0 until then, which bounds nothing.
	ceiling int
	tenants map[string]*tenantHeld
}

type tenantHeld struct {
	n int
	// waits are the sheddable holds: a wait can end early and answer with the effect as it is.
	waits map[*heldWait]struct{}
}

type heldWait struct{ shed context.CancelFunc }

func newHeld(limit func(string) int, gauge *prometheus.GaugeVec) *held {
	return &held{limit: limit, gauge: gauge, tenants: map[string]*tenantHeld{}}
}

// heldCeiling is the most held requests one tenant may have when the gateway holds at most conns client
// connections: a quarter, so that the tenant with the most still leaves most of them to the others.
func heldCeiling(conns int) int { return max(1, conns/4) }

// setCeiling bounds every tenant's limit by the connections the gateway will hold.
func (h *held) setCeiling(conns int) {
	h.mu.Lock()
	h.ceiling = heldCeiling(conns)
	h.mu.Unlock()
}

// limitOf is tenant's limit, within the ceiling.
func (h *held) limitOf(tenant string) int {
	n := h.limit(tenant)
	if h.ceiling > 0 {
		n = min(n, h.ceiling)
	}
	return n
}

// hold takes one of tenant's held requests; ok is false, and nothing is taken, when it has none left. release
// gives it back and may be called more than once.
func (h *held) hold(tenant string) (release func(), ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.tenantLocked(tenant)
	if t.n >= h.limitOf(tenant) {
		return func() {}, false
	}
	t.n++
	h.gauge.WithLabelValues(tenant).Set(float64(t.n))
	var once sync.Once
	return func() { once.Do(func() { h.release(tenant, nil) }) }, true
}

// holdWait is hold for a wait, which ctx carries: ctx ends when the wait is shed (shedOne) to free its
// connection for another tenant, and the waiter then answers at once with the effect as it is.
func (h *held) holdWait(ctx context.Context, tenant string) (context.Context, func(), bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.tenantLocked(tenant)
	if t.n >= h.limitOf(tenant) {
		return ctx, func() {}, false
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &heldWait{shed: cancel}
	t.n++
	t.waits[w] = struct{}{}
	h.gauge.WithLabelValues(tenant).Set(float64(t.n))
	var once sync.Once
	return ctx, func() { once.Do(func() { cancel(); h.release(tenant, w) }) }, true
}

func (h *held) tenantLocked(tenant string) *tenantHeld {
	t := h.tenants[tenant]
	if t == nil {
		t = &tenantHeld{waits: map[*heldWait]struct{}{}}
		h.tenants[tenant] = t
	}
	return t
}

func (h *held) release(tenant string, w *heldWait) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.tenants[tenant]
	t.n--
	if w != nil {
		delete(t.waits, w)
	}
	h.gauge.WithLabelValues(tenant).Set(float64(t.n))
}

// shedOne ends one wait of the tenant that holds the most requests, so that its connection is answered and
// freed; false when that tenant holds no wait that can be shed (its held requests are proxied calls or
// bodies). The connection gate calls it when every connection it may hold is
// taken by a request in progress (connGate).
func (h *held) shedOne() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The tenant holding the most, whether or not what it holds can be shed: another tenant's waits are not
	// cut for it. An outside tester's 2,000 proxied waiters held 36 requests against another tenant's 4, and
	// the gate cut that tenant's waits, the only ones it could (a quarter of its creates with wait came back
	// unfinished); the most a tenant holds is bounded anyway (its held_requests, a quarter of the cap).
	var most *tenantHeld
	for _, t := range h.tenants {
		if most == nil || t.n > most.n || (t.n == most.n && len(t.waits) > len(most.waits)) {
			most = t
		}
	}
	if most == nil || len(most.waits) == 0 {
		return false
	}
	for w := range most.waits {
		w.shed()
		delete(most.waits, w) // shed once; its release still counts it down
		return true
	}
	return false
}

// snapshot is every tenant's held requests now, those holding none left out.
func (h *held) snapshot() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for tenant, t := range h.tenants {
		if t.n > 0 {
			out[tenant] = t.n
		}
	}
	return out
}

// count is tenant's held requests now.
func (h *held) count(tenant string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t := h.tenants[tenant]; t != nil {
		return t.n
	}
	return 0
}
