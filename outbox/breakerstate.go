package outbox

import (
	"sort"
	"time"
)

// BreakerState is one circuit breaker as the operator sees it: its destination and its state.
type BreakerState struct {
	Type        string    `json:"type"`
	Tenant      string    `json:"tenant"`
	Destination string    `json:"destination"`
	State       string    `json:"state"`               // closed, half-open or open, as gobreaker names them
	OpenUntil   time.Time `json:"open_until,omitzero"` // open: when it lets a probe through
	LastUsed    time.Time `json:"last_used,omitzero"`  // the last delivery that went through it
	InFlight    int32     `json:"in_flight,omitempty"` // calls through it now
}

// Breakers returns the dispatcher's circuit breakers, sorted by type, tenant and destination, for the
// gateway's heartbeat row (and so for `oncegate breaker ls`).
func (d *Dispatcher) Breakers() []BreakerState {
	s := d.breakers
	s.mu.Lock()
	out := make([]BreakerState, 0, len(s.byKey))
	for _, b := range s.byKey {
		st := BreakerState{Type: b.key.typ, Tenant: b.key.tenant, Destination: b.key.dest,
			State: b.cb.State().String(), LastUsed: b.lastUsed, InFlight: b.inflight.Load()}
		b.mu.Lock()
		if st.State == "open" {
			st.OpenUntil = b.openUntil
		}
		b.mu.Unlock()
		out = append(out, st)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Type != b.Type {
			return a.Type < b.Type
		}
		if a.Tenant != b.Tenant {
			return a.Tenant < b.Tenant
		}
		return a.Destination < b.Destination
	})
	return out
}

// Owner is the name this dispatcher leases rows under: the gateway instance's id.
func (d *Dispatcher) Owner() string { return d.cfg.Owner }
