package gateway

import (
	"io"
	"net/http"
	"testing"
)

// a header value that is not UTF-8 (Latin-1, as RFC 9110 still allows as obs-text) comes back byte for
// byte, on the first answer and on replays.
func TestProxyKeepsObsTextHeaderValues(t *testing.T) {
	t.Parallel()
	const latin = "caf\xe9 \xff"
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		w.Header().Set("X-Latin", latin)
		w.Header().Set("X-Plain", "plain")
		w.WriteHeader(http.StatusCreated)
	})
	h := proxyGateway(t, up, nil)
	for i := range 2 {
		r := h.req("POST", "/v1/proxy/payments/latin", acmeKey, "{}", "Idempotency-Key: latin")
		if r.status != 201 || r.header.Get("X-Latin") != latin || r.header.Get("X-Plain") != "plain" {
			t.Fatalf("answer %d: %d %q", i, r.status, r.header)
		}
	}
}

// an answer without Content-Type gets none (no sniffing). an upstream's Idempotent-Replayed is not
// passed on: the flag is the gateway's to set.
func TestProxyAnswerHeadersAreTheUpstreams(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header()["Content-Type"] = nil
		_, _ = io.WriteString(w, "<html>plain bytes</html>")
	})
	h := proxyGateway(t, up, nil)
	for i := range 2 {
		r := h.req("POST", "/v1/proxy/payments/x", acmeKey, "{}", "Idempotency-Key: ct")
		if r.status != 200 || r.header.Get("Content-Type") != "" || (i == 1) != (r.header.Get("Idempotent-Replayed") == "true") {
			t.Errorf("POST %d: %d %v", i, r.status, r.header)
		}
	}
	r := h.req("GET", "/v1/proxy/payments/x", acmeKey, "")
	if r.status != 200 || r.header.Get("Content-Type") != "" || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("GET: %d %v", r.status, r.header)
	}
}
