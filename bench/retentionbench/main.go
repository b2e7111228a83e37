// Command retentionbench measures retention under load (issue 30): a gateway accepts new effects at full
// speed for -duration and delivers them (signed webhooks to a local receiver), with -retention of keys,
// twice on a private Postgres cluster of its own (so that pg_stat_statements is loaded, and nothing else
// runs there):
//
//   - partitions: effects, replays and attempts in -interval partitions, retired by the partition manager
//     (DETACH ... CONCURRENTLY and DROP, the keys freed first);
//   - purge: the same schema with partitions.disabled, every effect in one partition, retired by the
//     row-by-row purge (a batched DELETE every minute), as before migration 00023.
//
// For each it reports accepts per second, the accept p99 of requests that overlapped a retirement (a
// manager's pass that dropped a partition, a purge that deleted rows; their span is taken from the gateway's
// log) against the others, Postgres's CPU over the run, the WAL and execution time of the retiring statements
// (pg_stat_statements) per effect retired, Postgres's planning time a second during a retirement and outside
// (track_planning: a DDL on a partitioned table has every session plan its statements again), the tables'
// sizes every 10 s (growth: the last minute's mean
// against the mean of the minute after warm-up, retention + 2 intervals), dead tuples at the end, and the
// checkpoints Postgres began (the requests of the minute after each, when full-page writes burst, apart, and
// the ratio again without them). Its last line is the one scripts read:
//
//	retention: p99 during drop X.XXx outside; size growth after warm-up N%; old purge p99 Y.YYx outside
//
// Run it with `scripts/bench retention` (flags: -duration -interval -retention -clients).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/partitions"
)

var (
	duration  = flag.Duration("duration", 10*time.Minute, "how long each mode accepts effects")
	interval  = flag.Duration("interval", time.Minute, "the partitions' interval")
	retention = flag.Duration("retention", 3*time.Minute, "retention.keys")
	payloads  = flag.Duration("payloads", 0, "retention.payloads in the partitions mode (0: off, bodies in the effects' rows)")
	clients   = flag.Int("clients", 16, "concurrent clients posting new effects")
	gwBin     = flag.String("gateway", "bin/gateway", "the gateway binary")
	modes     = flag.String("modes", "partitions,purge", "the modes to run, in order")
	rate      = flag.Int("rate", 1500, "accepts a second the clients aim at together (0: as fast as they go); "+
		"above what the gateway delivers, the outbox and every table grow whatever retention does")
	pgSettings = flag.String("postgres-settings", "", "more settings for the private Postgres, as -c name=value ... "+
		"(e.g. \"-c log_lock_waits=on -c deadlock_timeout=5ms\" to see what a retirement's requests wait for)")
	pgLog = flag.String("postgres-log", "", "a file to copy the private Postgres's log to when it stops")
)

const apiKey = "og_retentionbench_key_0123456789abcdef"

func main() {
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()
	cl, err := startCluster()
	if err != nil {
		log.Fatal(err)
	}
	defer cl.stop()

	var results []*run
	for _, mode := range strings.Split(*modes, ",") {
		r, err := measure(ctx, cl, mode)
		if err != nil {
			cl.stop()
			log.Fatalf("%s: %v", mode, err)
		}
		results = append(results, r)
	}
	report(results)
}

// cluster is a private Postgres, started by initdb and pg_ctl in a temporary folder.
type cluster struct {
	dir, bin string
	port     int
	as       []string // runuser -u postgres --, as root: Postgres refuses to run as root
}

func (c *cluster) cmd(tool string, args ...string) *exec.Cmd {
	full := append(slices.Clone(c.as), append([]string{filepath.Join(c.bin, tool)}, args...)...)
	return exec.Command(full[0], full[1:]...)
}

func serverBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no initdb: run scripts/services, which installs Postgres")
}

func startCluster() (*cluster, error) {
	bin, err := serverBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "retentionbench")
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c := &cluster{dir: dir, bin: bin, port: port}
	if os.Geteuid() == 0 {
		c.as = []string{"runuser", "-u", "postgres", "--"}
		if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("chown: %v %s", err, out)
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := c.cmd("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8").
		CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements "+
		"-c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on -c max_connections=200 -c shared_buffers=512MB -c fsync=on "+
		"-c synchronous_commit=on %s", port, dir, *pgSettings)
	if out, err := c.cmd("pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"),
		"-w", "start").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_ctl start: %v\n%s", err, out)
	}
	return c, nil
}

