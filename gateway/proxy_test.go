package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	httpprov "github.com/oncegate/oncegate/providers/http"
)

// upstream is a real HTTP server that counts what reaches it and answers as told.
type upstream struct {
	*httptest.Server
	calls  atomic.Int64
	mu     sync.Mutex
	seen   []*http.Request
	bodies [][]byte
	answer func(w http.ResponseWriter, r *http.Request, n int64)
}

func newUpstream(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int64)) *upstream {
	u := &upstream{answer: answer}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen, u.bodies = append(u.seen, r), append(u.bodies, b)
		u.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		u.answer(w, r, n)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) last() (*http.Request, []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[len(u.seen)-1], u.bodies[len(u.bodies)-1]
}

func chargeAnswer(w http.ResponseWriter, r *http.Request, n int64) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Request-Id", fmt.Sprintf("req_%d", n))
	w.Header().Set("Connection", "X-Hop")
	w.Header().Set("X-Hop", "one connection only")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"ch_%d","amount":2000}`, n)
}

func proxyGateway(t *testing.T, up *upstream, mutate func(*Config)) *harness {
	return startGateway(t, func(c *Config) {
		c.EffectTypes["payments"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: up.URL + "/api",
			AllowPrivateNetworks: true, Headers: map[string]string{"Authorization": "Bearer sk_upstream_secret_1"}}}
		if mutate != nil {
			mutate(c)
		}
	})
}

func TestProxyReplaysByteForByte(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, chargeAnswer)
	h := proxyGateway(t, up, nil)
	send := func(body string) response {
		return h.req("POST", "/v1/proxy/payments/v1/charges?expand=x", acmeKey, body, "Idempotency-Key: ch-1",
			"Content-Type: application/x-www-form-urlencoded", "Stripe-Version: 2024-01-01", "Cookie: a=b")
	}
	first := send("amount=2000&currency=usd")
	if first.status != 400 || !strings.Contains(first.raw, "Cookie") {
		t.Fatalf("a Cookie header is refused by the http provider's rules: %d %s", first.status, first.raw)
	}
	send = func(body string) response {
		return h.req("POST", "/v1/proxy/payments/v1/charges?expand=x", acmeKey, body, "Idempotency-Key: ch-1",
			"Content-Type: application/x-www-form-urlencoded", "Stripe-Version: 2024-01-01")
	}
	first = send("amount=2000&currency=usd")
	if first.status != 201 || first.raw != `{"id":"ch_1","amount":2000}` {
		t.Fatalf("first: %d %s", first.status, first.raw)
	}
	if first.header.Get("Idempotent-Replayed") != "" || first.header.Get("X-Hop") != "" {
		t.Fatalf("first answer headers: %v", first.header)
	}
	req, body := up.last()
	if req.URL.Path != "/api/v1/charges" || req.URL.RawQuery != "expand=x" || string(body) != "amount=2000&currency=usd" {
		t.Fatalf("upstream saw %s %s %q", req.URL.Path, req.URL.RawQuery, body)
	}
	if req.Header.Get("Authorization") != "Bearer sk_upstream_secret_1" || req.Header.Get("Stripe-Version") != "2024-01-01" ||
		!strings.HasPrefix(req.Header.Get("Idempotency-Key"), "eff_") {
		t.Fatalf("upstream headers: %v", req.Header)
	}
	second := send("amount=2000&currency=usd")
	if second.status != 201 || second.raw != first.raw || second.header.Get("Idempotent-Replayed") != "true" ||
		second.header.Get("X-Request-Id") != "req_1" {
		t.Fatalf("replay: %d %v %s", second.status, second.header, second.raw)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d", n)
	}
	other := send("amount=3000&currency=usd")
	if other.status != 422 || other.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("other body under the key: %d %s", other.status, other.raw)
	}
	// The effect is an effect like any other.
	e := h.req("GET", "/v1/effects/ch-1", acmeKey, "")
	if e.body["status"] != "delivered" || e.body["type"] != "payments" {
		t.Fatalf("effect: %s", e.raw)
	}
	if n := h.count(`SELECT count(*) FROM oncegate_outbox`); n != 0 {
		t.Fatalf("outbox rows left: %d", n)
	}
}

func TestProxyConcurrentIdenticalPostsCallOnce(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		<-release
		chargeAnswer(w, r, n)
	})
	h := proxyGateway(t, up, nil)
	var wg sync.WaitGroup
	answers := make([]response, 50)
	for i := range answers {
		wg.Go(func() {
			answers[i] = h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"amount":1}`, "Idempotency-Key: c-50")
		})
	}
	for up.calls.Load() == 0 {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	for i, a := range answers {
		if a.status != 201 || a.raw != `{"id":"ch_1","amount":2000}` {
			t.Fatalf("answer %d: %d %s", i, a.status, a.raw)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d", n)
	}
}

func TestProxyTransientFailureIsNotStored(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "try later")
			return
		}
		chargeAnswer(w, r, n)
	})
	h := proxyGateway(t, up, nil)
	a := h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"amount":1}`, "Idempotency-Key: t-1")
	if a.status != 503 || a.raw != "try later" {
		t.Fatalf("first: %d %s", a.status, a.raw)
	}
	// The failed attempt leaves the effect to be retried, and Retry-After: 0 makes it due at once: the retry is
	// made by this request, or by the dispatcher first and then answered to it as a replay (a busy machine).
	// Either way the 503 was not stored and the upstream was called once more.
	b := h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"amount":1}`, "Idempotency-Key: t-1")
	if b.status != 201 || b.raw != `{"id":"ch_2","amount":2000}` {
		t.Fatalf("retry: %d %s", b.status, b.raw)
	}
	up.mu.Lock()
	k1, k2 := up.seen[0].Header.Get("Idempotency-Key"), up.seen[1].Header.Get("Idempotency-Key")
	up.mu.Unlock()
	if k1 != k2 {
		t.Fatalf("a retry under the key carries the same stable id: %q %q", k1, k2)
	}
	c := h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"amount":1}`, "Idempotency-Key: t-1")
	if c.status != 201 || c.raw != b.raw || c.header.Get("Idempotent-Replayed") != "true" || up.calls.Load() != 2 {
		t.Fatalf("replay: %d %s, %d calls", c.status, c.raw, up.calls.Load())
	}
}

func TestProxyRules(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("x"), 2048)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		switch r.URL.Path {
		case "/api/big":
			_, _ = w.Write(big)
		case "/api/binary":
			body, _ := io.ReadAll(r.Body)
			_, _ = w.Write(append([]byte{0, 0xff}, body...))
		default:
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprintf(w, "%s %s", r.Method, r.URL.RequestURI())
		}
	})
	h := proxyGateway(t, up, func(c *Config) {
		c.EffectTypes["small"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: up.URL + "/api",
			AllowPrivateNetworks: true, MaxAnswer: 1024}}
		c.EffectTypes["analytics"] = EffectType{Provider: "postgres"}
	})
	get := h.req("GET", "/v1/proxy/payments/things?a=1", acmeKey, "")
	if get.status != 200 || get.raw != "GET /api/things?a=1" {
		t.Fatalf("GET passes through: %d %s", get.status, get.raw)
	}
	if n := h.count(`SELECT count(*) FROM oncegate_effects`); n != 0 {
		t.Fatalf("a GET is not recorded: %d effects", n)
	}
	if r := h.req("POST", "/v1/proxy/payments/things", acmeKey, "{}"); r.status != 400 || r.body["field"] != "Idempotency-Key" {
		t.Fatalf("POST without a key: %d %s", r.status, r.raw)
	}
	if r := h.req("POST", "/v1/proxy/analytics/x", acmeKey, "{}", "Idempotency-Key: a"); r.status != 404 {
		t.Fatalf("a type whose provider is not http: %d %s", r.status, r.raw)
	}
	if r := h.req("POST", "/v1/proxy/payments/x", "", "{}", "Idempotency-Key: a"); r.status != 401 {
		t.Fatalf("no API key: %d", r.status)
	}
	if r := h.req("POST", "/v1/proxy/payments/a%5C..%5Cb", acmeKey, "{}", "Idempotency-Key: p"); r.status != 400 {
		t.Fatalf("the provider's path rules hold: %d %s", r.status, r.raw)
	}
	for range 2 {
		r := h.req("POST", "/v1/proxy/small/big", acmeKey, "{}", "Idempotency-Key: big")
		if r.status != 502 || !strings.Contains(r.raw, "answer-too-large") {
			t.Fatalf("an answer over max_answer: %d %s", r.status, r.raw)
		}
	}
	bin := []byte{0xff, 0xfe, 0, 1, 2}
	var answers []string
	for range 2 {
		req, _ := http.NewRequest("PUT", h.url+"/v1/proxy/payments/binary", bytes.NewReader(bin))
		req.Header.Set("Authorization", "Bearer "+acmeKey)
		req.Header.Set("Idempotency-Key", "bin")
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers = append(answers, string(b))
	}
	if want := string(append([]byte{0, 0xff}, bin...)); answers[0] != want || answers[1] != want {
		t.Fatalf("binary bodies go and come back as bytes: %q %q", answers[0], answers[1])
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("upstream calls: %d", n)
	}
}

func TestProxyAPIKeyHeader(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, chargeAnswer)
	h := proxyGateway(t, up, func(c *Config) { c.Proxy.APIKeyHeader = "Oncegate-Api-Key" })
	r := h.req("POST", "/v1/proxy/payments/charges", "", "{}", "Idempotency-Key: k", "Oncegate-Api-Key: "+acmeKey,
		"Authorization: Bearer sk_client_owned")
	if r.status != 201 {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	req, _ := up.last()
	if req.Header.Get("Authorization") != "Bearer sk_upstream_secret_1" || req.Header.Get("Oncegate-Api-Key") != "" {
		t.Fatalf("the upstream gets the configured credential only: %v", req.Header)
	}
}

// Through PgBouncer in transaction mode the proxy records, performs and replays: its statements run without
// prepared statements like every other.
func TestProxyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, chargeAnswer)
	h := startGatewayOn(t, pgtest.ThroughPgBouncer(t, pgtest.Database(t)), func(c *Config) {
		c.EffectTypes["payments"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: up.URL,
			AllowPrivateNetworks: true}}
	})
	for i := range 10 {
		key := fmt.Sprintf("pb-%d", i)
		a := h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"n":1}`, "Idempotency-Key: "+key)
		b := h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"n":1}`, "Idempotency-Key: "+key)
		if a.status != 201 || b.status != 201 || a.raw != b.raw || b.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: %d %s / %d %s", key, a.status, a.raw, b.status, b.raw)
		}
	}
	if n := up.calls.Load(); n != 10 {
		t.Fatalf("upstream calls: %d", n)
	}
}

// The address guard holds through the proxy: a type without allow_private_networks reaches no loopback
// upstream, and the refusal is the effect's answer for good.
func TestProxyKeepsTheAddressGuard(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, chargeAnswer)
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["payments"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: up.URL}}
	})
	for i := range 2 {
		r := h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{}`, "Idempotency-Key: ssrf")
		if r.status != 502 || !strings.Contains(r.raw, "upstream-unreachable") || (i == 1) != (r.header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("try %d: %d %v %s", i, r.status, r.header, r.raw)
		}
	}
	if g := h.req("GET", "/v1/proxy/payments/charges", acmeKey, ""); g.status != 502 {
		t.Fatalf("a GET is guarded too: %d %s", g.status, g.raw)
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("the loopback upstream was reached %d times", n)
	}
}

