package outbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/safehttp"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers"
	"github.com/oncegate/oncegate/providers/webhook"
)

var testSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("breaker-test-secret-of-32-bytes!"))

// createFor records an effect of tenant with payload.
func (f *fixture) createFor(tenant, key, typ, payload string) {
	f.t.Helper()
	if _, _, err := f.store.Create(context.Background(), dedup.NewEffect{Tenant: tenant, Key: key, Type: typ,
		Payload: json.RawMessage(payload)}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) getFor(tenant, key string) *dedup.Effect {
	f.t.Helper()
	e, err := f.store.Get(context.Background(), tenant, key)
	if err != nil {
		f.t.Fatal(err)
	}
	return e
}

// server is a real HTTP destination on loopback that answers with handle and counts its requests.
func server(t *testing.T, handle func(n int64, w http.ResponseWriter)) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		handle(n.Add(1), w)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func hookProvider(t *testing.T, defaultURL string) *webhook.Provider {
	t.Helper()
	p, err := webhook.New(webhook.Config{URL: defaultURL, AllowedHosts: []string{"http://127.0.0.1:*"}, Secret: testSecret,
		AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func hookPayload(u string) string { return fmt.Sprintf(`{"event":"e","data":1,"url":%q}`, u) }

// Finding 4 of issue 12: tenant beta's failing endpoint opened the effect type's one breaker, and tenant
// alpha's webhook of the same type to a healthy endpoint waited for it. Breakers are per destination (and
// tenant), so alpha's delivery goes at once.
func TestOneTenantsFailingDestinationDoesNotHoldAnother(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Isolation", "Tenant beta's webhook URL answers 500 until its breaker opens (open for 1 h); tenant alpha then sends a webhook of the same type to a healthy URL",
		"Alpha's webhook is delivered at once, in one attempt; beta's rows wait uncharged behind beta's open breaker")
	f := newFixture(t)
	failing, failed := server(t, func(_ int64, w http.ResponseWriter) { w.WriteHeader(500) })
	healthy, _ := server(t, func(_ int64, w http.ResponseWriter) { w.WriteHeader(204) })
	for i := range 6 {
		f.createFor("beta", fmt.Sprintf("b%d", i), "hook", hookPayload(failing.URL+"/beta"))
	}
	d := f.run(EffectType{Name: "hook", Provider: hookProvider(t, ""), BreakerFailures: 3, BreakerOpenFor: time.Hour,
		Retry: backoffPolicy(time.Millisecond), Concurrency: 1})
	testenv.Eventually(t, 10*time.Second, "beta's breaker opens, no delivery in flight", func() bool {
		return failed.Load() == 3 &&
			pgtest.Count(t, f.pool, "SELECT count(*) FROM oncegate_outbox WHERE lease_token IS NOT NULL") == 0
	})
	start := time.Now()
	f.createFor("alpha", "a1", "hook", hookPayload(healthy.URL+"/alpha"))
	d.Wake()
	var e *dedup.Effect
	testenv.Eventually(t, 10*time.Second, "alpha's webhook is delivered", func() bool {
		e = f.getFor("alpha", "a1")
		return e.Status == effect.StatusDelivered
	})
	took := time.Since(start)
	if took > 3*time.Second || e.Attempts != 1 {
		t.Fatalf("alpha's webhook took %v and %d attempts behind beta's open breaker", took, e.Attempts)
	}
	if b, a := d.breakers.state("hook", "beta", hostOf(failing.URL)), d.breakers.state("hook", "alpha", hostOf(healthy.URL)); b != "open" || a != "closed" {
		t.Fatalf("beta's breaker is %q, alpha's %q; want open and closed", b, a)
	}
	calls := failed.Load()
	charged := pgtest.Count(t, f.pool, "SELECT sum(attempts) FROM oncegate_effects WHERE tenant = 'beta'")
	if n := pgtest.Count(t, f.pool, "SELECT count(*) FROM oncegate_effects WHERE tenant = 'beta' AND status = 'pending'"); n != 6 || calls != 3 {
		t.Fatalf("beta: %d of 6 pending, its URL called %d times (want 3: the breaker opens after 3)", n, calls)
	}
	result(fmt.Sprintf("alpha delivered in %v, 1 attempt; beta's URL called %d times, %d attempts charged to 6 effects",
		took.Round(time.Millisecond), calls, charged))
}

// hostOf is the destination a webhook URL names: its host.
// hostOf is the destination a breaker is kept by: u's scheme, host and port (safehttp.Destination).
func hostOf(u string) string {
	p, _ := url.Parse(u)
	return safehttp.Destination(p)
}

// commitCounter counts the statements a pool runs: each is one transaction here (the dispatcher runs no
// explicit transaction for a webhook), so the count is the commits the dispatcher makes.
type commitCounter struct{ n atomic.Int64 }

func (c *commitCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *commitCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// xactCommits reads the database's committed transactions, as Postgres counts them.
func xactCommits(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(),
		"SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Finding 5 of issue 12: while a breaker was half-open and its one probe hung on a slow destination, every
// other row of the type was claimed and handed back with no delay, in a loop: 916 commits/s. A refused row now
// waits until the breaker can next let a call through, so the dispatcher is as quiet as when idle.
func TestHalfOpenProbeDoesNotSpin(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Isolation", "A breaker half-open for 3 s while its probe hangs on a slow destination, 20 rows waiting behind it",
		"No busy loop: the dispatcher's statements per second stay near its idle polling rate")
	dbURL := pgtest.Database(t)
	var counter commitCounter
	pool := pgtest.TracedPool(t, dbURL, &counter)
	f := &fixture{t: t, pool: pool, store: dedup.NewStore(pool)}
	observer := pgtest.Pool(t, dbURL)

	release := make(chan struct{})
	var probing atomic.Bool
	slow, _ := server(t, func(n int64, w http.ResponseWriter) {
		if n == 1 {
			w.WriteHeader(500) // opens the breaker
			return
		}
		probing.Store(true)
		<-release
		w.WriteHeader(204)
	})
	// One row opens the breaker; the others arrive while it is open, so the half-open probe is the only call
	// in flight and the type has free slots.
	f.createFor("t", "r0", "hook", hookPayload(slow.URL))
	d := f.dispatcher(Config{Types: []EffectType{{Name: "hook", Provider: hookProvider(t, ""), BreakerFailures: 1,
		BreakerOpenFor: 200 * time.Millisecond, Timeout: 5 * time.Second, Concurrency: 4,
		Retry: backoffPolicy(time.Millisecond)}}})
	f.start(d)
	testenv.Eventually(t, 10*time.Second, "the first attempt fails", func() bool { return f.get("r0").Attempts == 1 })
	for i := 1; i < 20; i++ {
		f.createFor("t", fmt.Sprintf("r%d", i), "hook", hookPayload(slow.URL))
	}
	testenv.Eventually(t, 10*time.Second, "the half-open probe reaches the slow destination", func() bool { return probing.Load() })
	time.Sleep(300 * time.Millisecond) // rows due when the breaker turned half-open have been refused by now
	const window = 3 * time.Second
	statements, commits := counter.n.Load(), xactCommits(t, observer)
	time.Sleep(window)
	statements, commits = counter.n.Load()-statements, xactCommits(t, observer)-commits
	close(release)
	perSecond := float64(statements) / window.Seconds()
	t.Logf("while the probe hung: %.0f dispatcher statements/s, %.0f commits/s in pg_stat_database", perSecond,
		float64(commits)/window.Seconds())
	result(fmt.Sprintf("%.0f dispatcher statements/s, %.0f commits/s (pg_stat_database) while the probe hung; idle polling at 50 ms is 20/s",
		perSecond, float64(commits)/window.Seconds()))
	// Idle, the dispatcher polls every 50 ms (fixture): 20 claims a second.
	if perSecond > 40 {
		t.Fatalf("%.0f statements/s while the probe hung: the dispatcher spins", perSecond)
	}
	for i := range 20 {
		f.waitStatus(fmt.Sprintf("r%d", i), effect.StatusDelivered)
	}
	if n := pgtest.Count(t, f.pool, "SELECT sum(attempts) FROM oncegate_effects"); n != 21 {
		t.Fatalf("%d attempts charged to 20 effects, want 21 (one failure, then one each)", n)
	}
}

// A tenant naming ever new hosts (a payload url on "*.example.com") keeps at most MaxBreakers breakers, and
// as many metric series, for the type: closed ones are forgotten least recently used first, open ones are
// kept (forgetting them would let calls through to a destination that is down), and once every kept breaker
// is open the tenant's further destinations share one overflow breaker. Idle breakers are forgotten.
func TestBreakersAreBounded(t *testing.T) {
	t.Parallel()
	m := NewMetrics()
	const maxKept = 50
	s := newBreakerSet(maxKept, time.Minute, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	typ := &effectType{EffectType: EffectType{Name: "hook", BreakerFailures: 1, BreakerOpenFor: time.Hour,
		Timeout: time.Second}}
	fail := func(b *breaker) {
		_, _ = b.cb.Execute(func() (providers.Outcome, error) { return providers.Outcome{}, errBreakerFailure })
	}
	series := func() int { return countSeries(m.BreakerState) }
	for i := range 100_000 {
		s.get(typ, "beta", fmt.Sprintf("h%d.example.com", i))
	}
	s.get(typ, "alpha", "hooks.alpha.test")
	if n := s.len(); n != maxKept+1 || series() != maxKept+1 {
		t.Fatalf("100,000 hosts of beta, 1 of alpha: %d breakers, %d series; want %d", n, series(), maxKept+1)
	}
	if s.state("hook", "alpha", "hooks.alpha.test") != "closed" {
		t.Fatal("beta's hosts evicted alpha's breaker")
	}
	// Beta's hosts all fail: every kept breaker opens, and is kept.
	for i := range 2 * maxKept {
		fail(s.get(typ, "beta", fmt.Sprintf("down%d.example.com", i)))
	}
	if n := s.len(); n != maxKept+2 || series() != maxKept+2 {
		t.Fatalf("%d breakers, %d series; want beta's %d open ones, its overflow and alpha's", n, series(), maxKept)
	}
	if got := s.state("hook", "beta", "down0.example.com"); got != "open" {
		t.Fatalf("the first open breaker was forgotten (%q) for room", got)
	}
	if got := s.state("hook", "beta", OverflowDestination); got != "open" {
		t.Fatalf("overflow breaker %q; want open after the failures beyond %d destinations", got, maxKept)
	}
	if open := gauge(t, m.BreakersOpen.WithLabelValues("hook")); open != maxKept+1 {
		t.Fatalf("oncegate_breakers_open = %v, want %d", open, maxKept+1)
	}
	// Alpha, beside them, still has a breaker of its own.
	if b := s.get(typ, "alpha", "hooks.alpha.test"); b.key.dest != "hooks.alpha.test" || b.cb.State().String() != "closed" {
		t.Fatalf("alpha's breaker: %+v %s", b.key, b.cb.State())
	}
	// Idle breakers are forgotten, open or not, with their series.
	s.mu.Lock()
	s.sweep(time.Now().Add(2 * time.Minute))
	s.mu.Unlock()
	if n := s.len(); n != 0 || series() != 0 || gauge(t, m.BreakersOpen.WithLabelValues("hook")) != 0 {
		t.Fatalf("after the idle time: %d breakers, %d series", n, series())
	}
}

func countSeries(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 1024)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
