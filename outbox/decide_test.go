package outbox

import (
	"errors"
	"testing"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/providers"
)

// decide is the whole delivery policy; these cases run it without Postgres or providers.
func TestDecide(t *testing.T) {
	t.Parallel()
	// The backoff delay after attempt n is n seconds here, so the arithmetic shows.
	p := func(onCrash OnCrash, tx bool) policy {
		return policy{onCrash: onCrash, tx: tx, maxAttempts: 3,
			retryDelay: func(n int) time.Duration { return time.Duration(n) * time.Second }}
	}
	least, most, mostTx := p(AtLeastOnce, false), p(AtMostOnce, false), p(AtMostOnce, true)
	fresh := dedup.Claimed{Attempts: 0}
	rescued := dedup.Claimed{Attempts: 1, Rescued: true}
	second := dedup.Claimed{Attempts: 1}
	last := dedup.Claimed{Attempts: 2}
	attempted := func(o providers.Outcome) event { return event{stage: stageAttempted, outcome: o} }
	boom := errors.New("503 busy")
	sent := providers.Retry(errors.New("timed out"))
	sent.MaybeSent = true

	cases := []struct {
		name string
		ev   event
		row  dedup.Claimed
		p    policy
		want action
	}{
		{"a fresh row is delivered", event{stage: stageClaimed}, fresh, most, action{kind: actDeliver}},
		{"at_least_once resends a rescued row", event{stage: stageClaimed}, rescued, least, action{kind: actDeliver}},
		{"at_most_once marks a rescued row unknown, uncharged", event{stage: stageClaimed}, rescued, most,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusUnknown, LastError: rescueUnknown, Interrupted: 1}}},
		{"a TxProvider has no crash window: its rescued row is resent", event{stage: stageClaimed}, rescued, mostTx,
			action{kind: actDeliver}},
		{"a row refused by its breaker waits until the breaker can let a call through, uncharged",
			event{stage: stageRefused, wait: 30 * time.Second}, last, least,
			action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: 30 * time.Second}}},
		{"an unreadable row is dead, uncharged but for a rescued row's interrupted attempt, with Postgres's reason, even rescued under at_most_once",
			event{stage: stageUnreadable, err: &dedup.UnstorableError{Reason: "out of memory", Err: boom}}, rescued, most,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusDead, LastError: unreadablePrefix + "out of memory", Interrupted: 1}}},
		{"a rescued row's interrupted attempt counts: after one failed attempt, the rescue's is the last of 3",
			attempted(providers.Retry(boom)), rescued, least,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusDead, LastError: "failed 3 of 3 attempts: 503 busy", Attempted: true, Interrupted: 1}}},
		{"a rescued row whose interrupted attempts used up the maximum is unknown, not called again",
			event{stage: stageClaimed}, dedup.Claimed{Attempts: 1, Rescued: true, InterruptedAttempts: 2}, least,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusUnknown,
				LastError: interruptedOut + " (3 of 3 attempts)", Interrupted: 2}}},
		{"a TxProvider's interrupted attempt rolled back: it does not count", attempted(providers.Retry(boom)), rescued, mostTx,
			action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: 2 * time.Second, LastError: "503 busy", Attempted: true}}},
		{"a rescued row refused by its breaker waits, its interrupted attempt counted",
			event{stage: stageRefused, wait: 30 * time.Second}, rescued, least,
			action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: 30 * time.Second, Interrupted: 1}}},
		{"a delivery that panicked is dead, charged", event{stage: stagePanicked}, fresh, least,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusDead, LastError: panicked, Attempted: true}}},
		{"delivered", attempted(providers.Outcome{Kind: providers.KindDelivered, Result: []byte(`{"id":1}`)}), fresh, least,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusDelivered, Result: []byte(`{"id":1}`), Attempted: true}}},
		{"failed for good", attempted(providers.Failed(errors.New("550 no such user"), true)), fresh, least,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusFailed, LastError: "550 no such user", Attempted: true}}},
		{"in doubt is unknown", attempted(providers.InDoubt(errors.New("lost after DATA"))), fresh, least,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusUnknown, LastError: "lost after DATA", Attempted: true}}},
		{"a transient failure backs off", attempted(providers.Retry(boom)), second, least,
			action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: 2 * time.Second, LastError: "503 busy", Attempted: true}}},
		{"Retry-After wins over the backoff", attempted(providers.RetryAfter(90*time.Second, boom)), fresh, least,
			action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: 90 * time.Second, LastError: "503 busy", Attempted: true}}},
		{"the last attempt's transient failure is dead", attempted(providers.RetryAfter(time.Second, boom)), last, least,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusDead, LastError: "failed 3 of 3 attempts: 503 busy", Attempted: true}}},
		{"shutdown hands a cancelled attempt back, uncharged",
			event{stage: stageAttempted, outcome: providers.Retry(errors.New("context canceled")), stopping: true}, last, least,
			action{kind: actReschedule}},
		{"at_least_once: a request that shutdown cut short after it went out is handed back, charged",
			event{stage: stageAttempted, outcome: sent, stopping: true}, last, least,
			action{kind: actReschedule, reschedule: dedup.Reschedule{LastError: "timed out; " + cutAfterSent, Attempted: true}}},
		{"at_most_once: a request that went out unanswered is unknown, charged, not resent",
			attempted(sent), fresh, most,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusUnknown, LastError: "timed out; " + sentUnknown, Attempted: true}}},
		{"at_most_once: so is one that shutdown cut short after it went out",
			event{stage: stageAttempted, outcome: sent, stopping: true}, fresh, most,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusUnknown, LastError: "timed out; " + sentUnknown, Attempted: true}}},
		{"at_most_once: a request that never went out (refused) is retried", attempted(providers.Retry(boom)), second, most,
			action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: 2 * time.Second, LastError: "503 busy", Attempted: true}}},
		{"at_least_once: a request that went out unanswered is resent", attempted(sent), second, least,
			action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: 2 * time.Second, LastError: "timed out", Attempted: true}}},
		{"a TxProvider has no such window", attempted(sent), second, mostTx,
			action{kind: actReschedule, reschedule: dedup.Reschedule{Delay: 2 * time.Second, LastError: "timed out", Attempted: true}}},
		{"an outcome that came before the shutdown is recorded",
			event{stage: stageAttempted, outcome: providers.Delivered(nil), stopping: true}, fresh, least,
			action{kind: actFinish, finish: dedup.Finish{Status: effect.StatusDelivered, Result: []byte("null"), Attempted: true}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := decide(c.ev, c.row, c.p)
			if got.kind != c.want.kind || got.finish.Status != c.want.finish.Status ||
				string(got.finish.Result) != string(c.want.finish.Result) ||
				got.finish.LastError != c.want.finish.LastError || got.finish.Attempted != c.want.finish.Attempted ||
				got.finish.Interrupted != c.want.finish.Interrupted ||
				got.reschedule != c.want.reschedule {
				t.Fatalf("decide = %+v\n          want %+v", got, c.want)
			}
			if got.kind == actFinish && !got.finish.Status.Terminal() {
				t.Fatalf("finish with %s, which is not terminal", got.finish.Status)
			}
		})
	}
}

