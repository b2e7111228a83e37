package gateway

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/reliability"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/providers/webhook"
)

// Payloads built to hurt: huge, deeply nested, not UTF-8, and header injection through every provider that
// writes headers. Each is refused with a 400 naming the field, or stored faithfully; nothing else.
func TestHostilePayloads(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input", "Huge, deeply nested, non-UTF-8 payloads; CR/LF header injection in email, webhook and proxy payloads",
		"400 naming the field (or stored as sent); nothing sent, nothing half-written")
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	h := startGateway(t, func(c *Config) {
		c.Limits.MaxBody = 1 << 20
		c.EffectTypes["email"] = EffectType{Provider: "smtp", SMTP: &smtp.Config{Addr: "127.0.0.1:9", From: "a@b.test"}}
		c.EffectTypes["hook"] = EffectType{Provider: "webhook", Webhook: &webhook.Config{URL: "https://h.example/x", Secret: secret}}
		c.EffectTypes["proxy"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: "https://api.example",
			Headers: map[string]string{"X-Api-Key": "operator-key-0123"}}}
	})
	deep := `{"type":"analytics","payload":{"name":"x","properties":` + strings.Repeat(`{"a":`, 20000) + "1" + strings.Repeat("}", 20000) + `}}`
	cases := []struct {
		name, key, body string
		status          int
		field           string
	}{
		{"nested 20000 deep", "deep", deep, 400, ""},
		{"subject with CR/LF", "inj1", `{"type":"email","payload":{"to":["a@b.test"],"subject":"Hi\r\nBcc: all@evil.test","text":"t"}}`, 400, "payload.subject"},
		{"recipient with CR/LF", "inj2", `{"type":"email","payload":{"to":["a@b.test\r\nBcc: x@y.test"],"subject":"s","text":"t"}}`, 400, "payload.to[0]"},
		{"email header with LF", "inj3", `{"type":"email","payload":{"to":["a@b.test"],"subject":"s","text":"t","headers":{"X-A":"v\nBcc: x@y.test"}}}`, 400, "payload.headers.X-A"},
		{"email header overriding From", "inj4", `{"type":"email","payload":{"to":["a@b.test"],"subject":"s","text":"t","headers":{"From":"ceo@b.test"}}}`, 400, "payload.headers.From"},
		{"proxy header with CR/LF", "inj5", `{"type":"proxy","payload":{"method":"GET","path":"/","headers":{"X-A":"v\r\nHost: evil"}}}`, 400, "payload.headers.X-A"},
		{"proxy header spoofing the client", "inj8", `{"type":"proxy","payload":{"method":"GET","path":"/","headers":{"X-Forwarded-For":"10.0.0.1"}}}`, 400, "payload.headers.X-Forwarded-For"},
		{"proxy header twinning the credential", "inj9", `{"type":"proxy","payload":{"method":"GET","path":"/","headers":{"X_Api_Key":"mine"}}}`, 400, "payload.headers.X_Api_Key"},
		{"proxy header name with a control byte", "inj10", `{"type":"proxy","payload":{"method":"GET","path":"/","headers":{"X-A\u0001":"v"}}}`, 400, "payload.headers.X-A\x01"},
		{"proxy path to another host", "inj6", `{"type":"proxy","payload":{"method":"GET","path":"//evil.example/x"}}`, 400, "payload.path"},
		{"webhook url off the allowed hosts", "inj7", `{"type":"hook","payload":{"event":"e","data":1,"url":"http://169.254.169.254/latest/meta-data"}}`, 400, "payload.url"},
		{"webhook event with a NUL", "nul", `{"type":"analytics","payload":{"name":"a\u0000b"}}`, 400, "payload"},
	}
	for _, c := range cases {
		r := h.post(c.key, c.body)
		if r.status != c.status || (c.field != "" && r.body["field"] != c.field) {
			t.Errorf("%s: %d field=%v %.200s", c.name, r.status, r.body["field"], r.raw)
		}
	}
	// Not UTF-8: refused, since JSON must be UTF-8; a key that is not ASCII is refused too.
	if r := h.post("utf8", "{\"type\":\"analytics\",\"payload\":{\"name\":\"caf\xe9\"}}"); r.status != 400 ||
		!strings.Contains(r.body["detail"].(string), "UTF-8") {
		t.Errorf("non-UTF-8 byte in a string: %d %s", r.status, r.raw)
	}
	if r := h.post("cl\xe9", analytics("x")); r.status != 400 || r.body["field"] != "Idempotency-Key" {
		t.Errorf("non-ASCII key: %d %s", r.status, r.raw)
	}
	// Huge but under the limit: stored whole.
	big := strings.Repeat("x", 900<<10)
	if r := h.post("big", `{"type":"analytics","payload":{"name":"x","properties":{"blob":"`+big+`"}}}`); r.status != 202 {
		t.Errorf("900 KiB payload under a 1 MiB limit: %d %.200s", r.status, r.raw)
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects WHERE key = 'big' AND length(payload->'properties'->>'blob') = $1", len(big)); n != 1 {
		t.Error("the large payload was not stored whole")
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects WHERE key LIKE 'inj%' OR key IN ('deep', 'nul', 'utf8')"); n != 0 {
		t.Errorf("%d refused requests recorded", n)
	}
	result("all refused with the field named; 0 recorded; 900 KiB stored whole")
}
