package gateway

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers/postgres"
)

type postgresConfig = postgres.Config

// gaugeValue reads a gauge of the gateway's own metrics.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// A destination that fails: a table that does not exist (yet). Every insert fails with a transient error,
// until the test creates the table.
func failingType(table string, retry *Retry, breaker Breaker) EffectType {
	return EffectType{Provider: "postgres", Postgres: &postgresConfig{Table: table}, Retry: retry, Breaker: breaker}
}

func createEventsTable(t *testing.T, h *harness, table string) {
	t.Helper()
	_, err := h.pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s (LIKE analytics_events INCLUDING ALL)`, table))
	if err != nil {
		t.Fatal(err)
	}
}

// Retries use up max_attempts, the effect is dead with the error; an operator's retry delivers it once the
// destination works.
func TestRetriesThenDeadThenOperatorRetry(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["flaky"] = failingType("flaky_events",
			&Retry{MaxAttempts: 3, BaseDelay: Duration(20 * time.Millisecond), MaxDelay: Duration(50 * time.Millisecond)},
			Breaker{Failures: 100})
	})
	if r := h.post("f1", `{"type":"flaky","payload":{"name":"a"}}`); r.status != 202 {
		t.Fatal(r.raw)
	}
	r := h.waitStatus(acmeKey, "f1", "dead")
	if r.body["attempts"] != float64(3) || !strings.Contains(r.body["last_error"].(string), "failed 3 of 3 attempts") ||
		!strings.Contains(r.body["last_error"].(string), "flaky_events") {
		t.Fatalf("dead effect: %s", r.raw)
	}
	if n := h.count("SELECT count(*) FROM oncegate_outbox"); n != 0 {
		t.Fatalf("a dead effect kept %d outbox rows", n)
	}
	// Retrying a delivered or pending effect is refused; a dead one goes back to pending.
	h.post("ok", analytics("a"))
	h.waitStatus(acmeKey, "ok", "delivered")
	if r := h.req("POST", "/v1/effects/ok/retry", acmeKey, ""); r.status != 409 || r.body["type"] != "/problems/not-retryable" {
		t.Fatalf("retry of a delivered effect: %d %s", r.status, r.raw)
	}
	if r := h.req("POST", "/v1/effects/nope/retry", acmeKey, ""); r.status != 404 {
		t.Fatalf("retry of a missing effect: %d %s", r.status, r.raw)
	}
	createEventsTable(t, h, "flaky_events")
	if r := h.req("POST", "/v1/effects/f1/retry", acmeKey, ""); r.status != 200 || r.body["attempts"] != float64(0) {
		t.Fatalf("retry: %d %s", r.status, r.raw)
	}
	r = h.waitStatus(acmeKey, "f1", "delivered")
	if r.body["attempts"] != float64(1) || r.body["result"] == nil {
		t.Fatalf("after the retry: %s", r.raw)
	}
	if n := h.count("SELECT count(*) FROM flaky_events"); n != 1 {
		t.Fatalf("%d rows delivered", n)
	}
}

// While a destination fails, its breaker opens: rows wait without being charged attempts, and drain once it
// recovers. Other effect types are not held up.
func TestBreakerOpensRowsWaitThenDrain(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "A destination failing (missing table) for 10 effects, then recovering", "Breaker opens; rows wait uncharged; other types unaffected; all 10 delivered once after recovery")
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["down"] = failingType("down_events",
			&Retry{MaxAttempts: 5, BaseDelay: Duration(10 * time.Millisecond), MaxDelay: Duration(20 * time.Millisecond)},
			Breaker{Failures: 3, OpenFor: Duration(700 * time.Millisecond)})
	})
	for i := range 10 {
		if r := h.post(fmt.Sprintf("d%d", i), `{"type":"down","payload":{"name":"a"}}`); r.status != 202 {
			t.Fatal(r.raw)
		}
	}
	// The breaker opens, and once the first round's deliveries have all been handed back, only the breaker's
	// half-open probes can charge an attempt. Two probes mean two open periods (1.4 s) in which retries every
	// 10-20 ms would have used up all 5 attempts of every row, had the breaker not held them.
	breaker := h.g.metrics.dispatcher.BreakerState.WithLabelValues("down", "acme", "down_events")
	downCharged := func() int {
		return h.count("SELECT COALESCE(sum(attempts), 0) FROM oncegate_effects WHERE type = 'down'")
	}
	var opened int
	testenv.Eventually(t, 10*time.Second, "the breaker opens with no delivery of down in flight", func() bool {
		opened = downCharged()
		return gaugeValue(t, breaker) == 2 &&
			h.count("SELECT count(*) FROM oncegate_outbox WHERE type = 'down' AND lease_token IS NOT NULL") == 0
	})
	testenv.Eventually(t, 10*time.Second, "two half-open probes", func() bool { return downCharged() >= opened+2 })
	if n := h.count("SELECT count(*) FROM oncegate_effects WHERE type = 'down' AND status IN ('dead', 'failed')"); n != 0 {
		t.Fatalf("%d effects ended while the breaker was open", n)
	}
	charged := downCharged()
	t.Logf("%d attempts charged to 10 effects before the breaker opened after 3 failures, %d over two open periods",
		opened, charged-opened)
	result(fmt.Sprintf("%d attempts charged to 10 effects over two open periods; 10/10 delivered after", charged-opened))
	// A failed call of a batch is one failure of the breaker however many rows it carried, so the three calls
	// that open it charge at most 10 rows each (30, as a run of CI saw); from then on only the probes charge,
	// one row each. Polled every 20 ms against probes 700 ms apart, a third probe is the most that can slip in.
	if opened > 30 {
		t.Fatalf("%d attempts charged before the breaker opened: more than 3 failed calls of 10 rows", opened)
	}
	if charged-opened > 3 {
		t.Fatalf("%d attempts charged over two open periods: rows were not held while the breaker was open",
			charged-opened)
	}
	// Another type delivers meanwhile.
	if r := h.req("POST", "/v1/effects", acmeKey, `{"type":"analytics","payload":{"name":"x"},"wait":"5s"}`,
		"Idempotency-Key: other"); r.body["status"] != "delivered" {
		t.Fatalf("other type held up: %s", r.raw)
	}
	createEventsTable(t, h, "down_events")
	for i := range 10 {
		h.waitStatus(acmeKey, fmt.Sprintf("d%d", i), "delivered")
	}
	if n := h.count("SELECT count(*) FROM down_events"); n != 10 {
		t.Fatalf("%d rows delivered, want 10", n)
	}
	if state := gaugeValue(t, breaker); state != 0 {
		t.Fatalf("the breaker is %v after the destination recovered, want 0 (closed)", state)
	}
}

// Retention purges terminal effects older than retention.keys, and only those; a purged key is new again.
func TestRetentionPurgesOnlyExpiredTerminalEffects(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) {
		c.Retention.Keys = Duration(time.Hour)
		c.EffectTypes["stuck"] = failingType("never", &Retry{BaseDelay: Duration(time.Hour), MaxDelay: Duration(time.Hour)}, Breaker{Failures: 100})
	})
	for _, k := range []string{"old", "recent"} {
		h.post(k, analytics(k))
		h.waitStatus(acmeKey, k, "delivered")
	}
	h.post("pending-old", `{"type":"stuck","payload":{"name":"a"}}`)
	ctx := context.Background()
	// The attempt log writes in batches; its insert holds a key-share lock on the effect row, which the purge's
	// SKIP LOCKED passes over (until the next purge). Wait until it has written, so one purge is the test.
	testenv.Eventually(t, 10*time.Second, "the delivered effects' attempts are logged", func() bool {
		var n int
		_ = h.pool.QueryRow(ctx, `SELECT count(*) FROM oncegate_effect_attempts a JOIN oncegate_effects e
			ON e.id = a.effect_id WHERE e.key IN ('old', 'recent')`).Scan(&n)
		return n == 2
	})
	if _, err := h.pool.Exec(ctx, `UPDATE oncegate_effects SET finished_at = now() - interval '2 hours',
		created_at = now() - interval '3 hours' WHERE key = 'old'`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE oncegate_effects SET created_at = now() - interval '3 hours'
		WHERE key = 'pending-old'`); err != nil {
		t.Fatal(err)
	}
	h.g.dispatcher.Purge(ctx)
	if r := h.req("GET", "/v1/effects/old", acmeKey, ""); r.status != 404 {
		t.Fatalf("expired effect still there: %s", r.raw)
	}
	for _, k := range []string{"recent", "pending-old"} {
		if r := h.req("GET", "/v1/effects/"+k, acmeKey, ""); r.status != 200 {
			t.Fatalf("%s purged: %s", k, r.raw)
		}
	}
	// The purged key can be used again, for any request.
	if r := h.post("old", analytics("another")); r.status != 202 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("reuse of a purged key: %d %s", r.status, r.raw)
	}
}