// A request under a key whose first request is still being performed waits for it, up to
// proxy.in_flight_wait, and then gets a 409 with Retry-After and sends nothing; once the first has its
// answer, the retry gets it. A body sent in chunks, without Content-Length, is recorded whole.
func TestProxyInFlightAndChunkedBodies(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		<-release
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})
	h := proxyGateway(t, up, func(c *Config) { c.Proxy.InFlightWait = Duration(200 * time.Millisecond) })
	chunked := func() (int, string, http.Header) {
		pr, pw := io.Pipe()
		go func() {
			for _, part := range []string{`{"chunk":`, `1,"more":`, `"yes"}`} {
				_, _ = pw.Write([]byte(part))
			}
			pw.Close()
		}()
		req, _ := http.NewRequest("POST", h.url+"/v1/proxy/payments/orders", pr)
		req.Header.Set("Authorization", "Bearer "+acmeKey)
		req.Header.Set("Idempotency-Key", "inflight")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, "", nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	first := make(chan string, 1)
	go func() {
		code, body, _ := chunked()
		first <- fmt.Sprint(code, " ", body)
	}()
	for up.calls.Load() == 0 {
		runtime.Gosched()
	}
	code, body, header := chunked()
	if code != http.StatusConflict || header.Get("Retry-After") == "" || !strings.Contains(body, "request-in-flight") {
		t.Fatalf("while the first is in flight: %d %v %s", code, header, body)
	}
	close(release)
	if got := <-first; got != `201 {"chunk":1,"more":"yes"}` {
		t.Fatalf("first: %s", got)
	}
	code, body, header = chunked()
	if code != 201 || body != `{"chunk":1,"more":"yes"}` || header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after: %d %v %s", code, header, body)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d", n)
	}
}

