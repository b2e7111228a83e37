package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// heldMetric reads one tenant's oncegate_held_requests from /metrics.
func (h *harness) heldMetric(tenant string) string {
	h.t.Helper()
	r := h.req("GET", "/metrics", "", "")
	for _, line := range strings.Split(r.raw, "\n") {
		if strings.HasPrefix(line, `oncegate_held_requests{tenant="`+tenant+`"}`) {
			return strings.Fields(line)[1]
		}
	}
	return ""
}

// awaitHeld polls /metrics until tenant holds want requests.
func (h *harness) awaitHeld(tenant, want string) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for h.heldMetric(tenant) != want {
		if time.Now().After(deadline) {
			h.t.Fatalf("tenant %s never held %s requests (it holds %q)", tenant, want, h.heldMetric(tenant))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A tenant's waits are bounded by its held_requests: past them a wait is answered at once with the effect as
// it is, and Retry-After, while another tenant's waits still wait, and /metrics shows what each holds.
func TestHeldWaitsAreBoundedPerTenant(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) {
		c.Dispatcher.Disabled = true // effects stay pending: every wait runs to its end
		acme := c.Tenants["acme"]
		acme.HeldRequests = 2
		c.Tenants["acme"] = acme
	})
	if r := h.post("held-1", analytics("held")); r.status != 202 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if r := h.req("GET", "/v1/effects/held-1?wait=3s", acmeKey, ""); r.status != 200 || r.header.Get("Retry-After") != "" {
				t.Errorf("a wait within held_requests: %d, Retry-After %q", r.status, r.header.Get("Retry-After"))
			}
		})
	}
	h.awaitHeld("acme", "2")

	start := time.Now()
	r := h.req("GET", "/v1/effects/held-1?wait=3s", acmeKey, "")
	if took := time.Since(start); took > time.Second || r.status != 200 || r.body["status"] != "pending" ||
		r.header.Get("Retry-After") != "1" {
		t.Fatalf("a wait over held_requests: %d after %v, Retry-After %q: %s", r.status, took,
			r.header.Get("Retry-After"), r.raw)
	}
	// A create with wait over the bound is recorded, and answered at once.
	start = time.Now()
	r = h.req("POST", "/v1/effects", acmeKey, `{"type":"analytics","payload":{"name":"x"},"wait":"3s"}`,
		"Idempotency-Key: held-2")
	if took := time.Since(start); took > time.Second || r.status != 202 || r.header.Get("Retry-After") != "1" {
		t.Fatalf("a create with wait over held_requests: %d after %v: %s", r.status, took, r.raw)
	}
	// Another tenant's wait is its own.
	start = time.Now()
	r = h.req("POST", "/v1/effects", globexKey, `{"type":"analytics","payload":{"name":"x"},"wait":"1s"}`,
		"Idempotency-Key: held-3")
	if took := time.Since(start); took < time.Second || r.status != 202 || r.header.Get("Retry-After") != "" {
		t.Fatalf("another tenant's create with wait: %d after %v, Retry-After %q", r.status, took, r.header.Get("Retry-After"))
	}
	metrics := h.req("GET", "/metrics", "", "").raw
	if !strings.Contains(metrics, `oncegate_held_cut_total{tenant="acme",what="wait"} 2`) {
		t.Errorf("/metrics does not count acme's 2 cut waits:\n%s", grepLines(metrics, "oncegate_held"))
	}
	wg.Wait()
	h.awaitHeld("acme", "0")
}

const thirdKey = "initech-api-key-5d7f9b1c3e5a7c9e1b3d"

