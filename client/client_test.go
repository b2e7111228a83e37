package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

const key = "client-test-key-5d2b8f4a6c1e3d7b9f0a"

// startGateway runs a real gateway on a database of the test's own and returns its URL and database pool.
func startGateway(t *testing.T) string {
	t.Helper()
	cfg := &gateway.Config{DatabaseURL: pgtest.Database(t),
		Tenants: map[string]gateway.Tenant{"acme": {APIKeys: []string{key}}}}
	g, err := gateway.New(cfg, gateway.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = g.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done; g.Close() })
	return "http://" + l.Addr().String()
}

func TestPerformReplayAndProblems(t *testing.T) {
	t.Parallel()
	c, err := New(startGateway(t), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e, err := c.Perform(ctx, "signup:1", "analytics", map[string]any{"name": "signup"}, &PerformOptions{Wait: 5 * time.Second})
	if err != nil || e.Status != "delivered" || e.Replayed || !e.Terminal() {
		t.Fatalf("first: %+v %v", e, err)
	}
	e, err = c.Perform(ctx, "signup:1", "analytics", map[string]any{"name": "signup"}, nil)
	if err != nil || !e.Replayed || e.Status != "delivered" {
		t.Fatalf("replay: %+v %v", e, err)
	}
	_, err = c.Perform(ctx, "signup:1", "analytics", map[string]any{"name": "other"}, nil)
	var pe *ProblemError
	if !errors.Is(err, ErrKeyReused) || !errors.As(err, &pe) || pe.Status != 422 {
		t.Fatalf("reuse: %v", err)
	}
	_, err = c.Perform(ctx, "bad", "analytics", map[string]any{"nom": "x"}, nil)
	if !errors.Is(err, ErrInvalid) || !errors.As(err, &pe) || pe.Field != "payload.nom" {
		t.Fatalf("invalid: %v", err)
	}
	bad, _ := New(c.base, "wrong-key-123", &Options{MaxTries: 1})
	if _, err := bad.Perform(ctx, "k", "analytics", map[string]any{"name": "x"}, nil); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("bad key: %v", err)
	}
	got, err := c.Get(ctx, "signup:1", 0)
	if err != nil || got.Status != "delivered" {
		t.Fatalf("get: %+v %v", got, err)
	}
}

// A gateway that answers 503 twice, then works: the call succeeds with the same key, one effect recorded;
// and the caller's trace context travels in the request.
func TestRetriesTransientFailuresWithTheSameKey(t *testing.T) {
	t.Parallel()
	target, _ := url.Parse(startGateway(t))
	proxy := httputil.NewSingleHostReverseProxy(target)
	var calls atomic.Int32
	var keys, traces []string
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		traces = append(traces, r.Header.Get("traceparent"))
		if n <= 2 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(503)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	c, _ := New(front.URL, key, &Options{RetryBase: time.Millisecond})
	tid := trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled}))
	e, err := c.Perform(ctx, "order:9", "analytics", map[string]any{"name": "order"}, nil)
	if err != nil || e.Replayed {
		t.Fatalf("%+v %v", e, err)
	}
	if calls.Load() != 3 || keys[0] != "order:9" || keys[2] != "order:9" {
		t.Fatalf("%d calls with keys %v", calls.Load(), keys)
	}
	if traces[2] == "" || traces[2][3:35] != tid.String() {
		t.Fatalf("traceparent %q", traces[2])
	}
	// Exhausted tries return the last problem.
	c1, _ := New(front.URL, key, &Options{MaxTries: 1})
	calls.Store(0)
	if _, err := c1.Perform(ctx, "x", "analytics", map[string]any{"name": "x"}, nil); err == nil {
		t.Fatal("a 503 with one try allowed succeeded")
	}
}

func TestForJobDerivesKeysAndFences(t *testing.T) {
	t.Parallel()
	c, _ := New(startGateway(t), key, nil)
	ctx := context.Background()
	first := c.ForJob("signup:user_6", 1)
	if first.Key("welcome-email") != "welcome-email:signup:user_6" {
		t.Fatal(first.Key("welcome-email"))
	}
	if _, err := first.Perform(ctx, "welcome-event", "analytics", map[string]any{"name": "w"}, nil); err != nil {
		t.Fatal(err)
	}
	// The job is re-run under epoch 2: its effect is a replay.
	second := c.ForJob("signup:user_6", 2)
	e, err := second.Perform(ctx, "welcome-event", "analytics", map[string]any{"name": "w"}, nil)
	if err != nil || !e.Replayed {
		t.Fatalf("re-run: %+v %v", e, err)
	}
	// The first run, still alive somewhere, may not start a new effect now.
	if _, err := first.Perform(ctx, "audit-event", "analytics", map[string]any{"name": "a"}, nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale epoch: %v", err)
	}
}

