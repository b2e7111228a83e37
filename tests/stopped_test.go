package tests

import (
	"context"
	"fmt"
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
// over. Here each gateway's pool is sized so that one fits Postgres and two do not.
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
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s%spool_max_conns=%d
tenants: { acme: { api_keys: [%s] } }
effect_types:
  clicks: { provider: postgres }
`, dbURL, sep, (maxConns-reserved)/2, apiKey))
	first, _ := startGateway(t, config)
	testenv.Eventually(t, 10*time.Second, "the first gateway's heartbeat", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_gateways`) == 1
	})
	var id string
	if err := pool.QueryRow(context.Background(), `SELECT id FROM oncegate_gateways`).Scan(&id); err != nil {
		t.Fatalf("the first gateway's heartbeat: %v", err)
	}
	first.Signal(syscall.SIGTERM)
	if err := first.Wait(30 * time.Second); err != nil {
		t.Fatalf("the first gateway's graceful stop: %v", err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_gateways WHERE stopped_at IS NOT NULL`); n != 1 {
		t.Fatalf("%d heartbeat rows say their gateway stopped, want the first's", n)
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
		t.Fatalf("the gateway that replaced a stopped one warned of both pools: %s", lineIn(second.Log(), warning))
	}
}

func lineIn(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
