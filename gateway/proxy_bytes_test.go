package gateway

// Tests for issue 27's findings 3 and 4 on the dedup proxy, tried as an outside tester would: bytes that are not
// UTF-8 in request headers, answer headers and answer bodies, and the headers a CDN or load balancer in front of
// the gateway adds.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/reliability"
	httpprov "github.com/oncegate/oncegate/providers/http"
)

// sendRaw sends a request through the gateway with the header lines given, each added as it is (bytes and
// repeats kept), and returns the answer with its whole body.
func sendRaw(t *testing.T, h *harness, method, path string, body []byte, lines ...[2]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, h.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+acmeKey)
	for _, l := range lines {
		req.Header[l[0]] = append(req.Header[l[0]], l[1])
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// Finding 3a: a request header value that is not UTF-8 reached the upstream with its byte turned into U+FFFD
// (the payload's JSON ate it). It is sent byte for byte, on the first attempt, on a pass-through GET, and on
// the retry the dispatcher makes from the stored row; repeated lines are joined with ", " as before.
func TestProxyRequestHeaderBytesReachTheUpstream(t *testing.T) {
	t.Parallel()
	reliability.Record(t, "Hostile input", "Proxied request header values that are not UTF-8 (caf\\xe9), and repeated lines "+
		"UTF-8 only when joined", "The upstream gets the bytes sent (lines joined with \", \"), on the first attempt, "+
		"the retry from the stored payload and a pass-through GET")("bytes kept on all three")
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // the retry is sent from the stored payload
			return
		}
		chargeAnswer(w, r, n)
	})
	h := proxyGateway(t, up, nil)
	lines := [][2]string{{"Idempotency-Key", "latin-req"}, {"X-Latin", "caf\xe9"}, {"X-Rep", "a"},
		{"X-Rep", "caf\xe9 \xff"}, {"X-Plain", "héllo"}, {"X-Split", "\xc3"}, {"X-Split", "\xa9"}}
	check := func(when string) {
		t.Helper()
		req, _ := up.last()
		for name, want := range map[string]string{"X-Latin": "caf\xe9", "X-Rep": "a, caf\xe9 \xff",
			"X-Plain": "héllo", "X-Split": "\xc3, \xa9"} {
			if got := req.Header.Values(name); len(got) != 1 || got[0] != want {
				t.Errorf("%s: the upstream got %s %q, want %q", when, name, got, want)
			}
		}
	}
	if resp, b := sendRaw(t, h, "POST", "/v1/proxy/payments/charges", []byte(`{}`), lines...); resp.StatusCode != 503 {
		t.Fatalf("first attempt: %d %s", resp.StatusCode, b)
	}
	check("first attempt")
	if resp, b := sendRaw(t, h, "POST", "/v1/proxy/payments/charges", []byte(`{}`), lines...); resp.StatusCode != 201 {
		t.Fatalf("retry: %d %s", resp.StatusCode, b)
	}
	check("retry from the stored payload")
	if resp, b := sendRaw(t, h, "GET", "/v1/proxy/payments/charges", nil, lines[1:]...); resp.StatusCode != 201 {
		t.Fatalf("GET: %d %s", resp.StatusCode, b)
	}
	check("pass-through GET")
}

// Finding 3b: an answer header sent as two lines whose bytes are UTF-8 only when joined ("\xc3" and "\xa9")
// was checked joined, stored as two JSON strings, and replayed as two U+FFFD. Each line is checked by itself,
// and the client gets the same two lines of the same bytes, first and on replay.
func TestProxyAnswerHeaderLinesKeepTheirBytes(t *testing.T) {
	t.Parallel()
	reliability.Record(t, "Hostile input", "An upstream answer header sent as lines \\xc3 and \\xa9 (UTF-8 only when joined)",
		"The client gets the same lines of the same bytes, first and on replay")("same lines, same bytes, twice")
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		w.Header()["X-Split"] = []string{"\xc3", "\xa9"}
		w.Header()["X-Mixed"] = []string{"plain", "caf\xe9", "last"}
		w.Header()["X-Text"] = []string{"é", "ü"}
		w.WriteHeader(http.StatusCreated)
	})
	h := proxyGateway(t, up, nil)
	for i := range 2 {
		resp, b := sendRaw(t, h, "POST", "/v1/proxy/payments/x", []byte(`{}`), [2]string{"Idempotency-Key", "split"})
		if resp.StatusCode != 201 {
			t.Fatalf("answer %d: %d %s", i, resp.StatusCode, b)
		}
		for name, want := range map[string][]string{"X-Split": {"\xc3", "\xa9"},
			"X-Mixed": {"plain", "caf\xe9", "last"}, "X-Text": {"é", "ü"}} {
			if got := resp.Header.Values(name); !slices.Equal(got, want) {
				t.Errorf("answer %d: %s %q, want %q", i, name, got, want)
			}
		}
	}
}

