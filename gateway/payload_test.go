package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/oncegate/oncegate/internal/jsonlimit"
	"github.com/oncegate/oncegate/internal/reliability"
	httpprov "github.com/oncegate/oncegate/providers/http"
)

// Payloads whose stored or delivered form would be larger than what was sent (issue 12, finding 2), and
// payloads that say one thing twice (finding 9), are refused at request time with a 400 naming the field;
// nothing is recorded.
func TestPayloadLimitsAtRequestTime(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input",
		"Payload numbers beyond a double (1e131071, 1e-16383) or over 40 characters, nesting beyond 64 levels, "+
			"duplicate and case-variant duplicate member names (payload and envelope), lone surrogate escapes",
		"400 naming the field at request time; nothing recorded")
	h := startGateway(t, func(c *Config) {
		c.Limits.MaxBody = 1 << 20
		c.EffectTypes["proxy"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: "https://api.example"}}
	})
	nest := func(levels int) string { // an object nested levels deep inside the payload object
		return strings.Repeat(`{"a":`, levels) + "1" + strings.Repeat("}", levels)
	}
	ev := func(props string) string {
		return `{"type":"analytics","payload":{"name":"x","properties":` + props + `}}`
	}
	cases := []struct {
		name, body, field string
	}{
		{"huge exponent", ev(`{"n":[1,1e131071]}`), "payload.properties.n[1]"},
		{"tiny exponent", ev(`{"n":1e-16383}`), "payload.properties.n"},
		{"beyond a double", ev(`{"n":1.8e308}`), "payload.properties.n"},
		{"41 characters", ev(`{"n":` + strings.Repeat("9", 41) + `}`), "payload.properties.n"},
		{"65 levels", ev(nest(64)), "payload.properties" + strings.Repeat(".a", 63)},
		{"duplicate", `{"type":"analytics","payload":{"name":"a","name":"b"}}`, "payload.name"},
		{"case-variant duplicate", `{"type":"analytics","payload":{"name":"a","NAME":"b"}}`, "payload.NAME"},
		{"duplicate in a nested object", ev(`{"to":[{"x":1},{"x":1,"X":2}]}`), "payload.properties.to[1].X"},
		{"lone surrogate", ev(`{"s":"\ud800"}`), "payload.properties.s"},
		{"envelope type twice", `{"type":"analytics","TYPE":"other","payload":{"name":"a"}}`, "TYPE"},
		{"envelope payload twice", `{"type":"analytics","payload":{"name":"a"},"payload":{"name":"b"}}`, "payload"},
		{"proxy body number", `{"type":"proxy","payload":{"method":"POST","path":"/","body":{"n":1e131071}}}`, "payload.body.n"},
	}
	for _, c := range cases {
		r := h.post("lim-"+strings.ReplaceAll(c.name, " ", "-"), c.body)
		if r.status != 400 || r.body["type"] != "/problems/invalid-request" || r.body["field"] != c.field ||
			!strings.HasPrefix(r.body["detail"].(string), c.field+": ") {
			t.Errorf("%s: %d field=%v, want 400 naming %s: %.300s", c.name, r.status, r.body["field"], c.field, r.raw)
		}
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects"); n != 0 {
		t.Fatalf("%d refused requests recorded", n)
	}
	// At the limits: accepted.
	for key, body := range map[string]string{
		"64-levels":  ev(nest(63)),
		"40-digits":  ev(`{"n":` + strings.Repeat("9", 40) + `}`),
		"double-max": ev(`{"n":1.7976931348623157e308,"m":5e-324}`),
		"same-names": ev(`{"to":[{"x":1},{"x":1}]}`),
	} {
		if r := h.post(key, body); r.status != 202 {
			t.Errorf("%s: %d %.300s", key, r.status, r.raw)
		}
	}
	result("12 refused with the field named, 0 recorded; 4 at the limits accepted")
}

// What a destination receives is the payload as the client sent it, byte for byte: the gateway stores the text
// it accepted (json, not jsonb) and never renders it again, so a payload cannot grow between the request and
// the delivery, and the order and spelling of its members are the client's.
func TestPayloadIsDeliveredAsSent(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input",
		"A payload that jsonb would print larger and reordered (1e300 as 301 digits, -0, member order, spacing)",
		"What the destination receives is the payload byte for byte as sent; what is stored is the text sent")
	var mu sync.Mutex
	var got []byte
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = b
		mu.Unlock()
		w.WriteHeader(204)
	}))
	t.Cleanup(up.Close)
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["proxy"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: up.URL, AllowPrivateNetworks: true}}
	})
	body := `{ "z": 1.50, "a" : [1e300, 0.000001, -0], "s": "caf\u00e9 <&>",` + "\n\t" + `"n": {"b":2, "a":1} }`
	payload := `{"method":"POST","path":"/x","body":` + body + `}`
	if r := h.post("as-sent", `{"type":"proxy","payload":`+payload+`}`); r.status != 202 {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	h.waitStatus(acmeKey, "as-sent", "delivered")
	mu.Lock()
	defer mu.Unlock()
	if string(got) != body {
		t.Fatalf("delivered %q, sent %q", got, body)
	}
	result(fmt.Sprintf("%d bytes sent, the same %d bytes delivered and stored", len(body), len(got)))
	var stored string
	if err := h.pool.QueryRow(t.Context(), "SELECT payload::text FROM oncegate_effects WHERE key = 'as-sent'").Scan(&stored); err != nil || stored != payload {
		t.Fatalf("stored %q (%v), sent %q", stored, err, payload)
	}
}

// What the request checks add to a create, on the benchmark's body (scripts/bench gateway): decode is the
// whole of decodeCreate, checks the two jsonlimit passes within it.
func BenchmarkCreateBodyChecks(b *testing.B) {
	body := []byte(`{"type":"analytics","payload":{"name":"signup","properties":{"plan":"pro"}}}`)
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := decodeCreate(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("checks", func(b *testing.B) {
		payload := body[len(`{"type":"analytics","payload":`) : len(body)-1]
		for b.Loop() {
			if _, err := checkLimits(payload, "payload", jsonlimit.Limits{}); err != nil {
				b.Fatal(err)
			}
			if _, err := checkLimits(body, "", jsonlimit.Limits{MaxDepth: jsonlimit.DefaultMaxDepth + 1}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
