package tests

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// A pause ends with one call, its probe (migration 00030), made by one gateway of the fleet. That gateway is
// SIGKILLed while its probe's call is in flight: the rows stay held, no gateway calls the destination until
// the probe's lease has run out, then another gateway probes, is answered, and every row goes. Every effect
// arrives; only the killed probe's own row may arrive twice (its call reached the receiver, the outcome was
// never recorded: at_least_once).
func TestAGatewayKilledWithAPausesProbeOutLeavesItToAnother(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Delivery limits",
		"3 gateways; a 429 with Retry-After: 1, then the gateway whose probe is in flight at its end is SIGKILLed",
		"no call until the probe's lease runs out, then one probe by another gateway and the rest; none lost")
	var (
		mu      sync.Mutex
		ids     = map[string]int{}
		at      []time.Time
		first   time.Time
		hold    = make(chan struct{})
		holding = make(chan string, 1)
		held    bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id := req.Header.Get("webhook-id")
		mu.Lock()
		now := time.Now()
		at = append(at, now)
		if first.IsZero() {
			first = now
		}
		switch {
		case now.Before(first.Add(500 * time.Millisecond)):
			// Every call of the first half second, the calls in flight as the first 429 came included.
			mu.Unlock()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case !held:
			// The probe: it reached the receiver, and its answer waits for the kill of its gateway.
			held = true
			ids[id]++
			mu.Unlock()
			holding <- id
			<-hold
			w.WriteHeader(http.StatusOK)
			return
		}
		ids[id]++
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	})
	secret24 := "whsec_" + base64.StdEncoding.EncodeToString([]byte("fleet-rate-secret-24-byt"))
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  hook:
    provider: webhook
    webhook: { url: "%s/in", secret: "%s", allow_private_networks: true }
    timeout: 2s
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey, srv.URL, secret24))
	const effects = 100
	if _, err := pool.Exec(context.Background(), `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'acme', 'p' || i, 'hook', '\x00', json_build_object('event', 'e', 'data', json_build_object('i', i)),
			       'eff_probe' || i
			FROM generate_series(1, $1) AS i
			RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, tenant, destination) SELECT id, type, tenant, $2 FROM e`,
		effects, srv.URL); err != nil {
		t.Fatal(err)
	}
	byPid := map[int]*proctest.Proc{}
	for range 3 {
		p, _ := startGateway(t, config)
		byPid[p.Pid()] = p
	}
	var probed string
	select {
	case probed = <-holding:
	case <-time.After(30 * time.Second):
		t.Fatal("no probe reached the receiver in 30 s")
	}
	// The gateway whose probe is out is named in the pause (prober: host/pid/suffix).
	var prober string
	var lease time.Time
	if err := pool.QueryRow(context.Background(), `SELECT prober, probe_lease FROM oncegate_destination_pauses
		WHERE probe_token IS NOT NULL`).Scan(&prober, &lease); err != nil {
		t.Fatalf("the pause names no probe out: %v", err)
	}
	parts := strings.Split(prober, "/")
	pid, err := strconv.Atoi(parts[len(parts)-2])
	if err != nil || byPid[pid] == nil {
		t.Fatalf("the prober %q is none of the gateways started", prober)
	}
	byPid[pid].Kill()
	killed := time.Now()
	close(hold)
	var leaseLeft time.Duration
	if err := pool.QueryRow(context.Background(), `SELECT extract(epoch FROM probe_lease - now()) * 1e9
		FROM oncegate_destination_pauses`).Scan(&leaseLeft); err != nil {
		t.Fatalf("the pause is gone after its prober was killed: %v", err)
	}
	testenv.Eventually(t, 60*time.Second, "every effect received", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ids) == effects
	})
	// The killed probe's row is rescued once its lease has run out, and sent again.
	testenv.Eventually(t, 30*time.Second, "the outbox empty and the pause lifted", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_outbox`) == 0 &&
			pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_destination_pauses`) == 0
	})
	mu.Lock()
	var quiet []time.Duration
	for _, c := range at {
		if c.After(killed) && c.Before(killed.Add(leaseLeft-300*time.Millisecond)) {
			quiet = append(quiet, c.Sub(killed))
		}
	}
	var twice []string
	for id, n := range ids {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s ×%d", id, n))
		}
	}
	mu.Unlock()
	t.Logf("probe of %s killed with %v of its lease left; calls in that time: %v; received twice: %v", probed,
		leaseLeft.Round(time.Millisecond), quiet, twice)
	result(fmt.Sprintf("%d calls while the dead gateway's probe lease ran (%v); %d effects received, twice: %v",
		len(quiet), leaseLeft.Round(100*time.Millisecond), effects, twice))
	if len(quiet) != 0 {
		t.Fatalf("%d calls at %v after the kill, while the dead gateway's probe held the rows", len(quiet), quiet)
	}
	if len(twice) > 1 || (len(twice) == 1 && !strings.HasPrefix(twice[0], probed+" ")) {
		t.Fatalf("received twice: %v; only the killed probe's row (%s) may be", twice, probed)
	}
	var status string
	var attempts int
	if err := pool.QueryRow(context.Background(), `SELECT status, attempts FROM oncegate_effects WHERE stable_id = $1`,
		probed).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	// Its attempts: the interrupted call and the one after it.
	if status != "delivered" || attempts != 2 {
		t.Fatalf("the killed probe's effect is %s after %d attempts, want delivered after 2", status, attempts)
	}
}
