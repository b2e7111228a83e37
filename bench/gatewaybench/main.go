// Command gatewaybench measures the gateway on the same Postgres, in one run:
//
//   - accepts: new effects per second, and p50/p99 latency, from -clients concurrent HTTP clients posting new
//     idempotency keys to a real gateway process running as an API node (--no-dispatch);
//   - delivered: effects delivered per second by a second gateway process, dispatching only, with the
//     postgres (analytics insert) provider: the backlog of the accept phase, from its start until the outbox
//     is empty;
//   - replays: requests per second that repeat a key already used (they write nothing);
//   - pgbench: the gateway's own insert statement (effect + outbox row, one transaction) run raw by pgbench
//     with as many clients, as the ceiling the gateway is measured against. (The gateway announces new
//     effects after the commit, batched: no NOTIFY in the statement.)
//
// Run it with scripts/bench or `make bench`; it creates and drops a database of its own.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/pgtest"
)

var (
	clients  = flag.Int("clients", 32, "concurrent clients, for the gateway and for pgbench")
	duration = flag.Duration("duration", 10*time.Second, "length of each measured phase")
	gwBin    = flag.String("gateway", "bin/gateway", "the gateway binary")
)

const apiKey = "bench-api-key-4a7c1e9f3b5d8a2c6e0f"

func main() {
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()
	admin := pgtest.AdminURL()
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
	dbURL := pgtest.WithDatabase(admin, name)
	var sync_, version string
	_ = conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('server_version')").Scan(&sync_, &version)

	dir, err := os.MkdirTemp("", "gatewaybench-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "gateway.yaml")
	// The tenant's rates are far above what one machine serves: the limiter runs on every request, so its
	// cost is measured, and refuses none.
	must(os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { bench: { api_keys: [%s], rate: { requests_per_second: 1000000, request_burst: 1000000, bytes_per_second: 1000MiB, byte_burst: 1000MiB } } }
effect_types: { analytics: { provider: postgres, concurrency: 32 } }
`, dbURL, apiKey)), 0o600))
	// An API-only gateway takes the load; a second gateway, started after the accept phase, dispatches. Run
	// together in one process, accepts and deliveries share the machine's 2 cores and Postgres's commits.
	base, stopAPI := startGateway(cfg, "--no-dispatch")
	defer stopAPI()

	fmt.Printf("Postgres %s (synchronous_commit=%s), %d clients, %v a phase\n\n", version, sync_, *clients, *duration)
	pool := http.Transport{MaxIdleConnsPerHost: *clients, MaxConnsPerHost: *clients}
	client := &http.Client{Transport: &pool, Timeout: 30 * time.Second}

	var next atomic.Int64
	accepts := load(client, base, func() string { return fmt.Sprintf("k%d", next.Add(1)) }, 202)
	created := next.Load()
	dbconn, err := pgx.Connect(ctx, dbURL)
	must(err)
	defer dbconn.Close(ctx)
	start := time.Now()
	_, stopDispatcher := startGateway(cfg)
	defer stopDispatcher()
	for {
		var n int64
		must(dbconn.QueryRow(ctx, "SELECT count(*) FROM oncegate_outbox").Scan(&n))
		if n == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var delivered int64
	must(dbconn.QueryRow(ctx, "SELECT count(*) FROM analytics_events").Scan(&delivered))
	deliveredRate := float64(delivered) / time.Since(start).Seconds()

	stopDispatcher()
	replays := load(client, base, func() string { return fmt.Sprintf("k%d", 1+time.Now().UnixNano()%created) }, 200)
	stopAPI() // its connections would count against pgbench's

	pgb := pgbench(dir, dbURL)

	fmt.Println("| measure | per second | p50 | p99 |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| gateway: new effects accepted | %.0f | %v | %v |\n", accepts.rate, accepts.p50, accepts.p99)
	fmt.Printf("| gateway: replays (same key, same request) | %.0f | %v | %v |\n", replays.rate, replays.p50, replays.p99)
	fmt.Printf("| dispatcher: delivered (postgres provider, claim + insert + record) | %.0f | | |\n", deliveredRate)
	fmt.Printf("| pgbench: the same insert statement, raw | %.0f | | |\n", pgb)
	fmt.Printf("\naccepts reach %.0f%% of pgbench's rate; deliveries keep up with %.0f%% of accepts (%d of %d delivered)\n",
		100*accepts.rate/pgb, 100*deliveredRate/accepts.rate, delivered, created)
}

type result struct {
	rate     float64
	p50, p99 time.Duration
}

// load posts from *clients goroutines for *duration, each request with key(), and expects status want.
func load(client *http.Client, base string, key func() string, want int) result {
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	stop := time.Now().Add(*duration)
	start := time.Now()
	for range *clients {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(stop) {
				req, _ := http.NewRequest("POST", base+"/v1/effects",
					strings.NewReader(`{"type":"analytics","payload":{"name":"signup","properties":{"plan":"pro"}}}`))
				req.Header.Set("Authorization", "Bearer "+apiKey)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key())
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					log.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want && !(want == 200 && resp.StatusCode == 202) {
					log.Fatalf("status %d, want %d", resp.StatusCode, want)
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	return result{rate: float64(len(lat)) / elapsed.Seconds(),
		p50: lat[len(lat)/2].Round(10 * time.Microsecond), p99: lat[len(lat)*99/100].Round(10 * time.Microsecond)}
}

// pgbench runs the gateway's insert statement (dedup/sql/insert.sql, columns expanded) with fresh keys.
func pgbench(dir, dbURL string) float64 {
	script := `\set k random(1, 1000000000000)
WITH effect AS (
    INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload)
    VALUES ('pgbench', 'k' || :k, 'analytics', '\x00'::bytea, '{"name":"signup","properties":{"plan":"pro"}}')
    ON CONFLICT (tenant, key) DO NOTHING
    RETURNING id, tenant, key, type, fingerprint, status, attempts, result, last_error, created_at, updated_at, delivered_at, next_attempt_at
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, run_at) SELECT id, type, now() + interval '1 day' FROM effect
)
SELECT effect.* FROM effect;
`
	f := filepath.Join(dir, "insert.sql")
	must(os.WriteFile(f, []byte(script), 0o600))
	cmd := exec.Command("pgbench", "-n", "-M", "prepared", "-c", strconv.Itoa(*clients), "-j", "2",
		"-T", strconv.Itoa(int(duration.Seconds())), "-f", f, dbURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		log.Fatalf("pgbench: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil {
		log.Fatalf("pgbench printed no tps:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	return tps
}

// startGateway starts the gateway binary and returns its base URL and a function that kills it.
func startGateway(cfg string, args ...string) (string, func()) {
	gw := exec.Command(*gwBin, append([]string{"serve", "--config", cfg, "--log-level", "warn"}, args...)...)
	gw.Stderr = os.Stderr
	gw.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive a benchmark that failed
	out, err := gw.StdoutPipe()
	must(err)
	must(gw.Start())
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		log.Fatal("gateway did not start")
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	var once sync.Once
	return "http://" + strings.TrimPrefix(sc.Text(), "listening "), func() {
		once.Do(func() { _ = gw.Process.Kill(); _ = gw.Wait() })
	}
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
