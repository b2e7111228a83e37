package tests

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/pgtest"
	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testenv"
)

// flakyReceiver is a webhook receiver on a fixed port whose behaviour the test changes: down (nothing
// listens), slow (beyond the gateway's timeout), 500, 429 with Retry-After, healthy.
type flakyReceiver struct {
	addr  string
	phase atomic.Value // string
	mu    sync.Mutex
	srv   *http.Server
	ok    map[string]int // 2xx answers per webhook-id
	seen  map[string]int // requests per webhook-id
}

func (f *flakyReceiver) handler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	id := r.Header.Get("webhook-id")
	f.mu.Lock()
	f.seen[id]++
	f.mu.Unlock()
	switch f.phase.Load().(string) {
	case "slow":
		time.Sleep(1500 * time.Millisecond) // the gateway's timeout is 500ms: it gives up first
		w.WriteHeader(503)
	case "500":
		w.WriteHeader(500)
	case "429":
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(429)
	default:
		f.mu.Lock()
		f.ok[id]++
		f.mu.Unlock()
		w.WriteHeader(204)
	}
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
	f := &flakyReceiver{addr: freeTCPAddr(t), ok: map[string]int{}, seen: map[string]int{}}
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
	gw, base := startGateway(t, config)
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
		time.Sleep(1500 * time.Millisecond)
		if bad := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status IN ('dead', 'failed', 'unknown')"); bad != 0 {
			t.Fatalf("%d effects ended during the %s phase", bad, ph)
		}
	}
	testenv.Eventually(t, 30*time.Second, "every effect delivered once the receiver is healthy", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'") == n
	})
	logs := gw.Log()
	for _, want := range []string{`"to":"open"`, `"to":"half-open"`, `"to":"closed"`, `"in":"1s"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("gateway log lacks %s", want)
		}
	}
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
