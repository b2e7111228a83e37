package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestLogsCarryTraceAndSpanIDs(t *testing.T) {
	var buf bytes.Buffer
	log := Logger(&buf, slog.LevelInfo, "worker")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled})
	log.With("queue", "jobs").InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "job done", "job", "j1")
	log.Debug("hidden at info")
	log.Info("outside a span")
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("%d lines: %s", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal(lines[0], &rec); err != nil {
		t.Fatal(err)
	}
	if rec["trace_id"] != sc.TraceID().String() || rec["span_id"] != sc.SpanID().String() || rec["service"] != "worker" ||
		rec["queue"] != "jobs" || rec["job"] != "j1" {
		t.Fatalf("record %v", rec)
	}
	if bytes.Contains(lines[1], []byte("trace_id")) {
		t.Fatalf("a record outside a span has a trace id: %s", lines[1])
	}
	if _, err := ParseLevel("loud"); err == nil {
		t.Fatal("a bad level parsed")
	}
}

func TestNothingExportedWithoutAnEndpoint(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	if Exporting() {
		t.Fatal("exporting with no endpoint")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	if !Exporting() {
		t.Fatal("not exporting with an endpoint")
	}
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if Exporting() {
		t.Fatal("exporting with the SDK disabled")
	}
}