func TestNewChecksItsArguments(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x"} {
		if _, err := New(u, key, nil); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if _, err := New("http://x", "", nil); err == nil {
		t.Error("empty key accepted")
	}
}

// countingServer answers every request with status, and a problem of type typ for an error, and counts the
// requests.
func countingServer(t *testing.T, status int, typ string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if status < 300 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, `{"key":"k","type":"analytics","status":"pending","attempts":0}`)
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"type":"`+typ+`","title":"t","status":`+strconv.Itoa(status)+`}`)
	}))
	t.Cleanup(s.Close)
	return s, &n
}

// A request the gateway could never accept (a key with a line break, which no HTTP client can send, or any
// key that is not 1-255 visible ASCII; a job ID that is no header value; a wait over 30 s) fails at once,
// as ErrInvalid naming the field, and reaches no server: it used to be tried 8 times over 8 s.
func TestUnsendableRequestsFailAtOnceWithoutARequest(t *testing.T) {
	t.Parallel()
	s, n := countingServer(t, 202, "")
	c, err := New(s.URL, key, nil) // the default 8 tries
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	payload := map[string]any{"name": "x"}
	cases := []struct {
		name, key, typ string
		payload        any
		opts           *PerformOptions
		field          string
	}{
		{"a line break in the key", "signup:1\r\nX-Injected: 1", "analytics", payload, nil, "Idempotency-Key"},
		{"a line feed in the key", "signup:1\n", "analytics", payload, nil, "Idempotency-Key"},
		{"an empty key", "", "analytics", payload, nil, "Idempotency-Key"},
		{"a space in the key", "sign up", "analytics", payload, nil, "Idempotency-Key"},
		{"a tab in the key", "sign\tup", "analytics", payload, nil, "Idempotency-Key"},
		{"a NUL in the key", "sign\x00up", "analytics", payload, nil, "Idempotency-Key"},
		{"non-ASCII in the key", "signé", "analytics", payload, nil, "Idempotency-Key"},
		{"a key of 256 bytes", strings.Repeat("k", 256), "analytics", payload, nil, "Idempotency-Key"},
		{"no type", "k", "", payload, nil, "type"},
		{"a payload that is no JSON object", "k", "analytics", []int{1}, nil, "payload"},
		{"a nil payload", "k", "analytics", nil, nil, "payload"},
		{"a wait over 30s", "k", "analytics", payload, &PerformOptions{Wait: 31 * time.Second}, "wait"},
		{"a line break in the job ID", "k", "analytics", payload, &PerformOptions{JobID: "job\n1", JobEpoch: 1}, "Oncegate-Job-Id"},
		{"a job ID over 512 bytes", "k", "analytics", payload, &PerformOptions{JobID: strings.Repeat("j", 513), JobEpoch: 1}, "Oncegate-Job-Id"},
		{"a job ID without an epoch", "k", "analytics", payload, &PerformOptions{JobID: "job-1"}, "Oncegate-Job-Epoch"},
		{"a queue name that is not UTF-8", "k", "analytics", payload, &PerformOptions{JobID: "job-1", JobEpoch: 1, JobQueue: "q\xff"}, "Oncegate-Job-Queue"},
		{"a creation past 9999", "k", "analytics", payload, &PerformOptions{JobID: "job-1", JobEpoch: 1, JobCreated: time.Unix(1<<62, 0)}, "Oncegate-Job-Created"},
		{"a creation before 1970", "k", "analytics", payload, &PerformOptions{JobID: "job-1", JobEpoch: 1, JobCreated: time.Unix(-5, 0)}, "Oncegate-Job-Created"},
	}
	for _, c2 := range cases {
		_, err := c.Perform(ctx, c2.key, c2.typ, c2.payload, c2.opts)
		var ie *InvalidError
		if !errors.Is(err, ErrInvalid) || !errors.As(err, &ie) || ie.Field != c2.field {
			t.Errorf("%s: %v, want ErrInvalid naming %s", c2.name, err, c2.field)
		}
	}
	// The queue takes such IDs; the key made of one is not the caller's to fix, the job's ID is.
	for _, id := range []string{"job\r\n1", "ctrl\nid", "user é", "a b"} {
		_, err := c.ForJob(id, 1).Perform(ctx, "welcome", "analytics", payload, nil)
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Field != "Oncegate-Job-Id" {
			t.Errorf("ForJob with the job ID %q: %v, want ErrInvalid naming Oncegate-Job-Id", id, err)
		}
	}
	if _, err := (&Client{}).Perform(ctx, "k", "analytics", payload, nil); err == nil || strings.Contains(err.Error(), "%!") {
		t.Errorf("a Client{} not made by New: %v", err)
	}
	if _, err := c.Get(ctx, "a\nb", 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("Get with a line break in the key: %v", err)
	}
	if got := n.Load(); got != 0 {
		t.Fatalf("%d requests reached the server", got)
	}
	// What can be sent is sent, once: every visible ASCII byte, 255 of them, a leading quote included.
	for _, k := range []string{strings.Repeat("k", 255), `!"#$%&'()*+,-./:;<=>?@[\]^_{|}~`, `"quoted"`} {
		if _, err := c.Perform(ctx, k, "analytics", payload, nil); err != nil {
			t.Errorf("key %q: %v", k, err)
		}
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("%d requests for 3 sendable keys", got)
	}
}

