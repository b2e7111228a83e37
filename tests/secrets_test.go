package tests

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/jaegertest"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// API keys, webhook secrets, upstream credentials and SMTP passwords never appear in the gateway's logs (at
// debug level), its metrics, its error bodies, or its traces, whatever requests and failures it meets.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Secrets", "Requests with right, wrong and other tenants' keys; failing deliveries with credentials configured",
		"No API key, webhook secret, upstream token or SMTP password in logs, metrics, error bodies or traces")
	const (
		acmeKey     = "acme-key-Qx7pL2mZ9vR4-Wb3sN6kD1fJ8hT0y"
		otherKey    = "globex-key-Hk3nW8sT1yB6-Pz5cV2mR9gL4"
		wrongKey    = "guessed-key-Ue5cJ0aF"
		upstreamTok = "sk_live_Tn4qV9wX2zK7"
		smtpPass    = "smtp-pass-Lr8dM3eG6"
	)
	hookKey := []byte("webhook-key-Ps2oY5iA8uQ1wE4rT7y")
	secret := "whsec_" + base64.StdEncoding.EncodeToString(hookKey)
	secrets := []string{acmeKey, otherKey, wrongKey, upstreamTok, smtpPass, secret, base64.StdEncoding.EncodeToString(hookKey)}

	jg := jaegertest.StartIfBuilt(t)
	dbURL := pgtest.Database(t)
	mail := smtptest.Start(t)
	check := newWebhookCheck(t, secret)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		// The webhook type's requests, told from the http type's by their id.
		if err == nil && r.Header.Get("webhook-id") != "" && !check.verify(w, r, body) {
			return
		}
		w.WriteHeader(500)
		fmt.Fprintf(w, "upstream echo: %s", r.Header.Get("Authorization")) // a hostile upstream echoing the token
	}))
	defer failing.Close()
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  acme: { api_keys: [%s] }
  globex: { api_keys: [%s] }
effect_types:
  hook: { provider: webhook, webhook: { url: "%s", secret: "%s", allow_private_networks: true }, retry: { max_attempts: 2, base_delay: 10ms } }
  proxy: { provider: http, http: { base_url: "%s", headers: { Authorization: "Bearer %s" }, allow_private_networks: true }, retry: { max_attempts: 2, base_delay: 10ms } }
  email: { provider: smtp, smtp: { addr: "%s", from: "a@b.test", username: u, password: %s }, retry: { max_attempts: 2, base_delay: 10ms } }
dispatcher: { poll_interval: 100ms }
`, dbURL, acmeKey, otherKey, failing.URL, secret, failing.URL, upstreamTok, mail.Addr, smtpPass))
	cmd := exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config, "--log-level", "debug")
	if jg != nil {
		cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT="+jg.OTLP, "OTEL_BSP_SCHEDULE_DELAY=100")
	}
	p := proctest.Start(t, cmd)
	base := gatewayBase(t, p)

	var bodies []string
	do := func(method, path, key, idem, body string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		req.Header.Set("Content-Type", "application/json")
		if idem != "" {
			req.Header.Set("Idempotency-Key", idem)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		bodies = append(bodies, string(b))
	}
	do("POST", "/v1/effects", wrongKey, "k1", `{"type":"hook","payload":{"event":"e","data":1}}`)
	do("POST", "/v1/effects", "", "k1", `{"type":"hook","payload":{"event":"e","data":1}}`)
	do("POST", "/v1/effects", acmeKey, "k1", `{"type":"hook","payload":{"event":"e","data":1}}`)
	do("POST", "/v1/effects", acmeKey, "k2", `{"type":"proxy","payload":{"method":"POST","path":"/charge"}}`)
	do("POST", "/v1/effects", acmeKey, "k3", `{"type":"email","payload":{"to":["x@y.test"],"subject":"s","text":"t"}}`)
	do("POST", "/v1/effects", acmeKey, "k1", `{"type":"hook","payload":{"event":"other","data":2}}`)
	do("POST", "/v1/effects", acmeKey, "", `{"type":"hook"}`)
	do("GET", "/v1/effects/k1", otherKey, "", "")
	// Every delivery fails for good (dead after its retries, or failed at once where the error is permanent),
	// so every failure path (logging, tracing, storing the error) has run before anything is searched.
	// Otherwise the test proves nothing.
	var effects []effect
	testenv.Eventually(t, 30*time.Second, "the deliveries did not all fail as planned", func() bool {
		effects = effects[:0]
		for _, k := range []string{"k1", "k2", "k3"} {
			if e := getAs(t, base, acmeKey, k); e.Attempts > 0 && (e.Status == "dead" || e.Status == "failed") {
				effects = append(effects, e)
			}
		}
		return len(effects) == 3
	})
	attempts := 0
	for _, e := range effects {
		attempts += e.Attempts
	}
	for _, k := range []string{"k1", "k2", "k3"} {
		do("GET", "/v1/effects/"+k+"?wait=5s", acmeKey, "", "")
	}
	do("GET", "/v1/effects?status=dead", acmeKey, "", "")
	metrics := scrape(t, base)
	// A graceful stop flushes the gateway's logs and spans: once it has exited, both are complete.
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(30 * time.Second); err != nil {
		t.Fatalf("gateway shutdown: %v", err)
	}
	logs := p.Log()

	places := map[string]string{"logs": logs, "metrics": metrics, "error bodies and effects": strings.Join(bodies, "\n")}
	if jg != nil {
		// A dispatch span for each failed attempt, stored once Jaeger's batch is written.
		var dump string
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("Jaeger holds the gateway's %d dispatch spans", attempts), func() bool {
			dump = jaegerDump(t, jg.Query)
			return strings.Count(dump, `"operationName":"outbox.dispatch `) >= attempts
		})
		places["traces"] = dump
	}
	for where, text := range places {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				i := strings.Index(text, s)
				t.Errorf("%s contain the secret %q: …%s…", where, s, text[max(0, i-120):min(len(text), i+40)])
			}
		}
	}
	result(fmt.Sprintf("%d secrets, 0 found in %d places (%d bytes of logs)", len(secrets), len(places), len(logs)))
}

// jaegerDump returns every trace of the gateway service as Jaeger stores it so far.
func jaegerDump(t *testing.T, query string) string {
	resp, err := http.Get(query + "/api/traces?service=oncegate-gateway&limit=1000&lookback=1h")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