// An operator's `oncegate type pause` stops delivery of a type, and the proxy delivers in the request: a
// proxied request that would reach the upstream is refused while the type is paused, and nothing is recorded,
// so that the client's retry after the resume is a first request. What needs no upstream (a stored answer)
// is still replayed, and a key waiting for a retry after a transient failure is not performed either.
func TestProxyHonoursAPausedType(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		if strings.Contains(r.URL.Path, "flaky") && n == 2 {
			// Not due again for a minute: the dispatcher would otherwise retry the row after the default
			// backoff, which a loaded machine (CI's -race run) let pass before the pause was in place. A 502,
			// not a 503: a 503 with Retry-After pauses the upstream for the fleet, which is not this test's.
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		chargeAnswer(w, r, n)
	})
	h := proxyGateway(t, up, nil)
	send := func(path, key string) response {
		return h.req("POST", "/v1/proxy/payments/"+path, acmeKey, `{"amount":1}`, "Idempotency-Key: "+key)
	}
	if a := send("charges", "done-1"); a.status != 201 {
		t.Fatalf("before the pause: %d %s", a.status, a.raw)
	}
	if a := send("flaky", "flaky-1"); a.status != 502 {
		t.Fatalf("transient failure before the pause: %d %s", a.status, a.raw)
	}
	if _, err := h.pool.Exec(context.Background(), `INSERT INTO oncegate_paused_types (type, paused_by, reason)
		VALUES ('payments', 'test', 'upstream incident')`); err != nil {
		t.Fatal(err)
	}
	paused := send("charges", "new-1")
	if paused.status != 503 || paused.body["type"] != "/problems/type-paused" || paused.header.Get("Retry-After") == "" {
		t.Fatalf("a new key while paused: %d %v %s", paused.status, paused.header, paused.raw)
	}
	if n := h.count(`SELECT count(*) FROM oncegate_effects WHERE key = 'new-1'`); n != 0 {
		t.Fatalf("a refused request was recorded: %d rows", n)
	}
	if a := send("flaky", "flaky-1"); a.status != 503 || a.body["type"] != "/problems/type-paused" {
		t.Fatalf("a key waiting for its retry while paused: %d %s", a.status, a.raw)
	}
	if a := send("charges", "done-1"); a.status != 201 || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a stored answer while paused: %d %s", a.status, a.raw)
	}
	if n := up.calls.Load(); n != 2 {
		t.Fatalf("the upstream was called while the type was paused: %d calls", n)
	}
	if _, err := h.pool.Exec(context.Background(), `DELETE FROM oncegate_paused_types`); err != nil {
		t.Fatal(err)
	}
	if a := send("charges", "new-1"); a.status != 201 || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after the resume: %d %s", a.status, a.raw)
	}
	if a := send("flaky", "flaky-1"); a.status != 201 {
		t.Fatalf("the waiting key after the resume: %d %s", a.status, a.raw)
	}
}

