package outbox

import (
	"fmt"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/providers"
)

// interruptedError is what the attempt log says of a delivery whose gateway died or lost its lease.
const interruptedError = "the lease ran out before this gateway recorded an outcome (it died, or lost its " +
	"database for longer than the lease): the provider may or may not have been called"

// recordAttempt is the dispatcher's one hook for the operator's attempt log (Config.Attempts): it writes
// nothing itself, the log batches. It is called after each provider call, and, for a rescued row, for the
// interrupted attempt of the gateway that held it (called is false, out is ignored, and start is when that
// lease began: its expiry less the type's lease).
func (d *Dispatcher) recordAttempt(t *effectType, r dedup.Claimed, start time.Time, out providers.Outcome, called bool) {
	if d.cfg.Attempts == nil {
		return
	}
	dest := destination(t, &r)
	if !called {
		owner := r.Interrupted.Owner
		if owner == "" {
			owner = "(not known)"
		}
		d.cfg.Attempts.Record(dedup.Attempt{EffectID: r.EffectID, Attempt: r.Attempts + interruptions(r), Start: start,
			Gateway: owner, Token: r.Interrupted.Token, Outcome: "interrupted", Type: t.Name, Destination: dest,
			Error: fmt.Sprintf("%s; rescued by %s", interruptedError, d.cfg.Owner)})
		return
	}
	// The interrupted attempts of the gateways a row was rescued from took the numbers before it.
	a := dedup.Attempt{EffectID: r.EffectID, Attempt: nextAttempt(r), Start: start, Gateway: d.cfg.Owner,
		Token: &r.Token, Outcome: out.Kind.String(), Latency: time.Since(start), Called: true, Type: t.Name,
		Destination: dest}
	if out.Err != nil {
		a.Error = out.Err.Error()
	}
	d.cfg.Attempts.Record(a)
}

// leaseStart is when the lease a row was rescued from began, as far as the claim knows: its expiry less the
// type's lease, or now when the expiry is not known.
func leaseStart(r dedup.Claimed, lease time.Duration) time.Time {
	if r.Interrupted.Expired.IsZero() {
		return time.Now()
	}
	return r.Interrupted.Expired.Add(-lease)
}
