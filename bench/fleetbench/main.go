// Command fleetbench measures what issue 31 asks of a fleet of gateways on one database, with real gateway
// processes and a real local receiver, and ends with one line that scripts can read:
//
//		fleet: limit 50/s held at R/s (E% off) by 3 gateways; 429 paused P s of 5; quiet tenant p99 T.TTx alone
//
//	  - limit: three gateways deliver a webhook type limited to 50 calls a second (burst 10) from a backlog to
//	    one receiver; over -window, one gateway is SIGKILLed at a third and another started at a half. R is
//	    the receiver's calls over the window, E how far that is from 50.
//	  - 429: the receiver then answers one call 429 with Retry-After: 5; P is the time from that answer to the
//	    next call it gets from any gateway.
//	  - quiet tenant: the p99 of a quiet tenant's effects of an unlimited type (from the POST to the receiver)
//	    while another tenant has -backlog effects of the same type waiting, over the p99 when it is alone.
//	    The type's concurrency is the gateway's default unless -concurrency sets it.
//
// Before that line, a line of its own for a limited type: the quiet tenant's effects to one destination while
// the other tenant's -backlog effects wait for another destination of the type, held at its 50/s.
//
// Every effect of the limit phases is counted at the receiver: lost and twice are reported beside the line.
// Run it with `scripts/bench fleet`; it creates and drops a database of its own.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	gwBin   = flag.String("gateway", "bin/gateway", "the gateway binary")
	window  = flag.Duration("window", time.Minute, "how long the limit is measured")
	backlog = flag.Int("backlog", 100000, "the noisy tenant's effects in the fairness phase")
	quiet   = flag.Int("quiet", 200, "the quiet tenant's effects in each fairness phase, one at a time")
	poolMax = flag.Int("pool-max-conns", 30, "each gateway's pool_max_conns")
	slow    = flag.Duration("log-slow-plans", 0, "when set, Postgres logs the plan of every statement in the benchmark's database slower than this (auto_explain)")
	fairC   = flag.Int("concurrency", 0, "the concurrency of the fairness phase's type in each gateway (0: the gateway's default, 16)")
)

const (
	apiKey   = "fleet-bench-api-key-5b8d2f0e7a1c3e9b"
	quietKey = "fleet-bench-quiet-key-9c1e7a3b5d2f0e8a"
	limit    = 50.0
)

// receiver is a webhook destination that notes when each call came and which effect it carried.
type receiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	at       []time.Time
	ids      map[string]int
	byData   map[string]time.Time // the arrival of each effect, by its data.q
	throttle bool
	limited  time.Time
}