// Answers that no retry changes come back after one request: 400, 401, 403, 404, 409, 413, 415, 422.
func TestPermanentAnswersAreNotRetried(t *testing.T) {
	t.Parallel()
	for status, typ := range map[int]string{400: "/problems/invalid-request", 401: "/problems/unauthorized",
		403: "/problems/effect-type-not-allowed", 404: "/problems/not-found", 409: "/problems/job-fenced",
		413: "/problems/body-too-large", 415: "/problems/unsupported-media-type", 422: "/problems/idempotency-key-reused"} {
		s, n := countingServer(t, status, typ)
		c, _ := New(s.URL, key, &Options{RetryBase: time.Millisecond})
		_, err := c.Perform(context.Background(), "k", "analytics", map[string]any{"name": "x"}, nil)
		var pe *ProblemError
		if !errors.As(err, &pe) || pe.Status != status || pe.Type != typ || n.Load() != 1 {
			t.Errorf("%d: %v after %d requests, want the problem after 1", status, err, n.Load())
		}
	}
	// And those that can change are retried, up to MaxTries.
	for _, status := range []int{408, 429, 500, 502, 503} {
		s, n := countingServer(t, status, "/problems/unavailable")
		c, _ := New(s.URL, key, &Options{MaxTries: 3, RetryBase: time.Millisecond, RetryMax: time.Millisecond})
		if _, err := c.Perform(context.Background(), "k", "analytics", map[string]any{"name": "x"}, nil); err == nil || n.Load() != 3 {
			t.Errorf("%d: %v after %d requests, want 3", status, err, n.Load())
		}
	}
}

// Against a real gateway: a body over its limit is a 413 after one request.
func TestRealGatewayTooLargeIsNotRetried(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	counting := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		n.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})}
	c, _ := New(startGateway(t), key, &Options{HTTPClient: counting, RetryBase: time.Millisecond})
	_, err := c.Perform(context.Background(), "big", "analytics", map[string]any{"name": strings.Repeat("x", 300<<10)}, nil)
	var pe *ProblemError
	if !errors.As(err, &pe) || pe.Status != 413 || n.Load() != 1 {
		t.Fatalf("%v after %d requests", err, n.Load())
	}
	// A key that starts with a quote is sent quoted, so the gateway records the key itself, which Get finds.
	e, err := c.Perform(context.Background(), `"quoted\"`, "analytics", map[string]any{"name": "x"}, nil)
	if err != nil || e.Key != `"quoted\"` {
		t.Fatalf("quoted key: %+v %v", e, err)
	}
	if e, err := c.Get(context.Background(), `"quoted\"`, 0); err != nil || e.Key != `"quoted\"` {
		t.Fatalf("get of the quoted key: %+v %v", e, err)
	}
	n.Store(1)
	// And a key with a line break makes no request at all.
	if _, err := c.Perform(context.Background(), "a\nb", "analytics", map[string]any{"name": "x"}, nil); !errors.Is(err, ErrInvalid) || n.Load() != 1 {
		t.Fatalf("%v after %d requests", err, n.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The client's idea of a sendable key and of its header is the gateway's: every key the client sends is
// read back by dedup.ParseKey as exactly that key, and every key it refuses ParseKey refuses too.
func TestKeyRulesAreTheGateways(t *testing.T) {
	t.Parallel()
	keys := []string{"k", `"k"`, `"`, `""`, `a"b`, `\`, `"a\b"`, `"\"`, strings.Repeat("k", 255), `"` + strings.Repeat("k", 254),
		strings.Repeat("k", 256), "", " k", "k ", "a b", "a\tb", "a\nb", "é", "\x7f"}
	for c := 0; c < 256; c++ {
		keys = append(keys, "k"+string(rune(c)), string([]byte{byte(c)}))
	}
	for _, k := range keys {
		got, perr := dedup.ParseKey(keyHeader(k))
		cerr := checkKey(k)
		if cerr == nil && (perr != nil || got != k) {
			t.Errorf("%q: the client sends %q, the gateway reads %q, %v", k, keyHeader(k), got, perr)
		}
		if cerr != nil && perr == nil && got == k {
			t.Errorf("%q: the client refuses a key the gateway accepts: %v", k, cerr)
		}
	}
	if MaxKeyLen != dedup.MaxKeyLen || MaxWait != gateway.MaxWait {
		t.Errorf("client limits %d, %v; gateway's %d, %v", MaxKeyLen, MaxWait, dedup.MaxKeyLen, gateway.MaxWait)
	}
}
