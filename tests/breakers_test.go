package tests

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// An outside finding of issue 31: a gateway whose breaker for a destination opened (its calls overran their
// timeout while it stood still) went on claiming that destination's rows, only to put each off for the
// breaker's open period, while the other gateways could deliver them: 17 to 32 of 100 new effects waited up
// to 40 s. Here gateway A's breaker opens on a destination that failed while A was alone; the destination
// recovers, B starts, and new effects posted through A go out at once, through B, each once. A destination
// down for both would have its rows put off by each, as by a gateway alone (outbox's tests).
func TestAGatewaysOpenBreakerLeavesItsRowsToTheFleet(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Two gateways; A's breaker for a destination opened (open_for 60 s) and the destination recovered; 20 webhooks posted through A",
		"All 20 delivered at once by B, each once; A claims none while its breaker is open")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	var failing atomic.Bool
	failing.Store(true)
	var mu sync.Mutex
	got := map[string]int{}
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if failing.Load() {
			w.WriteHeader(500)
			return
		}
		mu.Lock()
		got[r.Header.Get("webhook-id")]++
		mu.Unlock()
		w.WriteHeader(204)
	}))
	t.Cleanup(recv.Close)
	config := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  acme: { api_keys: [%s] }
effect_types:
  hook:
    provider: webhook
    timeout: 2s
    webhook: { url: "%s/in", secret: "%s", allow_private_networks: true }
    breaker: { failures: 3, open_for: 60s }
    retry: { base_delay: 10ms, max_delay: 10ms }
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey, recv.URL, whsec)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, a := startGateway(t, config)
	for i := range 3 {
		if code := post(t, a, fmt.Sprintf("opens-%d", i), `{"type":"hook","payload":{"event":"e","data":{}}}`); code != 202 {
			t.Fatalf("POST: %d", code)
		}
	}
	testenv.Eventually(t, 15*time.Second, "A's breaker opens", func() bool {
		v, ok := breakerGauge(scrape(t, a), `type="hook"`)
		return ok && v == 2
	})
	failing.Store(false)
	startGateway(t, config) // B
	// A leaves the rows to B once its heartbeat has read B's row, closed breakers and all (every 5 s).
	testenv.Eventually(t, 15*time.Second, "A has read B's heartbeat row", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_gateways WHERE last_seen > (SELECT max(started_at) FROM oncegate_gateways)`) == 2
	})
	start := time.Now()
	for i := range 20 {
		if code := post(t, a, fmt.Sprintf("new-%d", i), `{"type":"hook","payload":{"event":"e","data":{}}}`); code != 202 {
			t.Fatalf("POST: %d", code)
		}
	}
	testenv.Eventually(t, 20*time.Second, "the 20 new webhooks are delivered", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE key LIKE 'new-%' AND status = 'delivered'") == 20
	})
	took := time.Since(start)
	mu.Lock()
	ids, twice := len(got), 0
	for _, n := range got {
		twice += n - 1
	}
	mu.Unlock()
	if twice != 0 {
		t.Fatalf("%d webhooks received twice", twice)
	}
	if v, ok := breakerGauge(scrape(t, a), `type="hook"`); !ok || v != 2 {
		t.Fatalf("A's breaker is %v (present %v), want still open (2)", v, ok)
	}
	if took > 10*time.Second {
		t.Fatalf("the 20 new webhooks took %v: rows waited for A's open breaker", took)
	}
	t.Logf("20 new webhooks delivered in %v through B (%d distinct received)", took, ids)
	result(fmt.Sprintf("20 delivered in %v, none twice; A's breaker still open", took.Round(time.Millisecond)))
}