func (c *cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

func (c *cluster) stop() {
	_ = c.cmd("pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "fast", "-w", "stop").Run()
	if *pgLog != "" {
		if b, err := os.ReadFile(filepath.Join(c.dir, "log")); err == nil {
			_ = os.WriteFile(*pgLog, b, 0o644)
		}
	}
	_ = os.RemoveAll(c.dir)
}

// cpu is the CPU time, in seconds, of the cluster's processes now.
func (c *cluster) cpu() float64 {
	pidFile, err := os.ReadFile(filepath.Join(c.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	master, _ := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	tick := 100.0 // USER_HZ
	var total float64
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		pid, _ := strconv.Atoi(strings.Split(p, "/")[2])
		ppid, _ := strconv.Atoi(f[1])
		if pid != master && ppid != master {
			continue
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		k, _ := strconv.ParseFloat(f[12], 64)
		total += (u + k) / tick
	}
	return total
}

type request struct {
	start, end time.Time
}

type sample struct {
	at    time.Duration
	bytes int64
	dead  int64
}

type run struct {
	mode            string
	accepted        int64
	refused         int64
	duration        time.Duration
	during, outside []time.Duration
	windows         int
	// byStep: the latencies of requests during a pass, by the step of the pass they overlapped ("between":
	// none, the pauses between batches of keys and the pass's own reads).
	byStep              map[string][]time.Duration
	retired             int64
	retireWAL, retireMS float64
	pgCPU               float64
	sizes               []sample
	growth              float64
	deadEnd             int64
	tables              map[string]int64
	statements          []string
	// planDuring, planOutside: Postgres's planning time (pg_stat_statements.track_planning) a second, over
	// the seconds that overlapped a retirement and the others. A DDL on a partitioned table invalidates every
	// session's cached plans of it, so a replanning wave would show here.
	planDuring, planOutside   float64
	plansDuring, plansOutside float64
	// checkpoints: when Postgres began each checkpoint in the run (pg_stat_bgwriter's counts, read every
	// second). The pages a checkpoint's first minute touches first go whole into the WAL (full_page_writes),
	// a burst that lands inside or outside a retirement by chance: the requests of that minute are reported
	// apart, and the ratio again without them.
	checkpoints               []time.Time
	afterCkpt                 []time.Duration
	duringClean, outsideClean []time.Duration
	windowsAfterCkpt          int
}

// afterCheckpoint is how long after a checkpoint began its burst of full-page writes is counted.
const afterCheckpoint = time.Minute

// planSample is pg_stat_statements' planning totals at one moment.
type planSample struct {
	at    time.Time
	ms    float64
	plans float64
}

func measure(ctx context.Context, cl *cluster, mode string) (*run, error) {
	name := "rb_" + mode
	admin, err := pgx.Connect(ctx, cl.url("postgres"))
	if err != nil {
		return nil, err
	}
	defer admin.Close(ctx)
	for _, q := range []string{"DROP DATABASE IF EXISTS " + name + " WITH (FORCE)", "CREATE DATABASE " + name} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return nil, err
		}
	}
	url := cl.url(name)

	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(204)
	}))
	defer receiver.Close()
	parts := fmt.Sprintf("{ interval: %s, ahead: 3 }", *interval)
	if mode == "purge" {
		parts = "{ disabled: true }"
	}
	bodies := ""
	if *payloads > 0 && mode == "partitions" {
		bodies = fmt.Sprintf(", payloads: %s", *payloads)
	}
	cfgPath := filepath.Join(os.TempDir(), name+".yaml")
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s], rate: { requests_per_second: 1000000, request_burst: 1000000 } } }
effect_types:
  signup-webhook:
    provider: webhook
    webhook: { url: "%s", secret: "whsec_cmV0ZW50aW9uYmVuY2gtc2VjcmV0LTMyLWJ5dGVzISE=", allow_private_networks: true }
