package tests

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// webhookCheck verifies the webhooks a receiver gets as a receiver built on the official Standard Webhooks Go
// library would, with an implementation nobody here wrote: the three headers present, the timestamp within
// the library's tolerance, a v1 signature over id.timestamp.body that verifies with the secret. On top of
// the library, the body is the JSON object the spec describes ({type, timestamp, data}). A request that
// fails fails the test; the receiver answers it 401, as a real one would.
type webhookCheck struct {
	t  testing.TB
	wh *standardwebhooks.Webhook
}

// newWebhookCheck returns the check for webhooks signed with secret ("whsec_" and base64).
func newWebhookCheck(t testing.TB, secret string) *webhookCheck {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatalf("the Standard Webhooks library refuses the secret: %v", err)
	}
	return &webhookCheck{t: t, wh: wh}
}

// verify reports whether a webhook request, whose body was read whole, is one the library accepts; if not,
// it fails the test, saying why, and answers w with 401. It may be called from a handler's goroutine.
func (c *webhookCheck) verify(w http.ResponseWriter, r *http.Request, body []byte) bool {
	if err := c.check(r.Header, body); err != nil {
		c.t.Errorf("webhook %s to %s fails Standard Webhooks verification: %v (body %.200s)",
			r.Header.Get("webhook-id"), r.URL.Path, err, body)
		w.WriteHeader(http.StatusUnauthorized)
		return false
	}
	return true
}

