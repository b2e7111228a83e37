package http

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/providers"
)

func headerPayload(name, value string) json.RawMessage {
	h, _ := json.Marshal(map[string]string{name: value})
	return json.RawMessage(`{"method":"GET","path":"/x","headers":` + string(h) + `}`)
}

// refusedAs checks that err is a field error naming payload.headers.<name>.
func refusedAs(t *testing.T, err error, name, why string) {
	t.Helper()
	var fe *providers.FieldError
	if !errors.As(err, &fe) || fe.Field != "payload.headers."+name {
		t.Errorf("%s %q: %v, want refused naming payload.headers.%s", why, name, err, name)
	}
}

// Finding 7 of issue 13: a tenant could set headers that the upstream or the proxies before it trust to say
// who is calling, how the request is framed, or which credential it carries (an underscore twin of the
// configured one reaches nginx, CGI and WSGI apps as the same variable). Each is refused at request time,
// naming the header.
func TestPayloadHeadersThatSpeakForTheGatewayAreRefused(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input", "http payload headers that spoof the client, reframe the request, belong to one hop, or twin the configured credential (X_Api_Key for X-Api-Key)",
		"Refused at request time, 400 naming payload.headers.<name>")
	p, err := New(Config{BaseURL: "https://api.example", Headers: map[string]string{"X-Api-Key": "key-abcdef12", "Authorization": "Bearer sk"}})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{
		// who is calling, and from where
		"X-Forwarded-For", "x-forwarded-for", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Prefix", "Forwarded",
		"X-Real-IP", "X-Client-IP", "True-Client-IP", "CF-Connecting-IP", "Cookie",
		// where, and by which method, a front end routes it
		"X-Original-URL", "X-Rewrite-URL", "X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override",
		// one hop's, or the framing's
		"Connection", "Keep-Alive", "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Proxy-Connection",
		"Proxy-Authorization", "Proxy-Authenticate", "Proxy-Anything", "Host", "Content-Length", "Idempotency-Key",
		// the configured credentials, and names servers read as the same
		"X-Api-Key", "x-api-key", "X_Api_Key", "x_api_key", "X.Api.Key", "Authorization", "AUTHORIZATION",
		// twins of the others
		"X_Forwarded_For", "Content_Length", "Transfer_Encoding", "Idempotency_Key", "Proxy_Authorization",
	}
	for _, name := range names {
		refusedAs(t, p.Validate(headerPayload(name, "v")), name, "header")
	}
	result(fmt.Sprintf("%d/%d refused, each naming its header", len(names), len(names)))
}

// Control bytes and bytes outside an HTTP token in a header name, and control bytes in a value, were accepted
// and then refused by net/http at every attempt. Every byte is tried in a name and in a value: what Validate
// accepts reaches a real upstream as sent, and what it refuses names the header.
func TestPayloadHeaderBytesAreRefusedAtRequestTimeOrSent(t *testing.T) {
	t.Parallel()
	p, lastHeaders := echoHeaders(t)
	sentNames, sentValues, refusedNames, refusedValues := 0, 0, 0, 0
	for b := range 256 {
		c := string(rune(b)) // as the JSON payload carries it: bytes from 0x80 are UTF-8
		for _, side := range []string{"name", "value"} {
			name, value := "X-A"+c+"b", "v"+c+"w"
			if side == "name" {
				value = "v"
			} else {
				name = "X-A"
			}
			payload := headerPayload(name, value)
			if err := p.Validate(payload); err != nil {
				refusedAs(t, err, name, side+" with byte "+fmt.Sprintf("%#x", b))
				if side == "name" {
					refusedNames++
				} else {
					refusedValues++
				}
				continue
			}
			o := p.Deliver(context.Background(), delivery(fmt.Sprintf("%s-%d", side, b), string(payload)))
			if o.Kind != providers.KindDelivered {
				t.Errorf("%s with byte %#x accepted, then %v: %v", side, b, o.Kind, o.Err)
				continue
			}
			v := lastHeaders().Get(name)
			if v != strings.Trim(value, " \t") {
				t.Errorf("%s with byte %#x: the upstream got %q, want %q", side, b, v, value)
			}
			if side == "name" {
				sentNames++
			} else {
				sentValues++
			}
		}
	}
	t.Logf("names: %d bytes sent, %d refused; values: %d sent, %d refused", sentNames, refusedNames, sentValues, refusedValues)
	// A token holds letters, digits and !#$%&'*+-.^_`|~ (RFC 9110 §5.6.2): 77 bytes. A value refuses the
	// control bytes but tab: 0x00 to 0x1f less 0x09, and 0x7f.
	if sentNames != 77 || refusedValues != 32 {
		t.Errorf("sent %d name bytes (want the 77 token characters), refused %d value bytes (want the 32 controls but tab)",
			sentNames, refusedValues)
	}
	// The tenant's own ordinary headers pass, and reach the upstream.
	for name, value := range map[string]string{"X-Trace": "t1", "User-Agent": "mine/1", "Accept": "application/json",
		"Content-Type": "text/plain", "X-Unicode": "héllo", "X-Tab": "a\tb", "X-Empty": ""} {
		if err := p.Validate(headerPayload(name, value)); err != nil {
			t.Errorf("%s: %q refused: %v", name, value, err)
		}
	}
}

