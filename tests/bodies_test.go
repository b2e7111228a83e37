package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// retention.payloads (issue 30): a gateway keeps bodies apart, and once their partitions are past it they are
// dropped while the effects stay. The effect still says what happened (status, when, attempts); its replay is
// still a no-op (no second row at the destination, no second call upstream), the proxy's replay says its
// answer expired (410) instead of pretending the upstream failed, a retry is refused with a clear problem,
// and the CLI shows the body as expired. A request under a key whose body expired, with another payload, is
// still a reuse: the key's fingerprint tells.
func TestBodiesExpireBeforeTheirEffects(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	pgtest.Repartition(t, dbURL, 2*time.Second, time.Now())
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/refused" { // a permanent failure: the effect is failed, and may be retried
			w.WriteHeader(400)
			_, _ = w.Write([]byte(`{"error":"no"}`))
			return
		}
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"id":"ord_1"}`))
	}))
	defer upstream.Close()
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  analytics: { provider: postgres }
  orders:
    provider: http
    http: { base_url: "%s", allow_private_networks: true }
retention: { keys: 2m, payloads: 2s }
partitions: { interval: 2s, ahead: 3 }
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey, upstream.URL))
	gw := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config))
	base := "http://" + strings.TrimPrefix(gw.WaitLine("listening ", 30*time.Second), "listening ")

	const signup = `{"type":"analytics","payload":{"name":"signup","properties":{"plan":"pro"}}}`
	code, _, body := exchange(t, "POST", base+"/v1/effects", apiKey,
		strings.Replace(signup, "{", `{"wait":"10s",`, 1), "Idempotency-Key: s1")
	if code != 200 {
		t.Fatalf("the effect: %d %s", code, body)
	}
	var first struct {
		StableID string          `json:"stable_id"`
		Status   string          `json:"status"`
		Result   json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal([]byte(body), &first); err != nil || first.Status != "delivered" {
		t.Fatalf("the effect: %s (%v)", body, err)
	}
	// Kept apart: the effect's row holds no payload, its body does.
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects e JOIN oncegate_effect_bodies b
		ON b.effect_id = e.id WHERE e.key = 's1' AND e.payload IS NULL AND b.payload::text LIKE '%signup%'`); n != 1 {
		t.Fatalf("%d effects with their payload in oncegate_effect_bodies", n)
	}
	code, _, proxied := exchange(t, "POST", base+"/v1/proxy/orders/orders", apiKey, `{"amount":100}`, "Idempotency-Key: o1")
	if code != 201 || proxied != `{"id":"ord_1"}` {
		t.Fatalf("the proxied call: %d %s", code, proxied)
	}
	if code, h, again := exchange(t, "POST", base+"/v1/proxy/orders/orders", apiKey, `{"amount":100}`,
		"Idempotency-Key: o1"); code != 201 || again != proxied || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the proxied replay within retention.payloads: %d %s", code, again)
	}

	if code, _, body := exchange(t, "POST", base+"/v1/proxy/orders/refused", apiKey, `{}`, "Idempotency-Key: o2"); code != 400 {
		t.Fatalf("the refused call: %d %s", code, body)
	}

	testenv.Eventually(t, 60*time.Second, "the bodies' partitions dropped", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effect_bodies") == 0
	})
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE key IN ('s1', 'o1', 'o2')"); n != 3 {
		t.Fatalf("%d of the 3 effects left after their bodies went", n)
	}

	code, _, body = exchange(t, "GET", base+"/v1/effects/s1", apiKey, "")
	var after struct {
		StableID    string          `json:"stable_id"`
		Status      string          `json:"status"`
		Result      json.RawMessage `json:"result"`
		BodyExpired bool            `json:"body_expired"`
	}
	if err := json.Unmarshal([]byte(body), &after); err != nil || code != 200 || after.Status != "delivered" ||
		!after.BodyExpired || string(after.Result) != "null" || after.StableID != first.StableID {
		t.Fatalf("the effect after its body expired: %d %s", code, body)
	}
	code, h, body := exchange(t, "POST", base+"/v1/effects", apiKey, signup, "Idempotency-Key: s1")
	if code != 200 || h.Get("Idempotent-Replayed") != "true" || !strings.Contains(body, first.StableID) ||
		!strings.Contains(body, `"body_expired":true`) {
		t.Fatalf("the replay after its body expired: %d %s", code, body)
	}
	if code, _, body := exchange(t, "POST", base+"/v1/effects", apiKey,
		`{"type":"analytics","payload":{"name":"other"}}`, "Idempotency-Key: s1"); code != 422 {
		t.Fatalf("another payload under the key: %d %s", code, body)
	}
	code, h, body = exchange(t, "POST", base+"/v1/proxy/orders/orders", apiKey, `{"amount":100}`, "Idempotency-Key: o1")
	if code != 410 || !strings.Contains(body, "/problems/answer-expired") || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the proxied replay after its answer expired: %d %s", code, body)
	}
	if code, _, body := exchange(t, "POST", base+"/v1/effects/o2/retry", apiKey, ""); code != 409 ||
		!strings.Contains(body, "retention.payloads") {
		t.Fatalf("a retry of an effect whose body expired: %d %s", code, body)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events WHERE key = 's1'"); n != 1 || calls.Load() != 2 {
		t.Fatalf("%d analytics rows and %d upstream calls, want 1 and 2", n, calls.Load())
	}

	cli := exec.Command(filepath.Join(bin, "oncegate"), "effect", "show", "s1", "--tenant", "acme")
	cli.Env = append(cli.Environ(), "DATABASE_URL="+dbURL)
	out, err := cli.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "expired: retention.payloads") {
		t.Fatalf("oncegate effect show: %v\n%s", err, out)
	}
}
