// Package jaegertest runs a real Jaeger (v2, in-memory storage) for tests, every listener on loopback, and
// reads traces back through its query API. The binary comes from scripts/jaeger, which builds it once into a
// cache folder; without it the test is skipped, saying so, except under CI, where it fails.
package jaegertest

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// Version is the Jaeger release the project tests against.
const Version = "v1.76.0"

// Binary returns the Jaeger binary: JAEGER_BIN, or the one scripts/jaeger caches.
func Binary() string {
	if b := os.Getenv("JAEGER_BIN"); b != "" {
		return b
	}
	cache := os.Getenv("ONCEGATE_CACHE")
	if cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(dir, "oncegate")
	}
	b := filepath.Join(cache, "jaeger-"+Version)
	if _, err := os.Stat(b); err != nil {
		return ""
	}
	return b
}

// Jaeger is a running Jaeger.
type Jaeger struct {
	// OTLP is the OTLP/HTTP endpoint, for OTEL_EXPORTER_OTLP_ENDPOINT.
	OTLP string
	// Query is the base URL of the query API and UI.
	Query string
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs Jaeger until the test ends. Without a built binary it skips the test, since a cold build takes
// minutes and the module proxy; under CI it fails it instead, as CI must have built one.
func Start(t *testing.T) *Jaeger {
	t.Helper()
	bin := Binary()
	if bin == "" {
		const how = "run scripts/jaeger to build " + Version + " (scripts/test does, when the module proxy is reachable)"
		if testenv.CI() {
			t.Fatal("no Jaeger binary, and under CI the tracing tests must run: " + how)
		}
		t.Skip("no Jaeger binary: " + how)
	}
	otlp, query, grpcQ := freePort(t), freePort(t), freePort(t)
	cfg := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, query, grpcQ, otlp)
	path := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", "file:"+path)
	cmd.Env = append(os.Environ(), "JAEGER_LISTEN_HOST=127.0.0.1")
	proctest.Start(t, cmd)
	j := &Jaeger{OTLP: fmt.Sprintf("http://127.0.0.1:%d", otlp), Query: fmt.Sprintf("http://127.0.0.1:%d", query)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(j.Query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return j
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger did not answer on %s within 30s: %v", j.Query, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StartIfBuilt runs Jaeger like Start when a binary is built, and returns nil when none is, for a test that
// checks traces only as part of what it checks. Under CI it is Start: a missing binary fails the test.
func StartIfBuilt(t *testing.T) *Jaeger {
	t.Helper()
	if Binary() == "" && !testenv.CI() {
		return nil
	}
	return Start(t)
}

// Span is a span as the v1 query API returns it, with its service and tags flattened.
type Span struct {
	TraceID       string
	SpanID        string
	ParentSpanID  string
	OperationName string
	Service       string
	Tags          map[string]any
	Start         time.Time
}

// Trace returns the spans of a trace (hex trace ID), or nil when Jaeger does not have it (yet).
func (j *Jaeger) Trace(traceID string) ([]Span, error) {
	resp, err := http.Get(j.Query + "/api/traces/" + traceID)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == 404 {
		return nil, nil
	}
	var body struct {
		Data []struct {
			Spans []struct {
				TraceID       string `json:"traceID"`
				SpanID        string `json:"spanID"`
				OperationName string `json:"operationName"`
				ProcessID     string `json:"processID"`
				StartTime     int64  `json:"startTime"`
				References    []struct {
					RefType string `json:"refType"`
					SpanID  string `json:"spanID"`
				} `json:"references"`
				Tags []struct {
					Key   string `json:"key"`
					Value any    `json:"value"`
				} `json:"tags"`
			} `json:"spans"`
			Processes map[string]struct {
				ServiceName string `json:"serviceName"`
			} `json:"processes"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	var out []Span
	for _, tr := range body.Data {
		for _, s := range tr.Spans {
			sp := Span{TraceID: s.TraceID, SpanID: s.SpanID, OperationName: s.OperationName,
				Service: tr.Processes[s.ProcessID].ServiceName, Tags: map[string]any{}, Start: time.UnixMicro(s.StartTime)}
			for _, r := range s.References {
				if r.RefType == "CHILD_OF" {
					sp.ParentSpanID = r.SpanID
				}
			}
			for _, tg := range s.Tags {
				sp.Tags[tg.Key] = tg.Value
			}
			out = append(out, sp)
		}
	}
	return out, nil
}
