// Command gatewaybench measures the gateway on the same Postgres, in one run, at each number of clients of
// -clients (1, 8 and 32 by default):
//
//   - accepts: new effects per second, and p50/p99 latency, from concurrent HTTP clients posting new
//     idempotency keys to a real gateway process running as an API node (--no-dispatch);
//   - replays: requests per second that repeat a key already used (they write nothing);
//   - pgbench: the single-request insert statement (effect + outbox row, one transaction; the gateway
//     announces new effects after the commit, batched, so no NOTIFY) run raw by pgbench with as many clients,
//     as the yardstick: group commit is how the gateway goes past it.
//
// Then deliveries, by a second gateway process that only dispatches: the backlog of the accept phases with the
// postgres (analytics insert) provider, and -webhooks signed webhooks to a local receiver, then as many of a
// webhook type with a fleet-wide rate far above what the machine delivers (the cost of a limit, beside the
// unlimited type of the same run). The gateways' largest resident memory is reported for every phase.
//
// Then the dedup proxy (/v1/proxy/{type}) at -proxy-clients clients, against a local upstream that answers
// at once: calls to the upstream directly (the yardstick), proxied calls under new keys (recorded, performed
// in the request, recorded again), and replays of them; the overhead is the proxied p50/p99 less the direct.
// The load's CPU there includes the upstream's, which runs in this process.
//
// It ends with issue 32's goals, each beside this run's figure, and one line that scripts read:
// `lone: accepts 1 client A.AAx pgbench, 8 clients B.BBx, 32 clients C.CCx; proxy new-call overhead D.DD ms
// p50 (one commit E.EE ms)`, where E is the p50 of one client's one-row inserts, each its own transaction,
// timed in the same run: one commit and one loopback round trip, which no accept can go below.
//
// Run it with scripts/bench or `make bench`; it creates and drops a database of its own. GATEWAYBENCH_CONFIG
// is added to the gateways' configuration as YAML (`group_commit: { parallel: 1 }`), to compare settings.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/partitions"
)

var (
	clientList = flag.String("clients", "1,8,32", "concurrent clients of each phase, a comma-separated list; pgbench runs with each")
	duration   = flag.Duration("duration", 5*time.Second, "length of each measured phase")
	gwBin      = flag.String("gateway", "bin/gateway", "the gateway binary")
	hooks      = flag.Int("webhooks", 20000, "webhook effects in the webhook delivery phase")
	proxyConc  = flag.Int("proxy-clients", 8, "concurrent clients of the dedup proxy phases; 0 skips them")
	windowConc = flag.Int("window-clients", 32, "concurrent clients of the crash-window phase; 0 skips it")
	windowOnly = flag.Bool("window-only", false, "run the crash-window phase alone")
	proxyOnly  = flag.Bool("proxy-only", false, "run the dedup proxy phases alone")
	parts      = flag.Int("partitions", 0, "daily partitions of the effects, their replays and bodies made ahead before the phases, "+
		"as a database that keeps a month has (0: the new database's own)")
)

const apiKey = "bench-api-key-4a7c1e9f3b5d8a2c6e0f"

const tableHeader = "| phase | clients | per second | p50 | p99 | pgbench, same clients | ratio | requests a statement | gateway RSS max | CPU µs a request: gateway / Postgres / load |\n|---|---|---|---|---|---|---|---|---|---|"