// The configured headers are checked the same way at start-up: a header net/http would refuse at send time,
// or one that belongs to one hop or to the framing, stops start-up rather than failing every request.
func TestConfiguredHeadersAreCheckedAtStartUp(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{"X-A": "b\x01c", "X\x01A": "v", "X A": "v", "X:A": "v", "": "v",
		"Connection": "close", "Transfer-Encoding": "chunked", "Host": "other.example", "Content_Length": "5",
		"Idempotency-Key": "k", "Upgrade": "h2c", "Keep-Alive": "timeout=5", "Proxy-Connection": "keep-alive", "TE": "trailers"} {
		if _, err := New(Config{BaseURL: "https://api.example", Headers: map[string]string{name: value}}); err == nil {
			t.Errorf("configured header %q: %q accepted", name, value)
		}
	}
	if _, err := New(Config{BaseURL: "https://api.example", Headers: map[string]string{"Authorization": "Bearer x",
		"X-Api-Key": "k", "Cookie": "session=operator"}}); err != nil {
		t.Errorf("ordinary configured headers refused: %v", err)
	}
}

// An outside tester's finding (issue 14's adversary): a payload's headers could set traceparent (malformed, or
// 6 KB of it), tracestate and baggage, and the upstream got them as sent; baggage and tracestate even when the
// creating request's own trace context overwrote the traceparent. The trace context is the gateway's to set,
// from the request that created the effect, and baggage is never sent (as the dedup proxy drops them).
// Refused at request time; an effect stored before this rule is delivered without them.
func TestPayloadTraceContextHeadersAreRefusedAndNeverSent(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input", "http payload headers that set traceparent (malformed), tracestate or baggage",
		"Refused at request time, 400 naming payload.headers.<name>; an effect stored before is delivered without them")
	p, lastHeaders := echoHeaders(t)
	for _, name := range []string{"traceparent", "Traceparent", "TRACESTATE", "tracestate", "Baggage", "baggage"} {
		refusedAs(t, p.Validate(headerPayload(name, "v")), name, "trace context header")
	}

	stored := json.RawMessage(`{"method":"POST","path":"/x","headers":{"traceparent":"ff-garbage","tracestate":"tenant=secret",` +
		`"baggage":"secret=1","X-Kept":"yes"}}`)
	for _, withTrace := range []bool{false, true} {
		ctx := context.Background()
		want := ""
		if withTrace {
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9}, SpanID: trace.SpanID{8},
				TraceFlags: trace.FlagsSampled, Remote: true})
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
			want = "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
		}
		if out := p.Deliver(ctx, delivery("tc", string(stored))); out.Kind != providers.KindDelivered {
			t.Fatalf("a stored effect with trace headers in its payload: %v, want delivered without them", out)
		}
		h := lastHeaders()
		if h.Get("Traceparent") != want || h.Get("Tracestate") != "" || h.Get("Baggage") != "" {
			t.Errorf("with a trace in the delivery's context %v, the upstream got traceparent %q, tracestate %q, baggage %q; "+
				"want traceparent %q and neither of the others", withTrace, h.Get("Traceparent"), h.Get("Tracestate"),
				h.Get("Baggage"), want)
		}
		if h.Get("X-Kept") != "yes" {
			t.Error("the payload's other headers were not sent")
		}
	}
	result("6/6 refused; a stored effect's upstream got only the delivery's own traceparent")
}

// echoHeaders returns a provider whose upstream, a real server on loopback, keeps the headers of the last
// request it got.
func echoHeaders(t *testing.T) (*Provider, func() http.Header) {
	t.Helper()
	var mu sync.Mutex
	var got http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
		w.WriteHeader(204)
	}))
	t.Cleanup(up.Close)
	p, err := New(Config{BaseURL: up.URL, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p, func() http.Header {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}
