package outbox

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/providers"
)

// policy is what decide knows of an effect type.
type policy struct {
	onCrash     OnCrash
	tx          bool // a providers.TxProvider: its effect commits with its record, so it has no crash window
	maxAttempts int
	// retryDelay is the (jittered) wait after the given failed attempt, 1-based.
	retryDelay func(attempt int) time.Duration
}

// doubted reports whether an attempt that the provider would have retried is finished unknown instead: its
// request went out unanswered, and the type is at most once (a TxProvider has no such window).
func (p policy) doubted(out providers.Outcome) bool {
	return out.Kind == providers.KindRetry && out.MaybeSent && p.onCrash == AtMostOnce && !p.tx
}

// seen is what an attempt came to, for the attempt log, the destinations' rollup and the attempts metric, as
// decide will finish it: a transient failure that an at-most-once type cannot resend is in doubt, and one on
// the last attempt allowed is the failure that makes the effect dead (an on-call engineer saw a webhook that
// never arrived as "0 failed, 2 retried"). A retry cut by a shutdown is handed back, and stays a retry.
func (p policy) seen(r dedup.Claimed, out providers.Outcome, stopping bool) providers.Outcome {
	switch {
	case p.doubted(out):
		out.Kind = providers.KindInDoubt
	case out.Kind == providers.KindRetry && !stopping && p.attemptsWith(r) >= p.maxAttempts:
		out.Kind = providers.KindFailed
	}
	return out
}

// stage is how far the delivery of a claimed row got.
type stage int

const (
	stageClaimed    stage = iota // claimed, nothing tried yet
	stageRefused                 // the breaker kept the call from the destination
	stageAttempted               // the provider was called; the outcome says how it went
	stageUnreadable              // the row was leased, but its payload could not be read back (err says why)
	stagePanicked                // its delivery panicked
)

// event is what decide is asked about.
type event struct {
	stage   stage
	outcome providers.Outcome // stageAttempted
	// wait is how long a row refused by its breaker waits: until the breaker can let a call through.
	wait time.Duration
	// paused says that the row was refused for its destination's pause, which wait is the end of.
	paused bool
	// stopping is set when the delivery's context ended (shutdown cancelled the attempt).
	stopping bool
	// err is why the payload could not be read (stageUnreadable).
	err error
	// at is when the provider's answer came (stageAttempted): for a delivery, the destination's acceptance.
	at time.Time
}

type actionKind int

const (
	actDeliver    actionKind = iota + 1 // call the provider
	actFinish                           // record a terminal status (dedup.Store.Finish)
	actReschedule                       // put the row back to wait (dedup.Store.Reschedule)
)

// action is what happens next to a row.
type action struct {
	kind       actionKind
	finish     dedup.Finish     // actFinish
	reschedule dedup.Reschedule // actReschedule
	// msg, when set, is logged at level with err: why the row went where it went.
	msg   string
	level slog.Level
	err   error
}

// unreadablePrefix starts the error an unreadable row is left with.
const unreadablePrefix = "set aside without an attempt: its stored payload cannot be read back, so no " +
	"delivery of it can start; check the row, then delete it or fix it and retry: "

// panicked is the error a row whose delivery panicked is left with.
const panicked = "the delivery panicked, a bug in the gateway or its provider that this effect sets off; it " +
	"was not retried (the log has the details)"

// leaseRanOut begins the error a rescue leaves on an effect it does not deliver, for the operator.
const leaseRanOut = "the lease of the gateway delivering this effect ran out before it recorded an outcome " +
	"(it died, or lost its database for longer than the lease), so the effect may or may not have happened"

// rescueUnknown is the error an at-most-once rescue leaves on the effect.
const rescueUnknown = leaseRanOut + "; on_crash is at_most_once, so it was not resent: check the destination, " +
	"then retry it or leave it"

// interruptedOut is the last error of an effect whose attempts ran out with the last one interrupted: it may
// have reached the destination, so the effect is unknown, not dead (a resend by an operator who took dead for
// "never happened" could be a second effect).
const interruptedOut = leaseRanOut + ", and max_attempts is used up: check the destination, then retry it or " +
	"leave it"