// an upstream's 1xx final answer (101 Switching Protocols) is never forwarded: the client gets a 502
// problem, and its connection stays HTTP.
func TestProxyInterimFinalStatusIsBadGateway(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		conn, buf, _ := w.(http.Hijacker).Hijack()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: evil\r\nConnection: Upgrade\r\n\r\nraw bytes")
		_ = buf.Flush()
		conn.Close()
	})
	h := proxyGateway(t, up, nil)
	for i := range 2 {
		p := h.req("POST", "/v1/proxy/payments/ws", acmeKey, "{}", "Idempotency-Key: ws")
		if p.status != 502 || p.header.Get("Content-Type") != "application/problem+json" || p.header.Get("Upgrade") != "" ||
			(i == 1) != (p.header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("POST %d: %d %v %s", i, p.status, p.header, p.raw)
		}
	}
	if g := h.req("GET", "/v1/proxy/payments/ws", acmeKey, ""); g.status != 502 || g.header.Get("Upgrade") != "" {
		t.Fatalf("GET: %d %v %s", g.status, g.header, g.raw)
	}
}

// an effect whose retries are used up answers 502 /problems/upstream-gave-up, on the attempt that made
// it dead and on every request after, never the last 5xx it got.
func TestProxyDeadEffectGaveUp(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "upstream broke")
	})
	h := proxyGateway(t, up, func(c *Config) {
		et := c.EffectTypes["payments"]
		et.Retry = &Retry{MaxAttempts: 2}
		c.EffectTypes["payments"] = et
	})
	first := h.req("POST", "/v1/proxy/payments/status/500", acmeKey, "{}", "Idempotency-Key: fd-1")
	if first.status != 500 || first.raw != "upstream broke" {
		t.Fatalf("first attempt: %d %s", first.status, first.raw)
	}
	for i := range 2 {
		// The second attempt is this request's, or the dispatcher's retry that came due at once (Retry-After:
		// 0) and, on a loaded machine, ran first: then this request replays it. The one after always replays.
		r := h.req("POST", "/v1/proxy/payments/status/500", acmeKey, "{}", "Idempotency-Key: fd-1")
		if r.status != 502 || !strings.Contains(r.raw, "/problems/upstream-gave-up") ||
			(i == 1 && r.header.Get("Idempotent-Replayed") != "true") {
			t.Fatalf("request %d after the last attempt: %d %v %s", i, r.status, r.header, r.raw)
		}
	}
	if e := h.req("GET", "/v1/effects/fd-1", acmeKey, ""); e.body["status"] != "dead" {
		t.Fatalf("effect: %s", e.raw)
	}
	if n := up.calls.Load(); n != 2 {
		t.Fatalf("upstream calls: %d", n)
	}
}

