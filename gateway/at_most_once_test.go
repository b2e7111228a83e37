package gateway

import (
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/outbox"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/webhook"
)

// A webhook or an upstream that takes the request and never answers may have acted on it. Under
// on_crash: at_most_once that attempt is finished unknown, as one a crash cut short, and nothing is resent
// (an outside tester saw a timed-out webhook sent three times to an at_most_once type); under
// at_least_once it is resent, with the same id. A destination that refuses the connection got nothing, so
// it is retried under either policy.
func TestAnUnansweredRequestUnderAtMostOnceIsUnknown(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		// Takes the request, never answers. The body read whole, the server notices the gateway hang up.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(silent.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	_ = ln.Close()
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	retry := &Retry{MaxAttempts: 3, BaseDelay: Duration(20 * time.Millisecond), MaxDelay: Duration(50 * time.Millisecond)}
	h := startGateway(t, func(c *Config) {
		hook := func(url string, onCrash outbox.OnCrash) EffectType {
			return EffectType{Provider: "webhook", OnCrash: onCrash, Timeout: Duration(300 * time.Millisecond),
				Retry: retry, Breaker: Breaker{Failures: 100},
				Webhook: &webhook.Config{URL: url, Secret: secret, AllowPrivateNetworks: true}}
		}
		c.EffectTypes["hook-once"] = hook(silent.URL, outbox.AtMostOnce)
		c.EffectTypes["hook-least"] = hook(silent.URL+"/least", outbox.AtLeastOnce)
		c.EffectTypes["hook-refused"] = hook(refused, outbox.AtMostOnce)
		c.EffectTypes["api-once"] = EffectType{Provider: "http", OnCrash: outbox.AtMostOnce,
			Timeout: Duration(300 * time.Millisecond), Retry: retry, Breaker: Breaker{Failures: 100},
			HTTP: &httpprov.Config{BaseURL: silent.URL + "/api", AllowPrivateNetworks: true}}
	})
	post := func(key, typ, payload string) {
		t.Helper()
		if r := h.post(key, `{"type":"`+typ+`","payload":`+payload+`}`); r.status != 202 {
			t.Fatalf("%s: %d %s", key, r.status, r.raw)
		}
	}
	hook := `{"event":"order.paid","data":{"order":1}}`
	post("once", "hook-once", hook)
	r := h.waitStatus(acmeKey, "once", "unknown")
	if r.body["attempts"] != float64(1) || !strings.Contains(r.body["last_error"].(string), "not resent") {
		t.Fatalf("the unanswered webhook under at_most_once: %s", r.raw)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the receiver got %d requests under at_most_once, want 1", n)
	}
	// The operator's attempt log says what the attempt came to: in doubt, not a retry.
	testenv.Eventually(t, 10*time.Second, "the attempt is logged in doubt", func() bool {
		return h.count(`SELECT count(*) FROM oncegate_effect_attempts a JOIN oncegate_effects e ON e.id = a.effect_id
			WHERE e.key = 'once' AND a.outcome = 'in_doubt'`) == 1
	})
	post("api", "api-once", `{"method":"POST","path":"/charges","body":{"amount":1}}`)
	if r := h.waitStatus(acmeKey, "api", "unknown"); r.body["attempts"] != float64(1) {
		t.Fatalf("the unanswered upstream under at_most_once: %s", r.raw)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d requests after the http effect, want 2", n)
	}
	post("least", "hook-least", hook)
	if r := h.waitStatus(acmeKey, "least", "dead"); r.body["attempts"] != float64(3) {
		t.Fatalf("the unanswered webhook under at_least_once: %s", r.raw)
	}
	if n := calls.Load(); n != 5 {
		t.Fatalf("%d requests after three at_least_once attempts, want 5", n)
	}
	post("refused", "hook-refused", hook)
	if r := h.waitStatus(acmeKey, "refused", "dead"); r.body["attempts"] != float64(3) {
		t.Fatalf("a refused connection under at_most_once is retried: %s", r.raw)
	}
}

// The dedup proxy performs in the request: an upstream that takes a request and does not answer within the
// type's timeout leaves the effect unknown under at_most_once, and every retry under the key gets the
// outcome-unknown problem without a second call.
func TestProxyUnansweredUnderAtMostOnceIsUnknown(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		if strings.Contains(r.URL.Path, "slow") {
			<-r.Context().Done()
			return
		}
		chargeAnswer(w, r, n)
	})
	h := proxyGateway(t, up, func(c *Config) {
		et := c.EffectTypes["payments"]
		et.OnCrash, et.Timeout = outbox.AtMostOnce, Duration(300*time.Millisecond)
		c.EffectTypes["payments"] = et
	})
	for i := range 3 {
		a := h.req("POST", "/v1/proxy/payments/slow", acmeKey, `{"amount":1}`, "Idempotency-Key: slow-1")
		if a.status != 502 || a.body["type"] != "/problems/outcome-unknown" {
			t.Fatalf("request %d: %d %s", i, a.status, a.raw)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("the upstream got %d calls under at_most_once, want 1", n)
	}
}

// An upstream whose 2xx answer breaks off mid-body (an outside tester's finding: the effect was delivered,
// its cut body stored and replayed as whole): the http provider treats it as no answer, unknown under
// at_most_once and resent under at_least_once, as the proxy always did.
func TestAnAnswerThatBreaksOffIsNoAnswer(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	partial := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ok\":tr")
		_ = buf.Flush()
		_ = conn.Close()
	}))
	t.Cleanup(partial.Close)
	retry := &Retry{MaxAttempts: 2, BaseDelay: Duration(20 * time.Millisecond), MaxDelay: Duration(50 * time.Millisecond)}
	h := startGateway(t, func(c *Config) {
		api := func(onCrash outbox.OnCrash) EffectType {
			return EffectType{Provider: "http", OnCrash: onCrash, Retry: retry, Breaker: Breaker{Failures: 100},
				HTTP: &httpprov.Config{BaseURL: partial.URL, AllowPrivateNetworks: true}}
		}
		c.EffectTypes["api-once"] = api(outbox.AtMostOnce)
		c.EffectTypes["api-least"] = api(outbox.AtLeastOnce)
	})
	for typ, want := range map[string]string{"api-once": "unknown", "api-least": "dead"} {
		if r := h.post(typ, `{"type":"`+typ+`","payload":{"method":"POST","path":"/charges","body":{"a":1}}}`); r.status != 202 {
			t.Fatalf("%s: %d %s", typ, r.status, r.raw)
		}
		r := h.waitStatus(acmeKey, typ, want)
		if r.body["result"] != nil && strings.Contains(string(r.raw), `tr"`) {
			t.Fatalf("%s: the cut body was stored: %s", typ, r.raw)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("the upstream got %d requests, want 1 under at_most_once and 2 under at_least_once", n)
	}
}