func TestGetWithWaitReturnsTerminalState(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["slow"] = failingType("slow_events",
			&Retry{MaxAttempts: 2, BaseDelay: Duration(300 * time.Millisecond), MaxDelay: Duration(300 * time.Millisecond)},
			Breaker{Failures: 100})
		// Retried an hour from now at the earliest: certainly not terminal within a short wait.
		c.EffectTypes["stuck"] = failingType("stuck_events",
			&Retry{MaxAttempts: 5, BaseDelay: Duration(time.Hour), MaxDelay: Duration(time.Hour)}, Breaker{Failures: 100})
	})
	h.post("w", `{"type":"slow","payload":{"name":"a"}}`)
	start := time.Now()
	r := h.req("GET", "/v1/effects/w?wait=10s", acmeKey, "")
	if r.status != 200 || r.body["status"] != "dead" {
		t.Fatalf("wait returned %d %s", r.status, r.raw)
	}
	t.Logf("GET ?wait answered %v after the request, when the effect went dead", time.Since(start))
	// A wait that runs out returns the state as it is.
	h.post("w2", `{"type":"stuck","payload":{"name":"a"}}`)
	start = time.Now()
	r = h.req("GET", "/v1/effects/w2?wait=300ms", acmeKey, "")
	// Pending, or delivering if a loaded machine has the first attempt still in flight: not terminal either way.
	if took := time.Since(start); r.status != 200 || (r.body["status"] != "pending" && r.body["status"] != "delivering") ||
		took < 300*time.Millisecond {
		t.Fatalf("short wait: %s", r.raw)
	}
	if r := h.req("GET", "/v1/effects/w2?wait=forever", acmeKey, ""); r.status != 400 || r.body["field"] != "wait" {
		t.Fatalf("bad wait: %s", r.raw)
	}
}

