package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/oncegate/oncegate/client"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/stripemocktest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// countingProxy is a reverse proxy in front of an upstream that counts the unsafe requests reaching it,
// by path, and the Idempotency-Keys they carried.
type countingProxy struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string]int // "POST /v1/charges" → how many reached the upstream
	keys map[string]int // Idempotency-Key → how many carried it
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	c := &countingProxy{hits: map[string]int{}, keys: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{} // not the spec-checked default: this is the upstream, not the gateway
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			c.mu.Lock()
			c.hits[r.Method+" "+r.URL.Path]++
			c.keys[r.Header.Get("Idempotency-Key")]++
			c.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *countingProxy) count(what string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits[what]
}

// dropFirstAnswer is a fault proxy between a client and the gateway: the first request under each
// Idempotency-Key is forwarded and its whole answer read, and then the client's connection is closed
// without a byte of it, as a network that fails after the work is done. Later requests pass.
type dropFirstAnswer struct {
	*httptest.Server
	mu      sync.Mutex
	seen    map[string]bool
	dropped []string // the bodies of the answers the clients never got, in order
}

func newDropFirstAnswer(t *testing.T, gateway string) *dropFirstAnswer {
	t.Helper()
	u, _ := url.Parse(gateway)
	d := &dropFirstAnswer{seen: map[string]bool{}}
	rp := httputil.NewSingleHostReverseProxy(u) // through http.DefaultTransport: the exchange is spec-checked
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		d.mu.Lock()
		first := key != "" && !d.seen[key]
		d.seen[key] = true
		d.mu.Unlock()
		if !first {
			rp.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		d.mu.Lock()
		d.dropped = append(d.dropped, rec.Body.String())
		d.mu.Unlock()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(d.Close)
	return d
}

// Stripe's own Go SDK, its base URL at the gateway's proxy in front of stripe-mock: every answer's first
// delivery is lost on the way back, the SDK retries under its own Idempotency-Key, and the retries are
// answered from the stored answers: stripe-mock sees each charge once, and the SDK gets the charge the
// first attempt made.
func TestStripeSDKThroughTheProxy(t *testing.T) {
	t.Parallel()
	mock := newCountingProxy(t, stripemocktest.Start(t))
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  stripe:
    provider: http
    http:
      base_url: %s
      headers: { Authorization: "Bearer sk_test_123" }
      allow_private_networks: true
proxy: { api_key_header: Oncegate-Api-Key }
`, pgtest.Database(t), apiKey, mock.URL))
	_, base := startGateway(t, config)
	fault := newDropFirstAnswer(t, base)

	backends := &stripe.Backends{API: stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(fault.URL + "/v1/proxy/stripe"),
		HTTPClient:        &http.Client{Transport: client.ProxyTransport(client.ProxyKeyHeader, apiKey, nil)},
		MaxNetworkRetries: stripe.Int64(3),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})}
	sc := stripe.NewClient("sk_test_client_owned", stripe.WithBackends(backends))
	ctx := testenv.Context(t, time.Minute)
	const charges = 3
	for i := range charges {
		ch, err := sc.V1Charges.Create(ctx, &stripe.ChargeCreateParams{Amount: stripe.Int64(int64(1000 + i)),
			Currency: stripe.String("usd"), Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
			Metadata: map[string]string{"order": fmt.Sprint(i)}})
		if err != nil {
			t.Fatalf("charge %d: %v", i, err)
		}
		fault.mu.Lock()
		lost := ""
		if len(fault.dropped) == i+1 {
			lost = fault.dropped[i]
		}
		fault.mu.Unlock()
		if lost == "" || string(ch.LastResponse.RawJSON) != lost {
			t.Fatalf("charge %d: the SDK got %q, the first attempt's lost answer was %q", i, ch.LastResponse.RawJSON, lost)
		}
		if ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("charge %d: the retry was not a replay: %v", i, ch.LastResponse.Header)
		}
	}
	if n := mock.count("POST /v1/charges"); n != charges {
		t.Fatalf("stripe-mock got %d charges, want %d (one per charge, retries replayed)", n, charges)
	}
	// A GET passes through, unrecorded.
	if _, err := sc.V1Charges.Retrieve(ctx, "ch_123", nil); err != nil {
		t.Fatalf("retrieve: %v", err)
	}
}

// proxyExchange sends one request to the gateway's proxy, as curl would.
func proxyExchange(t *testing.T, method, url, key, body string, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// recordingUpstream answers POSTs with a body naming the call, and can hold its answers.
type recordingUpstream struct {
	*httptest.Server
	calls   atomic.Int64
	arrived chan string // each call's Idempotency-Key, when hold is set
	hold    chan struct{}
	mu      sync.Mutex
	keys    map[string]int
	traces  []string // each call's traceparent
	baggage []string // each call's baggage
}

func newRecordingUpstream(t *testing.T, hold bool) *recordingUpstream {
	u := &recordingUpstream{keys: map[string]int{}, arrived: make(chan string, 100)}
	if hold {
		u.hold = make(chan struct{})
	}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.calls.Add(1)
		u.mu.Lock()
		u.keys[r.Header.Get("Idempotency-Key")]++
		u.traces = append(u.traces, r.Header.Get("Traceparent"))
		u.baggage = append(u.baggage, r.Header.Get("Baggage"))
		hold := u.hold
		u.mu.Unlock()
		u.arrived <- r.Header.Get("Idempotency-Key")
		if hold != nil {
			<-hold
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"call":%d,"got":%q}`, n, body)
	}))
	t.Cleanup(func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		if u.hold != nil {
			select {
			case <-u.hold:
			default:
				close(u.hold)
			}
		}
		u.Close()
	})
	return u
}

