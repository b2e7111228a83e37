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
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/pgtest"
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