// requests that wait for another's attempt under their key get that attempt's answer when it fails
// transiently, instead of each performing the request again as soon as it ends: twenty identical requests
// against a failing upstream make one call.
func TestProxyWaitersShareATransientFailure(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		<-release
		// Not due again for a minute: the dispatcher, which would otherwise retry the row at once, leaves it
		// to the requests (a waiter that meets the dispatcher's attempt instead gets the 502 docs/proxy.md
		// names, which a loaded machine made this test see). A 502: a 503 with Retry-After pauses the
		// upstream for the fleet, and the later retry below would be held.
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "overloaded")
	})
	h := proxyGateway(t, up, nil)
	answers := make([]response, 20)
	var wg sync.WaitGroup
	send := func(i int) {
		answers[i] = h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"n":1}`, "Idempotency-Key: fail-20")
	}
	wg.Go(func() { send(0) })
	for up.calls.Load() == 0 {
		runtime.Gosched()
	}
	for i := 1; i < len(answers); i++ {
		wg.Go(func() { send(i) })
	}
	waiting := func() int {
		h.g.waiters.mu.Lock()
		defer h.g.waiters.mu.Unlock()
		n := 0
		for _, list := range h.g.waiters.m {
			n += len(list)
		}
		return n
	}
	for waiting() < len(answers)-1 {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	for i, a := range answers {
		if a.status != 502 || a.raw != "overloaded" || (i > 0) != (a.header.Get("Idempotent-Replayed") == "true") {
			t.Errorf("request %d: %d %v %s", i, a.status, a.header, a.raw)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d", n)
	}
	// The next request under the key performs it again: it waited for no attempt.
	if a := h.req("POST", "/v1/proxy/payments/charges", acmeKey, `{"n":1}`, "Idempotency-Key: fail-20"); a.status != 502 ||
		up.calls.Load() != 2 {
		t.Fatalf("a later retry: %d %s, %d calls", a.status, a.raw, up.calls.Load())
	}
}

// the Bearer scheme is case-insensitive (RFC 9110 §11.1). an API key sent twice is refused, not
// read first-wins. the gateway's own Oncegate-* headers are dropped in any spelling a server reads as the
// same (Oncegate_Api_Key). a 405 names the methods in Allow.
func TestProxyAuthenticationHeaders(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, chargeAnswer)
	h := proxyGateway(t, up, nil)
	for _, scheme := range []string{"bearer", "BEARER", "Bearer"} {
		if r := h.req("GET", "/v1/proxy/payments/x", "", "", "Authorization: "+scheme+" "+acmeKey); r.status != 201 {
			t.Errorf("L2: scheme %q: %d %s", scheme, r.status, r.raw)
		}
		if r := h.req("GET", "/v1/effects", "", "", "Authorization: "+scheme+" "+acmeKey); r.status != 200 {
			t.Errorf("L2: scheme %q on /v1/effects: %d %s", scheme, r.status, r.raw)
		}
	}
	if r := h.req("GET", "/v1/proxy/payments/x", "", "", "Authorization: Bearer "+acmeKey,
		"Authorization: Bearer og_someone_else"); r.status != 401 {
		t.Errorf("L3: two Authorization headers: %d %s", r.status, r.raw)
	}
	calls := up.calls.Load()
	r := h.req("POST", "/v1/proxy/payments/x", acmeKey, "{}", "Idempotency-Key: u", "Oncegate_Api_Key: leaked",
		"Oncegate.Trace: leaked")
	if r.status != 201 {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	req, _ := up.last()
	for name := range req.Header {
		if strings.HasPrefix(strings.ToLower(name), "oncegate") {
			t.Errorf("L4: %s reached the upstream", name)
		}
	}
	for _, m := range []string{"TRACE", "PROPFIND", "CONNECT"} {
		for _, path := range []string{"/v1/proxy/payments/x", "/v1/proxy/payments", "/v1/proxy/payments/"} {
			r := h.req(m, path, acmeKey, "")
			if r.status != 405 || r.header.Get("Allow") == "" {
				t.Errorf("L9: %s %s: %d, Allow %q", m, path, r.status, r.header.Get("Allow"))
			}
		}
	}
	if up.calls.Load() != calls+1 {
		t.Errorf("upstream calls: %d", up.calls.Load()-calls)
	}

	two := proxyGateway(t, up, func(c *Config) { c.Proxy.APIKeyHeader = "Oncegate-Api-Key" })
	if r := two.req("GET", "/v1/proxy/payments/x", "", "", "Oncegate-Api-Key: "+acmeKey,
		"Oncegate-Api-Key: og_someone_else"); r.status != 401 {
		t.Errorf("L3: the key header twice: %d %s", r.status, r.raw)
	}
	if r := two.req("GET", "/v1/proxy/payments/x", "", "", "Oncegate-Api-Key: bearer "+acmeKey); r.status != 201 {
		t.Errorf("L2: bearer in the key header: %d %s", r.status, r.raw)
	}
}
