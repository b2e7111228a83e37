package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	httpprov "github.com/oncegate/oncegate/providers/http"
)

// Keys that are, or hold, dot segments and empty segments round-trip: the Location the gateway answers with
// survives an RFC 3986 client (which removes a bare . or .. segment), and reads and retries the same effect.
func TestDotAndSlashKeysRoundTrip(t *testing.T) {
	t.Parallel()
	h := startGateway(t, nil)
	want := map[string]string{".": "/v1/effects/%2E", "..": "/v1/effects/%2E%2E",
		"a/../b": "/v1/effects/a%2F..%2Fb", "//x": "/v1/effects/%2F%2Fx"}
	for key, loc := range want {
		r := h.post(key, analytics("dots"))
		if r.status != http.StatusAccepted && r.status != http.StatusOK {
			t.Fatalf("POST %q: %d %s", key, r.status, r.raw)
		}
		if got := r.header.Get("Location"); got != loc {
			t.Fatalf("POST %q: Location %q, want %q", key, got, loc)
		}
		g := h.req("GET", loc, acmeKey, "")
		if g.status != http.StatusOK || g.body["key"] != key {
			t.Fatalf("GET %s: %d %s", loc, g.status, g.raw)
		}
		// Lower-case escapes name the same key.
		if g := h.req("GET", strings.ReplaceAll(loc, "%2E", "%2e"), acmeKey, ""); g.status != http.StatusOK || g.body["key"] != key {
			t.Fatalf("GET %s in lower case: %d %s", loc, g.status, g.raw)
		}
		// The retry route reaches the same effect: it is not retryable (pending or delivered), which is a 409.
		if rr := h.req("POST", loc+"/retry", acmeKey, ""); rr.status != http.StatusConflict {
			t.Fatalf("POST %s/retry: %d %s", loc, rr.status, rr.raw)
		}
	}
}

// A path that is not a route is a 404 problem, never a redirect to another resource: the router does not
// clean paths, and a bare dot segment (which an RFC 3986 client would have removed) names no key.
func TestUncleanPathsAreNotFoundNotRedirected(t *testing.T) {
	t.Parallel()
	h := startGateway(t, nil)
	for _, k := range []string{".", ".."} {
		if r := h.post(k, analytics("dots")); r.status != http.StatusAccepted && r.status != http.StatusOK {
			t.Fatalf("POST %q: %d %s", k, r.status, r.raw)
		}
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/effects/."}, {"GET", "/v1/effects/.."}, {"GET", "/v1/effects//x"}, {"GET", "/v1/effects/"},
		{"POST", "/v1/effects/../retry"}, {"POST", "/v1/effects/./retry"}, {"GET", "/v1/./effects"},
		{"GET", "/v1/effects/x/../."}, {"GET", "//healthz"}, {"GET", "/./healthz"}, {"HEAD", "/v1/effects/."},
	} {
		r := h.req(c.method, c.path, acmeKey, "")
		if r.status != http.StatusNotFound {
			t.Errorf("%s %s: %d (Location %q), want 404: %s", c.method, c.path, r.status, r.header.Get("Location"), r.raw)
			continue
		}
		if c.method != "HEAD" && (r.header.Get("Content-Type") != "application/problem+json" || r.body["type"] != "/problems/not-found") {
			t.Errorf("%s %s: not a not-found problem: %q %s", c.method, c.path, r.header.Get("Content-Type"), r.raw)
		}
	}
}

// RFC 9110 §9.1: a general-purpose server supports HEAD wherever it supports GET, with GET's status and
// headers and no body; Allow lists it.
func TestHeadIsServedWhereverGetIs(t *testing.T) {
	t.Parallel()
	h := startGateway(t, nil)
	if r := h.post("head-1", analytics("head")); r.status != http.StatusAccepted && r.status != http.StatusOK {
		t.Fatalf("POST: %d %s", r.status, r.raw)
	}
	for _, c := range []struct {
		path, key string
	}{
		{"/healthz", ""}, {"/readyz", ""}, {"/metrics", ""}, {"/openapi.yaml", ""}, {"/problems/not-found", ""},
		{"/problems/no-such-problem", ""}, {"/v1/effects", acmeKey}, {"/v1/effects", ""}, {"/v1/effects/head-1", acmeKey},
		{"/v1/effects/no-such-key", acmeKey}, {"/v1/effects?limit=0", acmeKey},
	} {
		get := h.req("GET", c.path, c.key, "")
		head := h.req("HEAD", c.path, c.key, "")
		if head.status != get.status {
			t.Errorf("HEAD %s: %d, GET %d", c.path, head.status, get.status)
		}
		if head.raw != "" {
			t.Errorf("HEAD %s: a body: %q", c.path, head.raw)
		}
		for _, name := range []string{"Content-Type", "WWW-Authenticate", "Allow"} {
			if head.header.Get(name) != get.header.Get(name) {
				t.Errorf("HEAD %s: %s %q, GET's %q", c.path, name, head.header.Get(name), get.header.Get(name))
			}
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.yaml", "/problems/not-found",
		"/v1/effects", "/v1/effects/head-1"} {
		r := h.req("DELETE", path, acmeKey, "")
		if r.status != http.StatusMethodNotAllowed || !strings.Contains(r.header.Get("Allow"), "HEAD") ||
			!strings.Contains(r.header.Get("Allow"), "GET") {
			t.Errorf("DELETE %s: %d, Allow %q: want 405 listing GET and HEAD", path, r.status, r.header.Get("Allow"))
		}
	}
}

// the path's percent-encoding reaches the upstream as sent, and a path that decodes to a leading "//"
// (an authority, to an upstream that reads the request line as a URL) is refused as the literal one is.
// a request without a path after the type goes to base_url as written.
func TestProxyKeepsPercentEncoding(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		_, _ = io.WriteString(w, r.RequestURI)
	})
	h := proxyGateway(t, up, func(c *Config) {
		c.EffectTypes["root"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: up.URL,
			AllowPrivateNetworks: true}}
	})
	for i, tc := range []struct{ path, want string }{
		{"/v1/proxy/payments/files/a%2Fb", "/api/files/a%2Fb"},
		{"/v1/proxy/payments/x%3By", "/api/x%3By"},
		{"/v1/proxy/payments/%41?q=%2F", "/api/%41?q=%2F"},
		{"/v1/proxy/payments", "/api"},
		{"/v1/proxy/payments?q=1", "/api?q=1"},
		{"/v1/proxy/payments/", "/api/"},
	} {
		if g := h.req("GET", tc.path, acmeKey, ""); g.status != 200 || g.raw != tc.want {
			t.Errorf("GET %s: %d %q, want %q", tc.path, g.status, g.raw, tc.want)
		}
		p := h.req("POST", tc.path, acmeKey, "{}", fmt.Sprintf("Idempotency-Key: enc-%d", i))
		if p.status != 200 || p.raw != tc.want {
			t.Errorf("POST %s: %d %q, want %q", tc.path, p.status, p.raw, tc.want)
		}
	}
	for _, path := range []string{"/v1/proxy/root//evil.example/x", "/v1/proxy/root/%2F%2Fevil.example/x",
		"/v1/proxy/root/%2f/evil.example/x"} {
		if p := h.req("POST", path, acmeKey, "{}", "Idempotency-Key: evil"+path); p.status != 400 {
			t.Errorf("POST %s: %d %q", path, p.status, p.raw)
		}
	}
	if n := up.calls.Load(); n != 12 {
		t.Errorf("upstream calls: %d", n)
	}
}
