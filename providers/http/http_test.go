package http

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/providertest"
	"github.com/oncegate/oncegate/providers"
)

// upstream is a real HTTP API on loopback that counts requests by Idempotency-Key.
type upstream struct {
	srv       *httptest.Server
	mu        sync.Mutex
	behaviour providertest.Behaviour
	received  map[string]int
	last      *http.Request
	lastBody  []byte
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{received: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		b := u.behaviour
		u.last, u.lastBody = r, body
		u.mu.Unlock()
		switch b {
		case providertest.FailTransient:
			w.WriteHeader(502)
			return
		case providertest.FailPermanent:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(402)
			_, _ = w.Write([]byte(`{"error":"card_declined"}`))
			return
		case providertest.Hang:
			<-r.Context().Done()
			return
		}
		u.mu.Lock()
		u.received[r.Header.Get("Idempotency-Key")]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/charges/ch_1")
		w.Header().Set("X-Secret-Internal", "not kept")
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	}))
	t.Cleanup(u.srv.Close)
	return u
}

type dest struct {
	*upstream
	p *Provider
}

func (d dest) Provider() providers.Provider { return d.p }
func (d dest) Deliver(ctx context.Context, del providers.Delivery) providers.Outcome {
	return d.p.Deliver(ctx, del)
}
func (d dest) Set(b providertest.Behaviour) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.behaviour = b
	return true
}
func (d dest) Received(del providers.Delivery) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.received[del.StableID]
}
func (d dest) ValidPayload() json.RawMessage {
	return json.RawMessage(`{"method":"POST","path":"/v1/charges?expand=customer","headers":{"X-Trace":"t1"},"body":{"amount":500}}`)
}
func (d dest) InvalidPayloads() map[string]json.RawMessage {
	return map[string]json.RawMessage{
		"payload.method":                  json.RawMessage(`{"method":"TRACE","path":"/x"}`),
		"payload.path":                    json.RawMessage(`{"method":"GET","path":"https://evil.example/x"}`),
		"payload.headers.X-Evil":          json.RawMessage(`{"method":"GET","path":"/x","headers":{"X-Evil":"a\r\nHost: evil"}}`),
		"payload.headers.Idempotency-Key": json.RawMessage(`{"method":"GET","path":"/x","headers":{"Idempotency-Key":"mine"}}`),
	}
}

func newDest(t *testing.T) providertest.Destination {
	u := newUpstream(t)
	p, err := New(Config{BaseURL: u.srv.URL + "/api", AllowPrivateNetworks: true, Headers: map[string]string{"Authorization": "Bearer sk_test"}})
	if err != nil {
		t.Fatal(err)
	}
	return dest{u, p}
}

func TestConformance(t *testing.T) {
	providertest.Exercise(t, providertest.Capabilities{}, newDest)
}

func delivery(key, payload string) providers.Delivery {
	return providers.Delivery{Tenant: "acme", Key: key, StableID: effect.NewStableID("acme", key),
		Payload: json.RawMessage(payload), Attempt: 1, CreatedAt: time.Now()}
}

