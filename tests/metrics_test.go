package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

// metricNamesIn lists the oncegate_* metrics that the Go files of dirs (tests excluded) define, as
// collector options (Name: "…") or descriptors (NewDesc("…")).
func metricNamesIn(t *testing.T, dirs ...string) []string {
	t.Helper()
	def := regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(oncegate_[a-z0-9_]+)"`)
	var names []string
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join("..", dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range def.FindAllStringSubmatch(string(src), -1) {
				names = append(names, m[1])
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("no metrics defined in %v", dirs)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// lintScrape fails t for every problem promlint finds in a /metrics answer.
func lintScrape(t *testing.T, who, scrape string) {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(scrape)).Lint()
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	for _, p := range problems {
		t.Errorf("%s: promlint: %s: %s", who, p.Metric, p.Text)
	}
}

// missing lists the names that have no family in scrape.
func missing(scrape string, names []string) []string {
	var out []string
	for _, n := range names {
		if !strings.Contains(scrape, "\n# TYPE "+n+" ") {
			out = append(out, n)
		}
	}
	return out
}

// The gateway's and the worker's /metrics pass promlint after a run that makes every one of their metrics
// appear: effects created, replayed, refused as key reuses and over the rate; deliveries that succeed, fail
// for good, retry and die; a breaker open with rows waiting behind it; a row rescued from a gateway killed in
// the middle of its delivery; a job run by a worker, and its sweeps.
func TestMetricsPassPromlint(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hanging.Close()
	letGo := sync.OnceFunc(func() { close(release) })
	defer letGo() // before Close, which waits for the handler
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) }))
	defer down.Close()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(400) }))
	defer refusing.Close()
	hook := func(url, extra string) string {
		return fmt.Sprintf(`{ provider: webhook, webhook: { url: "%s", secret: "%s", allow_private_networks: true }%s }`,
			url, whsec, extra)
	}
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  acme: { api_keys: [%s] }
  slow: { api_keys: [%s], rate: { requests_per_second: 0.001, request_burst: 1 } }
effect_types:
  clicks: { provider: postgres }
  hung: %s
  refused: %s
  doomed: %s
  blocked: %s
  proxied: { provider: http, http: { base_url: "%s", allow_private_networks: true } }
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey, slowKey,
		hook(hanging.URL, ", timeout: 3s"),
		hook(refusing.URL, ""),
		hook(down.URL, ", retry: { max_attempts: 2, base_delay: 10ms, max_delay: 10ms }, breaker: { failures: 100 }"),
		hook(down.URL+"/blocked", ", breaker: { failures: 1, open_for: 1h }"), refusing.URL))

	// A gateway killed inside a delivery, for the row that the next one rescues.
	first, firstBase := startGateway(t, config)
	if code := post(t, firstBase, "hung:1", `{"type":"hung","payload":{"event":"e","data":1}}`); code != 202 {
		t.Fatalf("hung: %d", code)
	}
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery never reached the receiver")
	}
	first.Kill()
	letGo()

	_, base := startGateway(t, config)
	click := `{"type":"clicks","payload":{"name":"c"}}`
	for _, r := range []struct {
		key, body, apiKey string
		want              int
	}{
		{"click:1", click, apiKey, 202}, {"click:1", click, apiKey, 202}, // a replay of a pending one, or 200
		{"click:1", `{"type":"clicks","payload":{"name":"other"}}`, apiKey, 422},
		{"refused:1", `{"type":"refused","payload":{"event":"e","data":1}}`, apiKey, 202},
		{"doomed:1", `{"type":"doomed","payload":{"event":"e","data":1}}`, apiKey, 202},
		{"blocked:1", `{"type":"blocked","payload":{"event":"e","data":1}}`, apiKey, 202},
		{"blocked:2", `{"type":"blocked","payload":{"event":"e","data":2}}`, apiKey, 202},
		{"slow:1", click, slowKey, 202}, {"slow:2", click, slowKey, 429},
	} {
		code, _, _ := exchange(t, "POST", base+"/v1/effects", r.apiKey, r.body, "Idempotency-Key: "+r.key)
		if code != r.want && !(r.want == 202 && code == 200) {
			t.Fatalf("%s: %d, want %d", r.key, code, r.want)
		}
	}

	// Through the dedup proxy: the upstream's 400 comes back, stored (oncegate_proxy_requests_total).
	if code, _, _ := exchange(t, "POST", base+"/v1/proxy/proxied/orders", apiKey, `{"n":1}`, "Idempotency-Key: p:1"); code != 400 {
		t.Fatalf("proxied: %d, want the upstream's 400", code)
	}

	// The linter is no formality: a counter without _total and a unit that is not a base unit are caught.
	if problems, _ := promlint.New(strings.NewReader("# HELP oncegate_bad_ms x\n# TYPE oncegate_bad_ms counter\n" +
		"oncegate_bad_ms 1\n")).Lint(); len(problems) < 2 {
		t.Fatalf("promlint found %v in a bad exposition", problems)
	}
	gatewayMetrics := metricNamesIn(t, "gateway", "outbox")
	var scrapeText string
	deadline := time.Now().Add(60 * time.Second)
	for {
		scrapeText = scrape(t, base)
		if len(missing(scrapeText, gatewayMetrics)) == 0 &&
			strings.Contains(scrapeText, `oncegate_effects_finished_total{status="dead",type="doomed"} 1`) &&
			strings.Contains(scrapeText, `oncegate_effects_finished_total{status="failed",type="refused"} 1`) &&
			strings.Contains(scrapeText, `oncegate_breakers_open{type="blocked"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway's metrics lack %v after a minute:\n%s", missing(scrapeText, gatewayMetrics), scrapeText)
		}
		time.Sleep(200 * time.Millisecond)
	}
	lintScrape(t, "gateway", scrapeText)

	// A worker that runs a job through that gateway.
	rdb := testenv.Redis(t)
	q, err := queue.New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: it runs after the cleanup that stops the worker process started below, which
	// would otherwise write the queue's keys again once it is gone.
	t.Cleanup(func() { _ = q.Destroy(context.Background()) })
	if _, err := q.Enqueue(context.Background(), queue.NewJob{ID: "click:user_1", Kind: "click",
		Payload: []byte(`{"user":"user_1","link":"/x"}`)}); err != nil {
		t.Fatal(err)
	}
	metricsAddr := freeTCPAddr(t)
	w := proctest.Start(t, exec.Command(filepath.Join(bin, "worker"), "run", "--queue", q.Name(), "--gateway", base,
		"--api-key", apiKey, "--redis", testenv.RedisURL(), "--click-type", "clicks", "--metrics", metricsAddr))
	w.WaitLine("worker ", 30*time.Second)
	workerMetrics := metricNamesIn(t, "queue/queuemetrics")
	deadline = time.Now().Add(60 * time.Second)
	for {
		scrapeText = scrape(t, "http://"+metricsAddr)
		if len(missing(scrapeText, workerMetrics)) == 0 && strings.Contains(scrapeText, `outcome="completed"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker's metrics lack %v after a minute:\n%s", missing(scrapeText, workerMetrics), scrapeText)
		}
		time.Sleep(200 * time.Millisecond)
	}
	lintScrape(t, "worker", scrapeText)
	t.Logf("gateway metrics %v and worker metrics %v lint clean", gatewayMetrics, workerMetrics)
}
