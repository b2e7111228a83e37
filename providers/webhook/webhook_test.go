package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/providertest"
	"github.com/oncegate/oncegate/providers"
)

var (
	secretA = "whsec_" + base64.StdEncoding.EncodeToString([]byte("first-secret-of-32-bytes-length!"))
	secretB = "whsec_" + base64.StdEncoding.EncodeToString([]byte("rotated-secret-also-32-bytes-ok!"))
)

// receiver is a real webhook receiver on loopback that checks every signature, as a receiver following
// Standard Webhooks would, and counts deliveries by webhook-id.
type receiver struct {
	t         *testing.T
	srv       *httptest.Server
	mu        sync.Mutex
	behaviour providertest.Behaviour
	received  map[string]int
	requests  []*http.Request
	bodies    [][]byte
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{t: t, received: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func verify(secret string, h http.Header, body []byte) bool {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s.%s.%s", h.Get("webhook-id"), h.Get("webhook-timestamp"), body)
	want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	b := r.behaviour
	r.requests = append(r.requests, req)
	r.bodies = append(r.bodies, body)
	r.mu.Unlock()
	switch b {
	case providertest.FailTransient:
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(503)
		return
	case providertest.FailPermanent:
		w.WriteHeader(422)
		_, _ = w.Write([]byte(`{"error":"unknown event"}`))
		return
	case providertest.Hang:
		<-req.Context().Done()
		return
	}
	if !verify(secretA, req.Header, body) {
		w.WriteHeader(401)
		return
	}
	r.mu.Lock()
	r.received[req.Header.Get("webhook-id")]++
	r.mu.Unlock()
	w.WriteHeader(200)
	_, _ = w.Write([]byte(`{"ok":true}`))
}

func (r *receiver) Set(b providertest.Behaviour) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.behaviour = b
	return true
}

type dest struct {
	*receiver
	p *Provider
}

func (d dest) Provider() providers.Provider { return d.p }
func (d dest) Deliver(ctx context.Context, del providers.Delivery) providers.Outcome {
	return d.p.Deliver(ctx, del)
}
func (d dest) Received(del providers.Delivery) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.received[del.StableID]
}
func (d dest) ValidPayload() json.RawMessage {
	return json.RawMessage(`{"event":"order.paid","data":{"order":42}}`)
}
func (d dest) InvalidPayloads() map[string]json.RawMessage {
	return map[string]json.RawMessage{
		"payload.event": json.RawMessage(`{"data":{}}`),
		"payload.data":  json.RawMessage(`{"event":"x"}`),
		"payload.url":   json.RawMessage(`{"event":"x","data":1,"url":"https://evil.example/x"}`),
		"payload.extra": json.RawMessage(`{"event":"x","data":1,"extra":true}`),
	}
}

