package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// The database goes away for a moment just after the receiver took a webhook and before the gateway recorded
// it (a PgBouncer restart, a failover): no gateway dies, so nothing may be sent twice. The gateway tries the
// recording write again while the database is back within dispatcher.lease_margin, instead of leaving the
// row to be rescued, and resent, when its lease runs out (an outside test saw 39 duplicates this way).
func TestDatabaseBlipAfterDeliveryDoesNotResend(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Network", "The gateway's database connection reset for 1.5 s right after each of 5 webhooks was answered 2xx",
		"Each webhook sent once; each effect delivered with 1 attempt")
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	u, _ := url.Parse(dbURL)
	pg := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", u.Host)
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	u.Host = pg.Listen

	var mu sync.Mutex
	got := map[string]int{}
	check := newWebhookCheck(t, whsec)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := make([]byte, r.ContentLength)
		_, _ = r.Body.Read(body)
		if !check.verify(w, r, body) {
			return
		}
		mu.Lock()
		got[r.Header.Get("webhook-id")]++
		mu.Unlock()
		// The database goes away now, while the answer travels back, and comes back 1.5 s later.
		if _, err := pg.Toxics.AddToxicJson(strings.NewReader(
			`{"name":"blip","type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`)); err == nil {
			time.AfterFunc(1500*time.Millisecond, func() { pg.Toxics.ResetToxics(context.Background()) })
		}
		w.WriteHeader(204)
	}))
	t.Cleanup(receiver.Close)

	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  hook:
    provider: webhook
    webhook: { url: "%s/hooks", secret: "%s", allow_private_networks: true }
    timeout: 2s
dispatcher: { poll_interval: 200ms, lease_margin: 4s }
`, u.String(), apiKey, receiver.URL, whsec))
	_, base := startGateway(t, config)
	for i := range 5 {
		key := fmt.Sprintf("blip-%d", i)
		testenv.Eventually(t, 30*time.Second, "the gateway accepts "+key, func() bool {
			code, _, _ := postJSON(t, base, key, `{"type":"hook","payload":{"event":"e","data":1}}`)
			return code == 202 || code == 200
		})
		testenv.Eventually(t, 30*time.Second, key+" delivered", func() bool {
			return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE key = $1 AND status = 'delivered'", key) == 1
		})
	}
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, n := range got {
		dups += n - 1
	}
	attempts := pgtest.Count(t, pool, "SELECT coalesce(sum(attempts), 0) FROM oncegate_effects")
	if len(got) != 5 || dups != 0 || attempts != 5 {
		t.Fatalf("%d webhook ids received, %d duplicates, %d attempts recorded; want 5, 0, 5", len(got), dups, attempts)
	}
	result("5 webhooks, 5 received once each, 5 attempts recorded, 0 duplicates")
}
