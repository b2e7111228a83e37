package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/providers/postgres"
)

const bulkKey = "bulk-api-key-3c8e1f5a7b9d2e4f6a8c"

// One tenant over its request rate gets 429 with Retry-After, operator retries included, and the other tenant
// is not slowed; a tenant over its byte rate is refused before its body is read.
func TestTenantRateLimits(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Tenant isolation",
		"A tenant sends requests and operator retries past its rate (3 at once, 1/s), and bodies past its byte rate",
		"429 problem with Retry-After, the body unread and the connection closed; the other tenant unaffected")
	h := startGateway(t, func(c *Config) {
		c.Limits.MaxBody = 4 << 10
		acme := c.Tenants["acme"]
		acme.Rate = RateLimit{RequestsPerSecond: 1, RequestBurst: 3, BytesPerSecond: Unlimited, ByteBurst: 4 << 10}
		c.Tenants["acme"] = acme
		c.Tenants["bulk"] = Tenant{APIKeys: []string{bulkKey},
			Rate: RateLimit{RequestsPerSecond: Unlimited, RequestBurst: 1, BytesPerSecond: 1000, ByteBurst: 4 << 10}}
	})

	// Requests: a burst of 3, then refused; a retry is a request like the others. The bucket refills one a
	// second, so on a slow machine a request or two more may pass: as many as seconds went by, no more.
	start := time.Now()
	accepted := 0
	var r response
	for {
		r = h.post(fmt.Sprintf("r%d", accepted), analytics("x"))
		if r.status != 202 {
			break
		}
		if accepted++; accepted > 3+int(time.Since(start).Seconds()) {
			t.Fatalf("%d requests accepted in %v at a rate of 1/s with a burst of 3", accepted, time.Since(start))
		}
	}
	if accepted < 3 || r.status != 429 || r.body["type"] != "/problems/rate-limited" || r.header.Get("Retry-After") != "1" {
		t.Fatalf("request %d: %d Retry-After %q %s", accepted+1, r.status, r.header.Get("Retry-After"), r.raw)
	}
	if r := h.req("POST", "/v1/effects/r0/retry", acmeKey, ""); r.status != 429 {
		t.Fatalf("an operator retry over the rate: %d %s", r.status, r.raw)
	}
	for i := range 20 { // the other tenant, at once
		if r := h.req("POST", "/v1/effects", globexKey, analytics("x"), fmt.Sprintf("Idempotency-Key: g%d", i)); r.status != 202 {
			t.Fatalf("globex request %d while acme is limited: %d %s", i, r.status, r.raw)
		}
	}
	time.Sleep(1100 * time.Millisecond)
	if r := h.post(fmt.Sprintf("r%d", accepted), analytics("x")); r.status != 202 {
		t.Fatalf("after Retry-After: %d %s", r.status, r.raw)
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects WHERE tenant = 'acme'"); n != accepted+1 {
		t.Fatalf("%d acme effects, want %d: a 429 records nothing", n, accepted+1)
	}
	// A client that sent its whole body before the 429 reads the 429: the connection is closed cleanly, not
	// reset under the answer.
	full := `{"type":"analytics","payload":{"name":"x","properties":{"pad":"` + strings.Repeat("p", 3900) + `"}}}`
	refused := 0
	start = time.Now()
	for i := range 30 {
		if r := h.req("POST", "/v1/effects", acmeKey, full, fmt.Sprintf("Idempotency-Key: f%d", i)); r.status == 429 {
			refused++
		}
	}
	if refused < 30-2-int(time.Since(start).Seconds()) {
		t.Fatalf("%d of 30 requests at once over a rate of 1/s refused", refused)
	}

	// Bytes: 4 KiB at once, then 1000 bytes/s. A declared body past that is refused from its headers: the
	// client sends none of it and still gets its answer, and the connection is closed.
	body := `{"type":"analytics","payload":{"name":"x","properties":{"pad":"` + strings.Repeat("p", 3000) + `"}}}`
	if r := h.req("POST", "/v1/effects", bulkKey, body, "Idempotency-Key: b1"); r.status != 202 {
		t.Fatalf("a body within the byte burst: %d %s", r.status, r.raw)
	}
	c := h.dial()
	fmt.Fprintf(c, "POST /v1/effects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Idempotency-Key: b2\r\nContent-Length: %d\r\n\r\n", bulkKey, len(body))
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a body over the byte rate, unsent: no answer: %v", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != 429 || !resp.Close || after < 2 || after > 4 || !strings.Contains(string(raw), "request-body bytes") {
		t.Fatalf("a body over the byte rate: %d close=%v Retry-After %q %s", resp.StatusCode, resp.Close,
			resp.Header.Get("Retry-After"), raw)
	}
	closedWithin(t, c, 2*time.Second)

	// A chunked body is charged once read: it passes, and the next body pays for it.
	time.Sleep(4 * time.Second) // the bucket refills to its burst
	req, _ := http.NewRequest("POST", h.url+"/v1/effects", strings.NewReader(body))
	req.ContentLength = -1 // unknown: sent chunked
	req.Header.Set("Authorization", "Bearer "+bulkKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "b3")
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("a chunked body within the burst: %v %v", resp, err)
	}
	_ = resp.Body.Close()
	if r := h.req("POST", "/v1/effects", bulkKey, body, "Idempotency-Key: b4"); r.status != 429 {
		t.Fatalf("a body after a chunked one that spent the bucket: %d %s", r.status, r.raw)
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects WHERE tenant = 'bulk'"); n != 2 {
		t.Fatalf("%d bulk effects, want 2", n)
	}
	result("429 + Retry-After for the 4th request, the retry and the over-rate body (unread, connection closed); the other tenant 20/20 accepted meanwhile")
}

