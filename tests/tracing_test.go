package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/oncegate/oncegate/internal/testkit/jaegertest"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
)

// One job's trace in a real Jaeger: enqueue (in this process), lease and handler (worker), the worker's call
// to the gateway, the gateway's handler and dedup insert, the dispatch and the SMTP send. A re-run after the
// worker is SIGKILLed appears in the same trace as a second lease whose gateway call is a replay.
func TestJobTraceInJaeger(t *testing.T) {
	t.Parallel()
	jg := jaegertest.Start(t)
	otelEnv := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + jg.OTLP, "OTEL_BSP_SCHEDULE_DELAY=100"}

	dbURL := pgtest.Database(t)
	mail := smtptest.Start(t)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  welcome-email: { provider: smtp, smtp: { addr: "%s", from: "Acme <noreply@acme.test>" } }
dispatcher: { poll_interval: 100ms }
`, dbURL, apiKey, mail.Addr))
	gw := exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config)
	gw.Env = append(os.Environ(), otelEnv...)
	gp := proctest.Start(t, gw)
	base := gatewayBase(t, gp)

	// The producer: this test, with a tracer exporting to the same Jaeger.
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(jg.OTLP+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	res, _ := resource.New(context.Background(), resource.WithAttributes(attribute.String("service.name", "oncegate-producer")))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	defer tp.Shutdown(context.Background()) //nolint:errcheck
	rdb := testenv.Redis(t)
	q, err := queue.New(rdb, testenv.Name(t, "q"), &queue.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: it runs after the cleanups that stop the worker processes started below, which
	// would otherwise write the queue's keys again once it is gone.
	t.Cleanup(func() { _ = q.Destroy(context.Background()) })
	enqueue := func(user string) string {
		payload, _ := json.Marshal(jobs.Signup{User: user, Email: user + "@example.com"})
		r, err := q.Enqueue(context.Background(), queue.NewJob{ID: "signup:" + user, Kind: jobs.KindSignup, Payload: payload})
		if err != nil {
			t.Fatal(err)
		}
		return r.Job.TraceContext["traceparent"][3:35]
	}
	worker := func() *proctest.Proc {
		cmd := exec.Command(filepath.Join(bin, "worker"), "run", "--queue", q.Name(), "--work", "3s",
			"--gateway", base, "--api-key", apiKey, "--redis", testenv.RedisURL())
		cmd.Env = append(os.Environ(), otelEnv...)
		p := proctest.Start(t, cmd)
		p.WaitLine("worker ", 30*time.Second)
		return p
	}

	// A job that runs once.
	first := worker()
	traceID := enqueue("user_1")
	var spans []jaegertest.Span
	want := []string{"queue.enqueue", "queue.lease", "queue.handle signup", "POST /v1/effects", "dedup.record",
		"outbox.dispatch welcome-email", "smtp.send"}
	testenv.Eventually(t, 30*time.Second, "the job's trace holds every span", func() bool {
		spans, _ = jg.Trace(traceID)
		return hasAll(spans, want...) && hasService(spans, "oncegate-worker", "oncegate-gateway", "oncegate-producer")
	})
	for _, s := range spans {
		t.Logf("%-18s %-34s %v", s.Service, s.OperationName, pick(s.Tags, "idempotency.key", "idempotency.replayed", "effect.status"))
	}
	server := find(spans, "POST /v1/effects", "oncegate-gateway")
	if server == nil || server.Tags["idempotency.key"] != "welcome-email:signup:user_1" || server.Tags["idempotency.replayed"] != false {
		t.Fatalf("gateway span: %+v", server)
	}

	// A job whose worker is SIGKILLed after the email went out: the re-run is in the same trace, and its
	// gateway call is a replay.
	mailed := make(chan struct{}, 1)
	mail.OnMessage(func(m smtptest.Message) {
		if m.To[0] == "user_2@example.com" {
			mailed <- struct{}{}
		}
	})
	traceID = enqueue("user_2")
	<-mailed
	// Kill the worker once its call to the gateway is in Jaeger (the job still works for 3s): the re-run's
	// spans must join a trace that already holds the first run's.
	testenv.Eventually(t, 20*time.Second, "the first worker's gateway call is in the trace", func() bool {
		spans, _ = jg.Trace(traceID)
		return countService(spans, "POST", "oncegate-worker") == 1 // otelhttp's client span, "HTTP POST"
	})
	first.Kill()
	worker()
	testenv.Eventually(t, 40*time.Second, "the re-run's replay is in the trace", func() bool {
		spans, _ = jg.Trace(traceID)
		return count(spans, "queue.lease") == 2 && countTag(spans, "POST /v1/effects", "idempotency.replayed", true) == 1
	})
	for _, s := range spans {
		t.Logf("%-18s %-34s %v", s.Service, s.OperationName, pick(s.Tags, "idempotency.replayed", "job.epoch"))
	}
	if n := countTag(spans, "POST /v1/effects", "idempotency.replayed", false); n != 1 {
		t.Fatalf("%d first-time gateway calls in the trace, want 1", n)
	}
	if n := count(spans, "smtp.send"); n != 1 {
		t.Fatalf("%d SMTP sends in the trace, want 1", n)
	}
}

func hasAll(spans []jaegertest.Span, prefixes ...string) bool {
	for _, p := range prefixes {
		if count(spans, p) == 0 {
			return false
		}
	}
	return true
}

func hasService(spans []jaegertest.Span, services ...string) bool {
	seen := map[string]bool{}
	for _, s := range spans {
		seen[s.Service] = true
	}
	for _, s := range services {
		if !seen[s] {
			return false
		}
	}
	return true
}

func count(spans []jaegertest.Span, prefix string) int {
	n := 0
	for _, s := range spans {
		if strings.HasPrefix(s.OperationName, prefix) {
			n++
		}
	}
	return n
}

func countTag(spans []jaegertest.Span, prefix, key string, value any) int {
	n := 0
	for _, s := range spans {
		if strings.HasPrefix(s.OperationName, prefix) && s.Tags[key] == value {
			n++
		}
	}
	return n
}

// countService counts the spans of service whose operation name contains part.
func countService(spans []jaegertest.Span, part, service string) int {
	n := 0
	for _, s := range spans {
		if strings.Contains(s.OperationName, part) && s.Service == service {
			n++
		}
	}
	return n
}

func find(spans []jaegertest.Span, prefix, service string) *jaegertest.Span {
	for i, s := range spans {
		if strings.HasPrefix(s.OperationName, prefix) && s.Service == service {
			return &spans[i]
		}
	}
	return nil
}

func pick(tags map[string]any, keys ...string) map[string]any {
	out := map[string]any{}
	for _, k := range keys {
		if v, ok := tags[k]; ok {
			out[k] = v
		}
	}
	return out
}
