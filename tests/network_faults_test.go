package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
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

// Network faults between the gateway and Postgres, and between the gateway and a webhook receiver, made by
// Toxiproxy run in-process: latency, connections reset, a blackhole. Requests meet delays or 503s, and every
// request that was acknowledged is delivered once the network heals; nothing is half-recorded.
func TestNetworkFaultsLoseNothing(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Network", "Toxiproxy between gateway and Postgres (latency 300 ms, reset, blackhole) and gateway and receiver (latency past the timeout, reset)",
		"Every acknowledged effect delivered after; no half-recorded effect; nothing dead")
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	newProxy := func(name, upstream string) *toxiproxy.Proxy {
		p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		return p
	}
	toxic := func(p *toxiproxy.Proxy, name, typ, stream string, attrs string) {
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
			`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, name, typ, stream, attrs))); err != nil {
			t.Fatal(err)
		}
	}
	clear := func(p *toxiproxy.Proxy) { p.Toxics.ResetToxics(context.Background()) }

	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	u, _ := url.Parse(dbURL)
	pg := newProxy("postgres", u.Host)
	u.Host = pg.Listen
	hk := newHooks(t)
	hookURL, _ := url.Parse(hk.srv.URL)
	hook := newProxy("receiver", hookURL.Host)

	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  clicks: { provider: postgres, retry: { max_attempts: 50, base_delay: 100ms, max_delay: 1s } }
  hook:
    provider: webhook
    webhook: { url: "http://%s/hooks", secret: "%s", allow_private_networks: true }
    timeout: 500ms
    retry: { max_attempts: 50, base_delay: 100ms, max_delay: 1s }
    breaker: { failures: 5, open_for: 500ms }
dispatcher: { poll_interval: 200ms, lease_margin: 1s }
`, u.String(), apiKey, hook.Listen, whsec))
	_, base := startGateway(t, config)

	var mu sync.Mutex
	acked := map[string]string{} // key -> type
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 20 * time.Second}
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				typ := []string{"clicks", "hook"}[i%2]
				key := fmt.Sprintf("w%d-%d", w, i)
				body := `{"type":"clicks","payload":{"name":"c"}}`
				if typ == "hook" {
					body = `{"type":"hook","payload":{"event":"e","data":1}}`
				}
				req, _ := http.NewRequest("POST", base+"/v1/effects", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+apiKey)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 202 || resp.StatusCode == 200 {
					mu.Lock()
					acked[key] = typ
					mu.Unlock()
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	phase := func(d time.Duration) { time.Sleep(d) }
	phase(time.Second)
	toxic(pg, "slow", "latency", "downstream", `{"latency":300}`)
	phase(1500 * time.Millisecond)
	clear(pg)
	toxic(pg, "reset", "reset_peer", "upstream", `{"timeout":0}`)
	phase(1500 * time.Millisecond)
	clear(pg)
	toxic(pg, "blackhole", "timeout", "upstream", `{"timeout":0}`)
	phase(2 * time.Second)
	clear(pg)
	toxic(hook, "slow", "latency", "downstream", `{"latency":1500}`)
	phase(2 * time.Second)
	clear(hook)
	toxic(hook, "reset", "reset_peer", "upstream", `{"timeout":0}`)
	phase(1500 * time.Millisecond)
	clear(hook)
	phase(time.Second)
	close(stop)
	wg.Wait()

	mu.Lock()
	n := len(acked)
	mu.Unlock()
	defer func() {
		if t.Failed() {
			rows, _ := pool.Query(context.Background(), `SELECT e.status, e.type, count(*), max(e.attempts), count(o.lease_token), max(e.last_error)
				FROM oncegate_effects e LEFT JOIN oncegate_outbox o ON o.effect_id = e.id GROUP BY 1, 2`)
			for rows.Next() {
				var st, typ string
				var c, a, leased int
				var le *string
				_ = rows.Scan(&st, &typ, &c, &a, &leased, &le)
				t.Logf("%s %s: %d effects, max %d attempts, %d leased, last error %v", typ, st, c, a, leased, deref(le))
			}
			rows.Close()
		}
	}()
	testenv.Eventually(t, 60*time.Second, "every acknowledged effect delivered after the faults", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'") >= n &&
			pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox") == 0
	})
	if c := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status <> 'delivered'"); c != 0 {
		t.Fatalf("%d effects not delivered", c)
	}
	lost := 0
	for key, typ := range acked {
		switch typ {
		case "clicks":
			if pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events WHERE key = $1", key) != 1 {
				lost++
			}
		case "hook":
			var id string
			_ = pool.QueryRow(t.Context(), "SELECT stable_id FROM oncegate_effects WHERE tenant = 'acme' AND key = $1", key).Scan(&id)
			if id == "" || hk.count(id) == 0 {
				lost++
			}
		}
	}
	hk.mu.Lock()
	dups := 0
	for _, c := range hk.byID {
		dups += c - 1
	}
	hk.mu.Unlock()
	if lost != 0 {
		t.Fatalf("%d of %d acknowledged effects lost", lost, n)
	}
	t.Logf("%d effects acknowledged through the faults, all delivered; %d webhook resends (same webhook-id)", n, dups)
	result(fmt.Sprintf("%d acknowledged, %d delivered, 0 lost; %d webhook resends with the same id", n, n, dups))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