// A tenant with effect_types may use those types only: any other, configured or not, is a 403 naming the
// field and only the tenant's own types; create, replay and retry alike. A tenant without a list uses all.
func TestTenantEffectTypeAllowList(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Tenant isolation",
		"A tenant asks for an effect type outside its effect_types list (configured for others, or not at all), and retries one",
		"403 problem naming type and only the tenant's own types; nothing recorded or resent")
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["payouts"] = EffectType{Provider: "postgres", Postgres: &postgres.Config{}}
		c.EffectTypes = c.WithDefaults().EffectTypes
		acme := c.Tenants["acme"]
		acme.EffectTypes = []string{"analytics"}
		c.Tenants["acme"] = acme
	})
	for _, typ := range []string{"payouts", "fax"} {
		r := h.post("k-"+typ, `{"type":"`+typ+`","payload":{"name":"x"}}`)
		if r.status != 403 || r.body["type"] != "/problems/effect-type-not-allowed" || r.body["field"] != "type" ||
			!strings.HasSuffix(r.body["detail"].(string), "its types are analytics") {
			t.Fatalf("acme asks for %s: %d %s", typ, r.status, r.raw)
		}
	}
	if r := h.post("k-ok", analytics("x")); r.status != 202 {
		t.Fatalf("acme, an allowed type: %d %s", r.status, r.raw)
	}
	if r := h.req("POST", "/v1/effects", globexKey, `{"type":"payouts","payload":{"name":"x"}}`, "Idempotency-Key: g"); r.status != 202 {
		t.Fatalf("globex, without a list: %d %s", r.status, r.raw)
	}
	if r := h.req("POST", "/v1/effects", globexKey, `{"type":"fax","payload":{"name":"x"}}`, "Idempotency-Key: g2"); r.status != 400 ||
		r.body["field"] != "type" {
		t.Fatalf("globex, an unknown type: %d %s", r.status, r.raw)
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects WHERE tenant = 'acme' AND type <> 'analytics'"); n != 0 {
		t.Fatalf("%d refused effects recorded", n)
	}
	// An effect of a type no longer on the tenant's list (the list changed since) is not delivered again.
	h.waitStatus(acmeKey, "k-ok", "delivered")
	if n := h.count("UPDATE oncegate_effects SET type = 'payouts', status = 'dead' WHERE tenant = 'acme' AND key = 'k-ok' RETURNING 1"); n != 1 {
		t.Fatal("could not set up a dead payouts effect")
	}
	if r := h.req("POST", "/v1/effects/k-ok/retry", acmeKey, ""); r.status != 403 || r.body["field"] != "type" {
		t.Fatalf("retry of a type off the list: %d %s", r.status, r.raw)
	}
	if r := h.req("GET", "/v1/effects/k-ok", acmeKey, ""); r.status != 200 || r.body["status"] != "dead" {
		t.Fatalf("reading it: %d %s", r.status, r.raw)
	}
	result("403 for a type of another tenant's and for an unknown one, and for the retry; 0 recorded, 0 resent")
}