// The request is forwarded as described, with the effect's stable ID as Idempotency-Key, and the answer is
// kept (bounded, chosen headers) as the result that replays return.
func TestForwardsAndKeepsTheAnswer(t *testing.T) {
	t.Parallel()
	d := newDest(t).(dest)
	del := delivery("charge:42", string(d.ValidPayload()))
	o := d.p.Deliver(context.Background(), del)
	if o.Kind != providers.KindDelivered {
		t.Fatalf("%v %v", o.Kind, o.Err)
	}
	r := d.last
	if r.Method != "POST" || r.URL.Path != "/api/v1/charges" || r.URL.RawQuery != "expand=customer" ||
		r.Header.Get("X-Trace") != "t1" || r.Header.Get("Authorization") != "Bearer sk_test" ||
		r.Header.Get("Idempotency-Key") != del.StableID || r.Header.Get("Content-Type") != "application/json" ||
		string(d.lastBody) != `{"amount":500}` {
		t.Fatalf("forwarded %s %s %v %s", r.Method, r.URL, r.Header, d.lastBody)
	}
	var res struct {
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	if err := json.Unmarshal(o.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != 201 || res.Body != `{"id":"ch_1"}` || res.Headers["Location"] != "/v1/charges/ch_1" ||
		res.Headers["X-Secret-Internal"] != "" {
		t.Fatalf("result %s", o.Result)
	}
	// A string body is sent as it is.
	o = d.p.Deliver(context.Background(), delivery("form", `{"method":"PUT","path":"/f","body":"a=1&b=2"}`))
	if o.Kind != providers.KindDelivered || string(d.lastBody) != "a=1&b=2" || d.last.Header.Get("Content-Type") != "" {
		t.Fatalf("string body: %s %v", d.lastBody, d.last.Header)
	}
	// A refusal is kept too: the client sees what the upstream said.
	d.Set(providertest.FailPermanent)
	o = d.p.Deliver(context.Background(), delivery("declined", string(d.ValidPayload())))
	if o.Kind != providers.KindFailed || !strings.Contains(string(o.Result), "card_declined") {
		t.Fatalf("refusal: %v %s", o.Kind, o.Result)
	}
}

func TestPrivateUpstreamRefusedUnlessAllowed(t *testing.T) {
	t.Parallel()
	u := newUpstream(t)
	p, err := New(Config{BaseURL: u.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	o := p.Deliver(context.Background(), delivery("x", `{"method":"GET","path":"/"}`))
	if o.Kind != providers.KindFailed || !strings.Contains(o.Err.Error(), "not allowed") || u.last != nil {
		t.Fatalf("%v %v; upstream got %v", o.Kind, o.Err, u.last)
	}
	for _, bad := range []string{"", "ftp://x", "http://", "https://u:p@x.example"} {
		if _, err := New(Config{BaseURL: bad}); err == nil {
			t.Errorf("base_url %q accepted", bad)
		}
	}
	if _, err := New(Config{BaseURL: "https://x.example", Headers: map[string]string{"A": "b\r\nc: d"}}); err == nil {
		t.Error("a configured header with CR/LF was accepted")
	}
}

// An upstream that echoes its request does not hand the configured credentials to whoever reads the result.
func TestConfiguredCredentialsAreRedactedFromResults(t *testing.T) {
	t.Parallel()
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/echo?auth="+r.Header.Get("Authorization"))
		w.WriteHeader(200)
		_, _ = w.Write([]byte("you sent: " + r.Header.Get("Authorization") + " and " + r.Header.Get("X-Api-Key")))
	}))
	defer echo.Close()
	p, err := New(Config{BaseURL: echo.URL, AllowPrivateNetworks: true,
		Headers: map[string]string{"Authorization": "Bearer sk_live_secret123", "X-Api-Key": "key-abcdef12"}})
	if err != nil {
		t.Fatal(err)
	}
	o := p.Deliver(context.Background(), delivery("echo", `{"method":"GET","path":"/"}`))
	if o.Kind != providers.KindDelivered {
		t.Fatalf("%v %v", o.Kind, o.Err)
	}
	for _, secret := range []string{"sk_live_secret123", "key-abcdef12"} {
		if strings.Contains(string(o.Result), secret) {
			t.Fatalf("result holds %q: %s", secret, o.Result)
		}
	}
	if !strings.Contains(string(o.Result), "[redacted]") {
		t.Fatalf("result %s", o.Result)
	}
}

// A payload path cannot climb out of base_url, however it is spelled, and a base_url query (which no request
// would send) is refused at start-up rather than dropped.
func TestPathsStayUnderTheBaseURL(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"/../escape", "/a/../../b", "/%2e%2e/x", "/a/%2E%2E", "/./a", "/a/.."} {
		err := (&Provider{}).Validate(json.RawMessage(`{"method":"GET","path":` + strconv.Quote(path) + `}`))
		var fe *providers.FieldError
		if !errors.As(err, &fe) || fe.Field != "payload.path" {
			t.Errorf("path %q: %v, want refused naming path", path, err)
		}
	}
	for _, path := range []string{"/a/b", "/a..b/c", "/.well-known/x", "/a?b=../c"} {
		if err := (&Provider{}).Validate(json.RawMessage(`{"method":"GET","path":` + strconv.Quote(path) + `}`)); err != nil {
			t.Errorf("path %q refused: %v", path, err)
		}
	}
	for _, base := range []string{"https://api.example/v1?token=x", "https://api.example/v1#frag", "https://api.example/?"} {
		if _, err := New(Config{BaseURL: base}); err == nil || strings.Contains(err.Error(), "token") {
			t.Errorf("base_url %q: %v, want refused without quoting it", base, err)
		}
	}
}

// One attempt is one request at the upstream: when a reused connection is reset after the request was
// written, the attempt ends in doubt, and Go's Transport must not resend it by itself because the request
// carries an Idempotency-Key (an outside tester saw two upstream calls within a millisecond, the second
// answer stored, under at_most_once too).
func TestAResetConnectionIsNotRetriedBehindTheAttempt(t *testing.T) {
	t.Parallel()
	srv := providertest.NewResetting(t)
	p, err := New(Config{BaseURL: srv.URL, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, method := range []string{"POST", "DELETE"} { // with a body, and without one
		before := srv.Requests()
		payload := `{"method":"` + method + `","path":"/x","body":{"a":1}}`
		if method == "DELETE" {
			payload = `{"method":"DELETE","path":"/x"}`
		}
		if o := p.Deliver(context.Background(), delivery("first-"+method, payload)); o.Kind != providers.KindDelivered {
			t.Fatalf("%s on a new connection: %v %v", method, o.Kind, o.Err)
		}
		o := p.Deliver(context.Background(), delivery("second-"+method, payload))
		if o.Kind == providers.KindDelivered {
			t.Fatalf("%s: delivered on a connection that was reset", method)
		}
		if n := srv.Requests() - before; n != 2 {
			t.Fatalf("%s: the upstream read %d requests for two attempts", method, n)
		}
	}
}