// Finding 3c: an answer body that is not UTF-8 and echoes a configured credential was stored and returned
// unmasked (body_base64), while the same text answer was masked. Both are masked, in the answer, its replay and
// the stored result.
func TestProxyMasksBinaryAnswers(t *testing.T) {
	t.Parallel()
	reliability.Record(t, "Hostile input", "An upstream whose non-UTF-8 answer body echoes the configured credential",
		"Masked as a text answer is: in the answer, its replay, the stored result and a pass-through GET")("masked in all four")
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		prefix := ""
		if strings.HasSuffix(r.URL.Path, "/binary") {
			prefix = "\xff\x00"
		}
		_, _ = io.WriteString(w, prefix+"auth="+r.Header.Get("Authorization")+" end")
	})
	h := proxyGateway(t, up, nil)
	for _, kind := range []string{"text", "binary"} {
		want := "auth=[redacted] end" // the value as it was sent, "Bearer " included
		if kind == "binary" {
			want = "\xff\x00" + want
		}
		for i := range 2 {
			resp, b := sendRaw(t, h, "POST", "/v1/proxy/payments/"+kind, []byte(`{}`), [2]string{"Idempotency-Key", kind})
			if resp.StatusCode != 201 || string(b) != want {
				t.Errorf("%s answer %d: %d %q, want %q", kind, i, resp.StatusCode, b, want)
			}
		}
		var result json.RawMessage
		if err := h.pool.QueryRow(context.Background(), `SELECT result FROM oncegate_effects WHERE key = $1`,
			kind).Scan(&result); err != nil {
			t.Fatal(err)
		}
		var a httpprov.Answer
		if err := json.Unmarshal(result, &a); err != nil {
			t.Fatal(err)
		}
		if stored := a.Bytes(); bytes.Contains(stored, []byte("sk_upstream_secret_1")) || string(stored) != want {
			t.Errorf("%s: stored %q, want %q", kind, stored, want)
		}
		if kind == "binary" && (a.BodyBase64 == nil || *a.BodyBase64 != base64.StdEncoding.EncodeToString([]byte(want))) {
			t.Errorf("binary: stored as %s", result)
		}
	}
	resp, b := sendRaw(t, h, "GET", "/v1/proxy/payments/binary", nil)
	if resp.StatusCode != 201 || string(b) != "\xff\x00auth=[redacted] end" {
		t.Errorf("a binary GET: %d %q", resp.StatusCode, b)
	}
}

// Finding 4: a CDN or load balancer in front of the gateway adds client-IP headers to every request, and each
// made every proxied request a 400. They are dropped, as Forwarded and X-Forwarded-* were: the upstream's client
// is the gateway. A header a client sets to change what the upstream does (Cookie, a method override) is still
// refused, naming it.
func TestProxyDropsWhatAProxyInFrontAdds(t *testing.T) {
	t.Parallel()
	reliability.Record(t, "Gateway", "Proxied requests through a CDN that adds CF-Connecting-IP, True-Client-IP, X-Client-IP, "+
		"X-Cluster-Client-IP, Fastly-Client-IP, X-Forwarded-*, Forwarded, Via", "Performed (not a 400), the upstream sees "+
		"none of them; Cookie and method overrides still a 400 naming them")("POST and GET performed, none forwarded")
	up := newUpstream(t, chargeAnswer)
	h := proxyGateway(t, up, nil)
	front := [][2]string{{"CF-Connecting-IP", "203.0.113.7"}, {"True-Client-IP", "203.0.113.7"},
		{"X-Client-IP", "203.0.113.7"}, {"X-Cluster-Client-IP", "203.0.113.7"}, {"Fastly-Client-IP", "203.0.113.7"},
		{"X-Forwarded-For", "203.0.113.7, 10.0.0.1"}, {"X-Forwarded-Proto", "https"}, {"Forwarded", "for=203.0.113.7"},
		{"Via", "1.1 cdn"}, {"X-Real-IP", "203.0.113.7"}, {"X_Forwarded_Host", "evil.example"}}
	for _, method := range []string{"POST", "GET"} {
		lines := append([][2]string{{"Idempotency-Key", "cdn"}, {"X-Kept", "yes"}}, front...)
		resp, b := sendRaw(t, h, method, "/v1/proxy/payments/charges", []byte(`{}`), lines...)
		if resp.StatusCode != 201 {
			t.Fatalf("%s behind a CDN: %d %s", method, resp.StatusCode, b)
		}
		req, _ := up.last()
		for _, l := range front {
			if v := req.Header.Values(l[0]); len(v) > 0 {
				t.Errorf("%s: the upstream got %s %q", method, l[0], v)
			}
		}
		if req.Header.Get("X-Kept") != "yes" {
			t.Errorf("%s: the client's own header was not sent: %v", method, req.Header)
		}
	}
	for _, name := range []string{"Cookie", "X-HTTP-Method-Override", "X-Original-URL"} {
		r := h.req("POST", "/v1/proxy/payments/charges", acmeKey, "{}", "Idempotency-Key: refused", name+": v")
		if field, _ := r.body["field"].(string); r.status != 400 || !strings.EqualFold(field, name) {
			t.Errorf("%s: %d %s, want a 400 naming it", name, r.status, r.raw)
		}
		// A proxied request has no payload: the detail names the header as the client sent it.
		if d, _ := r.body["detail"].(string); strings.Contains(d, "payload") {
			t.Errorf("%s: detail %q", name, d)
		}
	}
}
