package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// The probe tells a pooler from Postgres itself, and through PgBouncer in transaction mode the gateway
// creates, replays and delivers: without prepared statements, which PgBouncer 1.18 loses between
// transactions (pgx's defaults answered 37 of 40 creates with a 500 there).
func TestThroughPgBouncerQueriesRunWithoutPreparedStatements(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	h := startGatewayOn(t, pgtest.ThroughPgBouncer(t, dbURL), nil)
	ctx := testenv.Context(t, 30*time.Second)
	if pooled, err := h.g.probe.Pooled(ctx); err != nil || !pooled {
		t.Fatalf("through PgBouncer: pooled %v, %v", pooled, err)
	}
	direct := startGatewayOn(t, dbURL, func(c *Config) { c.Dispatcher.Disabled = true })
	if pooled, err := direct.g.probe.Pooled(ctx); err != nil || pooled {
		t.Fatalf("direct: pooled %v, %v", pooled, err)
	}
	for i := range 40 {
		key := "k" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		if r := h.post(key, analytics("e")); r.status != 202 {
			t.Fatalf("create %d: %d %s", i, r.status, r.raw)
		}
		if r := h.post(key, analytics("e")); r.status/100 != 2 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay %d: %d %s", i, r.status, r.raw)
		}
	}
	pool := pgtest.Pool(t, dbURL)
	testenv.Eventually(t, 30*time.Second, "40 effects delivered through PgBouncer", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'") == 40
	})
	if !strings.Contains(h.logs.String(), "exec mode") {
		t.Fatalf("the gateway did not say how it runs its queries:\n%s", h.logs.String())
	}
}

// Without listen_url, behind PgBouncer, notifications are off: the gateway says so, and a request waiting on
// a gateway that does not deliver is answered by polling, not when its wait runs out.
func TestWaitIsAnsweredByPollingWhenNotificationsAreOff(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.ThroughPgBouncer(t, pgtest.Database(t))
	api := startGatewayOn(t, bouncer, func(c *Config) { c.Dispatcher.Disabled = true })
	startGatewayOn(t, bouncer, nil)
	testenv.Eventually(t, 10*time.Second, "the gateway says that notifications are off", func() bool {
		return strings.Contains(api.logs.String(), "notifications are off")
	})
	start := time.Now()
	r := api.post("k", `{"type":"analytics","payload":{"name":"e"},"wait":"25s"}`)
	took := time.Since(start)
	if r.status != 200 || r.body["status"] != "delivered" {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	t.Logf("answered after %v, polling every %v", took.Round(time.Millisecond), DefaultFallbackPollInterval)
	if took > 20*time.Second {
		t.Fatalf("the wait ran to its end (%v): it does not poll", took)
	}
}

// A new effect wakes the dispatchers at once, with both gateways polling only once a minute: this gateway's
// in-process, after the commit, and another gateway's through the batched notification, since the insert
// itself notifies no one.
func TestNewEffectWakesTheDispatchersAfterItsCommit(t *testing.T) {
	t.Parallel()
	db := pgtest.Database(t)
	slow := func(c *Config) {
		c.Dispatcher.PollInterval = Duration(time.Minute)
		c.Dispatcher.FallbackPollInterval = Duration(time.Minute)
	}
	// Through PgBouncer, without listen_url, notifications are off: only the in-process wake is left.
	// Five in a row, so that the dispatcher's first claim, at start, cannot be what finds them all.
	alone := startGatewayOn(t, pgtest.ThroughPgBouncer(t, pgtest.Database(t)), slow)
	for i := range 5 {
		if r := alone.post(fmt.Sprint("local", i), `{"type":"analytics","payload":{"name":"e"},"wait":"25s"}`); r.body["status"] != "delivered" {
			t.Fatalf("in-process wake %d: %d %s", i, r.status, r.raw)
		}
	}

	api := startGatewayOn(t, db, func(c *Config) { slow(c); c.Dispatcher.Disabled = true })
	disp := startGatewayOn(t, db, slow)
	for _, h := range []*harness{api, disp} {
		testenv.Eventually(t, 20*time.Second, "the notification self-check passes", func() bool { return h.g.heard.Load() })
	}
	if r := api.post("remote", analytics("e")); r.status != 202 {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	testenv.Eventually(t, 20*time.Second, "the other gateway delivers, woken by the notification", func() bool {
		return api.count("SELECT count(*) FROM oncegate_effects WHERE key = 'remote' AND status = 'delivered'") == 1
	})
	if !strings.Contains(api.logs.String(), "notifications work") {
		t.Fatalf("no word of the self-check:\n%s", api.logs.String())
	}
}