// proxyConfig is a gateway with one proxied type, payments, in front of upstream. inFlightWait is how long
// a duplicate waits for the attempt in flight under its key before its 409 ("" for the default, the type's
// timeout): the crash test shortens it so that its retry sees the dead gateway's lease sooner, and the test
// of 50 duplicates at once lengthens it, so that a machine loaded by the rest of the suite (the first attempt
// slower than the type's timeout allows a waiter) still shows waiting, not a 409.
func proxyConfig(t *testing.T, upstream, onCrash, inFlightWait string) string {
	proxy := ""
	if inFlightWait != "" {
		proxy = "proxy: { in_flight_wait: " + inFlightWait + " }"
	}
	return proxyConfigWith(t, pgtest.Database(t), upstream, "    on_crash: "+onCrash, proxy+"\n"+proxyDispatcher)
}

// proxyDispatcher is the proxy tests' dispatcher: a short poll and lease margin.
const proxyDispatcher = "dispatcher: { poll_interval: 100ms, lease_margin: 1s }"

// proxyConfigWith writes the configuration of a payments type on db with typeExtra among its settings
// (indented as they are) and extra at the top level (proxyDispatcher, say).
func proxyConfigWith(t *testing.T, db, upstream, typeExtra, extra string) string {
	return writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  payments:
    provider: http
    http: { base_url: "%s", allow_private_networks: true }
    timeout: 2s
%s
%s
`, db, apiKey, upstream, typeExtra, extra))
}

// The proxy with a plain HTTP client, as curl: two identical POSTs make one upstream call and get one
// answer; another body under the key is a 422; 50 identical POSTs at once make one upstream call.
func TestProxyWithAPlainClient(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t, false)
	_, base := startGateway(t, proxyConfig(t, up.URL, "at_least_once", "10s"))
	url := base + "/v1/proxy/payments/v1/charges?currency=eur"
	c1, h1, b1 := proxyExchange(t, "POST", url, "order-1", `{"amount":10}`)
	c2, h2, b2 := proxyExchange(t, "POST", url, "order-1", `{"amount":10}`)
	if c1 != 201 || c2 != 201 || b1 != b2 || b1 != `{"call":1,"got":"{\"amount\":10}"}` {
		t.Fatalf("answers: %d %s / %d %s", c1, b1, c2, b2)
	}
	if h1.Get("Idempotent-Replayed") != "" || h2.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("Idempotent-Replayed: %q then %q", h1.Get("Idempotent-Replayed"), h2.Get("Idempotent-Replayed"))
	}
	if c, _, b := proxyExchange(t, "POST", url, "order-1", `{"amount":11}`); c != 422 || !strings.Contains(b, "idempotency-key-reused") {
		t.Fatalf("another body under the key: %d %s", c, b)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d", n)
	}

	var wg sync.WaitGroup
	bodies := make([]string, 50)
	codes := make([]int, 50)
	for i := range bodies {
		wg.Go(func() { codes[i], _, bodies[i] = proxyExchange(t, "POST", url, "order-50", `{"amount":50}`) })
	}
	wg.Wait()
	for i := range bodies {
		if codes[i] != 201 || bodies[i] != bodies[0] {
			t.Fatalf("answer %d: %d %s, the first %s", i, codes[i], bodies[i], bodies[0])
		}
	}
	if n := up.calls.Load(); n != 2 {
		t.Fatalf("upstream calls after 50 identical POSTs: %d, want 2 in all", n)
	}

	// The trace goes on to the upstream: the caller's trace id (this gateway exports no spans, so the parent
	// the upstream sees is the caller's own span).
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	// A tenant's baggage (M5) is not the gateway's to pass on: it is dropped, as docs/proxy.md says.
	if c, _, b := proxyExchange(t, "POST", url, "order-traced", `{}`, "Traceparent: 00-"+trace+"-00f067aa0ba902b7-01",
		"Baggage: tenant=forged,user=admin"); c != 201 {
		t.Fatalf("traced: %d %s", c, b)
	}
	up.mu.Lock()
	got, baggage := up.traces[len(up.traces)-1], up.baggage[len(up.baggage)-1]
	up.mu.Unlock()
	if !strings.HasPrefix(got, "00-"+trace+"-") {
		t.Fatalf("the upstream got traceparent %q, want trace %s", got, trace)
	}
	if baggage != "" {
		t.Fatalf("the upstream got the client's baggage %q", baggage)
	}
}

// The gateway SIGKILLed while the upstream is answering a proxied request: the effect is recorded whole
// (effect and leased outbox row), and the client's retry under the key gets a defined answer: under
// at_least_once the request is resent, with the same Idempotency-Key to the upstream, and its answer stored;
// under at_most_once nothing is resent and the answer is the outcome-unknown problem, every time.
func TestKilledGatewayMidProxyFollowsOnCrash(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"at_least_once", "at_most_once"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			up := newRecordingUpstream(t, true)
			config := proxyConfig(t, up.URL, policy, "300ms")
			a, baseA := startGateway(t, config)
			dbURL := dbURLOf(t, config)
			url := "/v1/proxy/payments/charges"
			go func() {
				// Its answer never comes: the gateway dies first.
				req, _ := http.NewRequest("POST", baseA+url, strings.NewReader(`{"amount":7}`))
				req.Header.Set("Authorization", "Bearer "+apiKey)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "order-7")
				if resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			var first string
			select {
			case first = <-up.arrived:
			case <-time.After(20 * time.Second):
				t.Fatal("the request never reached the upstream")
			}
			a.Kill()
			up.mu.Lock()
			close(up.hold)
			up.hold = nil
			up.mu.Unlock()

			pool := pgtest.Pool(t, dbURL)
			var status string
			var outbox int
			if err := pool.QueryRow(context.Background(), `SELECT e.status, (SELECT count(*) FROM oncegate_outbox o
				WHERE o.effect_id = e.id AND o.lease_token IS NOT NULL) FROM oncegate_effects e WHERE e.key = 'order-7'`).
				Scan(&status, &outbox); err != nil {
				t.Fatal(err)
			}
			if status != "delivering" || outbox != 1 {
				t.Fatalf("after the kill: effect %s with %d leased outbox rows, want delivering with 1", status, outbox)
			}

			_, baseB := startGateway(t, config)
			var code int
			var body string
			testenv.Eventually(t, 30*time.Second, "the retry gets an answer other than 409", func() bool {
				code, _, body = proxyExchange(t, "POST", baseB+url, "order-7", `{"amount":7}`)
				return code != http.StatusConflict
			})
			again, _, body2 := proxyExchange(t, "POST", baseB+url, "order-7", `{"amount":7}`)
			switch policy {
			case "at_least_once":
				if code != 201 || !strings.Contains(body, `"got":"{\"amount\":7}"`) {
					t.Fatalf("the retry: %d %s", code, body)
				}
				up.mu.Lock()
				resent := up.keys[first]
				up.mu.Unlock()
				if n := up.calls.Load(); n != 2 || resent != 2 {
					t.Fatalf("upstream: %d calls, %d with the first's Idempotency-Key %s; want the one resend, same key", n, resent, first)
				}
			case "at_most_once":
				if code != 502 || !strings.Contains(body, "outcome-unknown") {
					t.Fatalf("the retry: %d %s", code, body)
				}
				if n := up.calls.Load(); n != 1 {
					t.Fatalf("upstream: %d calls, want 1 (not resent)", n)
				}
				// L8: the interrupted attempt reached the upstream, and counts.
				if c, _, e := proxyExchange(t, "GET", baseB+"/v1/effects/order-7", "", ""); c != 200 ||
					!strings.Contains(e, `"status":"unknown"`) || !strings.Contains(e, `"attempts":1,`) {
					t.Fatalf("the effect: %d %s", c, e)
				}
			}
			if again != code || body2 != body {
				t.Fatalf("the answer is not stable: %d %s, then %d %s", code, body, again, body2)
			}
			// The operator's attempt log tells the interrupted attempt, under the gateway that made it, before
			// the resend, whichever path rescued the row: the dispatcher's, or the retry's own in its request.
			want := "1 interrupted"
			if policy == "at_least_once" {
				want += ", 2 delivered"
			}
			var got string
			for deadline := time.Now().Add(10 * time.Second); got != want; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the attempt log holds %q, want %q", got, want)
				}
				if err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(a.attempt || ' ' || a.outcome, ', '
					ORDER BY a.attempt), '') FROM oncegate_effect_attempts a JOIN oncegate_effects e ON e.id = a.effect_id
					WHERE e.key = 'order-7'`).Scan(&got); err != nil {
					t.Fatal(err)
				}
			}
			var gateway string
			if err := pool.QueryRow(context.Background(), `SELECT a.gateway FROM oncegate_effect_attempts a
				JOIN oncegate_effects e ON e.id = a.effect_id WHERE e.key = 'order-7' AND a.outcome = 'interrupted'`).
				Scan(&gateway); err != nil {
				t.Fatal(err)
			}
			if gateway == "(not known)" || gateway == "" {
				t.Fatalf("the interrupted attempt is logged under gateway %q, not the one killed", gateway)
			}
		})
	}
}