retention: { keys: %s%s }
partitions: %s
`, url, apiKey, receiver.URL, *retention, bodies, parts)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	if out, err := exec.Command(*gwBin, "migrate", "--config", cfgPath).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("migrate: %v\n%s", err, out)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE EXTENSION pg_stat_statements"); err != nil {
		return nil, err
	}
	if mode == "partitions" {
		if err := reshape(ctx, url); err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", *interval, err)
		}
	}

	gw := exec.Command(*gwBin, "serve", "--config", cfgPath)
	stdout, _ := gw.StdoutPipe()
	stderr, _ := gw.StderrPipe()
	if err := gw.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = gw.Process.Kill(); _ = gw.Wait() }()
	type step struct {
		Kind string    `json:"kind"`
		At   time.Time `json:"at"`
		Took int64     `json:"took_ns"`
	}
	type window struct {
		from, to time.Time
		steps    []step
	}
	var mu sync.Mutex
	var windows []window
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				listening <- a
			}
		}
	}()
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l struct {
				Time    time.Time `json:"time"`
				Msg     string    `json:"msg"`
				Dropped []string  `json:"dropped"`
				Effects int64     `json:"effects"`
				TookMS  int64     `json:"took_ms"`
				Steps   []step    `json:"steps"`
			}
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			retiring := (l.Msg == "partitions: pass" && len(l.Dropped) > 0) ||
				(l.Msg == "purged effects past retention" && l.Effects > 0)
			if retiring {
				fmt.Fprintf(os.Stderr, "%s %s\n", mode, sc.Text())
				mu.Lock()
				windows = append(windows, window{l.Time.Add(-time.Duration(l.TookMS) * time.Millisecond), l.Time, l.Steps})
				mu.Unlock()
			}
		}
	}()
	var base string
	select {
	case a := <-listening:
		base = "http://" + a
	case <-time.After(60 * time.Second):
		return nil, errors.New("the gateway did not start")
	}
	if _, err := pool.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		return nil, err
	}

	r := &run{mode: mode, duration: *duration, tables: map[string]int64{}, byStep: map[string][]time.Duration{}}
	cpu0 := cl.cpu()
	began := time.Now()
	stop := make(chan struct{})
	var accepted, refused atomic.Int64
	reqs := make([][]request, *clients)
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *clients}, Timeout: 30 * time.Second}
	var pace <-chan time.Time
	if *rate > 0 {
		t := time.NewTicker(time.Second / time.Duration(*rate))
		defer t.Stop()
		pace = t.C
	}
	for c := range *clients {
		wg.Go(func() {
			body := `{"type":"signup-webhook","payload":{"event":"user.signed_up","data":{"user":"u","plan":"pro"}}}`
			for i := 0; ; i++ {
				if pace != nil {
					select {
					case <-stop:
						return
					case <-pace:
					}
				}
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("POST", base+"/v1/effects", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+apiKey)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d-%d", mode, c, i))
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					refused.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 != 2 {
					refused.Add(1)
					continue
				}
				accepted.Add(1)
				reqs[c] = append(reqs[c], request{t0, time.Now()})
			}
		})
	}
	sizeQ := `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint,
		coalesce(sum(s.n_dead_tup), 0)::bigint
		FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
		WHERE c.relkind = 'r' AND c.relname LIKE 'oncegate\_%' AND c.relname NOT LIKE 'oncegate\_effect\_attempts%'`
	tick := time.NewTicker(10 * time.Second)
	planTick := time.NewTicker(time.Second)
	defer planTick.Stop()
	var plans []planSample
	var ckptSeen bool
	var ckptCount int64
	deadline := time.After(*duration)
	for done := false; !done; {
		select {
		case <-planTick.C:
			var n int64
			if err := pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n); err == nil {
				if ckptSeen && n > ckptCount {
					r.checkpoints = append(r.checkpoints, time.Now())
				}
				ckptSeen, ckptCount = true, n
			}
			var p planSample
			if err := pool.QueryRow(ctx, `SELECT coalesce(sum(total_plan_time), 0)::float8, coalesce(sum(plans), 0)::float8
				FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).
				Scan(&p.ms, &p.plans); err == nil {
				p.at = time.Now()
				plans = append(plans, p)
			}
		case <-tick.C:
			var s sample
			s.at = time.Since(began)
			if err := pool.QueryRow(ctx, sizeQ).Scan(&s.bytes, &s.dead); err == nil {
				r.sizes = append(r.sizes, s)
				var eff, keys, out int64
				_ = pool.QueryRow(ctx, `SELECT
					(SELECT coalesce(sum(pg_total_relation_size(oid)), 0) FROM pg_class WHERE relkind = 'r' AND relname LIKE 'oncegate\_effects\_%')::bigint,
					pg_total_relation_size('oncegate_keys'), pg_total_relation_size('oncegate_outbox')`).Scan(&eff, &keys, &out)
				fmt.Fprintf(os.Stderr, "%s %4.0fs: %8d accepted, effect tables %6.1f MB (effects %.1f, keys %.1f, "+
					"outbox %.1f), %d dead tuples\n", mode, s.at.Seconds(), accepted.Load(), float64(s.bytes)/1e6,
					float64(eff)/1e6, float64(keys)/1e6, float64(out)/1e6, s.dead)
			}
		case <-deadline:
			done = true
		}
	}
	tick.Stop()
	close(stop)
	wg.Wait()
	elapsed := time.Since(began)
	r.pgCPU = cl.cpu() - cpu0
	r.accepted, r.refused, r.duration = accepted.Load(), refused.Load(), elapsed

	mu.Lock()
	ws := slices.Clone(windows)
	mu.Unlock()
	r.windows = len(ws)
	for _, rs := range reqs {
		for _, q := range rs {
			overlaps := false
			for _, w := range ws {
				if q.start.Before(w.to) && q.end.After(w.from) {
					overlaps = true
					kind := "between"
					for _, st := range w.steps {
						if q.start.Before(st.At.Add(time.Duration(st.Took))) && q.end.After(st.At) {
							kind = st.Kind
						}
					}
					r.byStep[kind] = append(r.byStep[kind], q.end.Sub(q.start))
					break
				}
			}
			after := false
			for _, c := range r.checkpoints {
				if q.end.After(c) && q.start.Before(c.Add(afterCheckpoint)) {
					after = true
					break
				}
			}
			took := q.end.Sub(q.start)
			switch {
			case after:
				r.afterCkpt = append(r.afterCkpt, took)
			case overlaps:
				r.duringClean = append(r.duringClean, took)
			default:
				r.outsideClean = append(r.outsideClean, took)
			}
			if overlaps {
				r.during = append(r.during, took)
			} else {
				r.outside = append(r.outside, took)
			}
		}
	}
	for _, w := range ws {
		for _, c := range r.checkpoints {
			if w.from.Before(c.Add(afterCheckpoint)) && w.to.After(c) {
				r.windowsAfterCkpt++
				break
			}
		}
	}
	var dSecs, oSecs float64
	for i := 1; i < len(plans); i++ {
		a, b := plans[i-1], plans[i]
		secs := b.at.Sub(a.at).Seconds()
		in := false
		for _, w := range ws {
			if a.at.Before(w.to) && b.at.After(w.from) {
				in = true
				break
			}
		}
		if in {
			r.planDuring, r.plansDuring, dSecs = r.planDuring+b.ms-a.ms, r.plansDuring+b.plans-a.plans, dSecs+secs
		} else {
			r.planOutside, r.plansOutside, oSecs = r.planOutside+b.ms-a.ms, r.plansOutside+b.plans-a.plans, oSecs+secs
		}
	}
	if dSecs > 0 {
		r.planDuring, r.plansDuring = r.planDuring/dSecs, r.plansDuring/dSecs
	}
	if oSecs > 0 {
		r.planOutside, r.plansOutside = r.planOutside/oSecs, r.plansOutside/oSecs
	}
	var remaining int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM oncegate_effects").Scan(&remaining); err != nil {
		return nil, err
	}
	r.retired = r.accepted - remaining
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(wal_bytes), 0)::float8, coalesce(sum(total_exec_time), 0)::float8
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND (query ILIKE '%DETACH PARTITION%' OR query ILIKE '%DROP TABLE%' OR query ILIKE '%Frees the keys%'
			OR query ILIKE '%Retention: deletes%')`).Scan(&r.retireWAL, &r.retireMS); err != nil {
		return nil, err
	}
	if err := pool.QueryRow(ctx, strings.Replace(sizeQ, "coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint",
		"0::bigint", 1)).Scan(new(int64), &r.deadEnd); err != nil {
		return nil, err
	}
	st, err := pool.Query(ctx, `SELECT calls, total_exec_time, plans, total_plan_time, wal_bytes::float8,
		left(regexp_replace(query, '\s+', ' ', 'g'), 70)
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time + total_plan_time DESC LIMIT 14`)
	if err != nil {
		return nil, err
	}
	for st.Next() {
		var calls, plans int64
		var ms, planMS, wal float64
		var q string
		if err := st.Scan(&calls, &ms, &plans, &planMS, &wal, &q); err != nil {
			return nil, err
		}
		r.statements = append(r.statements, fmt.Sprintf("%8d calls %9.0f ms, %8d plans %8.0f ms, %8.1f MB WAL  %s",
			calls, ms, plans, planMS, wal/1e6, q))
	}
	rows, err := pool.Query(ctx, `SELECT CASE WHEN relname LIKE 'oncegate\_effects\_%' THEN 'oncegate_effects'
			WHEN relname LIKE 'oncegate\_effect\_replays\_%' THEN 'oncegate_effect_replays'
			WHEN relname LIKE 'oncegate\_effect\_attempts\_%' THEN 'oncegate_effect_attempts'
			WHEN relname LIKE 'oncegate\_effect\_bodies\_%' THEN 'oncegate_effect_bodies' ELSE relname END,
		sum(pg_total_relation_size(oid))::bigint FROM pg_class WHERE relkind = 'r' AND relname LIKE 'oncegate\_%' GROUP BY 1`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var n string
		var b int64
		if err := rows.Scan(&n, &b); err != nil {
			return nil, err
		}
		r.tables[n] = b
	}
	warm := *retention + 2**interval
	r.growth = growth(r.sizes, warm)
	return r, nil
}

// reshape gives a new database partitions of effects, replays and attempts -interval long from now, in place
// of the migrations' first ones (which reach the day after tomorrow), so that the manager retires some
// within the run. Every table is empty.
func reshape(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	now := time.Now()
	for _, t := range partitions.All {
		rows, err := conn.Query(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = $1::regclass`, t.Name)
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, n := range names {
			if _, err := conn.Exec(ctx, "DROP TABLE "+pgx.Identifier{n}.Sanitize()); err != nil {
				return err
			}
		}
		if _, err := partitions.Ensure(ctx, conn, t, *interval, 3, now); err != nil {
			return err
		}
	}
	return nil
}

