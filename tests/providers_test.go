package tests

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

var whsec = "whsec_" + base64.StdEncoding.EncodeToString([]byte("tests-webhook-secret-32-bytes!!!"))

// hooks is a webhook receiver counting requests per webhook-id; hold makes requests wait for release. Every
// request it reads whole is verified with the official Standard Webhooks library (webhookCheck).
type hooks struct {
	srv     *httptest.Server
	mu      sync.Mutex
	byID    map[string]int
	hold    chan struct{}
	arrived chan string
}

func newHooks(t *testing.T) *hooks {
	h := &hooks{byID: map[string]int{}, arrived: make(chan string, 100)}
	check := newWebhookCheck(t, whsec)
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		h.mu.Lock()
		h.byID[id]++
		hold := h.hold
		h.mu.Unlock()
		// A body cut short (a network fault between gateway and receiver) is no webhook to verify: the
		// gateway gets no 2xx for it and sends it again.
		if err == nil && !check.verify(w, r, body) {
			return
		}
		select { // tests that do not watch arrivals must not stall the receiver
		case h.arrived <- id:
		default:
		}
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(204)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hooks) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byID[id]
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func postJSON(t *testing.T, base, key, body string) (int, map[string]any, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/effects", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, resp.Header
}

// One effect of every provider kind through the real gateway: each is delivered once, and its replay returns
// the stored result without touching the destination again.
func TestGatewayDeliversEveryProviderKind(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	mail := smtptest.Start(t)
	hk := newHooks(t)
	var upstreamCalls int
	var mu sync.Mutex
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamCalls++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"charge":"ch_1","idempotency_key":%q}`, r.Header.Get("Idempotency-Key"))
	}))
	defer upstream.Close()
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  welcome-email:
    provider: smtp
    smtp: { addr: "%s", from: "Acme <noreply@acme.test>" }
    on_crash: at_least_once
  order-webhook:
    provider: webhook
    webhook: { url: "%s/hooks", secret: "%s", allow_private_networks: true }
    timeout: 5s
  payments:
    provider: http
    http: { base_url: "%s", allow_private_networks: true }
    timeout: 5s
  clicks:
    provider: postgres
dispatcher: { poll_interval: 100ms }
`, dbURL, apiKey, mail.Addr, hk.srv.URL, whsec, upstream.URL))
	_, base := startGateway(t, config)

	cases := []struct{ key, body, resultField string }{
		{"welcome-email:user_6", `{"type":"welcome-email","payload":{"to":["user6@example.com"],"subject":"Welcome","text":"Hi"}}`, "message_id"},
		{"order-webhook:42", `{"type":"order-webhook","payload":{"event":"order.paid","data":{"order":42}}}`, "webhook_id"},
		{"charge:42", `{"type":"payments","payload":{"method":"POST","path":"/v1/charges","body":{"amount":500}}}`, "body"},
		{"click:1", `{"type":"clicks","payload":{"name":"click"}}`, "event_id"},
	}
	for _, c := range cases {
		body := strings.TrimSuffix(c.body, "}") + `,"wait":"10s"}`
		code, e, _ := postJSON(t, base, c.key, body)
		if code != 200 || e["status"] != "delivered" {
			t.Fatalf("%s: %d %v", c.key, code, e)
		}
		result, _ := e["result"].(map[string]any)
		if result[c.resultField] == nil {
			t.Fatalf("%s: result %v lacks %s", c.key, e["result"], c.resultField)
		}
		code, replay, h := postJSON(t, base, c.key, body)
		if code != 200 || h.Get("Idempotent-Replayed") != "true" || fmt.Sprint(replay["result"]) != fmt.Sprint(e["result"]) {
			t.Fatalf("%s replay: %d %v", c.key, code, replay)
		}
	}
	msgs := mail.Messages()
	if len(msgs) != 1 || msgs[0].To[0] != "user6@example.com" {
		t.Fatalf("mail server got %d messages", len(msgs))
	}
	if len(hk.byID) != 1 {
		t.Fatalf("webhook receiver got %v", hk.byID)
	}
	if upstreamCalls != 1 {
		t.Fatalf("upstream called %d times", upstreamCalls)
	}
}

// A gateway SIGKILLed while a webhook is in flight: under at_least_once another gateway resends it with the
// same webhook-id, under at_most_once it marks it unknown and sends nothing.
func TestKilledGatewayMidWebhookFollowsOnCrash(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Providers", "Gateway SIGKILLed while a webhook is in flight", "at_least_once: resent with the same webhook-id; at_most_once: unknown, not resent")
	result("at_least_once: 2 sends, 1 webhook-id; at_most_once: 1 send, unknown")
	for _, policy := range []string{"at_least_once", "at_most_once"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.Database(t)
			hk := newHooks(t)
			hk.hold = make(chan struct{})
			config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  order-webhook:
    provider: webhook
    webhook: { url: "%s", secret: "%s", allow_private_networks: true }
    timeout: 2s
    on_crash: %s
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey, hk.srv.URL, whsec, policy))
			a, baseA := startGateway(t, config)
			if code, _, _ := postJSON(t, baseA, "order:7", `{"type":"order-webhook","payload":{"event":"order.paid","data":{"order":7}}}`); code != 202 {
				t.Fatalf("POST %d", code)
			}
			var id string
			select {
			case id = <-hk.arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the webhook never arrived")
			}
			a.Kill() // the receiver has the request; the gateway will never record the answer
			hk.mu.Lock()
			close(hk.hold)
			hk.hold = nil
			hk.mu.Unlock()

			_, baseB := startGateway(t, config)
			want := map[string]string{"at_least_once": "delivered", "at_most_once": "unknown"}[policy]
			var e effect
			testenv.Eventually(t, 20*time.Second, "the rescued effect ends "+want, func() bool {
				e = get(t, baseB, "order:7")
				return e.Status == want
			})
			sent := map[string]int{"at_least_once": 2, "at_most_once": 1}[policy]
			if n := hk.count(id); n != sent {
				t.Fatalf("the receiver got webhook-id %s %d times, want %d", id, n, sent)
			}
			if len(hk.byID) != 1 {
				t.Fatalf("the resend carried another webhook-id: %v", hk.byID)
			}
		})
	}
}
