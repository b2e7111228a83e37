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
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// An outside finding of issue 31: a gateway stopped (SIGSTOP) for 3 s, shorter than its lease, while its
// webhooks were in flight, resent webhooks its receiver had answered at once, and finished an at_most_once
// one unknown: the answers waited in its sockets, and the 2 s timeouts, due during the stop, fired first when
// it resumed. The timeouts then opened the destination's breaker on a healthy receiver. A call's timeout now
// counts the time the process ran, not the time it stood still.
func TestAStoppedGatewayResendsNothingItsReceiverAnswered(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "A gateway SIGSTOPped for 3 s (its lease 7 s) with 16 webhooks in flight, 8 at_least_once and 8 at_most_once, which the receiver answers after 300 ms",
		"Each webhook received once; every effect delivered in one attempt, none unknown; the breaker stays closed")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	const n = 16
	var mu sync.Mutex
	got := map[string]int{}
	var arrived atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got[r.Header.Get("webhook-id")]++
		mu.Unlock()
		arrived.Add(1)
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(204)
	}))
	t.Cleanup(recv.Close)
	config := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %[1]s
tenants:
  acme: { api_keys: [%[2]s] }
effect_types:
  hook:
    provider: webhook
    timeout: 2s
    concurrency: 16
    webhook: { url: "%[3]s/in", secret: "%[4]s", allow_private_networks: true }
    breaker: { failures: 3, open_for: 60s }
  hook_amo:
    provider: webhook
    timeout: 2s
    concurrency: 16
    on_crash: at_most_once
    webhook: { url: "%[3]s/in", secret: "%[4]s", allow_private_networks: true }
    breaker: { failures: 3, open_for: 60s }
dispatcher: { poll_interval: 100ms, lease_margin: 5s }
`, dbURL, apiKey, recv.URL, whsec)), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, base := startGateway(t, config)
	for i := range n {
		typ := "hook"
		if i%2 == 1 {
			typ = "hook_amo"
		}
		if code := post(t, base, fmt.Sprintf("k-%d", i), fmt.Sprintf(`{"type":%q,"payload":{"event":"e","data":{}}}`, typ)); code != 202 {
			t.Fatalf("POST: %d", code)
		}
	}
	testenv.Eventually(t, 10*time.Second, "every webhook reaches the receiver", func() bool { return arrived.Load() == n })
	stopThenSettle(t, gw, pool)
	mu.Lock()
	twice := 0
	for _, c := range got {
		twice += c - 1
	}
	mu.Unlock()
	rows, err := pool.Query(t.Context(), "SELECT key, status, attempts FROM oncegate_effects WHERE status <> 'delivered' OR attempts <> 1")
	if err != nil {
		t.Fatal(err)
	}
	var odd []string
	for rows.Next() {
		var key, status string
		var attempts int
		if err := rows.Scan(&key, &status, &attempts); err != nil {
			t.Fatal(err)
		}
		odd = append(odd, fmt.Sprintf("%s %s after %d attempts", key, status, attempts))
	}
	rows.Close()
	breaker, _ := breakerGauge(scrape(t, base), `type="hook"`)
	if twice != 0 || len(odd) != 0 || breaker != 0 {
		t.Fatalf("%d webhooks received twice; effects not delivered in one attempt: %v; hook's breaker state %d (0 closed)",
			twice, odd, breaker)
	}
	result(fmt.Sprintf("%d webhooks, none received twice, all delivered in one attempt, breaker closed", n))
}

// The same stop with emails: the SMTP client's own per-command timeouts put wall-clock deadlines on the
// socket, which ran out during the stop, so each message whose 250 waited in the socket was sent again (an
// outside test: 6 of 6 twice). An attempt's context is the only bound now, and closes the connection when it
// ends.
func TestAStoppedGatewaySendsNoEmailTwice(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "A gateway SIGSTOPped for 3 s (its lease 7 s) with 6 emails in flight, whose server answers the end of DATA after 1.2 s",
		"Each email received once; every effect delivered in one attempt")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	const n = 6
	mail := smtptest.Start(t)
	var received atomic.Int64
	mail.OnMessage(func(smtptest.Message) {
		received.Add(1)
		time.Sleep(1200 * time.Millisecond) // the 250 comes while the gateway is stopped
	})
	config := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  acme: { api_keys: [%s] }
effect_types:
  mail:
    provider: smtp
    timeout: 2s
    concurrency: 8
    smtp: { addr: "%s", from: "Acme <noreply@acme.test>" }
dispatcher: { poll_interval: 100ms, lease_margin: 5s }
`, dbURL, apiKey, mail.Addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, base := startGateway(t, config)
	for i := range n {
		if code := post(t, base, fmt.Sprintf("m-%d", i), `{"type":"mail","payload":{"to":["u@example.com"],"subject":"s","text":"t"}}`); code != 202 {
			t.Fatalf("POST: %d", code)
		}
	}
	testenv.Eventually(t, 10*time.Second, "every message reaches the server", func() bool { return received.Load() == n })
	time.Sleep(300 * time.Millisecond)
	stopThenSettle(t, gw, pool)
	twice := 0
	for _, c := range mail.ByMessageID() {
		twice += c - 1
	}
	odd := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status <> 'delivered' OR attempts <> 1")
	if twice != 0 || odd != 0 {
		t.Fatalf("%d emails received twice; %d effects not delivered in one attempt", twice, odd)
	}
	result(fmt.Sprintf("%d emails, none received twice, all delivered in one attempt", n))
}

// stopThenSettle stops gw for 3 s (SIGSTOP, SIGCONT), then waits for its outbox to empty, for 20 s at most:
// an open breaker (60 s) would hold the rest, and what happened by then is the answer.
func stopThenSettle(t *testing.T, gw *proctest.Proc, pool *pgxpool.Pool) {
	t.Helper()
	gw.Signal(syscall.SIGSTOP)
	time.Sleep(3 * time.Second)
	gw.Signal(syscall.SIGCONT)
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox") == 0 {
			return
		}
	}
}
