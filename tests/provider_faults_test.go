package tests

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// flakyReceiver is a webhook receiver on a fixed port whose behaviour the test changes: down (nothing
// listens), slow (beyond the gateway's timeout), 500, 429 with Retry-After, healthy.
type flakyReceiver struct {
	addr  string
	phase atomic.Value // string
	mu    sync.Mutex
	srv   *http.Server
	ok    map[string]int      // 2xx answers per webhook-id
	seen  map[string]int      // requests per webhook-id
	log   map[string][]answer // every request per webhook-id, in order
	check *webhookCheck       // the official Standard Webhooks library's verdict on each request
}

// answer is one request the receiver answered: when it arrived, in which phase, with what status.
type answer struct {
	at    time.Time
	phase string
	code  int
}

func (f *flakyReceiver) handler(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err == nil && !f.check.verify(w, r, body) {
		return
	}
	id, at, phase := r.Header.Get("webhook-id"), time.Now(), f.phase.Load().(string)
	f.mu.Lock()
	f.seen[id]++
	f.mu.Unlock()
	code := 204
	switch phase {
	case "slow":
		// Beyond the gateway's timeout (500ms): it gives up first. A fault's duration, not a wait for a state.
		time.Sleep(1500 * time.Millisecond)
		code = 503
	case "500":
		code = 500
	case "429":
		w.Header().Set("Retry-After", "1")
		code = 429
	}
	f.mu.Lock()
	f.log[id] = append(f.log[id], answer{at: at, phase: phase, code: code})
	if code == 204 {
		f.ok[id]++
	}
	f.mu.Unlock()
	w.WriteHeader(code)
}

// breakerGauge reads the one oncegate_breaker_state series whose labels include label.
func breakerGauge(metrics, label string) (int, bool) {
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "oncegate_breaker_state{") && strings.Contains(l, label) {
			var n int
			fmt.Sscan(strings.Fields(l)[1], &n)
			return n, true
		}
	}
	return 0, false
}

// breakerStates samples the gateway's breaker gauge for typ (its one tenant and destination) every 20ms, from now until the test ends or the
// returned stop is called, and gives the states it saw in order, without repeats (0 closed, 1 half-open,
// 2 open): the breaker's history read from the gateway's metrics rather than from its log.
func breakerStates(t *testing.T, base, typ string) (stop func() []int) {
	// Breakers are per tenant and destination: this test has one of each, so the type's one series.
	label := `type="` + typ + `"`
	var states []int
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
			resp, err := http.Get(base + "/metrics")
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			v, ok := breakerGauge(string(b), label)
			if !ok {
				continue
			}
			if len(states) == 0 || states[len(states)-1] != v {
				states = append(states, v)
			}
		}
	}()
	var once sync.Once
	stop = func() []int {
		once.Do(func() { close(quit); <-done })
		return states
	}
	t.Cleanup(func() { stop() })
	return stop
}

func (f *flakyReceiver) up(t *testing.T) {
	l, err := net.Listen("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.srv = &http.Server{Handler: http.HandlerFunc(f.handler)}
	srv := f.srv
	f.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

func (f *flakyReceiver) down() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.srv != nil {
		_ = f.srv.Close()
		f.srv = nil
	}
}

func TestProviderFaultsDelayButLoseNothing(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Providers", "Webhook receiver down, then slower than the timeout, then 500, then 429 with Retry-After, then healthy",
		"Breaker opens and closes; Retry-After honoured; nothing dead early; every effect delivered after")
	f := &flakyReceiver{addr: freeTCPAddr(t), ok: map[string]int{}, seen: map[string]int{}, log: map[string][]answer{},
		check: newWebhookCheck(t, whsec)}
	f.phase.Store("down")
	defer f.down()
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  hook:
    provider: webhook
    webhook: { url: "http://%s/hooks", secret: "%s", allow_private_networks: true }
    timeout: 500ms
    retry: { max_attempts: 30, base_delay: 100ms, max_delay: 400ms }
    breaker: { failures: 3, open_for: 700ms }
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey, f.addr, whsec))
	_, base := startGateway(t, config)
	breaker := breakerStates(t, base, "hook")
	const n = 20
	for i := range n {
		if code, _, _ := postJSON(t, base, fmt.Sprintf("h%d", i), `{"type":"hook","payload":{"event":"e","data":1}}`); code != 202 {
			t.Fatalf("POST %d", code)
		}
	}
	phases := []string{"down", "slow", "500", "429", "healthy"}
	for _, ph := range phases {
		f.phase.Store(ph)
		if ph == "slow" {
			f.up(t)
		}
		time.Sleep(1500 * time.Millisecond) // the phase's length: the fault lasts this long, whatever happens
		if bad := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status IN ('dead', 'failed', 'unknown')"); bad != 0 {
			t.Fatalf("%d effects ended during the %s phase", bad, ph)
		}
	}
	testenv.Eventually(t, 30*time.Second, "every effect delivered once the receiver is healthy", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'") == n
	})
	// The breaker opened (the receiver down), let a probe through (half-open), and closed again at the end.
	states := breaker()
	if open := slices.Index(states, 2); open < 0 || !slices.Contains(states[open:], 1) || states[len(states)-1] != 0 {
		t.Errorf("breaker states seen %v, want open (2), then half-open (1), and closed (0) at the end", states)
	}
	f.mu.Lock()
	// Retry-After honoured: after a 429 with Retry-After: 1, the next request for that webhook came 1s later
	// or more, where the retry policy alone (100ms to 400ms) would have sent it sooner. Each phase was met.
	answered := map[string]int{}
	var shortest time.Duration
	for id, as := range f.log {
		for i, a := range as {
			answered[a.phase]++
			if a.code != 429 || i+1 == len(as) {
				continue
			}
			gap := as[i+1].at.Sub(a.at)
			if shortest == 0 || gap < shortest {
				shortest = gap
			}
			if gap < 950*time.Millisecond {
				t.Errorf("webhook %s asked again %v after a 429 with Retry-After: 1", id, gap)
			}
		}
	}
	f.mu.Unlock()
	for _, ph := range []string{"slow", "500", "429", "healthy"} {
		if answered[ph] == 0 {
			t.Errorf("no request reached the receiver while it was %s: that fault was never met", ph)
		}
	}
	t.Logf("breaker states %v; requests per phase %v; shortest wait after a 429: %v", states, answered, shortest)
	maxAttempts := pgtest.Count(t, pool, "SELECT max(attempts) FROM oncegate_effects")
	f.mu.Lock()
	dup, delivered := 0, len(f.ok)
	for _, c := range f.ok {
		dup += c - 1
	}
	requests := 0
	for _, c := range f.seen {
		requests += c
	}
	f.mu.Unlock()
	if delivered != n {
		t.Fatalf("the receiver acknowledged %d distinct webhooks, want %d", delivered, n)
	}
	t.Logf("%d requests reached the receiver for %d effects; at most %d attempts charged to one; %d duplicate 2xx", requests, n, maxAttempts, dup)
	result(fmt.Sprintf("%d/%d delivered, 0 dead; %d requests in all, max %d attempts charged, %d duplicates", delivered, n, requests, maxAttempts, dup))
}