func main() {
	flag.Parse()
	log.SetFlags(0)
	var counts []int
	for _, f := range strings.Split(*clientList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("-clients: %q is not a number of clients", f)
		}
		counts = append(counts, n)
	}
	ctx := context.Background()
	// The Postgres the tests use (DATABASE_URL, as internal/testkit/pgtest reads it), without linking test code.
	admin := os.Getenv("DATABASE_URL")
	if admin == "" {
		admin = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	name := fmt.Sprintf("oncegate_bench_%d", time.Now().Unix())
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		log.Fatal(err)
	}
	defer func() {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		conn.Close(ctx)
	}()
	u, err := url.Parse(admin)
	if err != nil {
		log.Fatalf("DATABASE_URL: %v", err)
	}
	u.Path = "/" + name
	dbURL := u.String()
	var sync_, version string
	_ = conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('server_version')").Scan(&sync_, &version)

	dir, err := os.MkdirTemp("", "gatewaybench-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The webhook receiver: a local server that answers 204 and counts what it gets.
	var received atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		received.Add(1)
		w.WriteHeader(204)
	}))
	defer receiver.Close()
	// The proxy's upstream: a local server that answers a small JSON body at once.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		_, _ = io.WriteString(w, `{"id":"ch_1","amount":2000,"currency":"usd","status":"succeeded"}`)
	}))
	defer upstream.Close()
	// The mail server of the window phase: it accepts every message.
	mail, err := smtptest.New("127.0.0.1:0")
	must(err)
	defer mail.Close()

	cfg := filepath.Join(dir, "gateway.yaml")
	// The tenant's rates are far above what one machine serves: the limiter runs on every request, so its
	// cost is measured, and refuses none.
	must(os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { bench: { api_keys: [%s], rate: { requests_per_second: 1000000, request_burst: 1000000, bytes_per_second: 1000MiB, byte_burst: 1000MiB } } }
%s
effect_types:
  analytics: { provider: postgres, tenant_concurrency: 128 }
  up:
    provider: http
    concurrency: 64
    tenant_concurrency: 64
    http: { base_url: "%s", allow_private_networks: true }
  hook:
    provider: webhook
    concurrency: 64
    tenant_concurrency: 64
    webhook: { url: "%s/hook", secret: "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", allow_private_networks: true }
  hooklimited:
    provider: webhook
    concurrency: 64
    tenant_concurrency: 64
    webhook: { url: "%s/hook", secret: "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", allow_private_networks: true }
    rate: { per_second: 10000, burst: 1000 }   # far above what one machine delivers: its cost, not its limit
  mail:
    provider: smtp
    concurrency: 64
    tenant_concurrency: 64
    smtp: { addr: "%s", from: "Bench <bench@example.test>", starttls: "off" }
`, dbURL, apiKey, os.Getenv("GATEWAYBENCH_CONFIG"), upstream.URL, receiver.URL, receiver.URL, mail.Addr)), 0o600))
	dbconn, err := pgx.Connect(ctx, dbURL)
	must(err)
	defer dbconn.Close(ctx)
	if *parts > 0 {
		// Made ahead, not behind: the count is what every statement over the effects pays for, and partitions
		// ahead are neither retired by the gateway's manager nor in the way of the new database's first one.
		migrate := exec.Command(*gwBin, "migrate")
		migrate.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
		if out, err := migrate.CombinedOutput(); err != nil {
			log.Fatalf("gateway migrate: %v\n%s", err, out)
		}
		for _, t := range []partitions.Table{partitions.Effects, partitions.Replays, partitions.Bodies} {
			if _, err := partitions.Ensure(ctx, dbconn, t, 24*time.Hour, *parts, time.Now()); err != nil {
				log.Fatalf("-partitions: %s: %v", t.Name, err)
			}
		}
		var n int
		must(dbconn.QueryRow(ctx, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'oncegate_effects'::regclass").Scan(&n))
		fmt.Printf("%d partitions of the effects, and as many of their replays and bodies\n", n)
	}

	fmt.Printf("Postgres %s (synchronous_commit=%s), %v a phase, GOMAXPROCS of the machine: %d cores\n\n", version,
		sync_, *duration, runtime.NumCPU())
	if *windowOnly {
		windowPhase(ctx, cfg, dbconn, *windowConc)
		return
	}
	if *proxyOnly {
		fmt.Println(tableHeader)
		proxyPhases(cfg, upstream.URL, *proxyConc)
		return
	}
	fmt.Println(tableHeader)
	var next atomic.Int64
	var lastAccepts float64
	var lastCreated int64
	acceptRatio, replayRatio := map[int]float64{}, map[int]float64{}
	for _, c := range counts {
		// An API-only gateway takes the load; pgbench runs after it has stopped, so neither shares the cores.
		api := startGateway(cfg, "--no-dispatch")
		first := next.Load()
		accepts := load(api, c, func() string { return fmt.Sprintf("k%d", next.Add(1)) }, 202)
		created := next.Load()
		acceptBatch := api.meanBatch()
		replays := load(api, c, func() string { return fmt.Sprintf("k%d", first+1+time.Now().UnixNano()%(created-first)) }, 200)
		replayBatch := api.meanBatch()
		api.stop()
		pgb, pgbCPU := pgbench(dir, dbURL, c)
		fmt.Printf("| accepts (new keys) | %d | %.0f | %v | %v | %.0f | %.2f× | %.1f | %.0f MiB | %s |\n", c, accepts.rate,
			accepts.p50, accepts.p99, pgb, accepts.rate/pgb, acceptBatch, accepts.rss, accepts.cpu)
		fmt.Printf("| replays (same key, same request) | %d | %.0f | %v | %v | %.0f | %.2f× | %.1f | %.0f MiB | %s |\n", c,
			replays.rate, replays.p50, replays.p99, pgb, replays.rate/pgb, replayBatch, replays.rss, replays.cpu)
		fmt.Printf("| pgbench: the insert statement raw | %d | %.0f | | | | | 1 | | – / %s |\n", c, pgb,
			strings.TrimPrefix(pgbCPU, "0 / "))
		lastAccepts, lastCreated = accepts.rate, created
		acceptRatio[c], replayRatio[c] = accepts.rate/pgb, replays.rate/pgb
	}
	// The floor of a lone accept: one commit and one loopback round trip, a one-row insert from one client.
	commit := commitTime(ctx, dbconn)
	fmt.Printf("| one commit: a one-row insert, the floor of a lone accept | 1 | %.0f | %v | %v | | | 1 | | – / %s |\n",
		commit.rate, commit.p50, commit.p99, strings.TrimPrefix(commit.cpu, "0 / "))

	// Deliveries: a dispatching gateway drains the backlog the accept phases left, with the postgres provider.
	var backlog int64
	must(dbconn.QueryRow(ctx, backlogSQL).Scan(&backlog))
	start := time.Now()
	disp := startGateway(cfg)
	cpu0 := sampleCPU(disp.pid)
	waitEmpty(ctx, dbconn)
	deliveredRate := float64(backlog) / time.Since(start).Seconds()
	cpu := perRequest(cpu0, sampleCPU(disp.pid), float64(backlog))
	disp.stop()
	fmt.Printf("| deliveries, postgres provider (claim + insert + record) | | %.0f | | | | %.2f× the last accepts | | %.0f MiB | %s |\n",
		deliveredRate, deliveredRate/lastAccepts, disp.maxRSS(), cpu)

	// Webhooks: a backlog of -webhooks effects, recorded with the dispatcher off, then delivered by one gateway.
	api := startGateway(cfg, "--no-dispatch")
	var hookNext atomic.Int64
	post(api, 32, *hooks, func() string { return fmt.Sprintf("h%d", hookNext.Add(1)) },
		`{"type":"hook","payload":{"event":"order.paid","data":{"order":42,"total":"19.99"}}}`)
	api.stop()
	start = time.Now()
	disp = startGateway(cfg)
	cpu0 = sampleCPU(disp.pid)
	waitEmpty(ctx, dbconn)
	hookRate := float64(*hooks) / time.Since(start).Seconds()
	cpu = perRequest(cpu0, sampleCPU(disp.pid), float64(*hooks))
	disp.stop()
	fmt.Printf("| deliveries, webhooks to a local receiver (signed, one gateway) | | %.0f | | | | | | %.0f MiB | %s |\n",
		hookRate, disp.maxRSS(), cpu)

	// The same webhooks of a type with a fleet-wide rate far above what the machine delivers: the cost of a
	// limit (its claim by destination and its take of tokens), beside the unlimited type of the same run.
	api = startGateway(cfg, "--no-dispatch")
	post(api, 32, *hooks, func() string { return fmt.Sprintf("hl%d", hookNext.Add(1)) },
		`{"type":"hooklimited","payload":{"event":"order.paid","data":{"order":42,"total":"19.99"}}}`)
	api.stop()
	start = time.Now()
	disp = startGateway(cfg)
	cpu0 = sampleCPU(disp.pid)
	waitEmpty(ctx, dbconn)
	limitedRate := float64(*hooks) / time.Since(start).Seconds()
	cpu = perRequest(cpu0, sampleCPU(disp.pid), float64(*hooks))
	disp.stop()
	fmt.Printf("| deliveries, webhooks of a type with a rate limit of 10,000/s (one gateway) | | %.0f | | | | %.2f× unlimited | | %.0f MiB | %s |\n",
		limitedRate, limitedRate/hookRate, disp.maxRSS(), cpu)
	overhead := time.Duration(-1)
	if *proxyConc > 0 {
		overhead = proxyPhases(cfg, upstream.URL, *proxyConc)
	}
	fmt.Printf("\n%d effects accepted in all; the receiver got %d webhooks for %d effects\n", lastCreated, received.Load(), 2**hooks)
	if *windowConc > 0 {
		fmt.Println()
		windowPhase(ctx, cfg, dbconn, *windowConc)
	}
	goals(acceptRatio, replayRatio, overhead, commit.p50, deliveredRate/lastAccepts, hookRate)
}

// proxyPhases measures the dedup proxy against calling the upstream directly, with c clients, and returns
// the proxied new calls' p50 less the direct calls'.
func proxyPhases(cfg, upstream string, c int) time.Duration {
	g := startGateway(cfg)
	defer g.stop()
	pool := http.Transport{MaxIdleConnsPerHost: c, MaxConnsPerHost: c}
	client := &http.Client{Transport: &pool, Timeout: 30 * time.Second}
	const body = "amount=2000&currency=usd&source=tok_visa"
	call := func(url, key string) {
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 {
			log.Fatalf("proxy phase: status %d", resp.StatusCode)
		}
	}
	var next atomic.Int64
	direct := timed(g, c, func() { call(upstream+"/v1/charges", "d") })
	proxied := timed(g, c, func() { call(g.url+"/v1/proxy/up/v1/charges", fmt.Sprintf("p%d", next.Add(1))) })
	made := next.Load()
	replays := timed(g, c, func() {
		call(g.url+"/v1/proxy/up/v1/charges", fmt.Sprintf("p%d", 1+time.Now().UnixNano()%made))
	})
	row := func(name string, r result) {
		fmt.Printf("| %s | %d | %.0f | %v | %v | +%v p50, +%v p99 over direct | | | %.0f MiB | %s |\n", name, c, r.rate, r.p50, r.p99,
			(r.p50 - direct.p50).Round(10*time.Microsecond), (r.p99 - direct.p99).Round(10*time.Microsecond), r.rss, r.cpu)
	}
	fmt.Printf("| upstream called directly | %d | %.0f | %v | %v | | | | | %s |\n", c, direct.rate, direct.p50, direct.p99, direct.cpu)
	row("proxied calls (new keys, performed in the request)", proxied)
	row("proxied replays (same key and request)", replays)
	return proxied.p50 - direct.p50
}

// timed runs fn from c goroutines for *duration and returns its rate and latencies.
func timed(g *gateway, c int, fn func()) result {
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	stop := time.Now().Add(*duration)
	start := time.Now()
	cpu0 := sampleCPU(g.pid)
	for range c {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(stop) {
				t0 := time.Now()
				fn()
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	r := summarize(lat, time.Since(start), perRequest(cpu0, sampleCPU(g.pid), float64(len(lat))))
	r.rss = g.maxRSS()
	return r
}

// commitTime times one client's one-row inserts, each its own transaction, for *duration: one commit (a WAL
// flush) and one loopback round trip, which no accept can go below.
func commitTime(ctx context.Context, conn *pgx.Conn) result {
	_, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS gatewaybench_commit (n bigint)")
	must(err)
	var lat []time.Duration
	start := time.Now()
	cpu0 := sampleCPU(0)
	for n := 0; time.Since(start) < *duration; n++ {
		t0 := time.Now()
		_, err := conn.Exec(ctx, "INSERT INTO gatewaybench_commit VALUES ($1)", n)
		must(err)
		lat = append(lat, time.Since(t0))
	}
	return summarize(lat, time.Since(start), perRequest(cpu0, sampleCPU(0), float64(len(lat))))
}

// goals prints issue 32's table, each measure of this run beside its goal, and the line scripts read.
func goals(accept, replay map[int]float64, overhead, commit time.Duration, deliveries, webhooks float64) {
	ratio := func(m map[int]float64, c int) string {
		if r, ok := m[c]; ok {
			return fmt.Sprintf("%.2fx", r)
		}
		return "n/a"
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
	proxied := "n/a"
	if overhead >= 0 {
		proxied = ms(overhead)
	}
	fmt.Println()
	fmt.Println("| measure | this run | goal |")
	fmt.Println("|---|---|---|")
	fmt.Printf("| accepts, 1 client / pgbench's statement, 1 client | %s | ≥ 0.7x |\n", ratio(accept, 1))
	fmt.Printf("| accepts, 8 clients / pgbench, 8 clients | %s | ≥ 1.0x |\n", ratio(accept, 8))
	fmt.Printf("| accepts and replays, 32 clients / pgbench, 32 clients | %s, %s | ≥ 1.5x, ≥ 2x |\n", ratio(accept, 32), ratio(replay, 32))
	fmt.Printf("| proxied new call, %d clients: p50 over calling the upstream directly | %s ms | ≤ one commit (%s ms) + 0.5 ms |\n",
		*proxyConc, proxied, ms(commit))
	fmt.Printf("| postgres-provider deliveries / the last accepts | %.2fx | ≥ 1.0x |\n", deliveries)
	fmt.Printf("| signed webhooks from one gateway / s | %.0f | ≥ 5,000 |\n", webhooks)
	fmt.Println("| queue lease+run+complete / asynq | scripts/bench queue | ≥ 4x |")
	fmt.Printf("lone: accepts 1 client %s pgbench, 8 clients %s, 32 clients %s; proxy new-call overhead %s ms p50 (one commit %s ms)\n",
		ratio(accept, 1), ratio(accept, 8), ratio(accept, 32), proxied, ms(commit))
}

// backlogSQL counts the gateway's outbox rows: pgbench's rows are due tomorrow, and stay.
const backlogSQL = `SELECT count(*) FROM oncegate_outbox WHERE run_at < now() + interval '1 hour'`

// drainedSQL says whether they are all gone. It probes the (type, run_at) index, where a count would read
// every row left every time: polled every 20 ms, the count took a core's fifth from the gateway it measured.
const drainedSQL = `SELECT NOT EXISTS (SELECT FROM oncegate_outbox WHERE type = ANY ('{analytics,hook,hooklimited}') AND run_at < now() + interval '1 hour')`

// waitEmpty waits until the gateway's outbox rows are gone.
func waitEmpty(ctx context.Context, conn *pgx.Conn) {
	for {
		var drained bool
		must(conn.QueryRow(ctx, drainedSQL).Scan(&drained))
		if drained {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// post sends n requests from c clients.
func post(g *gateway, c, n int, key func() string, body string) {
	var sent atomic.Int64
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			client := newRawClient(g.url)
			defer client.close()
			for sent.Add(1) <= int64(n) {
				do(client, key(), body, 202)
			}
		})
	}
	wg.Wait()
}

// do posts body under key with c and fails the benchmark on any status but want (a replay may find its
// effect still pending: 202 for 200).
func do(c *rawClient, key, body string, want int) {
	status, err := c.post("/v1/effects", key, "application/json", body)
	if err != nil {
		log.Fatal(err)
	}
	if status != want && !(want == 200 && status == 202) {
		log.Fatalf("status %d, want %d", status, want)
	}
}

type result struct {
	rate     float64
	p50, p99 time.Duration
	rss      float64 // the gateway's largest resident memory during the phase, MiB
	cpu      string  // CPU a request: µs of the gateway / Postgres / the load generator
}

// load posts from c goroutines for *duration, each request with key(), and expects status want.
func load(g *gateway, c int, key func() string, want int) result {
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	stop := time.Now().Add(*duration)
	start := time.Now()
	cpu0 := sampleCPU(g.pid)
	for range c {
		wg.Go(func() {
			client := newRawClient(g.url)
			defer client.close()
			var mine []time.Duration
			for time.Now().Before(stop) {
				t0 := time.Now()
				do(client, key(), `{"type":"analytics","payload":{"name":"signup","properties":{"plan":"pro"}}}`, want)
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	r := summarize(lat, time.Since(start), perRequest(cpu0, sampleCPU(g.pid), float64(len(lat))))
	r.rss = g.maxRSS()
	return r
}

// summarize is a phase's rate and latencies from the latencies of its requests, taken over elapsed.
func summarize(lat []time.Duration, elapsed time.Duration, cpu string) result {
	slices.Sort(lat)
	return result{rate: float64(len(lat)) / elapsed.Seconds(), cpu: cpu,
		p50: lat[len(lat)/2].Round(10 * time.Microsecond), p99: lat[len(lat)*99/100].Round(10 * time.Microsecond)}
}

// pgbench runs the gateway's insert statement (dedup/sql/insert.sql, columns expanded) with fresh keys.
func pgbench(dir, dbURL string, clients int) (tps float64, cpu string) {
	script := `\set k random(1, 1000000000000)
WITH held AS (
    SELECT k.effect_id, k.expires_at IS NULL OR k.expires_at >= now()
        OR EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0) AS held
    FROM oncegate_keys k WHERE k.tenant = 'pgbench' AND k.key = 'k' || :k
), claimed AS (
    INSERT INTO oncegate_keys AS k (tenant, key, effect_id, fingerprint, expires_at)
    SELECT 'pgbench', 'k' || :k, oncegate_next_effect_id(), '\x00'::bytea, now() + interval '1 day'
    WHERE NOT EXISTS (SELECT FROM held WHERE held.held)
    ON CONFLICT (tenant, key) DO UPDATE
    SET effect_id = EXCLUDED.effect_id, fingerprint = EXCLUDED.fingerprint, expires_at = EXCLUDED.expires_at
    WHERE k.effect_id = (SELECT held.effect_id FROM held) AND k.expires_at < now()
        AND NOT EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0)
    RETURNING k.effect_id
), effect AS (
    INSERT INTO oncegate_effects (id, tenant, key, type, fingerprint, payload, stable_id)
    SELECT claimed.effect_id, 'pgbench', 'k' || :k, 'analytics', '\x00'::bytea, '{"name":"signup","properties":{"plan":"pro"}}', 'eff_' || :k
    FROM claimed
    RETURNING id, tenant, key, type, fingerprint, status, attempts, result, last_error, created_at, updated_at, delivered_at, next_attempt_at, stable_id
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, run_at) SELECT id, type, now() + interval '1 day' FROM effect
)
SELECT effect.* FROM effect;
`
	f := filepath.Join(dir, "insert.sql")
	must(os.WriteFile(f, []byte(script), 0o600))
	cpu0 := sampleCPU(0)
	cmd := exec.Command("pgbench", "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 2)),
		"-T", strconv.Itoa(int(duration.Seconds())), "-f", f, dbURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		log.Fatalf("pgbench: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil {
		log.Fatalf("pgbench printed no tps:\n%s", out)
	}
	tps, _ = strconv.ParseFloat(string(m[1]), 64)
	if n := regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`).FindSubmatch(out); n != nil {
		txns, _ := strconv.ParseFloat(string(n[1]), 64)
		cpu = perRequest(cpu0, sampleCPU(0), txns)
	}
	return tps, cpu
}

