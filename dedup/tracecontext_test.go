package dedup

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// The trace id of the request that creates an effect is stored with it, for the operator (`oncegate effect
// show`, the console's search by trace id), whether the effect is recorded for the dispatcher (Create) or
// performed in the request (CreateLeased, the dedup proxy's path).
func TestTheCreatingRequestsTraceIDIsStored(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	if _, _, err := s.Create(ctx, NewEffect{Tenant: "t", Key: "queued", Type: "typ", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.CreateLeased(ctx, NewEffect{Tenant: "t", Key: "performed", Type: "typ", Payload: json.RawMessage(`{}`)},
		nil, Holder{Owner: "me", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"queued", "performed"} {
		var got *string
		if err := pool.QueryRow(context.Background(), `SELECT trace_id FROM oncegate_effects WHERE key = $1`, key).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == nil || *got != tid.String() {
			t.Errorf("%s: trace id %v, want %s", key, got, tid)
		}
	}
}
