package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

const apiKey = "tests-api-key-2f9d6b1e8a4c7f3b5d0e"

// gatewayConfig writes a configuration file for a gateway on dbURL; extra is YAML appended under
// effect_types' analytics type.
func gatewayConfig(t *testing.T, dbURL, analyticsExtra string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	body := fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  acme:
    api_keys: [%s]
effect_types:
  analytics:
    provider: postgres
%s
dispatcher:
  poll_interval: 100ms
  lease_margin: 1s
`, dbURL, apiKey, analyticsExtra)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startGateway runs the gateway binary and returns it with its base URL.
func startGateway(t *testing.T, config string) (*proctest.Proc, string) {
	t.Helper()
	p := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config))
	return p, gatewayBase(t, p)
}

// gatewayBase waits for the gateway p to listen and returns its base URL. Every exchange of the tests with
// it is then held to its OpenAPI description (watchGateway).
func gatewayBase(t *testing.T, p *proctest.Proc) string {
	t.Helper()
	base := "http://" + strings.TrimPrefix(p.WaitLine("listening ", 30*time.Second), "listening ")
	watchGateway(t, base)
	return base
}

type effect struct {
	Key      string `json:"key"`
	Status   string `json:"status"`
	Attempts int    `json:"attempts"`
}

func post(t *testing.T, base, key, body string) int {
	t.Helper()
	code, _, _ := postJSON(t, base, key, body)
	return code
}

func get(t *testing.T, base, key string) effect {
	t.Helper()
	return getAs(t, base, apiKey, key)
}

// getAs reads the effect under key as the tenant whose API key is apiKey.
func getAs(t *testing.T, base, apiKey, key string) effect {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/v1/effects/"+key, nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e effect
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return e
}

// A gateway SIGKILLed in the middle of a delivery loses nothing: the effect stays recorded, its outbox row's
// lease expires, and another gateway rescues and delivers it, once.
func TestKilledGatewayMidDeliveryIsRescuedByAnother(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Gateway SIGKILLed inside a delivery (analytics insert blocked)", "Another gateway rescues the row after its lease; one row inserted")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	ctx := context.Background()
	config := gatewayConfig(t, dbURL, "    timeout: 3s")

	// Hold the analytics table so that the delivery blocks inside its insert: the gateway is mid-delivery.
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, "LOCK TABLE analytics_events IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	a, baseA := startGateway(t, config)
	if code := post(t, baseA, "order:1", `{"type":"analytics","payload":{"name":"order"}}`); code != 202 {
		t.Fatalf("POST: %d", code)
	}
	testenv.Eventually(t, 10*time.Second, "gateway A starts delivering", func() bool {
		return get(t, baseA, "order:1").Status == "delivering"
	})
	a.Kill()
	killed := time.Now()
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	b, baseB := startGateway(t, config)
	var e effect
	testenv.Eventually(t, 30*time.Second, "gateway B delivers the effect gateway A held", func() bool {
		e = get(t, baseB, "order:1")
		return e.Status == "delivered"
	})
	t.Logf("delivered by the second gateway %v after the first was SIGKILLed (lease: timeout 3s + margin 1s)",
		time.Since(killed).Round(10*time.Millisecond))
	result(fmt.Sprintf("rescued and delivered %v after the kill; 1 row", time.Since(killed).Round(100*time.Millisecond)))
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events WHERE key = 'order:1'"); n != 1 {
		t.Fatalf("%d analytics rows, want exactly 1", n)
	}
	if e.Attempts != 1 {
		t.Fatalf("attempts %d: the killed gateway's attempt left no record, the rescue's is the one", e.Attempts)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); n != 0 {
		t.Fatalf("%d outbox rows left", n)
	}
	if !strings.Contains(scrape(t, baseB), `oncegate_rescued_total{type="analytics"} 1`) {
		t.Fatalf("gateway B's metrics do not count the rescue; log:\n%s", b.Log())
	}
}

// Two live gateways dispatching one outbox never both deliver a row: every effect is delivered once, in one
// attempt, and no lease is ever lost.
func TestTwoGatewaysDeliverEachEffectOnce(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Two live gateways dispatching one outbox (400 effects)", "Each effect delivered once, in one attempt; no lease lost; both gateways worked")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := gatewayConfig(t, dbURL, "    concurrency: 8")
	a, baseA := startGateway(t, config)
	b, baseB := startGateway(t, config)
	const n = 400
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		base := baseA
		if i%2 == 1 {
			base = baseB
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if code := post(t, base, fmt.Sprintf("e%d", i), `{"type":"analytics","payload":{"name":"e"}}`); code != 202 {
				t.Errorf("POST e%d: %d", i, code)
			}
		})
	}
	wg.Wait()
	testenv.Eventually(t, 60*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'") == n
	})
	if c := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events"); c != n {
		t.Fatalf("%d analytics rows for %d effects", c, n)
	}
	if c := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE attempts <> 1"); c != 0 {
		t.Fatalf("%d effects took more than one attempt", c)
	}
	ma, mb := scrape(t, baseA), scrape(t, baseB)
	// A lease lost by a live gateway shows as its row claimed again by the other: a rescue.
	for name, m := range map[string]string{"A": ma, "B": mb} {
		if n := counterIn(m, `oncegate_rescued_total{type="analytics"}`); n != 0 {
			t.Fatalf("gateway %s rescued %d rows from a live gateway: a lease was lost", name, n)
		}
	}
	da, db := attemptsIn(ma), attemptsIn(mb)
	t.Logf("gateway A delivered %d, gateway B %d", da, db)
	result(fmt.Sprintf("A %d + B %d = %d deliveries, all in 1 attempt", da, db, da+db))
	if da+db != n || da == 0 || db == 0 {
		t.Fatalf("deliveries A=%d B=%d, want both working and %d in all", da, db, n)
	}
	a.Signal(syscall.SIGTERM)
	b.Signal(syscall.SIGTERM)
	for _, p := range []*proctest.Proc{a, b} {
		if err := p.Wait(20 * time.Second); err != nil {
			t.Fatalf("graceful shutdown: %v\n%s", err, p.Log())
		}
	}
}

func scrape(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func attemptsIn(metrics string) int {
	return counterIn(metrics, `oncegate_delivery_attempts_total{outcome="delivered",type="analytics"}`)
}

// counterIn returns the value of series (name and labels, as exposed) in a /metrics page, 0 when absent.
func counterIn(metrics, series string) int {
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, series+" ") {
			var n int
			fmt.Sscan(strings.Fields(l)[1], &n)
			return n
		}
	}
	return 0
}

// A request waiting on an API-only gateway is answered as soon as another gateway delivers its effect: the
// delivering gateway's notification crosses over.
func TestWaitIsAnsweredAcrossGateways(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	config := gatewayConfig(t, dbURL, "")
	api := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config, "--no-dispatch"))
	apiBase := gatewayBase(t, api)
	startGateway(t, config) // the dispatcher

	req, _ := http.NewRequest("POST", apiBase+"/v1/effects",
		strings.NewReader(`{"type":"analytics","payload":{"name":"x"},"wait":"20s"}`))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "cross")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e effect
	_ = json.NewDecoder(resp.Body).Decode(&e)
	took := time.Since(start)
	t.Logf("answered %v after the request, delivered by the other gateway", took.Round(time.Millisecond))
	if resp.StatusCode != 200 || e.Status != "delivered" {
		t.Fatalf("%d %+v", resp.StatusCode, e)
	}
	if took > 10*time.Second {
		t.Fatalf("the wait was not cut short by the other gateway's notification: %v", took)
	}
}

// A gateway started while its database cannot be reached yet (Postgres starting, a failover, a connection
// refused or timed out under load) waits for it, saying so, rather than exit: a CI run saw a gateway
// restarted under load exit on a connection that timed out after 3 s ("failed to connect … timeout"), and
// its supervisor would have had to start it again. The database behind a proxy that refuses connections
// for 3 s, then lets them through: the gateway starts and serves.
func TestAGatewayStartedBeforeItsDatabaseIsReachableWaitsForIt(t *testing.T) {
	t.Parallel()
	db := pgtest.Database(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	proxy := redistest.StartProxy(t, u.Host)
	proxy.Cut()
	u.Host = proxy.Addr()
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  analytics: { provider: postgres, postgres: { table: analytics_events } }
`, u.String(), apiKey))
	p := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config))
	time.Sleep(3 * time.Second)
	proxy.Heal()
	base := gatewayBase(t, p)
	if code := post(t, base, "after-wait", `{"type":"analytics","payload":{"name":"a"}}`); code != 202 {
		t.Fatalf("POST after the database came: %d", code)
	}
}