// sentUnknown is added to the error of an attempt that went out unanswered under at_most_once.
const sentUnknown = "the request went out and no answer came back, so the destination may have acted on it; " +
	"on_crash is at_most_once, so it was not resent: check the destination, then retry it or leave it"

// cutAfterSent is added to the error of an attempt that a shutdown cut short after its request went out.
const cutAfterSent = "the gateway stopped (dispatcher.drain_timeout ran out) after the request went out and " +
	"before an answer came, so the destination may have acted on it; it is sent again"

// decide is the dispatcher's whole delivery policy, without I/O: given how far a claimed row got, it says
// what happens next. docs/effects.md draws the transitions it makes.
//
//   - A row whose payload cannot be read back from the database is finished dead, uncharged, with the
//     reason: trying again would fail again, and hold a lease and a claim each time.
//   - A row whose delivery panicked is finished dead, charged: trying again would panic again.
//   - Before the first call: a rescued row whose attempts, the interrupted ones included, reach the maximum
//     is finished unknown, uncalled: the last may have reached the destination.
//   - Before the first call: a rescued row (its dispatcher died mid-delivery) of an at-most-once type is
//     finished unknown rather than risk a second delivery, with the interrupted attempt counted (as every
//     rescued row's is): it may have reached the destination, and attempts: 0 would say that nothing was
//     sent; a TxProvider has no crash window, so its rows are always delivered. Every other row is delivered.
//   - The breaker refused the call: the row waits, uncharged, until the breaker can let a call through.
//   - A transient attempt whose request went out unanswered (MaybeSent) of an at-most-once type is finished
//     unknown, shutdown or not: a resend could be a second effect, as after a crash.
//   - Shutdown cut short an attempt whose request went out (MaybeSent): the row is handed back at once,
//     charged, since the destination may have acted on it and it will be sent again.
//   - Shutdown cancelled any other transient attempt: the row is handed back at once, uncharged, for any
//     gateway.
//   - Delivered, failed and in doubt finish the effect as delivered, failed and unknown.
//   - A transient failure is retried after the backoff delay (the destination's Retry-After wins), until the
//     attempts reach the type's maximum: then the effect is dead.
func decide(ev event, r dedup.Claimed, p policy) action {
	act := decideAttempts(ev, r, p)
	// A rescued row's interrupted attempts are counted with whatever comes of the row next (the attempt log
	// has them, numbered before the rescue's own), so that max_attempts bounds the calls that may have
	// reached the destination, interrupted ones included.
	act.countInterrupted(r, p)
	return act
}

// countInterrupted has the outcome or the hand-back of act count r's interrupted attempts. decide does it for
// the batches, whose outcomes do not go through apply; apply does it again (the same count) for every action,
// decide's or not: a hand-back starts the row's count again.
func (a *action) countInterrupted(r dedup.Claimed, p policy) {
	switch a.kind {
	case actFinish:
		a.finish.Interrupted = p.interrupted(r)
	case actReschedule:
		a.reschedule.Interrupted = p.interrupted(r)
	}
}

// interrupted is how many of r's interrupted attempts count towards the maximum. A TxProvider's rolled back
// with their gateway's transaction: they reached nothing, and are logged but not counted.
func (p policy) interrupted(r dedup.Claimed) int {
	if p.tx {
		return 0
	}
	return interruptions(r)
}

// interruptions is how many attempts of r were interrupted since its last recorded outcome: those its claims
// counted (migration 00027), and at least one for a rescued row (rescued by a claim that does not count them:
// the dedup proxy's, or a gateway's before 00027).
func interruptions(r dedup.Claimed) int {
	if r.Rescued && r.InterruptedAttempts == 0 {
		return 1
	}
	return r.InterruptedAttempts
}

// nextAttempt is the number of the attempt a claimed row is delivered for, in the attempt log and to its
// provider: after its failed attempts, and after the interrupted ones of a rescued row.
func nextAttempt(r dedup.Claimed) int {
	return r.Attempts + interruptions(r) + 1
}

// attemptsWith is how many attempts r will have made once the attempt it is delivered for ends.
func (p policy) attemptsWith(r dedup.Claimed) int {
	return r.Attempts + p.interrupted(r) + 1
}