// growth is the mean size over the run's last minute against the mean over the minute after warm, in percent.
func growth(s []sample, warm time.Duration) float64 {
	if len(s) == 0 {
		return 0
	}
	end := s[len(s)-1].at
	mean := func(from, to time.Duration) float64 {
		var sum, n float64
		for _, x := range s {
			if x.at >= from && x.at <= to {
				sum += float64(x.bytes)
				n++
			}
		}
		if n == 0 {
			return 0
		}
		return sum / n
	}
	a, b := mean(warm, warm+time.Minute), mean(end-time.Minute, end)
	if a == 0 {
		return 0
	}
	return (b - a) / a * 100
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)]
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func report(rs []*run) {
	fmt.Printf("\nretention: %d clients, retention.keys %s, partitions of %s; %s per mode, on a private Postgres %s\n\n",
		*clients, *retention, *interval, *duration, "(pg_stat_statements loaded)")
	fmt.Printf("| | %s |\n|---|%s\n", strings.Join(names(rs), " | "), strings.Repeat("---|", len(rs)))
	row := func(label string, f func(r *run) string) {
		var cells []string
		for _, r := range rs {
			cells = append(cells, f(r))
		}
		fmt.Printf("| %s | %s |\n", label, strings.Join(cells, " | "))
	}
	row("accepts a second", func(r *run) string { return fmt.Sprintf("%.0f", float64(r.accepted)/r.duration.Seconds()) })
	row("refused", func(r *run) string { return fmt.Sprint(r.refused) })
	row("retirements (passes that dropped, purges that deleted)", func(r *run) string { return fmt.Sprint(r.windows) })
	row("accept p99 during a retirement (requests)", func(r *run) string {
		return fmt.Sprintf("%.1f ms (%d)", p99(r.during).Seconds()*1000, len(r.during))
	})
	row("accept p99 outside", func(r *run) string {
		return fmt.Sprintf("%.1f ms (%d)", p99(r.outside).Seconds()*1000, len(r.outside))
	})
	row("ratio", func(r *run) string { return fmt.Sprintf("%.2fx", ratio(p99(r.during), p99(r.outside))) })
	for _, kind := range []string{"keys", "detach", "drop", "create", "keep", "between"} {
		row("  p99 of those overlapping "+kind+" (requests)", func(r *run) string {
			if len(r.byStep[kind]) == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f ms (%d)", p99(r.byStep[kind]).Seconds()*1000, len(r.byStep[kind]))
		})
	}
	row("checkpoints begun (retirements in the minute after one)", func(r *run) string {
		return fmt.Sprintf("%d (%d)", len(r.checkpoints), r.windowsAfterCkpt)
	})
	row("accept p99 in the minute after a checkpoint began (requests)", func(r *run) string {
		if len(r.afterCkpt) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f ms (%d)", p99(r.afterCkpt).Seconds()*1000, len(r.afterCkpt))
	})
	row("ratio without those minutes: during / outside", func(r *run) string {
		if len(r.duringClean) == 0 || len(r.outsideClean) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f / %.1f ms = %.2fx", p99(r.duringClean).Seconds()*1000, p99(r.outsideClean).Seconds()*1000,
			ratio(p99(r.duringClean), p99(r.outsideClean)))
	})
	row("Postgres planning a second, during / outside (plans a second)", func(r *run) string {
		return fmt.Sprintf("%.1f ms (%.0f) / %.1f ms (%.0f)", r.planDuring, r.plansDuring, r.planOutside, r.plansOutside)
	})
	row("effects retired", func(r *run) string { return fmt.Sprint(r.retired) })
	row("WAL of the retiring statements per effect", func(r *run) string {
		return fmt.Sprintf("%.0f B", r.retireWAL/float64(max(r.retired, 1)))
	})
	row("their execution time per effect", func(r *run) string {
		return fmt.Sprintf("%.1f µs", r.retireMS*1000/float64(max(r.retired, 1)))
	})
	row("Postgres CPU per 1,000 accepted (all work)", func(r *run) string {
		return fmt.Sprintf("%.2f s", r.pgCPU/float64(max(r.accepted, 1))*1000)
	})
	row("effect tables at the end (attempts apart)", func(r *run) string {
		return fmt.Sprintf("%.1f MB", float64(r.sizes[len(r.sizes)-1].bytes)/1e6)
	})
	row("size growth after warm-up", func(r *run) string { return fmt.Sprintf("%.1f%%", r.growth) })
	row("dead tuples at the end", func(r *run) string { return fmt.Sprint(r.deadEnd) })
	for _, t := range []string{"oncegate_effects", "oncegate_keys", "oncegate_effect_replays", "oncegate_outbox", "oncegate_effect_attempts"} {
		row(t, func(r *run) string { return fmt.Sprintf("%.1f MB", float64(r.tables[t])/1e6) })
	}
	fmt.Println()
	for _, r := range rs {
		fmt.Printf("%s sizes (s: MB):", r.mode)
		for _, s := range r.sizes {
			fmt.Printf(" %.0f:%.1f", s.at.Seconds(), float64(s.bytes)/1e6)
		}
		fmt.Println()
	}
	for _, r := range rs {
		fmt.Printf("\n%s: the statements Postgres spent most time in\n", r.mode)
		for _, s := range r.statements {
			fmt.Println("  " + s)
		}
	}
	var part, purge *run
	for _, r := range rs {
		switch r.mode {
		case "partitions":
			part = r
		case "purge":
			purge = r
		}
	}
	if part != nil && purge != nil {
		fmt.Printf("retention: p99 during drop %.2fx outside; size growth after warm-up %.0f%%; old purge p99 %.2fx outside\n",
			ratio(p99(part.during), p99(part.outside)), math.Round(part.growth)+0 /* -0.4 is 0, not -0 */, ratio(p99(purge.during), p99(purge.outside)))
	}
}

func names(rs []*run) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.mode)
	}
	return out
}
