package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	httpprov "github.com/oncegate/oncegate/providers/http"
)

// passGet sends a GET through the proxy and reads the whole body, reporting a read error instead of failing.
func passGet(t *testing.T, h *harness, method, path string) (*http.Response, string, error) {
	t.Helper()
	req, _ := http.NewRequest(method, h.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+acmeKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// a pass-through answer whose body breaks off (a reset, a timeout) must not reach the client as a
// complete one: the client's connection is aborted. HEAD keeps the upstream's Content-Length.
func TestProxyPassThroughTruncationAborts(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		switch r.URL.Path {
		case "/api/short", "/api/long":
			declared, sent := 1000, 100
			if r.URL.Path == "/api/long" {
				declared, sent = 10<<20, 5<<20
			}
			conn, buf, _ := w.(http.Hijacker).Hijack()
			fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", declared)
			_, _ = buf.WriteString(strings.Repeat("x", sent))
			_ = buf.Flush()
			conn.Close()
		case "/api/slow":
			w.Header().Set("Content-Length", "120")
			_, _ = io.WriteString(w, strings.Repeat("s", 60))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/api/head":
			w.Header().Set("Content-Length", "4242")
			w.WriteHeader(200)
		default:
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "whole")
		}
	})
	h := proxyGateway(t, up, func(c *Config) {
		et := c.EffectTypes["payments"]
		et.Timeout = Duration(time.Second)
		c.EffectTypes["payments"] = et
	})
	for _, p := range []string{"short", "long", "slow"} {
		// Either the connection is aborted, or (when the type's timeout ran out before the upstream's first
		// byte, as on a machine loaded by the rest of the suite) the gateway answers with its own problem,
		// which is whole. What must never come is the upstream's status with a body cut short.
		resp, body, err := passGet(t, h, "GET", "/v1/proxy/payments/"+p)
		if err == nil && (resp.StatusCode < 500 || resp.Header.Get("Content-Type") != "application/problem+json") {
			t.Errorf("%s: a body cut short reached the client as complete: %d, %d bytes, Content-Length %d",
				p, resp.StatusCode, len(body), resp.ContentLength)
		}
	}
	resp, body, err := passGet(t, h, "GET", "/v1/proxy/payments/whole")
	if err != nil || resp.StatusCode != 200 || body != "whole" {
		t.Fatalf("a whole answer: %v %v %q", err, resp, body)
	}
	resp, _, err = passGet(t, h, "HEAD", "/v1/proxy/payments/head")
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Length") != "4242" {
		t.Fatalf("M7: HEAD keeps the upstream's Content-Length: %v %v", err, resp.Header)
	}
}

// a configured credential echoed by the upstream is masked in a pass-through answer as in a stored one,
// however the body is cut into reads.
func TestProxyPassThroughMasksCredentials(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) {
		// Written a byte at a time, flushed, so that a secret straddles every read the gateway makes.
		echo := "auth=" + r.Header.Get("Authorization") + " key=" + r.Header.Get("X-Api-Key") + " end"
		bw := bufio.NewWriterSize(w, 1)
		for i := range len(echo) {
			_ = bw.WriteByte(echo[i])
			_ = bw.Flush()
			w.(http.Flusher).Flush()
		}
	})
	h := proxyGateway(t, up, func(c *Config) {
		c.EffectTypes["payments"] = EffectType{Provider: "http", HTTP: &httpprov.Config{BaseURL: up.URL + "/api",
			AllowPrivateNetworks: true, Headers: map[string]string{"Authorization": "Bearer sk_upstream_secret_1",
				"X-Api-Key": "APIKEYSECRET123"}}}
	})
	_, body, err := passGet(t, h, "GET", "/v1/proxy/payments/echoauth")
	if err != nil || strings.Contains(body, "secret_1") || strings.Contains(body, "APIKEYSECRET") ||
		!strings.HasSuffix(body, " end") || !strings.HasPrefix(body, "auth=") {
		t.Fatalf("H2: a GET reads the configured credentials: %v %q", err, body)
	}
	post := h.req("POST", "/v1/proxy/payments/echoauth", acmeKey, "{}", "Idempotency-Key: echo")
	if post.raw != body {
		t.Fatalf("a GET and a POST mask alike: %q / %q", body, post.raw)
	}
}