func decideAttempts(ev event, r dedup.Claimed, p policy) action {
	switch ev.stage {
	case stageClaimed:
		if r.Rescued && p.onCrash == AtMostOnce && !p.tx {
			return action{kind: actFinish,
				finish: dedup.Finish{Status: effect.StatusUnknown, LastError: rescueUnknown},
				msg:    "rescued a delivery interrupted by a crash; on_crash is at_most_once, so it is not resent",
				level:  slog.LevelWarn}
		}
		if made := r.Attempts + p.interrupted(r); r.Rescued && made >= p.maxAttempts {
			return action{kind: actFinish,
				finish: dedup.Finish{Status: effect.StatusUnknown, LastError: fmt.Sprintf("%s (%d of %d attempts)",
					interruptedOut, made, p.maxAttempts)},
				msg:   "rescued a delivery interrupted by a crash; its attempts are used up, so it is not resent",
				level: slog.LevelWarn}
		}
		return action{kind: actDeliver}
	case stageRefused:
		return action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: ev.wait, WhilePaused: ev.paused}}
	case stagePanicked:
		return action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusDead, LastError: panicked, Attempted: true}}
	case stageUnreadable:
		return action{kind: actFinish,
			finish: dedup.Finish{Status: effect.StatusDead, LastError: unreadablePrefix + unreadableReason(ev.err)},
			msg:    "a row's payload cannot be read back; set aside as dead", level: slog.LevelError, err: ev.err}
	}

	out := ev.outcome
	errText := ""
	if out.Err != nil {
		errText = out.Err.Error()
	}
	finish := func(s effect.Status, lastErr string) dedup.Finish {
		// A TxProvider's outcome commits with its effect; any other's effect happened outside the database,
		// and a crash before its record commits resends it: its record is never queued behind other writes.
		return dedup.Finish{Status: s, Result: out.Result, LastError: lastErr, Attempted: true, External: !p.tx}
	}
	switch out.Kind {
	case providers.KindDelivered:
		return action{kind: actFinish, finish: finish(effect.StatusDelivered, "")}
	case providers.KindFailed:
		return action{kind: actFinish, finish: finish(effect.StatusFailed, errText),
			msg: "delivery failed permanently", level: slog.LevelWarn, err: out.Err}
	case providers.KindInDoubt:
		return action{kind: actFinish, finish: finish(effect.StatusUnknown, errText),
			msg: "delivery in doubt", level: slog.LevelWarn, err: out.Err}
	}
	if p.doubted(out) {
		return action{kind: actFinish,
			finish: finish(effect.StatusUnknown, errText+"; "+sentUnknown),
			msg:    "no answer to a delivery that went out; on_crash is at_most_once, so it is not resent",
			level:  slog.LevelWarn, err: out.Err}
	}
	if ev.stopping && out.MaybeSent {
		// The request went out: the destination may have acted on it, and the gateway that takes the row sends
		// it again. That is an attempt, counted and logged as one; it is handed back at once.
		return action{kind: actReschedule,
			reschedule: dedup.Reschedule{LastError: errText + "; " + cutAfterSent, Attempted: true},
			msg:        "shutdown cut a delivery short after its request went out; handed back, it will be sent again",
			level:      slog.LevelWarn, err: out.Err}
	}
	if ev.stopping {
		return action{kind: actReschedule}
	}
	attempt := p.attemptsWith(r)
	if attempt >= p.maxAttempts {
		return action{kind: actFinish,
			finish: finish(effect.StatusDead, fmt.Sprintf("failed %d of %d attempts: %s", attempt, p.maxAttempts, errText)),
			msg:    "delivery failed; retries used up", level: slog.LevelError, err: out.Err}
	}
	delay := out.RetryAfter
	if delay <= 0 {
		delay = p.retryDelay(attempt)
	}
	return action{kind: actReschedule,
		reschedule: dedup.Reschedule{Delay: delay, LastError: errText, Attempted: true},
		msg:        "delivery failed; will retry", level: slog.LevelInfo, err: out.Err}
}

// unreadableReason is what Postgres said, without the store's wrapping, which speaks of storing.
func unreadableReason(err error) string {
	var ue *dedup.UnstorableError
	if errors.As(err, &ue) {
		return ue.Reason
	}
	return err.Error()
}
