package tests

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
)

// Finding 7 of issue 12: a configured URL, path and query tokens included, reached last_error and the logs
// (net/url's errors hold the whole URL), and upstream credentials were kept out of results by replacing
// their text, which an upstream echoing them encoded passed. A tenant's effects and the gateway's logs (at
// debug level) hold no token of a configured URL, whether its destination refuses the connection, answers
// with a page that quotes the URL, or echoes the credentials it was sent, encoded, in its headers; and a
// configured URL with user info stops start-up without printing it.
func TestSecretsOfConfiguredURLsNeverReachTenants(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Secrets", "Configured webhook and http URLs with tokens in path and query; destinations that refuse, quote the URL in a 404 page, echo the credentials base64- and URL-encoded; a URL with user info",
		"No token in last_error, the effects' JSON or the logs; start-up refuses the URL with user info without printing it")
	const (
		apiKey     = "acme-key-for-configured-secrets-test-Zk4"
		pathTok    = "PathT0ken8fJ2"
		queryTok   = "QueryT0ken3dK9"
		basePath   = "BasePathT0ken5mQ1"
		upstreamTk = "sk_live_UpstreamT0ken7wP6"
		apiKeyTk   = "key-UpstreamKey2xN4"
		userTok    = "UserInfoT0ken6hL3"
	)
	secrets := []string{pathTok, queryTok, basePath, upstreamTk, apiKeyTk, userTok,
		base64.StdEncoding.EncodeToString([]byte("Bearer " + upstreamTk)),
		base64.StdEncoding.EncodeToString([]byte(apiKeyTk)), url.QueryEscape("Bearer " + upstreamTk)}
	hookSecret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("configured-secrets-test-key-32b!"))

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	check := newWebhookCheck(t, hookSecret)
	quoting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil && !check.verify(w, r, body) {
			return
		}
		w.WriteHeader(404)
		fmt.Fprintf(w, "Cannot POST %s", r.URL.RequestURI())
	}))
	defer quoting.Close()
	echoing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		auth := r.Header.Get("Authorization")
		w.Header().Set("Authorization", base64.StdEncoding.EncodeToString([]byte(auth)))
		w.Header().Set("X-Api-Key", base64.StdEncoding.EncodeToString([]byte(r.Header.Get("X-Api-Key"))))
		w.Header().Set("X-Echo", url.QueryEscape(auth))
		w.WriteHeader(500)
	}))
	defer echoing.Close()
	secretPart := "/hooks/" + pathTok + "?token=" + queryTok

	write := func(effectTypes string) string {
		p := filepath.Join(t.TempDir(), "gateway.yaml")
		body := fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  acme: { api_keys: [%s] }
effect_types:
%s
dispatcher: { poll_interval: 100ms }
`, pgtest.Database(t), apiKey, effectTypes)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	retry := `retry: { max_attempts: 2, base_delay: 10ms }`
	config := write(fmt.Sprintf(`  refused: { provider: webhook, webhook: { url: "%s", secret: "%s", allow_private_networks: true }, %s }
  quoted: { provider: webhook, webhook: { url: "%s", secret: "%s", allow_private_networks: true }, %s }
  api: { provider: http, http: { base_url: "%s", headers: { Authorization: "Bearer %s", X-Api-Key: "%s" }, keep_headers: [Content-Type, X-Echo-Absent], allow_private_networks: true }, %s }
`, closed+secretPart, hookSecret, retry, quoting.URL+secretPart, hookSecret, retry,
		echoing.URL+"/api/"+basePath, upstreamTk, apiKeyTk, retry))
	p := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config, "--log-level", "debug"))
	base := gatewayBase(t, p)

	call := func(method, path, idem, body string) string {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		if idem != "" {
			req.Header.Set("Idempotency-Key", idem)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	var bodies []string
	bodies = append(bodies, call("POST", "/v1/effects", "r1", `{"type":"refused","payload":{"event":"e","data":1}}`),
		call("POST", "/v1/effects", "q1", `{"type":"quoted","payload":{"event":"e","data":1}}`),
		call("POST", "/v1/effects", "a1", `{"type":"api","payload":{"method":"POST","path":"/charges?x=1"}}`))
	want := map[string]string{"r1": `"status":"dead"`, "q1": `"status":"failed"`, "a1": `"status":"dead"`}
	var refused string
	for key, status := range want {
		var got string
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(got, status) && time.Now().Before(deadline) {
			got = call("GET", "/v1/effects/"+key+"?wait=5s", "", "")
		}
		if !strings.Contains(got, status) || !strings.Contains(got, `"last_error":"`) {
			t.Fatalf("effect %s: %s, want %s with its last_error", key, got, status)
		}
		t.Logf("%s: %s", key, got)
		bodies = append(bodies, got)
		if key == "r1" {
			refused = got
		}
	}
	bodies = append(bodies, call("GET", "/v1/effects?limit=10", "", ""))
	if !strings.Contains(refused, strings.TrimPrefix(closed, "http://")) {
		t.Errorf("last_error does not name the destination's host: %s", refused)
	}
	time.Sleep(300 * time.Millisecond)
	logs := p.Log()

	// A configured URL with user info stops start-up, and the error does not repeat it.
	bad := write(fmt.Sprintf(`  hook: { provider: webhook, webhook: { url: "https://user:%s@hooks.example.com%s", secret: "%s" } }
`, userTok, secretPart, hookSecret))
	out, err := exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", bad).CombinedOutput()
	if err == nil {
		t.Fatalf("the gateway started with a url holding user info: %s", out)
	}

	places := map[string]string{"the effects' JSON": strings.Join(bodies, "\n"), "the logs": logs,
		"the start-up error": string(out)}
	found := 0
	for where, text := range places {
		for _, s := range secrets {
			if i := strings.Index(text, s); i >= 0 {
				found++
				t.Errorf("%s hold %q: …%s…", where, s, text[max(0, i-120):min(len(text), i+40)])
			}
		}
	}
	if !strings.Contains(logs, "delivery failed") {
		t.Fatalf("the deliveries did not fail as planned; the test proved nothing:\n%s", logs)
	}
	result(fmt.Sprintf("%d tokens and encodings searched in %d bytes of effects, %d of logs and the start-up error: %d found",
		len(secrets), len(strings.Join(bodies, "")), len(logs), found))
}