func newReceiver() *receiver {
	r := &receiver{ids: map[string]int{}, byData: map[string]time.Time{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		now := time.Now()
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.throttle {
			r.throttle, r.limited = false, now
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		r.at = append(r.at, now)
		r.ids[req.Header.Get("webhook-id")]++
		var b struct {
			Data struct {
				Q string `json:"q"`
			} `json:"data"`
		}
		if json.Unmarshal(body, &b) == nil && b.Data.Q != "" {
			r.byData[b.Data.Q] = now
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	return r
}

func (r *receiver) between(from, to time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, at := range r.at {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

func (r *receiver) first() time.Time {
	for {
		r.mu.Lock()
		if len(r.at) > 0 {
			t := r.at[0]
			r.mu.Unlock()
			return t
		}
		r.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()
	admin := os.Getenv("DATABASE_URL")
	if admin == "" {
		admin = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	name := fmt.Sprintf("oncegate_fleetbench_%d", time.Now().Unix())
	conn, err := pgx.Connect(ctx, admin)
	must(err)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	must(err)
	if *slow > 0 {
		_, err = conn.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET session_preload_libraries = 'auto_explain';
			ALTER DATABASE %[1]s SET auto_explain.log_min_duration = %d;
			ALTER DATABASE %[1]s SET auto_explain.log_analyze = on`, name, slow.Milliseconds()))
		must(err)
	}
	var gws []*gateway
	defer func() {
		for _, g := range gws {
			g.stop()
		}
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		conn.Close(ctx)
	}()
	u, err := url.Parse(admin)
	must(err)
	u.Path = "/" + name
	dbURL := u.String()
	// Three gateways share Postgres's 100 connections (its default max_connections) with this benchmark: at
	// the gateway's default pool of 40 each they asked for 120, and a gateway refused a connection waited for it.
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(*poolMax))
	u.RawQuery = q.Encode()
	gwURL := u.String()
	dir, err := os.MkdirTemp("", "fleetbench-")
	must(err)
	defer os.RemoveAll(dir)

	limited, fair, side, held := newReceiver(), newReceiver(), newReceiver(), newReceiver()
	defer limited.srv.Close()
	defer fair.srv.Close()
	defer side.srv.Close()
	defer held.srv.Close()
	cfg := filepath.Join(dir, "gateway.yaml")
	must(os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  noisy: { api_keys: [%s] }
  quiet: { api_keys: [%s] }
effect_types:
  limited:
    provider: webhook
    timeout: 2s
    webhook: { url: "%s/in", secret: "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", allow_private_networks: true }
    rate: { per_second: %v, burst: 10 }
  fair:
    provider: webhook%s
    webhook: { url: "%s/in", secret: "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", allow_private_networks: true }
  side:
    provider: webhook
    concurrency: 64
    timeout: 2s
    webhook: { url: "%s/in", secret: "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", allow_private_networks: true,
      allowed_hosts: ["%s", "%s"] }
    rate: { per_second: %v, burst: 10 }
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, gwURL, apiKey, quietKey, limited.srv.URL, limit, fairConcurrency(), fair.srv.URL, side.srv.URL, side.srv.URL, held.srv.URL, limit)), 0o600))

	// The schema comes with the first gateway; the backlog goes in before the others start.
	gws = append(gws, startGateway(cfg, "--no-dispatch"))
	db, err := pgx.Connect(ctx, dbURL)
	must(err)
	defer db.Close(ctx)
	host := limited.srv.URL // as safehttp.Destination names it: scheme, host and port
	rows := int(limit*(window.Seconds()+20)) + 500
	_, err = db.Exec(ctx, `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'noisy', 'l' || i, 'limited', '\x00', json_build_object('event', 'e', 'data', json_build_object('i', i)), 'eff_l' || i
			FROM generate_series(1, $1) AS i RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, destination, tenant) SELECT id, type, $2, tenant FROM e`, rows, host)
	must(err)
	gws[0].stop()
	gws = []*gateway{startGateway(cfg), startGateway(cfg), startGateway(cfg)}

	// The limit, through a kill and a start.
	first := limited.first()
	from := first.Add(2 * time.Second)
	time.Sleep(time.Until(from.Add(*window / 3)))
	gws[0].kill()
	time.Sleep(time.Until(from.Add(*window / 2)))
	gws = append(gws, startGateway(cfg))
	time.Sleep(time.Until(from.Add(*window)))
	calls := limited.between(from, from.Add(*window))
	rate := float64(calls) / window.Seconds()
	off := math.Abs(rate-limit) / limit * 100
	fmt.Printf("limit: %d calls in %v: %.2f/s (limit %.0f/s), one gateway SIGKILLed at %v and one started at %v\n",
		calls, *window, rate, limit, *window/3, *window/2)

	// The destination's own signal.
	limited.mu.Lock()
	limited.throttle = true
	limited.mu.Unlock()
	var at time.Time
	for at.IsZero() {
		time.Sleep(10 * time.Millisecond)
		limited.mu.Lock()
		at = limited.limited
		limited.mu.Unlock()
	}
	// A row another gateway claimed, with its token, before the pause was written may still go in the
	// pause's first moments (each gateway learns of it at its next claim): those calls are counted apart, and
	// the pause is measured to the first call after them.
	const grace = 300 * time.Millisecond
	var paused time.Duration
	for paused == 0 {
		time.Sleep(10 * time.Millisecond)
		limited.mu.Lock()
		for _, c := range limited.at {
			if c.After(at.Add(grace)) {
				paused = c.Sub(at)
				break
			}
		}
		limited.mu.Unlock()
		if time.Since(at) > time.Minute {
			log.Fatal("429: no call came for a minute after it")
		}
	}
	early := limited.between(at, at.Add(grace))
	fmt.Printf("429: Retry-After: 5; next call %v after it (%d calls in its first 300 ms, claimed before it)\n",
		paused.Round(time.Millisecond), early)

	// Nothing lost, nothing twice: the limited backlog drains (at 50/s) while the fairness phases run.
	for _, g := range gws {
		g.stop()
	}
	gws = []*gateway{startGateway(cfg), startGateway(cfg), startGateway(cfg)}

	// Fairness on a limited type: the quiet tenant's effects to one destination, alone, then while the noisy
	// tenant's backlog waits for another destination of the type, which gets its 50 a second.
	sideAlone50, sideAlone := quietLatency(gws[0].url, "side", side, "side-alone")
	_, err = db.Exec(ctx, `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'noisy', 'h' || i, 'side', '\x00',
				json_build_object('event', 'e', 'url', $2::text || '/in', 'data', json_build_object('i', i)), 'eff_h' || i
			FROM generate_series(1, $1) AS i RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, destination, tenant) SELECT id, type, $2, tenant FROM e`, *backlog,
		held.srv.URL)
	must(err)
	time.Sleep(2 * time.Second) // the held destination at its limit
	sideBusy50, sideBusy := quietLatency(gws[0].url, "side", side, "side-busy")
	held.mu.Lock()
	heldCalls := len(held.at)
	held.mu.Unlock()
	fmt.Printf("quiet tenant, limited type: p50 %v, p99 %v alone; p50 %v, p99 %v (%.2fx) while the noisy tenant's %d effects wait for another destination of the type (%d delivered meanwhile)\n",
		sideAlone50.Round(time.Microsecond), sideAlone.Round(time.Microsecond), sideBusy50.Round(time.Microsecond),
		sideBusy.Round(time.Microsecond), float64(sideBusy)/float64(sideAlone), *backlog, heldCalls)
	// What is left of that backlog goes, so that the next phases do not share the gateways with it.
	_, err = db.Exec(ctx, `DELETE FROM oncegate_outbox WHERE type = 'side'`)
	must(err)
	_, err = db.Exec(ctx, `VACUUM ANALYZE oncegate_outbox`)
	must(err)

	// Fairness: the quiet tenant alone, then beside the noisy tenant's backlog of the same type.
	direct0 := directClaims(gws[0].url)
	asks0, waited0 := poolWaits(gws[0].url)
	alone50, alone := quietLatency(gws[0].url, "fair", fair, "alone")
	direct1 := directClaims(gws[0].url)
	asks1, waited1 := poolWaits(gws[0].url)
	_, err = db.Exec(ctx, `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'noisy', 'f' || i, 'fair', '\x00', json_build_object('event', 'e', 'data', json_build_object('i', i)), 'eff_f' || i
			FROM generate_series(1, $1) AS i RETURNING id, type, tenant)
		-- With its tenant, as a gateway writes it: a row that names none is one written before the outbox kept it.
		INSERT INTO oncegate_outbox (effect_id, type, destination, tenant) SELECT id, type, $2, tenant FROM e`, *backlog,
		fair.srv.URL)
	must(err)
	busy50, busy := quietLatency(gws[0].url, "fair", fair, "busy")
	direct2 := directClaims(gws[0].url)
	asks2, waited2 := poolWaits(gws[0].url)
	// A request, a claim or an outcome that found the pool empty waited for a connection before its statement.
	fmt.Printf("the posting gateway's pool: %.0f asks found no idle connection alone (%.1f ms waited in all), "+
		"%.0f busy (%.1f ms in all, %.2f ms each)\n", asks1-asks0, (waited1-waited0)*1000, asks2-asks1,
		(waited2-waited1)*1000, (waited2-waited1)*1000/max(1, asks2-asks1))
	fmt.Printf("quiet tenant: claimed by ID by the gateway that created them (without a claim round): %v of %d alone, %v of %d busy\n",
		direct1-direct0, *quiet, direct2-direct1, *quiet)
	// Where the quiet tenant's time goes, for both phases: from its effect's creation to its attempt's start
	// (the claim), the call, and from the call's end to the delivery's record.
	for _, phase := range []string{"alone", "busy"} {
		var c50, c99, call50, call99, r50, r99 float64
		must(db.QueryRow(ctx, `SELECT
				percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - e.created_at)),
				percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - e.created_at)),
				percentile_cont(0.5) WITHIN GROUP (ORDER BY a.latency_ms / 1000),
				percentile_cont(0.99) WITHIN GROUP (ORDER BY a.latency_ms / 1000),
				percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.delivered_at - a.started_at) - a.latency_ms / 1000),
				percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM e.delivered_at - a.started_at) - a.latency_ms / 1000)
			FROM oncegate_effects e JOIN oncegate_effect_attempts a ON a.effect_id = e.id
			WHERE e.tenant = 'quiet' AND e.type = 'fair' AND e.key LIKE $1 || '-%'`, phase).
			Scan(&c50, &c99, &call50, &call99, &r50, &r99))
		fmt.Printf("quiet tenant %s: creation to claim p50 %.1f ms p99 %.1f ms; call p50 %.1f ms p99 %.1f ms; call to record p50 %.1f ms p99 %.1f ms\n",
			phase, c50*1000, c99*1000, call50*1000, call99*1000, r50*1000, r99*1000)
	}
	// Who claimed the busy phase's quiet effects: the gateway the POST went to (by ID, or by its claim loop)
	// or another gateway's claim loop.
	byWho, err := db.Query(ctx, `SELECT a.gateway LIKE '%/' || $1::text || '/%' AS posted, count(*),
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - e.created_at)),
			percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - e.created_at)),
			max(extract(epoch FROM a.started_at - e.created_at))
		FROM oncegate_effects e JOIN oncegate_effect_attempts a ON a.effect_id = e.id
		WHERE e.tenant = 'quiet' AND e.type = 'fair' AND e.key LIKE 'busy-%' GROUP BY 1 ORDER BY 1 DESC`,
		strconv.Itoa(gws[0].cmd.Process.Pid))
	must(err)
	for byWho.Next() {
		var posted bool
		var n int
		var p50, p99, most float64
		must(byWho.Scan(&posted, &n, &p50, &p99, &most))
		who := "other gateways"
		if posted {
			who = "the gateway posted to"
		}
		fmt.Printf("quiet tenant busy, claimed by %s: %d, creation to claim p50 %.1f ms p99 %.1f ms max %.1f ms\n",
			who, n, p50*1000, p99*1000, most*1000)
	}
	must(byWho.Err())
	var left int
	must(db.QueryRow(ctx, `SELECT count(*) FROM oncegate_outbox o JOIN oncegate_effects e ON e.id = o.effect_id
		WHERE e.type = 'fair' AND e.tenant = 'noisy'`).Scan(&left))
	fmt.Printf("quiet tenant: p50 %v, p99 %v alone; p50 %v, p99 %v beside the noisy tenant's %d effects (%d of them still waiting at the end)\n",
		alone50.Round(time.Microsecond), alone.Round(time.Microsecond), busy50.Round(time.Microsecond),
		busy.Round(time.Microsecond), *backlog, left)
	// The noisy tenant's effects wait for their turn: from their creation (all at once) to their delivery.
	var n50, n99 float64
	var nDone int
	must(db.QueryRow(ctx, `SELECT count(*), coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at)), 0),
		coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at)), 0)
		FROM oncegate_effects WHERE type = 'fair' AND tenant = 'noisy' AND status = 'delivered'`).Scan(&nDone, &n50, &n99))
	fmt.Printf("noisy tenant: %d of its backlog delivered meanwhile, p50 %.2f s, p99 %.2f s from creation (a backlog drains in its turn)\n",
		nDone, n50, n99)

	deadline := time.Now().Add(5 * time.Minute)
	for {
		var n int
		must(db.QueryRow(ctx, `SELECT count(*) FROM oncegate_effects WHERE type = 'limited' AND status <> 'delivered'`).Scan(&n))
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	limited.mu.Lock()
	twice, got := 0, len(limited.ids)
	for _, c := range limited.ids {
		if c > 1 {
			twice++
		}
	}
	limited.mu.Unlock()
	var interrupted int
	must(db.QueryRow(ctx, `SELECT count(DISTINCT effect_id) FROM oncegate_effect_attempts WHERE outcome = 'interrupted'`).Scan(&interrupted))
	fmt.Printf("limited effects: %d, received %d, lost %d, received twice %d (deliveries interrupted by the kill: %d)\n",
		rows, got, rows-got, twice, interrupted)
	fmt.Printf("fleet: limit %.0f/s held at %.2f/s (%.2f%% off) by 3 gateways; 429 paused %.2f s of 5; quiet tenant p99 %.2fx alone\n",
		limit, rate, off, paused.Seconds(), float64(busy)/float64(alone))
}

// quietLatency posts the quiet tenant's effects one at a time and returns the p50 and p99 of the time from
// each POST to its arrival at the receiver. It prints the p50 and p99 of the POST's answer: the accept's part.
func quietLatency(base, typ string, r *receiver, phase string) (p50, p99 time.Duration) {
	var lat, answered []time.Duration
	for i := range *quiet {
		q := fmt.Sprintf("%s-%d", phase, i)
		body := fmt.Sprintf(`{"type":%q,"payload":{"event":"e","data":{"q":%q}}}`, typ, q)
		req, _ := http.NewRequest("POST", base+"/v1/effects", bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+quietKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", q)
		t0 := time.Now()
		resp, err := http.DefaultClient.Do(req)
		must(err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered = append(answered, time.Since(t0))
		if resp.StatusCode != 202 {
			log.Fatalf("quiet POST: %d", resp.StatusCode)
		}
		for {
			r.mu.Lock()
			at, ok := r.byData[q]
			r.mu.Unlock()
			if ok {
				lat = append(lat, at.Sub(t0))
				break
			}
			if time.Since(t0) > 2*time.Minute {
				log.Fatalf("quiet effect %s not delivered in 2 minutes", q)
			}
			time.Sleep(time.Millisecond)
		}
	}
	slices.Sort(lat)
	slices.Sort(answered)
	fmt.Printf("quiet tenant %s: POST answered p50 %.1f ms p99 %.1f ms\n", phase,
		float64(answered[len(answered)/2].Microseconds())/1000, float64(answered[len(answered)*99/100].Microseconds())/1000)
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// directClaims reads a gateway's count of new effects of type fair that it claimed by their ID
// (oncegate_direct_claims_total).
func directClaims(base string) float64 {
	return metric(base, "oncegate_direct_claims_total{", `result="claimed"`, `type="fair"`)
}

// metric reads from a gateway's /metrics the first sample whose line starts with prefix and holds every
// label of labels; 0 when there is none.
func metric(base, prefix string, labels ...string) float64 {
	resp, err := http.Get(base + "/metrics")
	must(err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		must(err)
		return v
	}
	return 0
}

// poolWaits reads a gateway's asks for a connection of its main pool that found none idle, and their wait.
func poolWaits(base string) (asks, waited float64) {
	return metric(base, "oncegate_db_pool_empty_acquires_total{", `pool="main"`),
		metric(base, "oncegate_db_pool_empty_acquire_wait_seconds_total{", `pool="main"`)
}

// gateway is a running gateway process.
type gateway struct {
	url string
	cmd *exec.Cmd
}

func startGateway(cfg string, args ...string) *gateway {
	cmd := exec.Command(*gwBin, append([]string{"serve", "--config", cfg, "--log-level", "error"}, args...)...)
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
	return &gateway{url: "http://" + strings.TrimPrefix(sc.Text(), "listening "), cmd: cmd}
}

func (g *gateway) kill() { _ = g.cmd.Process.Kill(); _ = g.cmd.Wait() }

func (g *gateway) stop() {
	if g.cmd.ProcessState == nil {
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		_ = g.cmd.Wait()
	}
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// fairConcurrency is the fairness type's concurrency line of the configuration: none for the default.
func fairConcurrency() string {
	if *fairC == 0 {
		return ""
	}
	return fmt.Sprintf("\n    concurrency: %d", *fairC)
}
