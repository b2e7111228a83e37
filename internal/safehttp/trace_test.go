package safehttp

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The destination gets the trace context of the delivery whether the gateway exports spans or not, and never
// the baggage. Without a recording span (no exporter: the common case) no client span is made, which is the
// point; with one, the client span is recorded and the destination sees it as its parent.
func TestTraceContextReachesTheDestinationWithOrWithoutSpans(t *testing.T) {
	var mu sync.Mutex
	var parents, bags []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		parents, bags = append(parents, r.Header.Get("Traceparent")), append(bags, r.Header.Get("Baggage"))
		mu.Unlock()
		w.WriteHeader(204)
	}))
	defer srv.Close()
	client := Client(true)
	defer client.CloseIdleConnections()
	send := func(ctx context.Context) (sent *http.Request, traceparent string) {
		t.Helper()
		member, _ := baggage.NewMember("tenant_secret", "s3cret")
		bag, _ := baggage.New(member)
		req, err := http.NewRequestWithContext(baggage.ContextWithBaggage(ctx, bag), "POST", srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		defer mu.Unlock()
		if b := bags[len(bags)-1]; b != "" {
			t.Errorf("the destination got baggage %q", b)
		}
		return req, parents[len(parents)-1]
	}

	if _, tp := send(context.Background()); tp != "" {
		t.Errorf("without a trace the destination got traceparent %q", tp)
	}

	remote := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6},
		TraceFlags: trace.FlagsSampled, Remote: true})
	req, tp := send(trace.ContextWithRemoteSpanContext(context.Background(), remote))
	if want := "00-" + remote.TraceID().String() + "-" + remote.SpanID().String() + "-01"; tp != want {
		t.Errorf("without a recording span the destination got traceparent %q, want %q", tp, want)
	}
	if req.Header.Get("Traceparent") != "" {
		t.Error("the caller's request was changed: a RoundTripper must not")
	}

	rec := tracetest.NewSpanRecorder()
	tp0 := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp0.Shutdown(context.Background()) }()
	ctx, parent := tp0.Tracer("test").Start(context.Background(), "deliver")
	_, tp = send(ctx)
	parent.End()
	var client0 sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			client0 = s
		}
	}
	if client0 == nil {
		t.Fatal("with a recording span no client span was recorded")
	}
	if client0.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("the client span's parent is %s, want the delivery's span %s", client0.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	if want := "00-" + client0.SpanContext().TraceID().String() + "-" + client0.SpanContext().SpanID().String() + "-01"; tp != want {
		t.Errorf("with a recording span the destination got traceparent %q, want the client span's %q", tp, want)
	}
}

// As many connections to one destination stay open as were in use at once: a type delivering to one host with
// a concurrency of 64 used to close half of them each time its deliveries went idle together, and dial them
// again a moment later (issue 14).
func TestConnectionsInUseAtOnceAreKept(t *testing.T) {
	const inFlight, waves = 64, 3
	var mu sync.Mutex
	dialed := 0
	var arrived sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived.Done()
		arrived.Wait() // every request of the wave holds its connection until all have one
		w.WriteHeader(204)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			dialed++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	client := Client(true)
	defer client.CloseIdleConnections()
	for wave := range waves {
		arrived.Add(inFlight)
		var wg sync.WaitGroup
		for range inFlight {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			})
		}
		wg.Wait()
		mu.Lock()
		got := dialed
		mu.Unlock()
		if got != inFlight {
			t.Fatalf("after wave %d, %d connections were opened; want %d: the first wave's, kept", wave+1, got, inFlight)
		}
	}
}

// A provider's Close releases its idle connections through the client, and so through traced.
func TestCloseIdleConnectionsReachesTheTransport(t *testing.T) {
	closed := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	client := Client(true)
	resp, err := client.Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	client.CloseIdleConnections()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the idle connection stayed open after CloseIdleConnections")
	}
}