// With Postgres down, requests get 503 with Retry-After and nothing is half-written; once it is back, the
// same request succeeds and is delivered once.
func TestPostgresDownGives503AndNothingHalfWritten(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Postgres stopped (immediate) under requests, then started", "503 with Retry-After during the outage, no half-written effect, the retried request delivered once")
	result("503 x3, then 1 effect, 1 delivery")
	cluster := pgtest.StartCluster(t)
	h := startGatewayOn(t, pgtest.DatabaseAt(t, cluster.URL()), nil)
	dbURL := h.db
	if r := h.post("before", analytics("a")); r.status != 202 {
		t.Fatal(r.raw)
	}
	h.waitStatus(acmeKey, "before", "delivered")

	cluster.Stop()
	for i := range 3 {
		r := h.post("during", analytics("b"))
		if r.status != 503 || r.header.Get("Retry-After") == "" || r.body["type"] != "/problems/unavailable" {
			t.Fatalf("request %d during the outage: %d %v %s", i, r.status, r.header, r.raw)
		}
		if strings.Contains(r.raw, "goroutine") || strings.Contains(r.raw, ".go:") {
			t.Fatalf("the 503 leaks internals: %s", r.raw)
		}
	}
	if r := h.req("GET", "/readyz", "", ""); r.status != 503 {
		t.Fatalf("readyz during the outage: %d", r.status)
	}
	if r := h.req("GET", "/healthz", "", ""); r.status != 200 {
		t.Fatalf("healthz during the outage: %d", r.status)
	}
	cluster.Start()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := h.post("during", analytics("b"))
		if r.status == 202 || r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d after Postgres came back: %s", r.status, r.raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
	h.waitStatus(acmeKey, "during", "delivered")
	pool := pgtest.Pool(t, dbURL)
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects"); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events"); n != 2 {
		t.Fatalf("%d deliveries, want 2", n)
	}
	if r := h.req("GET", "/readyz", "", ""); r.status != 200 {
		t.Fatalf("readyz after the outage: %d %s", r.status, r.raw)
	}
}