// dbURLOf reads database_url back from a configuration file that writeFile wrote.
func dbURLOf(t *testing.T, config string) string {
	t.Helper()
	raw, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	b := string(raw)
	for _, line := range strings.Split(b, "\n") {
		if v, ok := strings.CutPrefix(line, "database_url: "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no database_url in " + config)
	return ""
}

// The proxy's own calls take their tokens of the type's fleet-wide rate, as the dispatcher's do: 12 proxied
// requests at once through two gateways, limited at 2 a second with a burst of 1, reach the upstream at that
// pace; a request with no call free within a second is answered 429 upstream-rate-limited with
// Retry-After, nothing sent, and its effect is performed later, once. Before, all 12 went at once.
func TestProxiedCallsKeepTheFleetRate(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var at []time.Time
	keys := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		at = append(at, time.Now())
		keys[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		w.WriteHeader(201)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	config := proxyConfigWith(t, pgtest.Database(t), up.URL, "    rate: { per_second: 2, burst: 1 }", proxyDispatcher)
	_, baseA := startGateway(t, config)
	_, baseB := startGateway(t, config)
	const n = 12
	codes := make([]int, n)
	headers := make([]http.Header, n)
	bodies := make([]string, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		base := baseA
		if i%2 == 1 {
			base = baseB
		}
		wg.Go(func() {
			codes[i], headers[i], bodies[i] = proxyExchange(t, "POST", base+"/v1/proxy/payments/charges",
				fmt.Sprintf("rate-%d", i), `{"amount":1}`)
		})
	}
	wg.Wait()
	answered := time.Since(start)
	limited := 0
	for i := range n {
		switch codes[i] {
		case 201:
		case 429:
			if !strings.Contains(bodies[i], "upstream-rate-limited") || headers[i].Get("Retry-After") == "" {
				t.Fatalf("request %d: 429 without the problem or Retry-After: %v %s", i, headers[i], bodies[i])
			}
			limited++
		default:
			t.Fatalf("request %d: %d %s", i, codes[i], bodies[i])
		}
	}
	mu.Lock()
	calls := len(at)
	mu.Unlock()
	// By the time every request is answered: the burst, and two a second since.
	if most := 1 + int(2*answered.Seconds()) + 1; calls > most {
		t.Fatalf("%d calls reached the upstream in %v, limited at 2 a second with a burst of 1 (at most %d)",
			calls, answered.Round(time.Millisecond), most)
	}
	if limited == 0 {
		t.Fatalf("no request was answered 429 though %d went at once against 2 a second", n)
	}
	t.Logf("%d calls in %v while the requests were answered; %d answered 429", calls, answered.Round(time.Millisecond), limited)
	// The refused effects wait, uncharged, and the dispatchers perform each of them once, at the rate.
	testenv.Eventually(t, 30*time.Second, "every effect performed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(keys) == n
	})
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	for k, c := range keys {
		if c != 1 {
			t.Errorf("%s reached the upstream %d times", k, c)
		}
	}
	for i := 2; i < len(at); i++ { // never more than the burst and a token within half a second
		if at[i].Sub(at[i-2]) < 400*time.Millisecond {
			t.Errorf("calls %d and %d came %v apart", i-2, i, at[i].Sub(at[i-2]))
		}
	}
}

// An upstream's 429 with Retry-After to a proxied call pauses it for every gateway, as a dispatcher's does
// (SPEC §2): a request through another gateway is answered 503 upstream-paused with the time left, nothing
// sent, and the upstream is called again after the pause. Before, the next call went at once.
func TestAProxiedRetryAfterPausesTheUpstreamForTheFleet(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var mu sync.Mutex
	var at []time.Time
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(201)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	config := proxyConfigWith(t, pgtest.Database(t), up.URL, "", proxyDispatcher)
	_, baseA := startGateway(t, config)
	_, baseB := startGateway(t, config)
	code, h, body := proxyExchange(t, "POST", baseA+"/v1/proxy/payments/charges", "p-1", `{}`)
	throttled := time.Now()
	if code != 429 || h.Get("Retry-After") != "3" {
		t.Fatalf("the upstream's 429 is the client's to see: %d %v %s", code, h, body)
	}
	code, h, body = proxyExchange(t, "POST", baseB+"/v1/proxy/payments/charges", "p-2", `{}`)
	if code != 503 || !strings.Contains(body, "upstream-paused") || h.Get("Retry-After") == "" {
		t.Fatalf("another gateway's request during the pause: %d %v %s", code, h, body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the upstream was called %d times during its pause", n)
	}
	testenv.Eventually(t, 15*time.Second, "both effects performed after the pause", func() bool { return calls.Load() >= 3 })
	mu.Lock()
	defer mu.Unlock()
	if first := at[1].Sub(throttled); first < 2700*time.Millisecond {
		t.Fatalf("the upstream was called %v after its 429 with Retry-After: 3", first)
	}
	if code, _, body := proxyExchange(t, "POST", baseB+"/v1/proxy/payments/charges", "p-2", `{}`); code != 201 {
		t.Fatalf("p-2 after the pause: %d %s", code, body)
	}
}

// The rows that proxied calls left waiting for a pause are the destination's like any other: an operator's
// `oncegate destination resume` makes them due at once, and without it they go when the pause ends, not at
// the next poll (here 5 s). Before, the proxy's rows named no destination: the resume made none of them due
// ("made due now: 0"), and they waited out the whole Retry-After, then up to a poll more.
func TestProxiedRowsWaitingForAPauseGoWhenItEnds(t *testing.T) {
	t.Parallel()
	for _, lift := range []string{"resume", "end"} {
		t.Run(lift, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int64
			var mu sync.Mutex
			keys := map[string]time.Time{}
			retryAfter := "30"
			if lift == "end" {
				retryAfter = "2"
			}
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					w.Header().Set("Retry-After", retryAfter)
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				mu.Lock()
				keys[r.Header.Get("Idempotency-Key")] = time.Now()
				mu.Unlock()
				w.WriteHeader(201)
			}))
			t.Cleanup(up.Close)
			db := pgtest.Database(t)
			config := proxyConfigWith(t, db, up.URL, "", "dispatcher: { poll_interval: 5s, lease_margin: 1s }")
			_, baseA := startGateway(t, config)
			_, baseB := startGateway(t, config)
			if code, _, body := proxyExchange(t, "POST", baseA+"/v1/proxy/payments/x", "w-0", `{}`); code != 503 {
				t.Fatalf("the upstream's 503: %d %s", code, body)
			}
			paused := time.Now()
			for i := 1; i <= 3; i++ {
				if code, _, body := proxyExchange(t, "POST", baseB+"/v1/proxy/payments/x", fmt.Sprintf("w-%d", i), `{}`); code != 503 ||
					!strings.Contains(body, "upstream-paused") {
					t.Fatalf("w-%d during the pause: %d %s", i, code, body)
				}
			}
			from := paused
			if lift == "resume" {
				time.Sleep(500 * time.Millisecond)
				out, errOut, code := oncegateCLI(t, []string{"DATABASE_URL=" + db}, "destination", "resume", "payments",
					up.URL, "--reason", "upstream fixed")
				if code != 0 {
					t.Fatalf("destination resume: exit %d: %s%s", code, out, errOut)
				}
				t.Logf("oncegate destination resume: %s", strings.TrimSpace(out))
				from = time.Now()
			}
			testenv.Eventually(t, 40*time.Second, "the four effects performed", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(keys) == 4
			})
			mu.Lock()
			defer mu.Unlock()
			var last time.Time
			for _, at := range keys {
				if at.After(last) {
					last = at
				}
			}
			took := last.Sub(from)
			t.Logf("the held effects were performed %v after the %s", took.Round(time.Millisecond), map[string]string{
				"resume": "resume", "end": "503"}[lift])
			if lift == "resume" && took > 2*time.Second {
				t.Fatalf("the held effects went %v after the resume", took)
			}
			if lift == "end" && (took < 1800*time.Millisecond || took > 3500*time.Millisecond) {
				t.Fatalf("the held effects went %v after a 503 with Retry-After: 2 (the poll is 5 s)", took)
			}
		})
	}
}
