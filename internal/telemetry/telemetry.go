// Package telemetry sets up each binary's OpenTelemetry tracing from the standard OTEL_* environment, and its
// JSON logs with the trace and span of each record. With no OTLP endpoint configured nothing is exported, but
// trace context still flows from enqueue to provider, so a trace started elsewhere continues here.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Version is the version reported in traces, set at build time with -ldflags "-X ...telemetry.Version=v1.2.3".
var Version = "dev"

// Telemetry is one binary's tracing.
type Telemetry struct {
	// Provider is installed as otel's global tracer provider.
	Provider trace.TracerProvider
	// Children is for driver hooks (Redis, Postgres): it records spans only inside a trace that already
	// exists, so background polling (leases, heartbeats, claims) does not fill the tracing backend with
	// traces of their own. It shares Provider's exporter.
	Children trace.TracerProvider
	shutdown []func(context.Context) error
}

// Shutdown flushes and stops the exporters.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// Exporting reports whether the environment asks for traces to be exported.
func Exporting() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the W3C propagator and, when the environment configures an OTLP endpoint, an exporter over
// HTTP (the default) or gRPC (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL=grpc). service names the binary;
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it.
func Setup(ctx context.Context, service string) (*Telemetry, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Exporting() {
		np := noop.NewTracerProvider()
		return &Telemetry{Provider: otel.GetTracerProvider(), Children: np}, nil
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service), attribute.String("service.version", Version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	bsp := sdktrace.NewBatchSpanProcessor(exp)
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(bsp))
	children := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(bsp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	otel.SetTracerProvider(tp)
	return &Telemetry{Provider: tp, Children: children, shutdown: []func(context.Context) error{tp.Shutdown}}, nil
}

// Logger returns a JSON logger at level whose records carry trace_id and span_id when logged with a context
// inside a span (log.InfoContext(ctx, ...)).
func Logger(w io.Writer, level slog.Level, service string) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})
	return slog.New(traceHandler{h}).With("service", service)
}

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}
func (h traceHandler) WithGroup(n string) slog.Handler { return traceHandler{h.Handler.WithGroup(n)} }

// ParseLevel reads debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var lv slog.Level
	err := lv.UnmarshalText([]byte(s))
	return lv, err
}

// Start sets up a binary's logs and tracing: a JSON logger at level (debug, info, warn or error), installed
// as slog's default, with service=name on every record; and tracing from the environment as service
// "oncegate-<name>". stop flushes and stops the exporter.
func Start(level, name string) (log *slog.Logger, tel *Telemetry, stop func(), err error) {
	lv, err := ParseLevel(level)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("log level: %w", err)
	}
	log = Logger(os.Stderr, lv, name)
	slog.SetDefault(log)
	tel, err = Setup(context.Background(), "oncegate-"+name)
	if err != nil {
		return nil, nil, nil, err
	}
	return log, tel, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(ctx)
	}, nil
}

// RedisLog passes go-redis's own messages (a pool that cannot dial, a Sentinel that does not answer) to log
// as warnings, through redis.SetLogger: go-redis prints them as plain lines on stderr, into a stream that is
// otherwise JSON, where a log collector could not read them.
type RedisLog struct{ Log *slog.Logger }

// Printf logs one message of go-redis.
func (l RedisLog) Printf(ctx context.Context, format string, v ...any) {
	l.Log.WarnContext(ctx, "redis: "+strings.TrimSpace(fmt.Sprintf(format, v...)))
}