// Postgres stopped and restarted while four clients keep posting and the dispatcher keeps delivering:
// requests during the outage get 503, no effect is recorded without its outbox row, and every acknowledged
// effect is delivered once Postgres is back.
func TestPostgresOutageUnderLoad(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Postgres stopped for 2 s and restarted under 4 concurrent clients, dispatcher running",
		"503 + Retry-After during the outage; no effect without its outbox row; every acknowledged effect delivered after")
	cluster := pgtest.StartCluster(t)
	h := startGatewayOn(t, pgtest.DatabaseAt(t, cluster.URL()), nil)
	dbURL := h.db
	var mu sync.Mutex
	acked := map[string]bool{}
	statuses := map[int]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				r := h.post(key, analytics("load"))
				mu.Lock()
				statuses[r.status]++
				if r.status == 202 || r.status == 200 {
					acked[key] = true
				}
				if r.status == 503 && r.header.Get("Retry-After") == "" {
					t.Errorf("503 without Retry-After")
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	ackedNow := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	testenv.Eventually(t, 10*time.Second, "requests acknowledged before the outage", func() bool { return ackedNow() >= 20 })
	cluster.Stop()
	// The outage itself lasts 2 s: that is the fault, not a wait for something to happen.
	time.Sleep(2 * time.Second)
	cluster.Start()
	before := ackedNow()
	testenv.Eventually(t, 30*time.Second, "requests acknowledged again after the outage", func() bool {
		return ackedNow() >= before+20
	})
	close(stop)
	wg.Wait()

	pool := pgtest.Pool(t, dbURL)
	testenv.Eventually(t, 30*time.Second, "every acknowledged effect delivered", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox") == 0
	})
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects e WHERE status NOT IN ('delivered')
		OR NOT EXISTS (SELECT 1 FROM analytics_events a WHERE a.tenant = e.tenant AND a.key = e.key)`); n != 0 {
		t.Fatalf("%d effects undelivered or without their event", n)
	}
	missing := 0
	for key := range acked {
		if pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events WHERE key = $1", key) != 1 {
			missing++
		}
	}
	if missing != 0 || statuses[503] == 0 {
		t.Fatalf("%d acknowledged effects missing; answers %v", missing, statuses)
	}
	t.Logf("answers %v; %d acknowledged, all delivered once", statuses, len(acked))
	result(fmt.Sprintf("%d acknowledged and delivered; %d answered 503; 0 half-recorded", len(acked), statuses[503]))
}

// Each gateway counts into collectors of its own: two gateways in one process share no counter, and each
// serves the same metric names.
func TestMetricsArePerGateway(t *testing.T) {
	t.Parallel()
	db := pgtest.Database(t)
	a := startGatewayOn(t, db, nil)
	b := startGatewayOn(t, db, func(c *Config) { c.Dispatcher.Disabled = true })
	if r := a.post("m1", analytics("a")); r.status != 202 {
		t.Fatal(r.raw)
	}
	a.waitStatus(acmeKey, "m1", "delivered")
	metrics := func(h *harness) string { return h.req("GET", "/metrics", "", "").raw }
	for _, want := range []string{`oncegate_effects_created_total{type="analytics"} 1`,
		`oncegate_effects_finished_total{status="delivered",type="analytics"} 1`,
		`oncegate_delivery_attempts_total{outcome="delivered",type="analytics"} 1`,
		`oncegate_breaker_state{destination="analytics_events",tenant="acme",type="analytics"} 0`,
		`oncegate_breakers_open{type="analytics"} 0`} {
		if !strings.Contains(metrics(a), want) {
			t.Errorf("the gateway that did the work does not show %s", want)
		}
	}
	got := metrics(b)
	for _, absent := range []string{"oncegate_effects_created_total{", "oncegate_effects_finished_total{",
		"oncegate_delivery_attempts_total{"} {
		if strings.Contains(got, absent) {
			t.Errorf("the idle gateway shows the other's %s…", absent)
		}
	}
	// Breakers are per destination and made by deliveries: the idle gateway has none, but serves its count of
	// open ones.
	if strings.Contains(got, `oncegate_breaker_state{`) || !strings.Contains(got, `oncegate_breakers_open{type="analytics"} 0`) {
		t.Error("the idle gateway does not serve its own breaker state")
	}
}
