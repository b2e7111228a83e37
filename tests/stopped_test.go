package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// A gateway stopped gracefully (SIGTERM) says so in its heartbeat row (migration 00031), and the fleet counts
// it gone at once. Before, its last heartbeat read as alive for three more (15 s): the gateway started in its
// place, in a rolling restart, counted both and warned that their pools could ask Postgres for more
// connections than it allows, and a partition manager with new settings waited those seconds to take them
// over. Here each gateway's pool is sized so that one fits Postgres and two do not, and the first stops with a
// delivery in flight: its row says so as its stop begins, while it drains.
func TestAGatewayStoppedGracefullyIsCountedGoneAtOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	var maxConns, reserved int
	if err := pool.QueryRow(context.Background(), `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int`).Scan(&maxConns, &reserved); err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	// A receiver that holds each call for 3 s: the first gateway stops with a delivery in flight.
	arrived := make(chan struct{}, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		time.Sleep(3 * time.Second)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(slow.Close)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s%spool_max_conns=%d
tenants: { acme: { api_keys: [%s] } }
effect_types:
  slow:
    provider: webhook
    webhook: { url: "%s/in", secret: "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", allow_private_networks: true }
    timeout: 10s
`, dbURL, sep, (maxConns-reserved)/2, apiKey, slow.URL))
	first, firstBase := startGateway(t, config)
	testenv.Eventually(t, 10*time.Second, "the first gateway's heartbeat", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_gateways`) == 1
	})
	var id string
	if err := pool.QueryRow(context.Background(), `SELECT id FROM oncegate_gateways`).Scan(&id); err != nil {
		t.Fatalf("the first gateway's heartbeat: %v", err)
	}
	if code := post(t, firstBase, "slow:1", `{"type":"slow","payload":{"event":"e","data":1}}`); code != 202 {
		t.Fatalf("POST: %d", code)
	}
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery never reached the receiver")
	}
	first.Signal(syscall.SIGTERM)
	// Marked as its stop begins, while it drains the delivery in flight: neither alive nor read as killed.
	testenv.Eventually(t, 2*time.Second, "the first gateway's row marked stopped during its drain", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_gateways WHERE stopped_at IS NOT NULL`) == 1
	})
	if err := first.Wait(30 * time.Second); err != nil {
		t.Fatalf("the first gateway's graceful stop: %v", err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`); n != 1 {
		t.Fatalf("%d effects delivered by the drain, want the one in flight", n)
	}
	second, _ := startGateway(t, config)
	var gws struct {
		Gateways []struct {
			ID    string `json:"id"`
			Alive bool   `json:"alive"`
		} `json:"gateways"`
	}
	cliJSON(t, []string{"DATABASE_URL=" + dbURL}, &gws, "gateway", "ls")
	for _, g := range gws.Gateways {
		if g.ID == id && g.Alive {
			t.Fatalf("gateway ls counts the stopped gateway alive: %+v", gws.Gateways)
		}
	}
	// The check runs right after the first heartbeat.
	testenv.Eventually(t, 10*time.Second, "the second gateway's heartbeat", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_gateways`) == 2
	})
	time.Sleep(time.Second)
	const warning = "the gateways' pools together can ask Postgres for more connections than it allows"
	if strings.Contains(second.Log(), warning) {
		t.Fatalf("the gateway that replaced a stopped one warned of both pools: %s", grepLines(second.Log(), warning))
	}
}
