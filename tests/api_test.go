package tests

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
)

const (
	limitedKey = "tests-limited-key-7c1e9b3d5f2a8e4c6b0d"
	slowKey    = "tests-slow-key-3e8a1c5f7b9d2e4a6c8f0b"
)

// exchange sends one request to the gateway and returns the status and the answer's headers and body.
// noRedirects hands a redirect back to the test: the gateway sends none, and one followed would hide it.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func exchange(t *testing.T, method, url, key, body string, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw)
}

// Every row of the API's table, and every problem type, against the gateway binary: each exchange is held
// to gateway/openapi.yaml by the checking transport, so this is where the description meets every answer
// the gateway gives, 503s from a gateway whose database is down included.
func TestGatewayAnswersAsDescribed(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest) // a permanent refusal: the effect fails
	}))
	defer refusing.Close()
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  acme: { api_keys: [%s] }
  limited: { api_keys: [%s], effect_types: [clicks] }
  slow: { api_keys: [%s], rate: { requests_per_second: 0.001, request_burst: 1 } }
effect_types:
  clicks: { provider: postgres }
  refused:
    provider: webhook
    webhook: { url: "%s", secret: "%s", allow_private_networks: true }
limits: { max_body: 1KiB }
dispatcher: { poll_interval: 100ms }
`, dbURL, apiKey, limitedKey, slowKey, refusing.URL, whsec))
	_, base := startGateway(t, config)
	checked := specCheck.checked(base)
	sent := 0
	expect := func(want int, method, path, key, body string, headers ...string) (http.Header, string) {
		t.Helper()
		sent++
		code, h, raw := exchange(t, method, base+path, key, body, headers...)
		if code != want {
			t.Errorf("%s %s: %d %s, want %d", method, path, code, raw, want)
		}
		return h, raw
	}
	click := `{"type":"clicks","payload":{"name":"c"}}`

	h, _ := expect(202, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: click:1")
	if h.Get("Location") != "/v1/effects/click:1" {
		t.Errorf("Location %q", h.Get("Location"))
	}
	expect(200, "POST", "/v1/effects", apiKey, `{"type":"clicks","payload":{"name":"c"},"wait":"10s"}`, "Idempotency-Key: click:2")
	h, _ = expect(200, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: click:2")
	if h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay without Idempotent-Replayed: %v", h)
	}
	expect(200, "POST", "/v1/effects", apiKey, click, `Idempotency-Key: "click:2"`)
	expect(422, "POST", "/v1/effects", apiKey, `{"type":"clicks","payload":{"name":"other"}}`, "Idempotency-Key: click:2")
	for _, bad := range []struct{ body, key string }{
		{click, ""}, {click, `"unterminated`}, {click, strings.Repeat("k", 256)}, {`{"type":`, "k"},
		{`{"type":"fax","payload":{}}`, "k"}, {`{"type":"clicks","payload":{"nom":"x"}}`, "k"},
		{`{"type":"clicks","payload":{"name":"c"},"wait":"31s"}`, "k"}, {`{"type":"clicks","payload":[1]}`, "k"},
	} {
		headers := []string{}
		if bad.key != "" {
			headers = append(headers, "Idempotency-Key: "+bad.key)
		}
		expect(400, "POST", "/v1/effects", apiKey, bad.body, headers...)
	}
	expect(400, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: k", "Oncegate-Job-Id: job-1", "Oncegate-Job-Epoch: zero")
	expect(401, "POST", "/v1/effects", "", click, "Idempotency-Key: k")
	expect(401, "POST", "/v1/effects", "not-a-key-of-this-gateway-at-all-00", click, "Idempotency-Key: k")
	expect(403, "POST", "/v1/effects", limitedKey, `{"type":"refused","payload":{"event":"e","data":1}}`, "Idempotency-Key: k")
	expect(413, "POST", "/v1/effects", apiKey, `{"type":"clicks","payload":{"name":"`+strings.Repeat("x", 2048)+`"}}`, "Idempotency-Key: k")
	expect(415, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: k", "Content-Type: text/plain")
	expect(415, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: k", "Content-Type: application/merge-patch+json")
	expect(202, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: charset:1", "Content-Type: application/json; charset=utf-8")
	expect(202, "POST", "/v1/effects", slowKey, click, "Idempotency-Key: k")
	h, _ = expect(429, "POST", "/v1/effects", slowKey, click, "Idempotency-Key: k")
	if h.Get("Retry-After") == "" {
		t.Errorf("429 without Retry-After")
	}
	expect(202, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: fenced:1", "Oncegate-Job-Id: job-1", "Oncegate-Job-Epoch: 2")
	expect(409, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: fenced:2", "Oncegate-Job-Id: job-1", "Oncegate-Job-Epoch: 1")

	expect(200, "GET", "/v1/effects/click:1?wait=10s", apiKey, "")
	expect(200, "GET", "/v1/effects/click%3A2", apiKey, "")
	expect(404, "GET", "/v1/effects/nothing-here", apiKey, "")
	expect(400, "GET", "/v1/effects/click:1?wait=forever", apiKey, "")
	expect(200, "GET", "/v1/effects?status=delivered&type=clicks&limit=1", apiKey, "")
	expect(200, "GET", "/v1/effects", apiKey, "")
	expect(400, "GET", "/v1/effects?status=lost", apiKey, "")
	expect(400, "GET", "/v1/effects?cursor=not-one", apiKey, "")

	expect(202, "POST", "/v1/effects", apiKey, `{"type":"refused","payload":{"event":"e","data":1}}`, "Idempotency-Key: refused:1")
	expect(200, "GET", "/v1/effects/refused:1?wait=10s", apiKey, "")
	expect(200, "POST", "/v1/effects/refused:1/retry", apiKey, "")
	expect(409, "POST", "/v1/effects/click:1/retry", apiKey, "")
	expect(404, "POST", "/v1/effects/nothing-here/retry", apiKey, "")
	expect(404, "POST", "/v1/effects/refused:1/retry", limitedKey, "") // another tenant's: not found for it
	expect(401, "GET", "/v1/effects", "", "")

	// Keys that are dot segments, or hold them: Location spells them so that they survive, and reads them back.
	for key, loc := range map[string]string{".": "/v1/effects/%2E", "..": "/v1/effects/%2E%2E",
		"a/../b": "/v1/effects/a%2F..%2Fb", "//x": "/v1/effects/%2F%2Fx"} {
		h, _ := expect(202, "POST", "/v1/effects", apiKey, click, "Idempotency-Key: "+key)
		if h.Get("Location") != loc {
			t.Errorf("key %q: Location %q, want %q", key, h.Get("Location"), loc)
		}
		if _, raw := expect(200, "GET", loc, apiKey, ""); !strings.Contains(raw, fmt.Sprintf(`"key":%q`, key)) {
			t.Errorf("GET %s: %s", loc, raw)
		}
	}
	// Paths are routed as sent, never cleaned and redirected to another resource.
	expect(404, "GET", "/v1/effects/.", apiKey, "")
	expect(404, "GET", "/v1/effects//x", apiKey, "")
	expect(404, "POST", "/v1/effects/../retry", apiKey, "")

	// HEAD wherever GET, with GET's status and headers and no body.
	for _, c := range []struct {
		want      int
		path, key string
	}{
		{200, "/healthz", ""}, {200, "/readyz", ""}, {200, "/metrics", ""}, {200, "/openapi.yaml", ""},
		{200, "/problems/not-found", ""}, {404, "/problems/no-such-problem", ""}, {200, "/v1/effects", apiKey},
		{401, "/v1/effects", ""}, {400, "/v1/effects?status=lost", apiKey}, {200, "/v1/effects/click:1", apiKey},
		{404, "/v1/effects/nothing-here", apiKey},
	} {
		if _, raw := expect(c.want, "HEAD", c.path, c.key, ""); raw != "" {
			t.Errorf("HEAD %s: a body %q", c.path, raw)
		}
	}
	expect(404, "HEAD", "/v1/nothing", apiKey, "")

	expect(405, "PUT", "/v1/effects", apiKey, click)
	expect(405, "DELETE", "/v1/effects/click:1", apiKey, "")
	expect(405, "GET", "/v1/effects/click:1/retry", "", "")
	expect(405, "POST", "/healthz", "", "")
	expect(404, "GET", "/v1/nothing", apiKey, "")
	expect(200, "GET", "/healthz", "", "")
	expect(200, "GET", "/readyz", "", "")
	expect(200, "GET", "/metrics", "", "")
	expect(200, "GET", "/openapi.yaml", "", "")
	// Every problem type the gateway can answer with, as its code lists them, has a page.
	for _, k := range gateway.ProblemKinds() {
		_, page := expect(200, "GET", k.Type(), "", "")
		if !strings.Contains(page, k.Slug) {
			t.Errorf("%s: the page does not name its type: %s", k.Type(), page)
		}
	}
	expect(404, "GET", "/problems/no-such-problem", "", "")

	// A gateway whose database is down: 503 with Retry-After everywhere one is described.
	down := startGatewayWithoutDatabase(t)
	downChecked := specCheck.checked(down)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/effects", click}, {"GET", "/v1/effects/click:1", ""}, {"GET", "/v1/effects", ""},
		{"POST", "/v1/effects/click:1/retry", ""}, {"GET", "/readyz", ""},
	} {
		sent++
		code, h, raw := exchange(t, c.method, down+c.path, apiKey, c.body, "Idempotency-Key: k")
		if code != 503 || h.Get("Retry-After") == "" {
			t.Errorf("database down: %s %s: %d %v %s", c.method, c.path, code, h, raw)
		}
	}
	if got := checked.Load() + downChecked.Load(); got != int64(sent) {
		t.Fatalf("%d exchanges checked against the description, %d sent", got, sent)
	}
	t.Logf("%d exchanges checked against gateway/openapi.yaml", sent)
}

// startGatewayWithoutDatabase runs a gateway whose database_url names a port nothing listens on.
func startGatewayWithoutDatabase(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: postgres://postgres@%s/none?sslmode=disable&connect_timeout=1
tenants: { acme: { api_keys: [%s] } }
effect_types: { clicks: { provider: postgres } }
timeouts: { database: 1s, ready: 1s }
`, closed, apiKey))
	p := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config, "--no-migrate"))
	return gatewayBase(t, p)
}

// The check is no formality: a server that answers as the description does not is caught, and so is one
// that accepts what the description refuses.
func TestOpenAPICheckCatchesMismatches(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		effect := `{"key":"k","type":"t","status":"sent","attempts":0,"created_at":"2026-01-01T00:00:00Z",` +
			`"updated_at":"2026-01-01T00:00:00Z","delivered_at":null,"next_attempt_at":null,"last_error":null,"result":null}`
		switch r.URL.Path {
		case "/v1/effects": // 202 without Location
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(202)
			_, _ = io.WriteString(w, strings.Replace(effect, "sent", "pending", 1))
		case "/v1/effects/k": // a status the description does not have
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, effect)
		case "/v1/effects/k/retry": // a problem with another title than its type's
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(409)
			_, _ = io.WriteString(w, `{"type":"/problems/not-retryable","title":"Conflict","status":409}`)
		case "/healthz": // a 418, which the description does not have
			w.WriteHeader(418)
		default: // a 404 that is no problem
			w.WriteHeader(404)
		}
	}))
	defer srv.Close()
	var mu sync.Mutex
	var caught []error
	specCheck.watch(t, srv.URL, &watched{report: func(err error) { mu.Lock(); caught = append(caught, err); mu.Unlock() }})
	exchange(t, "POST", srv.URL+"/v1/effects", apiKey, `{"type":"t","payload":{}}`, "Idempotency-Key: k")
	exchange(t, "POST", srv.URL+"/v1/effects", "", `{"type":"t","payload":{},"extra":1}`) // no key, no API key, accepted
	exchange(t, "GET", srv.URL+"/v1/effects/k", apiKey, "")
	exchange(t, "POST", srv.URL+"/v1/effects/k/retry", apiKey, "")
	exchange(t, "GET", srv.URL+"/healthz", "", "")
	exchange(t, "GET", srv.URL+"/nothing", "", "")
	exchange(t, "PUT", srv.URL+"/healthz", "", "")
	mu.Lock()
	defer mu.Unlock()
	want := []string{`"Location" missing`, `"/status"`, `title "Conflict"`, "refuses got 202", "418", `Content-Type ""`, "Allow"}
	joined := fmt.Sprint(errors.Join(caught...))
	for _, w := range want {
		if !strings.Contains(joined, w) {
			t.Errorf("no mismatch mentions %q; caught:\n%s", w, joined)
		}
	}
}
