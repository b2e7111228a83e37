package http

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/providers"
)

const (
	pathToken   = "T0kenInBasePath3q8"
	apiToken    = "sk_live_T0kenEchoed6w1"
	apiKey      = "key-T0kenEchoed2e9"
	userinfoTok = "T0kenAsPassword4r7"
)

var encoded = []string{base64.StdEncoding.EncodeToString([]byte("Bearer " + apiToken)),
	base64.StdEncoding.EncodeToString([]byte(apiKey)), url.QueryEscape("Bearer " + apiToken)}

func assertNone(t *testing.T, where, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s holds %q: %s", where, s, text)
		}
	}
}

// Finding 7 of issue 12: the configured base_url (a token in its path) reached last_error through net/url's
// errors; the configured credentials were kept out of results only by replacing their text, which an upstream
// echoing them encoded passes. Errors name the upstream by origin; configured headers are never kept from a
// response, whatever keep_headers says; the body is the upstream's, stored as it sent it.
func TestConfiguredSecretsStayOutOfErrorsAndKeptHeaders(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	stop := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-stop
	}))
	defer hanging.Close()
	defer close(stop)
	for name, base := range map[string]string{"refused": closed, "timeout": hanging.URL} {
		p, err := New(Config{BaseURL: base + "/api/" + pathToken, AllowPrivateNetworks: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		o := p.Deliver(ctx, delivery("k", `{"method":"POST","path":"/charges?x=1"}`))
		cancel()
		if o.Kind != providers.KindRetry || !strings.Contains(o.Err.Error(), strings.TrimPrefix(base, "http://")) {
			t.Errorf("%s: %v %v", name, o.Kind, o.Err)
		}
		assertNone(t, name+": the error", o.Err.Error(), pathToken, "/api/")
		if d := p.Destination(nil); d != base { // scheme, host and port (safehttp.Destination)
			t.Errorf("destination %q", d)
		}
	}
	_, err = New(Config{BaseURL: "https://user:" + userinfoTok + "@api.example.com/api/" + pathToken})
	if err == nil {
		t.Fatal("a base_url with user info was accepted")
	}
	assertNone(t, "the configuration error", err.Error(), userinfoTok, pathToken)
	if _, err := New(Config{BaseURL: "https://api.example.com", Headers: map[string]string{"X-Api-Key": apiKey},
		KeepHeaders: []string{"x-api-key"}}); err == nil || strings.Contains(err.Error(), apiKey) {
		t.Fatalf("keep_headers naming a configured header: %v", err)
	}

	// An upstream that echoes the credentials it was sent, encoded, in headers and body, with a 500.
	var sentBody string
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth, key := r.Header.Get("Authorization"), r.Header.Get("X-Api-Key")
		w.Header().Set("X-Api-Key", base64.StdEncoding.EncodeToString([]byte(key)))
		w.Header().Set("Authorization", base64.StdEncoding.EncodeToString([]byte(auth)))
		w.Header().Set("X-Echo", url.QueryEscape(auth))
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(500)
		sentBody = "you sent " + base64.StdEncoding.EncodeToString([]byte(auth))
		_, _ = w.Write([]byte(sentBody))
	}))
	defer echo.Close()
	p, err := New(Config{BaseURL: echo.URL + "/api/" + pathToken, AllowPrivateNetworks: true,
		Headers:     map[string]string{"Authorization": "Bearer " + apiToken, "X-Api-Key": apiKey},
		KeepHeaders: []string{"Content-Type", "X-Echo-Not-Sent"}})
	if err != nil {
		t.Fatal(err)
	}
	o := p.Deliver(context.Background(), delivery("k", `{"method":"POST","path":"/charges"}`))
	if o.Kind != providers.KindRetry {
		t.Fatalf("%v %v", o.Kind, o.Err)
	}
	assertNone(t, "the error", o.Err.Error(), append(encoded, apiToken, apiKey, pathToken)...)
	var result struct {
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	if err := json.Unmarshal(o.Result, &result); err != nil {
		t.Fatal(err)
	}
	headers, _ := json.Marshal(result.Headers)
	assertNone(t, "the kept headers", string(headers), append(encoded, apiToken, apiKey)...)
	if result.Headers["Content-Type"] != "text/plain" || len(result.Headers) != 1 {
		t.Errorf("kept headers %s", headers)
	}
	// The body is the upstream's: stored as it was sent, which the docs say.
	if result.Body != sentBody {
		t.Errorf("body %q, upstream sent %q", result.Body, sentBody)
	}
}