// gateway is a running gateway process; its resident memory is sampled every 100 ms while it runs.
type gateway struct {
	url  string
	pid  int
	stop func()
	rss  atomic.Int64 // KiB, the largest seen

	rows, stmts float64 // group commit's counters at the last meanBatch
}

func (g *gateway) maxRSS() float64 { return float64(g.rss.Load()) / 1024 }

// startGateway starts the gateway binary.
func startGateway(cfg string, args ...string) *gateway {
	cmd := exec.Command(*gwBin, append([]string{"serve", "--config", cfg, "--log-level", "warn"}, args...)...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive a benchmark that failed
	out, err := cmd.StdoutPipe()
	must(err)
	must(cmd.Start())
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		log.Fatal("gateway did not start")
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	g := &gateway{url: "http://" + strings.TrimPrefix(sc.Text(), "listening "), pid: cmd.Process.Pid}
	done := make(chan struct{})
	go func() {
		for {
			if kib := rssKiB(cmd.Process.Pid); kib > g.rss.Load() {
				g.rss.Store(kib)
			}
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	g.stop = func() {
		once.Do(func() { close(done); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	return g
}

// meanBatch reads the gateway's group-commit counters from /metrics and returns the requests recorded per
// statement since the last call (oncegate_group_commit_rows_total over _statements_total, kind create).
func (g *gateway) meanBatch() float64 {
	resp, err := http.Get(g.url + "/metrics")
	must(err)
	defer resp.Body.Close()
	var rows, stmts float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case `oncegate_group_commit_rows_total{kind="create"}`:
			rows = v
		case `oncegate_group_commit_statements_total{kind="create"}`:
			stmts = v
		}
	}
	dr, ds := rows-g.rows, stmts-g.stmts
	g.rows, g.stmts = rows, stmts
	if ds == 0 {
		return 0
	}
	return dr / ds
}

// rssKiB reads a process's resident memory from /proc.
func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