// When every connection the gateway may hold serves a wait, a new connection is not left in the accept queue:
// the wait of the tenant holding the most is ended early (answered with Retry-After) to make room.
func TestAFullGateShedsAWait(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) {
		c.Dispatcher.Disabled = true
		c.Limits.MaxConnections = 2
		third := c.Tenants["acme"]
		third.APIKeys = []string{thirdKey}
		c.Tenants["initech"] = third
	})
	for _, k := range []string{acmeKey, globexKey} {
		if r := h.req("POST", "/v1/effects", k, analytics("shed"), "Idempotency-Key: shed"); r.status != 202 {
			t.Fatalf("create: %d %s", r.status, r.raw)
		}
	}
	// The creates' keep-alive connection is let go first: a wait sent on it could meet the gate closing it
	// as idle to make room for the other wait's new connection (the server had not yet seen a byte of the
	// request); the client's retry then found both places taken, and the two waits never held together.
	// (The gate's closing of idle connections is TestConnectionCapLetsALegitimateRequestThrough's.)
	noRedirects.CloseIdleConnections()
	// One wait after the other: two new connections at once are two that hold no request yet, one over the
	// gate's spare of max/4 (here 1), and the gate closed one of them before it was read, which the client
	// retried into the same race (the waits never both held, 1 run in 4).
	var wg sync.WaitGroup
	cut := make(chan string, 2)
	for i, k := range []string{acmeKey, globexKey} {
		wg.Go(func() {
			r := h.req("GET", "/v1/effects/shed?wait=5s", k, "")
			if r.header.Get("Retry-After") == "1" {
				cut <- k
			}
		})
		for deadline := time.Now().Add(5 * time.Second); h.g.held.count("acme")+h.g.held.count("globex") < i+1; {
			if time.Now().After(deadline) {
				t.Fatalf("wait %d never held", i+1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	start := time.Now()
	// A third tenant's: each of the others owns a connection, and one over its share would be refused.
	r := h.req("GET", "/v1/effects?limit=1", thirdKey, "")
	took := time.Since(start)
	if r.status != 200 || took > 2*time.Second {
		t.Fatalf("a request while both connections wait: %d after %v", r.status, took)
	}
	select {
	case <-cut:
	case <-time.After(2 * time.Second):
		t.Fatal("no wait was cut short")
	}
	t.Logf("answered in %v", took.Round(time.Millisecond))
	wg.Wait()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return fmt.Sprint(strings.Join(out, "\n"))
}

// While connections are scarce (the gate three quarters full), a tenant that owns over a quarter of them is
// refused at once, 429 with Retry-After and its connection closed, and another tenant is served.
func TestATenantOverItsShareOfScarceConnectionsIsRefused(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) { c.Limits.MaxConnections = 8 }) // scarce from 6; a quarter is 2
	send := func(key string) *http.Response {
		c := h.dial()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "GET /v1/effects?limit=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+key+"\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp // its connection stays open, idle
	}
	for i := range 5 {
		if r := send(acmeKey); r.StatusCode != 200 {
			t.Fatalf("acme's request %d on 5 connections of 8: %d", i, r.StatusCode)
		}
	}
	r := send(acmeKey)
	if r.StatusCode != 429 || r.Header.Get("Retry-After") != "1" || !r.Close {
		t.Fatalf("acme's request on its 6th connection of 8: %d, Retry-After %q, close %v", r.StatusCode,
			r.Header.Get("Retry-After"), r.Close)
	}
	if r := send(globexKey); r.StatusCode != 200 {
		t.Fatalf("globex's request: %d", r.StatusCode)
	}
	if m := h.req("GET", "/metrics", "", "").raw; !strings.Contains(m, `oncegate_rate_limited_total{bucket="connections",tenant="acme"} 1`) {
		t.Errorf("/metrics does not count the refusal:\n%s", grepLines(m, "rate_limited"))
	}
}

// A tenant that holds all its held_requests gets a second for a body, not timeouts.read: a dribbled body is
// cut off after heldBodyGrace, and the request answered without recording anything.
func TestASlowBodyOverHeldRequestsIsCutOffAfterASecond(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) {
		c.Dispatcher.Disabled = true
		c.Timeouts.Read = Duration(10 * time.Second)
		acme := c.Tenants["acme"]
		acme.HeldRequests = 1
		c.Tenants["acme"] = acme
	})
	if r := h.post("held-body", analytics("held")); r.status != 202 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	waited := make(chan struct{})
	go func() { // h.req would call t.Fatal off the test's goroutine
		defer close(waited)
		req, _ := http.NewRequest("GET", h.url+"/v1/effects/held-body?wait=5s", nil)
		req.Header.Set("Authorization", "Bearer "+acmeKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	defer func() { <-waited }()
	for deadline := time.Now().Add(5 * time.Second); h.g.held.count("acme") < 1; {
		if time.Now().After(deadline) {
			t.Fatal("the wait never held")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c := h.dial()
	start := time.Now()
	fmt.Fprintf(c, "POST /v1/effects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Idempotency-Key: slow\r\nContent-Length: 1000\r\n\r\n{", acmeKey)
	go func() {
		for range 20 {
			time.Sleep(250 * time.Millisecond)
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	closedWithin(t, c, 4*time.Second)
	if took := time.Since(start); took < heldBodyGrace || took > 3*time.Second {
		t.Fatalf("the slow body's connection was closed after %v; want about %v, far below timeouts.read", took, heldBodyGrace)
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects WHERE key = 'slow'"); n != 0 {
		t.Fatalf("%d effects recorded from a body cut off", n)
	}
	if m := h.req("GET", "/metrics", "", "").raw; !strings.Contains(m, `oncegate_held_cut_total{tenant="acme",what="body"} 1`) {
		t.Errorf("/metrics does not count the cut body:\n%s", grepLines(m, "oncegate_held"))
	}
}

// The heartbeat writes, with the types the gateway delivers, the requests each tenant holds open in it, for
// `oncegate gateway ls` and the console (issue 33 asks for them beside /metrics).
func TestTheHeartbeatWritesHeldRequests(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) { c.Dispatcher.Disabled = true })
	if r := h.post("held-beat", analytics("held")); r.status != 202 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 2 {
		wg.Go(func() { h.req("GET", "/v1/effects/held-beat?wait=2s", acmeKey, "") })
	}
	h.awaitHeld("acme", "2")
	if err := h.g.writeHeartbeat(t.Context(), "127.0.0.1:1", time.Now()); err != nil {
		t.Fatal(err)
	}
	var held, types string
	if err := h.pool.QueryRow(t.Context(), `SELECT held::text, array_to_string(types, ',') FROM oncegate_gateways
		WHERE id = $1`, h.g.dispatcher.Owner()).Scan(&held, &types); err != nil {
		t.Fatal(err)
	}
	if held != `{"acme": 2}` || !strings.Contains(types, "analytics") {
		t.Fatalf("heartbeat row: held %s, types %s", held, types)
	}
}

// A tenant refused for holding too many connections is told to come back later the more of its requests
// were refused this second, a share of its ceiling per second, so that its clients do not all reconnect at
// once and fill the accept queue every other tenant's new connections wait in.
func TestRefusedConnectionsComeBackSpread(t *testing.T) {
	g := newConnGate(nil, 200, nil, nil, nil) // a ceiling of 50 a tenant
	now := time.Now()
	got := map[int]int{}
	for range 2000 {
		got[g.retryAfter("alpha", now)]++
	}
	if got[1] != 50 || got[2] != 50 || got[29] != 50 || got[30] != 2000-29*50 {
		t.Fatalf("Retry-After counts %v; want 50 each of 1..29 and the rest 30", got)
	}
	if after := g.retryAfter("beta", now); after != 1 {
		t.Fatalf("another tenant's first refusal: Retry-After %d; want 1", after)
	}
	if after := g.retryAfter("alpha", now.Add(time.Second)); after != 1 {
		t.Fatalf("alpha's first refusal of the next second: Retry-After %d; want 1", after)
	}
}

// When every connection serves a request, the gate sheds a wait of the tenant holding the most; never another
// tenant's waits because that one's held requests (proxied calls, bodies) cannot be shed.
func TestShedOnlyTheTenantHoldingTheMost(t *testing.T) {
	h := newHeld(func(string) int { return 100 }, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g"}, []string{"tenant"}))
	for range 30 {
		if _, ok := h.hold("alpha"); !ok { // proxied calls: held, not sheddable
			t.Fatal("alpha: no held request")
		}
	}
	betaWait, releaseBeta, ok := h.holdWait(context.Background(), "beta")
	if !ok {
		t.Fatal("beta: no held request")
	}
	defer releaseBeta()
	if h.shedOne() || betaWait.Err() != nil {
		t.Fatal("beta's wait was shed for alpha, which holds the most")
	}
	alphaWait, releaseAlpha, _ := h.holdWait(context.Background(), "alpha")
	defer releaseAlpha()
	if !h.shedOne() || alphaWait.Err() == nil || betaWait.Err() != nil {
		t.Fatalf("shed: alpha's wait %v, beta's %v; want alpha's ended and beta's not", alphaWait.Err(), betaWait.Err())
	}
}

// The heartbeat says which partition settings the gateway's manager runs with (migration 00029), and none
// while it runs no manager: the fleet's settings change only when no gateway alive runs with them, and a
// gateway that makes no partitions must not hold them.
func TestTheHeartbeatSaysWhichPartitionSettingsItsManagerRunsWith(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) { c.Dispatcher.Disabled = true })
	settings := func() *string {
		t.Helper()
		if err := h.g.writeHeartbeat(t.Context(), "127.0.0.1:1", time.Now()); err != nil {
			t.Fatal(err)
		}
		var s *string
		if err := h.pool.QueryRow(t.Context(), `SELECT partition_settings FROM oncegate_gateways WHERE id = $1`,
			h.g.dispatcher.Owner()).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	testenv.Eventually(t, 10*time.Second, "the partition manager runs", h.g.managing.Load)
	// Asked until it holds: the gateway's own heartbeat, begun before, may land after this test's write.
	var last *string
	testenv.Eventually(t, 10*time.Second, "the heartbeat names the manager's settings", func() bool {
		last = settings()
		return last != nil && strings.Contains(*last, "interval=")
	})
	h.g.managing.Store(false)
	testenv.Eventually(t, 10*time.Second, "the heartbeat of a gateway running no manager names none", func() bool {
		last = settings()
		return last == nil
	})
}
