package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

const (
	acmeKey   = "acme-api-key-4f7b2c9e1d3a8b6c5e0f"
	globexKey = "globex-api-key-9a1c3e5b7d2f4a6c8e0b"
)

// harness is a gateway serving on loopback over a database of the test's own, with two tenants.
type harness struct {
	t    *testing.T
	url  string
	db   string
	pool *pgxpool.Pool
	g    *Gateway
	logs *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testConfig(t *testing.T, dbURL string) *Config {
	t.Helper()
	cfg := &Config{DatabaseURL: dbURL, Listen: "127.0.0.1:0",
		Tenants: map[string]Tenant{"acme": {APIKeys: []string{acmeKey}}, "globex": {APIKeys: []string{globexKey}}}}
	cfg.Dispatcher.PollInterval = Duration(100 * time.Millisecond)
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func startGateway(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	return startGatewayOn(t, pgtest.Database(t), mutate)
}

// startGatewayOn is startGateway on a database the test made (on a private cluster, say).
func startGatewayOn(t *testing.T, dbURL string, mutate func(*Config)) *harness {
	t.Helper()
	cfg := testConfig(t, dbURL)
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.WithDefaults().validate(); err != nil {
		t.Fatal(err)
	}
	return serve(t, cfg)
}

func serve(t *testing.T, cfg *Config) *harness {
	t.Helper()
	return serveWith(t, cfg, Options{})
}

// serveWith is serve with opts (its Logger is the harness's).
func serveWith(t *testing.T, cfg *Config, opts Options) *harness {
	t.Helper()
	logs := &syncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	g, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Serve(ctx, l) }()
	h := &harness{t: t, url: "http://" + l.Addr().String(), db: cfg.DatabaseURL, g: g, logs: logs}
	h.pool = pgtest.Pool(t, cfg.DatabaseURL)
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("gateway did not shut down within 30s")
		}
		g.Close()
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs.String())
		}
	})
	return h
}

type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// noRedirects hands a redirect back to the test, which sees the gateway's answer as it was.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// req sends a request as it is written (the path is not cleaned, like curl --path-as-is); headers are "Name: value" strings. A nil apiKey sends no Authorization header.
func (h *harness) req(method, path, apiKey, body string, headers ...string) response {
	h.t.Helper()
	r, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if apiKey != "" {
		r.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	given := map[string]bool{}
	for _, hv := range headers {
		k, v, _ := strings.Cut(hv, ": ")
		if given[k] {
			r.Header.Add(k, v) // named twice: send it twice
		} else {
			r.Header.Set(k, v)
		}
		given[k] = true
	}
	resp, err := noRedirects.Do(r)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := response{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &out.body)
	return out
}

// post creates an effect as acme.
func (h *harness) post(key, body string) response {
	h.t.Helper()
	return h.req("POST", "/v1/effects", acmeKey, body, "Idempotency-Key: "+key)
}

func (h *harness) count(query string, args ...any) int {
	h.t.Helper()
	return pgtest.Count(h.t, h.pool, query, args...)
}

func (h *harness) waitStatus(apiKey, key, status string) response {
	h.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := h.req("GET", "/v1/effects/"+key+"?wait=2s", apiKey, "")
		if r.body["status"] == status {
			return r
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("effect %s never reached %s: %s", key, status, r.raw)
		}
	}
}

func analytics(name string) string {
	return `{"type":"analytics","payload":{"name":"` + name + `"}}`
}
