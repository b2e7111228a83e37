package gateway

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	httpprov "github.com/oncegate/oncegate/providers/http"
)

// Two gateways on one database: gateway A performs a proxied call and its upstream holds it; identical
// requests wait in gateway B; the upstream then answers A with a 503. A request that waited is never the one
// that performs again (docs/proxy.md), so the upstream sees one call a round, however B's waiters and A's
// outcome interleave. Before the waiters' claim was fenced by the attempt they waited on, one of B's waiters
// claimed the row the moment A rescheduled it and called the upstream again (9 of 20 rounds in an outside test).
func TestProxyWaiterInAnotherGatewayNeverPerformsAgain(t *testing.T) {
	t.Parallel()
	const rounds, waiters = 50, 8
	var mu sync.Mutex
	release := map[string]chan struct{}{}
	calls := map[string]int{}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		key := r.Header.Get("Idempotency-Key") // the effect's stable id: one per round
		mu.Lock()
		calls[key]++
		ch := release[r.URL.Query().Get("round")]
		mu.Unlock()
		if ch != nil {
			<-ch
		}
		// Not due again for a minute: no dispatcher retries the row meanwhile, so any second call in the
		// round is a waiter's. A 502: a 503 with Retry-After would pause the upstream for the fleet.
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "overloaded")
	})
	db := pgtest.Database(t)
	a := proxyGatewayOn(t, db, up)
	b := proxyGatewayOn(t, db, up)
	waitingIn := func(h *harness) int {
		h.g.waiters.mu.Lock()
		defer h.g.waiters.mu.Unlock()
		n := 0
		for _, list := range h.g.waiters.m {
			n += len(list)
		}
		return n
	}
	for round := range rounds {
		ch := make(chan struct{})
		mu.Lock()
		release[fmt.Sprint(round)] = ch
		mu.Unlock()
		path := fmt.Sprintf("/v1/proxy/payments/charges?round=%d", round)
		key := fmt.Sprintf("Idempotency-Key: race-%d", round)
		var wg sync.WaitGroup
		answers := make([]response, waiters+1)
		before := up.calls.Load()
		wg.Go(func() { answers[0] = a.req("POST", path, acmeKey, `{"n":1}`, key) })
		for up.calls.Load() == before {
			time.Sleep(time.Millisecond)
		}
		for i := 1; i <= waiters; i++ {
			// Staggered, and released at any point of their rechecks: where A's outcome lands in a waiter's
			// look at the effect is what this test varies.
			time.Sleep(time.Duration(rand.IntN(int(proxyRecheck / 4))))
			wg.Go(func() { answers[i] = b.req("POST", path, acmeKey, `{"n":1}`, key) })
		}
		for waitingIn(b) < waiters {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Duration(rand.IntN(int(proxyRecheck))))
		close(ch)
		wg.Wait()
		if n := up.calls.Load() - before; n != 1 {
			t.Fatalf("round %d: the upstream was called %d times for one request; answers: %v", round, n, statuses(answers))
		}
		if answers[0].status != 502 || answers[0].raw != "overloaded" {
			t.Fatalf("round %d: the performing request got %d %s", round, answers[0].status, answers[0].raw)
		}
		for i, r := range answers[1:] {
			// A waiter in another gateway cannot have the attempt's answer (it was not stored): it is told to
			// come back when the effect is due again.
			if r.status != 502 || r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Retry-After") == "" {
				t.Fatalf("round %d: waiter %d got %d %v %s", round, i+1, r.status, r.header, r.raw)
			}
		}
	}
}

func statuses(rs []response) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = r.status
	}
	return out
}

// proxyGatewayOn is proxyGateway on a database shared with other gateways.
func proxyGatewayOn(t *testing.T, db string, up *upstream) *harness {
	return startGatewayOn(t, db, func(c *Config) {
		et := proxyType(up)
		et.Breaker.Failures = 1 << 20 // every round fails once: the breaker must not hold a round's call
		c.EffectTypes["payments"] = et
	})
}

// proxyType is the effect type "payments" of proxyGateway.
func proxyType(up *upstream) EffectType {
	return EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: up.URL + "/api",
		AllowPrivateNetworks: true, Headers: map[string]string{"Authorization": "Bearer sk_upstream_secret_1"}}}
}

// A gateway that was paused (SIGSTOP, a long GC, a VM migration) past its lease finds, when its upstream
// answers, that another gateway rescued the effect and stored another answer. It must not give its client
// the answer it could not record: the client gets the stored one, as every replay does (an outside tester
// saw 201 {"n":1} on the first request and {"n":2} on every replay).
func TestProxyAnAnswerThatCouldNotBeRecordedIsNotGiven(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		<-release
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	h := proxyGateway(t, up, nil)
	done := make(chan response)
	go func() { done <- h.req("POST", "/v1/proxy/payments/c", acmeKey, `{}`, "Idempotency-Key: paused") }()
	for up.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	// Meanwhile the lease ran out and another gateway's rescue stored its own answer.
	if _, err := h.pool.Exec(context.Background(), `
		WITH e AS (UPDATE oncegate_effects SET status = 'delivered', finished_at = now(), delivered_at = now(),
			result = '{"status":201,"headers":{},"body":"{\"n\":2}"}' WHERE key = 'paused' RETURNING id)
		DELETE FROM oncegate_outbox o USING e WHERE o.effect_id = e.id`); err != nil {
		t.Fatal(err)
	}
	close(release)
	first := <-done
	replay := h.req("POST", "/v1/proxy/payments/c", acmeKey, `{}`, "Idempotency-Key: paused")
	if first.status != 201 || first.raw != `{"n":2}` || first.raw != replay.raw {
		t.Fatalf("the request whose outcome was not recorded got %d %s; the replay %d %s", first.status, first.raw,
			replay.status, replay.raw)
	}
}