// What an attempt came to, for the attempt log and the metric, is what decide finishes it as: the last
// attempt's transient failure is the failure that makes the effect dead, not a retry.
func TestSeenIsWhatDecideFinishes(t *testing.T) {
	t.Parallel()
	p := policy{onCrash: AtLeastOnce, maxAttempts: 3}
	retry := providers.Outcome{Kind: providers.KindRetry}
	for _, c := range []struct {
		attempts int
		stopping bool
		want     providers.OutcomeKind
	}{{0, false, providers.KindRetry}, {1, false, providers.KindRetry}, {2, false, providers.KindFailed},
		{2, true, providers.KindRetry}} {
		if got := p.seen(dedup.Claimed{Attempts: c.attempts}, retry, c.stopping).Kind; got != c.want {
			t.Errorf("attempt %d of 3 (stopping %v): seen as %v, want %v", c.attempts+1, c.stopping, got, c.want)
		}
		if c.want == providers.KindFailed && decide(event{stage: stageAttempted, outcome: retry}, dedup.Claimed{Attempts: c.attempts}, p).finish.Status != effect.StatusDead {
			t.Errorf("attempt %d of 3: decide does not finish it dead", c.attempts+1)
		}
	}
	doubted := providers.Outcome{Kind: providers.KindRetry, MaybeSent: true}
	if got := (policy{onCrash: AtMostOnce, maxAttempts: 3}).seen(dedup.Claimed{}, doubted, false).Kind; got != providers.KindInDoubt {
		t.Errorf("an unanswered request of an at-most-once type: %v, want in doubt", got)
	}
}