func newDest(t *testing.T) providertest.Destination {
	r := newReceiver(t)
	p, err := New(Config{URL: r.srv.URL + "/hooks", Secret: secretA, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	return dest{r, p}
}

func TestConformance(t *testing.T) {
	providertest.Exercise(t, providertest.Capabilities{}, newDest)
}

func delivery(key, payload string) providers.Delivery {
	return providers.Delivery{Tenant: "acme", Key: key, StableID: effect.NewStableID("acme", key),
		Payload: json.RawMessage(payload), Attempt: 1, CreatedAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
}

// Standard Webhooks: a stable webhook-id (also the Idempotency-Key), a fresh timestamp, one v1 signature per
// secret; the body is {type, timestamp, data} and is the same on every attempt.
func TestRequestsFollowStandardWebhooks(t *testing.T) {
	t.Parallel()
	r := newReceiver(t)
	p, err := New(Config{URL: r.srv.URL, Secret: secretA, Secrets: []string{secretB}, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	d := delivery("order:42", `{"event":"order.paid","data":{"order":42,"note":"<b>&"}}`)
	for range 2 {
		if o := p.Deliver(context.Background(), d); o.Kind != providers.KindDelivered {
			t.Fatalf("%v %v", o.Kind, o.Err)
		}
	}
	for i, req := range r.requests {
		h := req.Header
		if h.Get("webhook-id") != d.StableID || h.Get("Idempotency-Key") != d.StableID || strings.Contains(h.Get("webhook-id"), "order:42") {
			t.Fatalf("ids: %v", h)
		}
		ts, _ := strconv.ParseInt(h.Get("webhook-timestamp"), 10, 64)
		if time.Since(time.Unix(ts, 0)).Abs() > 5*time.Second {
			t.Fatalf("webhook-timestamp %d is not now", ts)
		}
		if sigs := strings.Fields(h.Get("webhook-signature")); len(sigs) != 2 {
			t.Fatalf("signatures %q, want one per secret", sigs)
		}
		if !verify(secretA, h, r.bodies[i]) || !verify(secretB, h, r.bodies[i]) {
			t.Fatal("a signature does not verify")
		}
		if verify("whsec_"+base64.StdEncoding.EncodeToString([]byte("some-other-secret-32-bytes-long!")), h, r.bodies[i]) {
			t.Fatal("a wrong secret verifies")
		}
		if h.Get("Content-Type") != "application/json" || req.Method != "POST" {
			t.Fatalf("request %s %v", req.Method, h)
		}
	}
	if string(r.bodies[0]) != string(r.bodies[1]) {
		t.Fatalf("the body changed between attempts:\n%s\n%s", r.bodies[0], r.bodies[1])
	}
	// data as the tenant sent it: no \u003c for "<", no reordering.
	if !strings.Contains(string(r.bodies[0]), `"data":{"order":42,"note":"<b>&"}`) {
		t.Fatalf("data was re-encoded: %s", r.bodies[0])
	}
	var body map[string]any
	if err := json.Unmarshal(r.bodies[0], &body); err != nil || body["type"] != "order.paid" ||
		body["timestamp"] != "2026-11-29T12:00:00Z" || body["data"].(map[string]any)["note"] != "<b>&" {
		t.Fatalf("body %s", r.bodies[0])
	}
}

func TestConfigIsChecked(t *testing.T) {
	for _, c := range []Config{
		{URL: "https://h.example/x"},
		{URL: "https://h.example/x", Secret: "not-whsec"},
		{URL: "https://h.example/x", Secret: "whsec_" + base64.StdEncoding.EncodeToString([]byte("short"))},
		{URL: "ftp://h.example/x", Secret: secretA},
		{URL: "https://user:pw@h.example/x", Secret: secretA},
		{Secret: secretA},
		// A secret listed twice, which signs every request twice (an outside tester's).
		{URL: "https://h.example/x", Secret: secretA, Secrets: []string{secretB, secretA}},
		{URL: "https://h.example/x", Secrets: []string{secretB, secretB}},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// Loopback, private and metadata destinations are refused at dial time unless allowed, wherever the URL
// comes from; a redirect is not followed, so it cannot lead a request anywhere.
func TestPrivateDestinationsAndRedirectsAreRefused(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "SSRF", "Webhook to loopback (default URL, allowed host names, ::1), a redirect to another server", "Refused before or at dial; redirects not followed; the receivers got nothing")
	result("0 requests reached")
	r := newReceiver(t)
	port := r.srv.URL[strings.LastIndex(r.srv.URL, ":")+1:]
	p, err := New(Config{URL: r.srv.URL, Secret: secretA, AllowedHosts: []string{"http://localhost:" + port, "*.internal.test"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"", "http://localhost:" + port + "/x", "http://[::1]:" + port + "/"} {
		payload := `{"event":"e","data":1}`
		if u != "" {
			payload = `{"event":"e","data":1,"url":"` + u + `"}`
		}
		d := delivery("ssrf", payload)
		if err := p.Validate(d.Payload); err != nil {
			var fe *providers.FieldError
			if !errors.As(err, &fe) || u != "http://[::1]:"+port+"/" {
				t.Fatalf("%s: validation %v", u, err)
			}
			continue // ::1 is not an allowed host: refused before any dial
		}
		o := p.Deliver(context.Background(), d)
		if o.Kind != providers.KindFailed || !strings.Contains(o.Err.Error(), "not allowed") {
			t.Fatalf("%q: outcome %v %v, want refused", u, o.Kind, o.Err)
		}
	}
	if len(r.requests) != 0 {
		t.Fatalf("the loopback receiver got %d requests", len(r.requests))
	}
	for _, host := range []string{"a.internal.test", "deep.a.internal.test"} {
		if err := p.Validate(json.RawMessage(`{"event":"e","data":1,"url":"https://` + host + `/"}`)); err != nil {
			t.Errorf("%s refused: %v", host, err)
		}
	}
	if err := p.Validate(json.RawMessage(`{"event":"e","data":1,"url":"https://internal.test.evil.example/"}`)); err == nil {
		t.Error("a look-alike host was allowed")
	}

	// A receiver that redirects to another server: the redirect is the answer, not followed.
	target := newReceiver(t)
	redirector := httptest.NewServer(http.RedirectHandler(target.srv.URL, http.StatusFound))
	defer redirector.Close()
	pr, _ := New(Config{URL: redirector.URL, Secret: secretA, AllowPrivateNetworks: true})
	if o := pr.Deliver(context.Background(), delivery("redirect", `{"event":"e","data":1}`)); o.Kind != providers.KindFailed {
		t.Fatalf("redirect: %v %v", o.Kind, o.Err)
	}
	if len(target.requests) != 0 {
		t.Fatal("the redirect was followed")
	}
}

// One attempt is one request at the receiver: a reused connection reset after the request was written is not
// resent by Go's Transport behind the attempt's back (it would, for a request with an Idempotency-Key).
func TestAResetConnectionIsNotRetriedBehindTheAttempt(t *testing.T) {
	t.Parallel()
	srv := providertest.NewResetting(t)
	p, err := New(Config{URL: srv.URL + "/hooks", Secret: secretA, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	del := func(key string) providers.Delivery {
		return providers.Delivery{Tenant: "acme", Key: key, StableID: effect.NewStableID("acme", key),
			Payload: json.RawMessage(`{"event":"order.paid","data":{"order":42}}`), Attempt: 1, CreatedAt: time.Now()}
	}
	if o := p.Deliver(context.Background(), del("first")); o.Kind != providers.KindDelivered {
		t.Fatalf("on a new connection: %v %v", o.Kind, o.Err)
	}
	if o := p.Deliver(context.Background(), del("second")); o.Kind == providers.KindDelivered {
		t.Fatal("delivered on a connection that was reset")
	}
	if n := srv.Requests(); n != 2 {
		t.Fatalf("the receiver read %d requests for two attempts", n)
	}
}
