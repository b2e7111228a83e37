package gateway

import (
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// The caller's trace context reaches the effect and its outbox row (from where its delivery continues the
// trace) whether the gateway starts a span per request or not (Options.NoServerSpans, when nothing would
// receive the spans), and a request without one records none.
func TestTraceContextReachesTheOutboxWithOrWithoutServerSpans(t *testing.T) {
	// The propagator the binaries install (internal/telemetry): tests otherwise run with otel's, which reads
	// nothing.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, noSpans := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoServerSpans=%v", noSpans), func(t *testing.T) {
			cfg := testConfig(t, pgtest.Database(t))
			cfg.Dispatcher.Disabled = true
			h := serveWith(t, cfg, Options{NoServerSpans: noSpans})
			if r := h.req("POST", "/v1/effects", acmeKey, analytics("traced"), "Idempotency-Key: traced",
				"Traceparent: 00-"+trace+"-00f067aa0ba902b7-01"); r.status != 202 {
				t.Fatalf("traced request: %d %s", r.status, r.raw)
			}
			if r := h.post("untraced", analytics("untraced")); r.status != 202 {
				t.Fatalf("untraced request: %d %s", r.status, r.raw)
			}
			var parent, traceID string
			if err := h.pool.QueryRow(t.Context(), `SELECT o.trace ->> 'traceparent', e.trace_id FROM oncegate_outbox o
				JOIN oncegate_effects e ON e.id = o.effect_id WHERE e.key = 'traced'`).Scan(&parent, &traceID); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(parent, "00-"+trace+"-") || traceID != trace {
				t.Errorf("outbox traceparent %q, effect trace id %q: want trace %s", parent, traceID, trace)
			}
			if n := h.count(`SELECT count(*) FROM oncegate_outbox o JOIN oncegate_effects e ON e.id = o.effect_id
				WHERE e.key = 'untraced' AND (o.trace IS NOT NULL OR e.trace_id IS NOT NULL)`); n != 0 {
				t.Errorf("a request without a trace context recorded one")
			}
		})
	}
}
