package http

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/providers"
)

// proxiedHeaders returns the headers the proxy would record for a request carrying h, or the error.
func proxiedHeaders(p *Provider, h http.Header) (map[string]string, error) {
	raw, err := p.Proxied("POST", "/x", h, nil, "Oncegate-Api-Key")
	if err != nil {
		return nil, err
	}
	var pl Payload
	if err := json.Unmarshal(raw, &pl); err != nil {
		return nil, err
	}
	return pl.headers()
}

// Issue 27, finding 4: the proxy and the http provider decided request headers by two lists, and a header a
// CDN adds in front of the gateway (CF-Connecting-IP, True-Client-IP, ...) was dropped by neither and refused
// by the provider: every proxied request through such a CDN was a 400. One table decides, for a payload and for
// a proxied request, each class once; a name is looked up by one fold, so a twin spelling is the same header.
func TestOneHeaderPolicy(t *testing.T) {
	t.Parallel()
	p, err := New(Config{BaseURL: "https://api.example", Headers: map[string]string{"X-Api-Key": "key-abcdef12"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		class            string
		names            []string
		payload, proxied Decision
	}{
		{"hop-by-hop", []string{"Connection", "Keep-Alive", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
			"Content-Length", "Content_Length", "Host", "Proxy-Connection", "Proxy-Authorization", "Proxy-Anything"}, Refuse, Drop},
		{"gateway-owned", []string{"Idempotency-Key", "idempotency_key"}, Refuse, Drop},
		{"trace context", []string{"traceparent", "Tracestate", "BAGGAGE"}, Refuse, Drop},
		{"added in front", []string{"Forwarded", "Via", "X-Forwarded-For", "X_Forwarded_Host", "x-forwarded-proto",
			"X-Real-IP", "CF-Connecting-IP", "cf_connecting_ip", "CF-Connecting-IPv6", "True-Client-IP", "X-Client-IP",
			"X-Cluster-Client-IP", "Fastly-Client-IP", "X-Original-Forwarded-For", "X-Azure-ClientIP",
			"X-Envoy-External-Address"}, Refuse, Drop},
		{"routing", []string{"Cookie", "X-Original-URL", "X-Rewrite-URL", "X-HTTP-Method-Override", "X-HTTP-Method",
			"x_method_override"}, Refuse, Refuse},
		{"configured", []string{"X-Api-Key", "x_api_key", "X.Api.Key"}, Refuse, Drop},
		{"addressed to the gateway", []string{"Authorization", "Expect", "Accept-Encoding", "Oncegate-Api-Key",
			"Oncegate_Api_Key", "oncegate.trace"}, Send, Drop},
		{"", []string{"X-Kept", "Stripe-Version", "User-Agent", "Content-Type"}, Send, Send},
	} {
		for _, name := range tc.names {
			if c, _ := p.class(name); tc.class != "" && (c == nil || c.name != tc.class) {
				t.Errorf("%s: class %v, want %s", name, c, tc.class)
			}
			value := "v"
			if strings.EqualFold(name, "Expect") {
				value = "100-continue"
			}
			err := p.Validate(headerPayload(name, value))
			switch tc.payload {
			case Refuse:
				refusedAs(t, err, name, tc.class+" in a payload")
			case Send:
				if err != nil {
					t.Errorf("%s in a payload: %v, want sent", name, err)
				}
			}
			got, err := proxiedHeaders(p, http.Header{name: {value}})
			switch tc.proxied {
			case Refuse:
				refusedAs(t, err, name, tc.class+" through the proxy")
			case Drop:
				if err != nil || len(got) != 0 {
					t.Errorf("%s through the proxy: %v %v, want dropped", name, got, err)
				}
			case Send:
				if err != nil || got[name] != value {
					t.Errorf("%s through the proxy: %v %v, want sent", name, got, err)
				}
			}
		}
	}
	// A header a proxied request's Connection names is that connection's.
	got, err := proxiedHeaders(p, http.Header{"Connection": {"X-Hop, close"}, "X-Hop": {"1"}, "X-Kept": {"1"}})
	if err != nil || len(got) != 1 || got["X-Kept"] != "1" {
		t.Errorf("Connection-named header: %v %v", got, err)
	}
	// An operator may configure a routing header; a proxied request's own is then dropped for it.
	cookie, err := New(Config{BaseURL: "https://api.example", Headers: map[string]string{"Cookie": "session=operator"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := proxiedHeaders(cookie, http.Header{"Cookie": {"a=b"}}); err != nil || len(got) != 0 {
		t.Errorf("a configured Cookie through the proxy: %v %v, want dropped", got, err)
	}
}

// Issue 27, finding 3: a request header value that is not UTF-8 reached the upstream as U+FFFD. A payload
// carries it in headers_base64, and the upstream gets its bytes; a payload stored before, with headers only,
// is delivered as it was; what the rules refuse in headers they refuse in headers_base64.
func TestHeaderValueBytesReachTheUpstream(t *testing.T) {
	t.Parallel()
	p, lastHeaders := echoHeaders(t)
	raw, err := p.Proxied("POST", "/x", http.Header{"X-Latin": {"caf\xe9"}, "X-Rep": {"a", "\xff"},
		"X-Split": {"\xc3", "\xa9"}, "X-Text": {"héllo"}}, []byte("b\x00dy"), "Authorization")
	if err != nil {
		t.Fatal(err)
	}
	var pl Payload
	if err := json.Unmarshal(raw, &pl); err != nil {
		t.Fatal(err)
	}
	if pl.Headers["X-Text"] != "héllo" || len(pl.Headers) != 1 || len(pl.HeadersBase64) != 3 || pl.BodyBase64 == "" {
		t.Errorf("recorded as %s", raw)
	}
	if o := p.Deliver(context.Background(), delivery("bytes", string(raw))); o.Kind != providers.KindDelivered {
		t.Fatalf("%v %v", o.Kind, o.Err)
	}
	h := lastHeaders()
	for name, want := range map[string]string{"X-Latin": "caf\xe9", "X-Rep": "a, \xff", "X-Split": "\xc3, \xa9",
		"X-Text": "héllo"} {
		if got := h.Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("the upstream got %s %q, want %q", name, got, want)
		}
	}

	old := `{"method":"POST","path":"/x","headers":{"X-Old":"stored before"},"proxied":true}`
	if err := p.Validate(json.RawMessage(old)); err != nil {
		t.Fatal(err)
	}
	if o := p.Deliver(context.Background(), delivery("old", old)); o.Kind != providers.KindDelivered ||
		lastHeaders().Get("X-Old") != "stored before" {
		t.Errorf("a payload of the old form: %v %v %v", o.Kind, o.Err, lastHeaders())
	}

	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for name, c := range map[string]struct{ payload, field string }{
		"not base64":       {`{"headers_base64":{"X-A":"%%%"}}`, "payload.headers_base64.X-A"},
		"a line break":     {`{"headers_base64":{"X-A":"` + b64("a\r\nX-B: c") + `"}}`, "payload.headers.X-A"},
		"NUL":              {`{"headers_base64":{"X-A":"` + b64("a\x00") + `"}}`, "payload.headers.X-A"},
		"a class's header": {`{"headers_base64":{"Cookie":"` + b64("a=b") + `"}}`, "payload.headers.Cookie"},
		"set twice":        {`{"headers":{"x-a":"1"},"headers_base64":{"X-A":"` + b64("2") + `"}}`, "payload.headers.X-A"},
	} {
		payload := `{"method":"POST","path":"/x",` + strings.TrimPrefix(c.payload, "{")
		var fe *providers.FieldError
		if err := p.Validate(json.RawMessage(payload)); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: %v, want refused naming %s", name, err, c.field)
		}
	}
}

// Issue 27, finding 3: an answer header sent as two lines, "\xc3" and "\xa9", was checked joined (UTF-8
// then), stored as two JSON strings and replayed as two U+FFFD. Each line is checked by itself; a header with
// a line that is not UTF-8 keeps all its lines, in order, in headers_base64. An answer stored in the old shape
// still reads as it was.
func TestAnswerHeaderLinesKeepTheirBytes(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-Split"] = []string{"\xc3", "\xa9"}
		w.Header()["X-Mixed"] = []string{"a", "caf\xe9", "b"}
		w.Header()["X-Text"] = []string{"é", "ü"}
		w.WriteHeader(201)
	}))
	t.Cleanup(up.Close)
	p, err := New(Config{BaseURL: up.URL, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	o := p.Deliver(context.Background(), delivery("lines", `{"method":"POST","path":"/","proxied":true}`))
	if o.Kind != providers.KindDelivered {
		t.Fatalf("%v %v", o.Kind, o.Err)
	}
	var a Answer
	if err := json.Unmarshal(o.Result, &a); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{"X-Split": {"\xc3", "\xa9"}, "X-Mixed": {"a", "caf\xe9", "b"},
		"X-Text": {"é", "ü"}} {
		if got := a.Header()[name]; !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q (stored as %s)", name, got, want, o.Result)
		}
	}
	if _, ok := a.Headers["X-Text"]; !ok {
		t.Errorf("a header whose lines are all UTF-8 is stored as text: %s", o.Result)
	}

	var stored Answer
	if err := json.Unmarshal([]byte(`{"status":201,"headers":{"X-A":["1","2"]},"headers_base64":{"X-L":["`+
		base64.StdEncoding.EncodeToString([]byte("caf\xe9"))+`"]},"body":"b"}`), &stored); err != nil {
		t.Fatal(err)
	}
	if h := stored.Header(); !slices.Equal(h["X-A"], []string{"1", "2"}) || h.Get("X-L") != "caf\xe9" ||
		string(stored.Bytes()) != "b" {
		t.Errorf("an answer of the old shape: %q %q", h, stored.Bytes())
	}
}

// Issue 27, finding 3: a proxied answer body that is not UTF-8 and echoes a configured credential was stored
// unmasked, as body_base64, where the same text answer was masked. Both are masked alike.
func TestBinaryAnswersAreMasked(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		prefix := ""
		if r.URL.Path == "/binary" {
			prefix = "\xff\x00"
		}
		_, _ = w.Write([]byte(prefix + "auth=" + r.Header.Get("Authorization") + " key=" + r.Header.Get("X-Api-Key")))
	}))
	t.Cleanup(up.Close)
	p, err := New(Config{BaseURL: up.URL, AllowPrivateNetworks: true, Headers: map[string]string{
		"Authorization": "Bearer sk_live_secret123", "X-Api-Key": "key-abcdef12"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	for path, want := range map[string]string{"/text": "auth=[redacted] key=[redacted]",
		"/binary": "\xff\x00auth=[redacted] key=[redacted]"} {
		o := p.Deliver(context.Background(), delivery(path, `{"method":"POST","path":"`+path+`","proxied":true}`))
		var a Answer
		if err := json.Unmarshal(o.Result, &a); err != nil {
			t.Fatal(err)
		}
		if got := string(a.Bytes()); got != want {
			t.Errorf("%s: stored %q, want %q", path, got, want)
		}
	}
}

// The result of an effect posted to /v1/effects keeps its bytes too: a body that is not UTF-8 text was stored
// with U+FFFD in place of its bytes (and a NUL as U+FFFD by the store). It is body_base64, masked as text is,
// and a kept header whose value is not UTF-8 is in headers_base64; a body cut at MaxBody inside a character
// stays text.
func TestResultsKeepTheirBytes(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", MaxBody-1) + "é"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/caf\xe9")
		w.Header().Set("Content-Type", "text/plain")
		switch r.URL.Path {
		case "/binary":
			_, _ = w.Write([]byte("\xff\x00auth=" + r.Header.Get("Authorization")))
		case "/long":
			_, _ = w.Write([]byte(long))
		}
	}))
	t.Cleanup(up.Close)
	p, err := New(Config{BaseURL: up.URL, AllowPrivateNetworks: true, Headers: map[string]string{
		"Authorization": "Bearer sk_live_secret123"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	o := p.Deliver(context.Background(), delivery("bin", `{"method":"GET","path":"/binary"}`))
	var res struct {
		Headers       map[string]string `json:"headers"`
		HeadersBase64 map[string]string `json:"headers_base64"`
		Body          *string           `json:"body"`
		BodyBase64    string            `json:"body_base64"`
		Truncated     bool              `json:"body_truncated"`
	}
	if err := json.Unmarshal(o.Result, &res); err != nil {
		t.Fatal(err)
	}
	body, _ := base64.StdEncoding.DecodeString(res.BodyBase64)
	location, _ := base64.StdEncoding.DecodeString(res.HeadersBase64["Location"])
	if res.Body != nil || string(body) != "\xff\x00auth=[redacted]" || string(location) != "/caf\xe9" ||
		res.Headers["Content-Type"] != "text/plain" || res.Headers["Location"] != "" {
		t.Errorf("a binary answer's result: %s", o.Result)
	}
	o = p.Deliver(context.Background(), delivery("long", `{"method":"GET","path":"/long"}`))
	res.Body, res.BodyBase64 = nil, ""
	if err := json.Unmarshal(o.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.Body == nil || *res.Body != long[:MaxBody-1] || !res.Truncated || res.BodyBase64 != "" {
		t.Errorf("a text answer cut inside a character: body %v, truncated %v, base64 %d bytes", res.Body != nil,
			res.Truncated, len(res.BodyBase64))
	}
}

// Names added to a refused class (Via, Fastly-Client-IP and the client-IP family beyond the first few) were
// sent from payloads, and recorded by the proxy, before: an effect stored with one is delivered without it,
// not failed at every attempt, while a new payload with one is refused.
func TestStoredPayloadsWithNewlyRefusedHeadersAreDeliveredWithoutThem(t *testing.T) {
	t.Parallel()
	p, lastHeaders := echoHeaders(t)
	stored := `{"method":"POST","path":"/x","headers":{"Via":"1.1 cdn","Fastly-Client-IP":"203.0.113.7",` +
		`"X-Kept":"yes"},"proxied":true}`
	refusedAs(t, p.Validate(json.RawMessage(stored)), "Fastly-Client-IP", "a new payload")
	if o := p.Deliver(context.Background(), delivery("stored", stored)); o.Kind != providers.KindDelivered {
		t.Fatalf("a stored payload: %v %v", o.Kind, o.Err)
	}
	if h := lastHeaders(); h.Get("Via") != "" || h.Get("Fastly-Client-IP") != "" || h.Get("X-Kept") != "yes" {
		t.Errorf("the upstream got %v", h)
	}
}