func (c *webhookCheck) check(h http.Header, body []byte) error {
	if err := c.wh.Verify(body, h); err != nil {
		return err
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		return fmt.Errorf("Content-Type %q, want application/json", ct)
	}
	var payload struct {
		Type      *string         `json:"type"`
		Timestamp *string         `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&payload); err != nil {
		return fmt.Errorf("body is not {type, timestamp, data}: %v", err)
	}
	if payload.Type == nil || *payload.Type == "" || payload.Timestamp == nil || len(payload.Data) == 0 {
		return errors.New("body lacks type, timestamp or data")
	}
	if _, err := time.Parse(time.RFC3339Nano, *payload.Timestamp); err != nil {
		return fmt.Errorf("body timestamp %q is not RFC 3339", *payload.Timestamp)
	}
	return nil
}

// The real gateway binary's webhooks, checked with the official Standard Webhooks library: data with
// non-ASCII text, HTML and JSON's awkward characters, signed with two secrets in whsec_ form (one of 24
// bytes, the shortest accepted), each of which verifies alone; to the configured url and to a payload url on
// allowed_hosts. The library also refuses what it must (another secret, one byte changed, an old timestamp),
// so its verdict is not vacuous. A secret of 23 bytes stops the binary at start-up.
func TestGatewayWebhooksPassTheOfficialStandardWebhooksLibrary(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Conformance", "Gateway binary's webhooks (non-ASCII, HTML, U+2028 in data; two whsec_ secrets, one of 24 bytes) checked with the official Standard Webhooks Go library",
		"Every request verifies with each secret; a changed byte, another secret or an old timestamp does not; a 23-byte secret stops start-up")
	secret24 := "whsec_" + base64.StdEncoding.EncodeToString([]byte("conformance-secret-24-b!"))
	secret32 := "whsec_" + base64.StdEncoding.EncodeToString([]byte("conformance-rotated-secret-32-b!"))
	checks := []*webhookCheck{newWebhookCheck(t, secret24), newWebhookCheck(t, secret32)}
	type request struct {
		path   string
		header http.Header
		body   []byte
	}
	var mu sync.Mutex
	var got []request
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("reading a webhook: %v", err)
			return
		}
		for _, c := range checks {
			if !c.verify(w, r, body) {
				return
			}
		}
		mu.Lock()
		got = append(got, request{r.URL.Path, r.Header.Clone(), body})
		mu.Unlock()
		w.WriteHeader(200)
		_, _ = w.Write([]byte(`{"received":"ok"}`))
	}))
	defer recv.Close()
	port := recv.URL[strings.LastIndex(recv.URL, ":")+1:]

	dbURL := pgtest.Database(t)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  signed:
    provider: webhook
    webhook:
      url: "%s/hooks"
      secret: "%s"
      secrets: ["%s"]
      allowed_hosts: ["http://127.0.0.1:%s"]
      allow_private_networks: true
dispatcher: { poll_interval: 100ms }
`, dbURL, apiKey, recv.URL, secret24, secret32, port))
	_, base := startGateway(t, config)

	data := `{"note":"<b>Grüße & 'Anführungszeichen'</b> — 日本語 😀","html":"<script>alert(\"x\")</script>",` +
		`"separators":"a\u2028b\u2029c","controls":"tab\there\nnewline","escaped":"\u00e9\ud83d\ude00","n":[1,2.5,-3e2,null,true]}`
	for _, c := range []struct{ key, url, path string }{
		{"conformance:default", "", "/hooks"},
		{"conformance:own", recv.URL + "/tenant-own?x=1", "/tenant-own"},
	} {
		payload := `{"event":"order.paid","data":` + data
		if c.url != "" {
			payload += `,"url":"` + c.url + `"`
		}
		code, e, _ := postJSON(t, base, c.key, `{"type":"signed","payload":`+payload+`},"wait":"10s"}`)
		if code != 200 || e["status"] != "delivered" {
			t.Fatalf("%s: %d %v", c.key, code, e)
		}
		mu.Lock()
		r := got[len(got)-1]
		mu.Unlock()
		res, _ := e["result"].(map[string]any)
		if r.path != c.path || r.header.Get("webhook-id") != res["webhook_id"] || r.header.Get("Idempotency-Key") != res["webhook_id"] {
			t.Fatalf("%s: request to %s with id %q, result %v", c.key, r.path, r.header.Get("webhook-id"), res)
		}
		var body struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil || body.Type != "order.paid" || !jsonEqual(t, body.Data, []byte(data)) {
			t.Fatalf("%s: the body's data is not the data sent:\n%s\n%s", c.key, r.body, data)
		}
		for _, raw := range []string{"<script>", "Grüße", "日本語", "😀"} {
			if !strings.Contains(string(r.body), raw) {
				t.Errorf("%s: %q arrived escaped: %s", c.key, raw, r.body)
			}
		}
		if code, replay, h := postJSON(t, base, c.key, `{"type":"signed","payload":`+payload+`}}`); code != 200 || h.Get("Idempotent-Replayed") != "true" ||
			replay["status"] != "delivered" {
			t.Fatalf("%s replay: %d %v", c.key, code, replay)
		}
	}
	// A payload url on the allowed host but another scheme is refused before anything is sent.
	code, e, _ := postJSON(t, base, "conformance:https", `{"type":"signed","payload":{"event":"e","data":1,"url":"https://127.0.0.1:`+port+`/x"}}`)
	if code != 400 || e["field"] != "payload.url" {
		t.Fatalf("https on an http-only allowed host: %d %v", code, e)
	}
	mu.Lock()
	requests := append([]request(nil), got...)
	mu.Unlock()
	if len(requests) != 2 {
		t.Fatalf("the receiver got %d webhooks, want 2 (replays send nothing)", len(requests))
	}

	// The library refuses what it must: the checks above are not vacuous.
	r := requests[0]
	other := newWebhookCheck(t, "whsec_"+base64.StdEncoding.EncodeToString([]byte("some-other-secret-of-32-bytes!!!")))
	changed := bytes.Replace(r.body, []byte("Grüße"), []byte("Grusse"), 1)
	old := r.header.Clone()
	ts, _ := strconv.ParseInt(old.Get("webhook-timestamp"), 10, 64)
	old.Set("webhook-timestamp", strconv.FormatInt(ts-600, 10))
	for name, err := range map[string]error{
		"another secret":      other.check(r.header, r.body),
		"a changed body":      checks[0].check(r.header, changed),
		"a 10-minute-old one": checks[0].check(old, r.body),
	} {
		if err == nil {
			t.Errorf("the library accepted %s", name)
		}
	}

	// A secret of 23 bytes stops the binary at start-up, naming the field.
	short := "whsec_" + base64.StdEncoding.EncodeToString([]byte("twenty-three-bytes-key!"))
	bad := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  signed: { provider: webhook, webhook: { url: "https://hooks.example.com/x", secret: "%s" } }
`, dbURL, apiKey, short))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "gateway"), "serve", "--config", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "effect_types.signed: webhook: webhook: secret: want whsec_ and the base64 of at least 24 bytes") {
		t.Fatalf("a 23-byte secret: %v\n%s", err, out)
	}
	result(fmt.Sprintf("%d webhooks, each verified with both secrets; 3/3 forgeries refused; the 23-byte secret stopped start-up", len(requests)))
}

// jsonEqual reports whether a and b hold the same JSON value.
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}
